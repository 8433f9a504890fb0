// The request a handler gets, the response it gives back, and the handler signatures.
#if canImport(Glibc)
import Glibc
#endif

public struct HTTPRequest: Sendable {
    public var method: String
    /// As sent: `path?query` (HTTP/2: the `:path` pseudo header).
    public var target: String
    /// `target` without the query.
    public var path: String
    public var version: HTTPVersion
    /// HTTP/2: no pseudo headers; `:authority` is also present as `host`.
    public var headers: HTTPHeaders
    public var body: [UInt8]
    /// "127.0.0.1:54321" or "[::1]:54321".
    public var remoteAddress: String
    public var tls: TLSInfo?
    /// Unique per server; lets a handler keep per-connection state.
    public var connectionID: UInt64
    /// HTTP/2 stream identifier, 0 for HTTP/1.
    public var streamID: Int32
    /// `remoteAddress` as per-address limits count it (`PeerKey.text`), worked out once per
    /// connection; empty when the address is unknown.
    public var clientKey: String

    public init(method: String, target: String, version: HTTPVersion, headers: HTTPHeaders,
                body: [UInt8], remoteAddress: String, tls: TLSInfo?, connectionID: UInt64,
                streamID: Int32, clientKey: String = "") {
        self.method = method
        self.clientKey = clientKey
        self.target = target
        // RFC 9112 3.2.2: an absolute-form target (sent to proxies, allowed to servers) names
        // the same resource as its path.
        var t = target
        if t.utf8.first != UInt8(ascii: "/"), let parts = absoluteFormParts(target) {
            t = parts.pathAndQuery.isEmpty ? "/" : String(parts.pathAndQuery)
        }
        // memchr over the bytes: the UTF8View's firstIndex walks an iterator.
        let q = t.withUTF8 { u -> Int? in
            guard let base = u.baseAddress, let hit = memchr(base, 0x3F, u.count) else { return nil }
            return base.distance(to: hit.assumingMemoryBound(to: UInt8.self))
        }
        if let q {
            self.path = q == 0 ? "/" : String(decoding: t.utf8.prefix(q), as: UTF8.self)
        } else {
            self.path = t
        }
        self.version = version
        self.headers = headers
        self.body = body
        self.remoteAddress = remoteAddress
        self.tls = tls
        self.connectionID = connectionID
        self.streamID = streamID
    }
}

/// An `http://` or `https://` absolute-form target split into its authority and the rest
/// (path and query, starting with "/" or "?", or empty); nil for any other target.
func absoluteFormParts(_ target: String) -> (authority: Substring, pathAndQuery: Substring)? {
    let lower = target.prefix(8).lowercased()
    let schemeLength: Int
    if lower.hasPrefix("http://") { schemeLength = 7 } else if lower.hasPrefix("https://") { schemeLength = 8 } else { return nil }
    let rest = target.dropFirst(schemeLength)
    let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
    return (rest[..<end], rest[end...])
}

public struct HTTPReply: Sendable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: [UInt8]

    public init(status: Int, headers: HTTPHeaders = .init(), body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A response with `content-type: application/json` and the given body text.
    public static func json(_ status: Int, _ body: String, headers: HTTPHeaders = .init()) -> HTTPReply {
        var h = headers
        h.replaceOrAdd("content-type", "application/json")
        return HTTPReply(status: status, headers: h, body: Array(body.utf8))
    }
}

/// What to do with the connection once a response has been written.
public enum ConnectionAction: Sendable {
    case keep
    /// HTTP/2: GOAWAY(NO_ERROR, last stream = this stream) after the response.
    /// HTTP/1: `Connection: close` on this response, then close.
    case goAway
    /// Abrupt: close the TCP connection right after writing this response.
    case close
}

/// Called on a loop thread: must not block. Blocking work goes to the caller's own thread and
/// answers later through the writer. A handler that never responds stalls its request; the
/// server's shutdown still completes (after its grace period).
public typealias HTTPHandler = @Sendable (HTTPRequest, HTTPReplyWriter) -> Void

/// HTTP/1.1 `Expect: 100-continue`: whether to invite the body. Called on a loop thread with
/// the request head (`body` empty) as soon as it is complete; must not block. Answer through
/// the decision from any thread: `proceed()` sends `100 Continue`; `refuse(response)` sends
/// that final response instead and closes the connection after it, the body is never read
/// and the request never reaches the handler. A body that arrives before the decision (a
/// client that stopped waiting) makes the decision moot: the request goes to the handler.
public typealias HTTPContinueCheck = @Sendable (HTTPRequest, HTTPContinueDecision) -> Void
