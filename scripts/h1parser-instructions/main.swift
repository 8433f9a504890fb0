// Harness for scripts/h1parser-instructions.sh: parses one kind of request N times through one
// parser (append + drain, as the server does) so callgrind can count instructions per request.
#if canImport(Glibc)
import Glibc
#endif
@main struct H1ParserInstructions {
    static func main() {
        let arguments = CommandLine.arguments
        guard arguments.count == 3, let count = Int(arguments[1]) else {
            print("usage: h1parser-instructions <count> wrk|browser|post")
            exit(64)
        }
        let request: [UInt8]
        switch arguments[2] {
        case "wrk":
            request = Array("GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n".utf8)
        case "browser":
            request = Array(("GET /v1/status?x=1 HTTP/1.1\r\nHost: relay.example.com\r\n"
                + "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36\r\n"
                + "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
                + "Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n"
                + "Connection: keep-alive\r\nCookie: session=0123456789abcdef0123456789abcdef\r\n\r\n").utf8)
        case "post":
            request = Array(("POST /v1/responses HTTP/1.1\r\nHost: relay.example\r\n"
                + "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n").utf8)
                + Array(repeating: UInt8(ascii: "x"), count: 200)
        default:
            print("unknown request kind \(arguments[2])")
            exit(64)
        }
        var parser = HTTP1Parser()
        var completed = 0
        request.withUnsafeBytes { raw in
            for _ in 0..<count {
                parser.append(raw)
                while let event = parser.next() {
                    if case .request = event { completed += 1 }
                }
            }
        }
        guard completed == count else {
            print("parsed \(completed) of \(count) requests")
            exit(1)
        }
    }
}
