// The protocol version a request arrived with. Defined by the HTTP/1.1 parser's owner because the
// parser produces it; the HTTP/2 side of the server uses `.http2`.
public enum HTTPVersion: Sendable, Hashable {
    case http1_0
    case http1_1
    case http2
}
