// CurlClient against scripted HTTP/1.1 servers on loopback: what a hostile or broken server can
// make it do (read an unbounded reply, follow a redirect elsewhere, use another scheme) is refused.
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import HTTPClient

/// Answers every connection with `response` (raw bytes) once the request has arrived, then
/// closes it. Counts the connections it served. `stop()` returns once the accept thread is gone
/// (LoopbackListener.close), so no accept runs on a descriptor number closed and reused since.
private final class ScriptedServer: Sendable {
    let listener: LoopbackListener
    let response: [UInt8]
    private let served = Atomic<Int>(0)

    init(_ response: [UInt8]) throws {
        listener = try LoopbackListener()
        self.response = response
        listener.acceptInBackground { [self] fd in serve(fd) }
    }

    convenience init(status: String, headers: [String], body: [UInt8]) throws {
        try self.init(Array(("HTTP/1.1 \(status)\r\n" + headers.map { $0 + "\r\n" }.joined() + "\r\n").utf8) + body)
    }

    func stop() { listener.close() }

    var url: String { "http://127.0.0.1:\(listener.port)" }
    var connections: Int { served.load(ordering: .acquiring) }

    /// One connection (the client's request arrives at once: curl, in the same test).
    private func serve(_ fd: Int32) {
        served.add(1, ordering: .releasing)
        // The request: its head, then Content-Length bytes.
        var data = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fd, &buffer, buffer.count)
            guard n > 0 else { break }
            data += buffer[0..<n]
            guard let end = data.indices.dropLast(3).first(where: { data[$0] == 13 && data[$0 + 1] == 10 && data[$0 + 2] == 13 && data[$0 + 3] == 10 }) else { continue }
            let head = String(decoding: data[0..<end], as: UTF8.self).lowercased()
            let length = head.split(separator: "\r\n").compactMap { line -> Int? in
                line.hasPrefix("content-length:") ? Int(line.dropFirst(15).trimmingCharacters(in: .whitespaces)) : nil
            }.first ?? 0
            if data.count >= end + 4 + length { break }
        }
        _ = response.withUnsafeBytes { writeAll(fd, $0) }
        shutdown(fd, Int32(SHUT_WR))
        close(fd)
    }

    private func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        var done = 0
        while done < bytes.count {
            // MSG_NOSIGNAL: a client that refuses the reply closes early; EPIPE, not SIGPIPE.
            let n = send(fd, bytes.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL))
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }   // the client hung up (it refused the reply)
            done += n
        }
        return true
    }
}

/// Connections waiting in `listener`'s backlog (nobody accepts on it), taken without blocking.
private func pendingConnections(_ listener: LoopbackListener) -> Int {
    _ = fcntl(listener.fd, F_SETFL, fcntl(listener.fd, F_GETFL) | O_NONBLOCK)
    var n = 0
    while true {
        let fd = accept(listener.fd, nil, nil)
        guard fd >= 0 else { return n }
        close(fd)
        n += 1
    }
}

private func body(_ count: Int) -> [UInt8] { [UInt8](repeating: UInt8(ascii: "x"), count: count) }

@Suite struct CurlClientTests {
    let client = CurlClient()

    /// libcurl's codes and texts as 7.88 on OpenSSL 3 gives them (the texts from real runs).
    @Test("a TLS handshake refused by either side is final; a reset or a timeout is not")
    func whichTLSFailuresAreFinal() {
        let cases: [(code: Int, detail: String, final: Bool)] = [
            (56, "OpenSSL SSL_read: error:0A00045C:SSL routines::tlsv13 alert certificate required, errno 0", true),
            (35, "OpenSSL/3.0.17: error:0A000418:SSL routines::tlsv1 alert unknown ca", true),
            (60, "SSL certificate problem: self-signed certificate", true),
            (58, "could not load PEM client certificate, OpenSSL error error:80000002:system library::No such file or directory", true),
            (77, "error setting certificate file: /nonexistent", true),
            (35, "OpenSSL SSL_connect: Connection reset by peer in connection to 127.0.0.1:8443", false),
            (56, "Recv failure: Connection reset by peer", false),
            (7, "Failed to connect to 127.0.0.1 port 1 after 0 ms: Couldn't connect to server", false),
            (28, "Operation timed out after 10001 milliseconds with 0 bytes received", false),
        ]
        for c in cases {
            #expect(CurlClient.tlsFailureIsFinal(curlCode: c.code, detail: c.detail) == c.final, "\(c.code) \(c.detail)")
        }
    }

    @Test("a body of exactly the cap (1 MiB) is read whole; one byte more is refused with an error naming the cap")
    func responseBodiesAreCapped() throws {
        let cap = CurlClient.Options().maxResponseBodyBytes
        #expect(cap == 1 << 20)
        let atCap = try ScriptedServer(status: "200 OK", headers: ["Content-Length: \(cap)"], body: body(cap))
        defer { atCap.stop() }
        let reply = try client.get(atCap.url + "/", bearer: "rk_x")
        #expect(reply.status == 200 && reply.body.count == cap)

        let over = try ScriptedServer(status: "200 OK", headers: ["Content-Length: \(cap + 1)"], body: body(cap + 1))
        defer { over.stop() }
        #expect(throws: CurlClient.TransportError(description: "GET \(over.url)/: the response body is larger than \(cap) bytes; refused")) {
            try client.get(over.url + "/", bearer: "rk_x")
        }
        // Without a Content-Length (read until close) the cap holds the same way.
        let unframed = try ScriptedServer(status: "200 OK", headers: ["Connection: close"], body: body(3 * cap))
        defer { unframed.stop() }
        #expect(throws: CurlClient.TransportError(description: "POST \(unframed.url)/: the response body is larger than \(cap) bytes; refused")) {
            try client.post(unframed.url + "/", bearer: "rk_x", json: Array("{}".utf8))
        }
        // A smaller cap is the caller's to choose.
        let small = CurlClient(CurlClient.Options(maxResponseBodyBytes: 10))
        #expect(throws: CurlClient.TransportError.self) { try small.get(atCap.url + "/", bearer: "rk_x") }
    }

    @Test("headers over their cap (64 KiB together) are refused")
    func responseHeadersAreCapped() throws {
        let fields = (0..<100).map { "X-Filler-\($0): " + String(repeating: "y", count: 1000) }
        let server = try ScriptedServer(status: "200 OK", headers: fields + ["Content-Length: 0"], body: [])
        defer { server.stop() }
        #expect(throws: CurlClient.TransportError(description: "GET \(server.url)/: the response headers are larger than 65536 bytes; refused")) {
            try client.get(server.url + "/", bearer: "rk_x")
        }
    }

    @Test("a redirect is reported and never followed: to file://, ftp:// or another http:// server")
    func redirectsAreNotFollowed() throws {
        let elsewhere = try LoopbackListener()
        defer { elsewhere.close() }
        let secretFile = FileManager.default.temporaryDirectory.appendingPathComponent("curl-redirect-\(UUID().uuidString)").path
        try Data("not for the server".utf8).write(to: URL(fileURLWithPath: secretFile))
        defer { unlink(secretFile) }
        for location in ["file://\(secretFile)", "ftp://127.0.0.1:\(elsewhere.port)/x", "http://127.0.0.1:\(elsewhere.port)/x"] {
            let redirecting = try ScriptedServer(status: "302 Found", headers: ["Location: \(location)", "Content-Length: 5"], body: Array("moved".utf8))
            defer { redirecting.stop() }
            let reply = try client.post(redirecting.url + "/v1/responses", bearer: "rk_x", json: Array("{}".utf8))
            #expect(reply.status == 302 && reply.location == location && reply.body == Array("moved".utf8), "\(location)")
            #expect(redirecting.connections == 1, "\(location)")
        }
        #expect(pendingConnections(elsewhere) == 0, "nothing connected to the redirect's target")
    }

    @Test("only http and https URLs are used: ftp:// and file:// are refused before any connection or read")
    func otherSchemesAreRefused() throws {
        #expect(CurlClient.allowedProtocols == "http,https")
        let ftp = try LoopbackListener()
        defer { ftp.close() }
        for url in ["ftp://127.0.0.1:\(ftp.port)/x", "file:///etc/hostname", "gopher://127.0.0.1:\(ftp.port)/"] {
            do {
                let reply = try client.get(url, bearer: "rk_x")
                Issue.record("\(url) answered \(reply.status) with \(reply.body.count) bytes")
            } catch {
                #expect("\(error)".hasPrefix("GET \(url): ") && "\(error)".contains("not supported or disabled"), "\(error)")
            }
        }
        #expect(pendingConnections(ftp) == 0)
    }
}
