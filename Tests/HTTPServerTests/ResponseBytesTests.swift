// The exact bytes of HTTP/1.x responses, compared with a reference serialiser written here from
// the rules in docs/http.md (status line, the handler's fields minus framing, date and server
// unless given, content-length unless bodyless, the connection line, the body unless HEAD or
// bodyless). The server's serialiser is tuned for instruction counts; this pins what it writes.
import Foundation
import HTTPServer
import Testing

@Suite(.serialized) struct ResponseBytesTests {
    static let reasons = [200: "OK", 202: "Accepted", 204: "No Content", 304: "Not Modified",
                          401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests", 503: "Service Unavailable"]

    /// What the handler answers, by request path `/<index>`.
    static let responses: [HTTPReply] = {
        var std = HTTPHeaders()
        std.add("x-request-id", "0123456789abcdef")
        std.add("content-type", "application/json")
        var mixed = HTTPHeaders([("X-Request-Id", "r1"), ("Content-Type", "application/json"), ("Retry-After", "5")])
        mixed.add("WWW-Authenticate", "Bearer")
        var framing = HTTPHeaders()
        framing.add("connection", "keep-alive")
        framing.add("content-length", "999")
        framing.add("transfer-encoding", "chunked")
        framing.add("x-kept", "yes")
        var own = HTTPHeaders()
        own.add("date", "Mon, 01 Jan 2001 00:00:00 GMT")
        own.add("server", "handler")
        // Heads larger than the serialiser's 4 KiB scratch: spilled part-way and past it whole.
        var big = HTTPHeaders()
        big.add("x-a", String(repeating: "a", count: 3000))
        big.add("x-b", String(repeating: "b", count: 3000))
        big.add("x-c", String(repeating: "c", count: 5000))
        big.add("content-type", "text/plain")
        let queued = Array(#"{"id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","state":"queued"}"#.utf8)
        return [
            HTTPReply(status: 202, headers: std, body: queued),
            HTTPReply(status: 200, headers: std, body: Array(#"{"id":"x","state":"delivered"}"#.utf8)),
            HTTPReply(status: 401, headers: mixed, body: Array(#"{"error":"unauthorized"}"#.utf8)),
            HTTPReply(status: 503, headers: mixed, body: []),
            HTTPReply(status: 404, headers: framing, body: Array(repeating: 0x61, count: 1500)),
            HTTPReply(status: 204, headers: std, body: Array("ignored".utf8)),
            HTTPReply(status: 304, headers: own, body: []),
            HTTPReply(status: 429, headers: own, body: Array(repeating: 0x62, count: 1023)),
            HTTPReply(status: 200, headers: HTTPHeaders(), body: Array(repeating: 0x63, count: 1024)),
            HTTPReply(status: 200, headers: big, body: Array(repeating: 0x64, count: 123_456)),
            HTTPReply(status: 404, headers: big, body: []),
        ]
    }()

    static let handler: HTTPHandler = { req, res in
        let i = Int(req.path.dropFirst()) ?? 0
        res.respond(responses[i])
    }

    /// The reference: what a response must look like on the wire.
    static func expected(_ r: HTTPReply, date: String, server: String?, keepAlive: Bool, http10: Bool, head: Bool) -> [UInt8] {
        var s = "HTTP/1.1 \(r.status) \(reasons[r.status]!)\r\n"
        let framing: Set = ["connection", "keep-alive", "content-length", "transfer-encoding", "upgrade", "proxy-connection"]
        for (name, value) in r.headers where !framing.contains(name.lowercased()) {
            s += "\(name.lowercased()): \(value)\r\n"
        }
        if r.headers["date"] == nil { s += "date: \(date)\r\n" }
        if let server, r.headers["server"] == nil { s += "server: \(server)\r\n" }
        let bodyless = r.status == 204 || r.status == 304
        if !bodyless { s += "content-length: \(r.body.count)\r\n" }
        if !keepAlive { s += "connection: close\r\n" } else if http10 { s += "connection: keep-alive\r\n" }
        s += "\r\n"
        return Array(s.utf8) + (bodyless || head ? [] : r.body)
    }

    /// Reads until `count` bytes arrived (or the peer stops sending).
    static func read(_ c: RawClient, count: Int) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while out.count < count {
            let n = chunk.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, min($0.count, count - out.count), 0) }
            if n <= 0 { break }
            out += chunk[0..<n]
        }
        return out
    }

    /// The server's own date line, taken from the answer to compare everything around it.
    static func date(in bytes: [UInt8]) -> String {
        let text = String(decoding: bytes, as: UTF8.self)
        guard let r = text.range(of: "\r\ndate: ") else { return "" }
        return String(text[r.upperBound...].prefix(29))
    }

    func check(serverName: String?) throws {
        let config = HTTPServerConfiguration(serverName: serverName)
        try withServer(config, handler: Self.handler) { server in
            // (request line suffix, extra header lines, keep-alive expected, HTTP/1.0)
            let modes: [(version: String, extra: String, keepAlive: Bool, http10: Bool)] = [
                ("HTTP/1.1", "", true, false),
                ("HTTP/1.1", "Connection: close\r\n", false, false),
                ("HTTP/1.0", "Connection: keep-alive\r\n", true, true),
                ("HTTP/1.0", "", false, true),
            ]
            var compared = 0
            for mode in modes {
                var client = try RawClient(port: server.localPort)
                for (i, response) in Self.responses.enumerated() {
                    for method in ["POST", "HEAD"] {
                        let head = method == "HEAD"
                        try client.send("\(method) /\(i) \(mode.version)\r\nHost: t\r\n\(mode.extra)Content-Length: 0\r\n\r\n")
                        // The date may differ between requests: measure the answer with a
                        // placeholder of the same length, then compare with the date it carries.
                        let size = Self.expected(response, date: String(repeating: "x", count: 29), server: serverName,
                                                 keepAlive: mode.keepAlive, http10: mode.http10, head: head).count
                        let got = Self.read(client, count: size)
                        let want = Self.expected(response, date: Self.date(in: got), server: serverName,
                                                 keepAlive: mode.keepAlive, http10: mode.http10, head: head)
                        #expect(got == want, "\(method) /\(i) \(mode.version) \(mode.extra): got \(String(decoding: got, as: UTF8.self))")
                        compared += 1
                        if !mode.keepAlive {
                            #expect(client.waitForClose())
                            client = try RawClient(port: server.localPort)
                        }
                    }
                }
            }
            #expect(compared == 4 * Self.responses.count * 2)
        }
    }

    @Test func http1ResponsesMatchTheReferenceBytes() throws {
        try check(serverName: nil)
    }

    @Test func http1ResponsesWithAServerNameMatchTheReferenceBytes() throws {
        try check(serverName: "relay-test")
    }

    /// Pipelined requests answered in one read: the concatenation of each answer's bytes.
    @Test func pipelinedAnswersAreTheReferenceBytesInOrder() throws {
        try withServer(handler: Self.handler) { server in
            let c = try RawClient(port: server.localPort)
            let order = [0, 2, 5, 1, 0]
            try c.send(order.map { "POST /\($0) HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n" }.joined())
            let probe = order.map { Self.expected(Self.responses[$0], date: String(repeating: "x", count: 29), server: nil,
                                                  keepAlive: true, http10: false, head: false) }
            let got = Self.read(c, count: probe.reduce(0) { $0 + $1.count })
            let date = Self.date(in: got)
            let want = order.flatMap { Self.expected(Self.responses[$0], date: date, server: nil, keepAlive: true, http10: false, head: false) }
            #expect(got == want)
        }
    }
}
