// The relay's answers byte for byte on the wire (HTTP/1.1 and 1.0, keep-alive and close, HEAD):
// the 202 body is written as bytes and handed to HTTPServer without a String in between, and
// these pin that the bytes are what the API documents, in the order HTTPServer writes fields.
import Foundation
import Glibc
import Testing
@testable import RelayCore

/// One loopback connection that sends raw bytes and reads raw bytes.
private final class WireClient {
    let fd: Int32

    init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr)
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { throw CocoaError(.fileReadUnknown) }   // deinit closes fd (closing here too was a double close)
    }

    deinit { Glibc.close(fd) }

    func send(_ text: String) {
        let bytes = Array(text.utf8)
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            off += n
        }
    }

    /// One response: the head up to the blank line, then Content-Length bytes unless `head`.
    func response(head: Bool = false) -> String {
        var out: [UInt8] = []
        var byte: UInt8 = 0
        while !out.ends(with: [13, 10, 13, 10]) {
            guard recv(fd, &byte, 1, 0) == 1 else { return String(decoding: out, as: UTF8.self) }
            out.append(byte)
        }
        let text = String(decoding: out, as: UTF8.self)
        let length = head ? 0 : text.components(separatedBy: "\r\n")
            .first { $0.hasPrefix("content-length: ") }.flatMap { Int($0.dropFirst(16)) } ?? 0
        var body = [UInt8](repeating: 0, count: length)
        var got = 0
        while got < length {
            let n = body[got...].withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            got += n
        }
        return text + String(decoding: body[0..<got], as: UTF8.self)
    }

    /// True when the peer closes (EOF) within the receive timeout.
    func closes() -> Bool {
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, 0) == 0
    }
}

private extension Array where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix }
}

@Suite struct IngestWireTests {
    let dir = TempDir()

    /// The date field is the server's; everything else must match `want` exactly.
    private func expectBytes(_ got: String, _ want: (String) -> String, sourceLocation: SourceLocation = #_sourceLocation) {
        let date = got.range(of: "\r\ndate: ").map { String(got[$0.upperBound...].prefix(29)) } ?? "(none)"
        #expect(got == want(date), sourceLocation: sourceLocation)
    }

    @Test func ingestAnswersAreTheDocumentedBytes() throws {
        let service = RelayService(config: try serviceTestConfig(db: dir.db), logger: RelayLogger(capture: true)) { _, _ in
            FakeTransport { _, _ in PushAnswer(status: 200, reason: nil, classification: .done) }
        }
        try service.start()
        defer { service.stop() }
        let store = try #require(service.store)
        let secret = try store.createCredential(name: "t", apps: ["com.example.app"]).secret
        func post(_ token: String, version: String = "HTTP/1.1", extra: String = "", auth: Bool = true) -> String {
            let body = #"{"pushToken":"\#(token)","sessionIdentifier":"6F9619FF-8B86-D011-B42D-00C04FC964FF","keyID":"AQIDBA==","messageIndex":3,"encryptedData":"\#(String(repeating: "A", count: 40))"}"#
            return "POST /v1/responses \(version)\r\nHost: t\r\nX-Request-Id: req-\(token)\r\n\(auth ? "Authorization: Bearer \(secret)\r\n" : "")"
                + "Content-Type: application/json\r\n\(extra)Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
        }
        func accepted(_ got: String, _ token: String, connection: String = "") throws {
            let id = try #require(got.range(of: #"{"id":""#).map { String(got[$0.upperBound...].prefix(36)) }, "\(got)")
            #expect(UUIDText.parse(id) != nil, "\(got)")
            let body = #"{"id":"\#(id)","state":"queued"}"#
            expectBytes(got) { date in
                "HTTP/1.1 202 Accepted\r\nx-request-id: req-\(token)\r\ncontent-type: application/json\r\ndate: \(date)\r\n"
                    + "content-length: \(body.utf8.count)\r\n\(connection)\r\n\(body)"
            }
        }
        let k = try WireClient(port: service.ingestPort)
        // Keep-alive HTTP/1.1: a 202, the same body again (200 duplicate), a 401, another 202.
        k.send(post("aa01"))
        try accepted(k.response(), "aa01")
        k.send(post("aa01"))
        let duplicate = k.response()
        // The fake transport may be delivering it meanwhile: the state is any the API has.
        let id = duplicate.range(of: #"{"id":""#).map { String(duplicate[$0.upperBound...].prefix(36)) } ?? ""
        let state = duplicate.range(of: #""state":""#).map { String(duplicate[$0.upperBound...].prefix { $0 != "\"" }) } ?? ""
        #expect(ResponseState(rawValue: state) != nil, "\(duplicate)")
        expectBytes(duplicate) { date in
            let body = #"{"id":"\#(id)","state":"\#(state)"}"#
            return "HTTP/1.1 200 OK\r\nx-request-id: req-aa01\r\ncontent-type: application/json\r\ndate: \(date)\r\n"
                + "content-length: \(body.utf8.count)\r\n\r\n\(body)"
        }
        k.send(post("aa02", auth: false))
        let unauthorized = #"{"error":"unauthorized","field":"authorization","message":"a valid bearer credential is required"}"#
        expectBytes(k.response()) { date in
            "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer\r\nx-request-id: req-aa02\r\ncontent-type: application/json\r\n"
                + "date: \(date)\r\ncontent-length: \(unauthorized.utf8.count)\r\n\r\n\(unauthorized)"
        }
        // Two Authorization fields, even both valid: ambiguous, so no credential (401).
        k.send(post("aa08", extra: "Authorization: Bearer \(secret)\r\n"))
        expectBytes(k.response()) { date in
            "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer\r\nx-request-id: req-aa08\r\ncontent-type: application/json\r\n"
                + "date: \(date)\r\ncontent-length: \(unauthorized.utf8.count)\r\n\r\n\(unauthorized)"
        }
        // Two Content-Type fields, as two Authorization fields: refused (the first used to win,
        // so json then text/plain got 202), even when both say application/json.
        let twoTypes = #"{"error":"unsupported_media_type","field":"content-type","message":"Content-Type must be one media type (RFC 9110 8.3.1), application/json"}"#
        for (token, second) in [("aa09", "text/plain"), ("aa10", "application/json")] {
            k.send(post(token, extra: "Content-Type: \(second)\r\n"))
            expectBytes(k.response()) { date in
                "HTTP/1.1 415 Unsupported Media Type\r\nx-request-id: req-\(token)\r\ncontent-type: application/json\r\n"
                    + "date: \(date)\r\ncontent-length: \(twoTypes.utf8.count)\r\n\r\n\(twoTypes)"
            }
        }
        // Pipelined: two 202s answered in request order.
        k.send(post("aa03") + post("aa04"))
        try accepted(k.response(), "aa03")
        try accepted(k.response(), "aa04")
        // Connection: close, and HTTP/1.0 with and without keep-alive.
        let close = try WireClient(port: service.ingestPort)
        close.send(post("aa05", extra: "Connection: close\r\n"))
        try accepted(close.response(), "aa05", connection: "connection: close\r\n")
        #expect(close.closes())
        let ten = try WireClient(port: service.ingestPort)
        ten.send(post("aa06", version: "HTTP/1.0", extra: "Connection: keep-alive\r\n"))
        try accepted(ten.response(), "aa06", connection: "connection: keep-alive\r\n")
        ten.send(post("aa07", version: "HTTP/1.0"))
        try accepted(ten.response(), "aa07", connection: "connection: close\r\n")
        #expect(ten.closes())
        // HEAD: the GET's head without the body (405 here: HEAD is not allowed on the collection).
        let head = try WireClient(port: service.ingestPort)
        head.send("HEAD /v1/responses HTTP/1.1\r\nHost: t\r\nX-Request-Id: req-h\r\n\r\n")
        let notAllowed = #"{"error":"method_not_allowed","message":"use POST"}"#
        expectBytes(head.response(head: true)) { date in
            "HTTP/1.1 405 Method Not Allowed\r\nallow: POST\r\nx-request-id: req-h\r\ncontent-type: application/json\r\n"
                + "date: \(date)\r\ncontent-length: \(notAllowed.utf8.count)\r\n\r\n"
        }
    }
}
