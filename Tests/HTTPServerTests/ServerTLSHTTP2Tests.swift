// TLS (OpenSSL, ALPN, mTLS) and HTTP/2 (nghttp2) driven by real clients: curl, nghttp,
// h2load, plus a raw h2c frame reader for GOAWAY and SETTINGS. Each CLI test skips with a
// message when its tool is missing (`make deps` installs them).
import Foundation
import HTTPServer
import Synchronization
import Testing

/// Throwaway CA, server and client certificates made with the openssl CLI, once per process.
struct TestCertificates: Sendable {
    let dir: String
    var serverCert: String { dir + "/server.pem" }
    var serverKey: String { dir + "/server.key" }
    var caCert: String { dir + "/ca.pem" }
    var clientCert: String { dir + "/client.pem" }
    var clientKey: String { dir + "/client.key" }

    static let shared: Result<TestCertificates, TestError> = {
        guard findTool("openssl") != nil else { return .failure(TestError(missingToolMessage("openssl"))) }
        let dir = NSTemporaryDirectory() + "httpserver-tests-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        let steps: [[String]] = [
            ["req", "-x509"] + ec + ["-keyout", dir + "/ca.key", "-out", dir + "/ca.pem", "-days", "2",
                                     "-subj", "/CN=Test CA"],
            ["req"] + ec + ["-keyout", dir + "/server.key", "-out", dir + "/server.csr", "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", dir + "/server.csr", "-CA", dir + "/ca.pem", "-CAkey", dir + "/ca.key",
             "-CAcreateserial", "-out", dir + "/server.pem", "-days", "2",
             "-extfile", dir + "/san.cnf"],
            ["req"] + ec + ["-keyout", dir + "/client.key", "-out", dir + "/client.csr", "-subj", "/CN=accessory-1"],
            ["x509", "-req", "-in", dir + "/client.csr", "-CA", dir + "/ca.pem", "-CAkey", dir + "/ca.key",
             "-CAcreateserial", "-out", dir + "/client.pem", "-days", "2"],
        ]
        try? "subjectAltName=IP:127.0.0.1,DNS:localhost\n".write(toFile: dir + "/san.cnf", atomically: true, encoding: .utf8)
        for s in steps {
            guard let r = try? runTool("openssl", s), r.status == 0 else {
                return .failure(TestError("openssl \(s.prefix(2).joined(separator: " ")) failed"))
            }
        }
        return .success(TestCertificates(dir: dir))
    }()
}

/// Echo handler that also reports the protocol details it saw.
let detailsHandler: HTTPHandler = { req, res in
    var h = HTTPHeaders()
    h.add("x-version", "\(req.version)")
    h.add("x-alpn", req.tls?.alpn ?? "-")
    h.add("x-tls", req.tls?.version ?? "-")
    h.add("x-peer", req.tls?.peerCertificateSubject ?? "-")
    h.add("x-stream-id", String(req.streamID))
    h.add("x-host", req.headers["host"] ?? "-")
    if req.path == "/echo" {
        res.respond(HTTPReply(status: 200, headers: h, body: req.body))
    } else if req.path.hasPrefix("/big/") {
        let n = Int(req.path.dropFirst(5)) ?? 0
        res.respond(HTTPReply(status: 200, headers: h, body: (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }))
    } else {
        res.respond(HTTPReply(status: 200, headers: h, body: Array("ok \(req.method) \(req.target)".utf8)))
    }
}

func tlsConfiguration(_ certs: TestCertificates, clientCA: Bool = false) -> HTTPServerConfiguration {
    var c = HTTPServerConfiguration()
    c.tls = TLSConfiguration(certificatePath: certs.serverCert, privateKeyPath: certs.serverKey,
                             clientCAPath: clientCA ? certs.caCert : nil, requireClientCertificate: clientCA)
    return c
}

@Suite struct ServerTLSHTTP2Tests {
    @Test func curlOverTLSWithHTTP1AndHTTP2() throws {
        guard case .success(let certs) = TestCertificates.shared, findTool("curl") != nil else {
            print(missingToolMessage("curl or openssl")); return
        }
        try withServer(tlsConfiguration(certs), handler: detailsHandler) { server in
            let url = "https://127.0.0.1:\(server.localPort)/hello?q=1"
            let h1 = try #require(try runTool("curl", ["-sS", "--cacert", certs.caCert, "--http1.1", "-D", "-", url]))
            #expect(h1.status == 0, "\(h1.output)")
            #expect(h1.output.contains("x-version: http1_1"))
            #expect(h1.output.contains("x-alpn: http/1.1"))
            #expect(h1.output.contains("x-tls: TLSv1."))
            #expect(h1.output.hasSuffix("ok GET /hello?q=1"))

            let h2 = try #require(try runTool("curl", ["-sS", "--cacert", certs.caCert, "--http2", "-D", "-", url]))
            #expect(h2.status == 0, "\(h2.output)")
            #expect(h2.output.hasPrefix("HTTP/2 200"))
            #expect(h2.output.contains("x-version: http2"))
            #expect(h2.output.contains("x-alpn: h2"))
            #expect(h2.output.contains("x-host: 127.0.0.1:\(server.localPort)"))
            #expect(h2.output.hasSuffix("ok GET /hello?q=1"))
        }
    }

    @Test func curlH2CPriorKnowledgeWithLargeBodiesBothWays() throws {
        guard findTool("curl") != nil else { print(missingToolMessage("curl")); return }
        try withServer(handler: detailsHandler) { server in
            let dir = NSTemporaryDirectory() + "h2c-\(UInt32.random(in: 0...UInt32.max))"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let upload = (0..<(200 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
            try Data(upload).write(to: URL(fileURLWithPath: dir + "/up"))
            let r = try #require(try runTool("curl", ["-sS", "--http2-prior-knowledge", "--data-binary", "@" + dir + "/up",
                                                      "-o", dir + "/down", "-w", "%{http_version} %{http_code}",
                                                      "http://127.0.0.1:\(server.localPort)/echo"]))
            #expect(r.output == "2 200", "\(r.output)")
            let down = try Data(contentsOf: URL(fileURLWithPath: dir + "/down"))
            #expect(Array(down) == upload)

            let big = try #require(try runTool("curl", ["-sS", "--http2-prior-knowledge", "-o", dir + "/big",
                                                        "-w", "%{http_code} %{size_download}",
                                                        "http://127.0.0.1:\(server.localPort)/big/204800"]))
            #expect(big.output == "200 204800", "\(big.output)")
            let bytes = try Data(contentsOf: URL(fileURLWithPath: dir + "/big"))
            #expect(Array(bytes) == (0..<204800).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        }
    }

    @Test func nghttpOverTLSAndH2C() throws {
        guard findTool("nghttp") != nil, case .success(let certs) = TestCertificates.shared else {
            print(missingToolMessage("nghttp or openssl")); return
        }
        try withServer(tlsConfiguration(certs), handler: detailsHandler) { server in
            let r = try #require(try runTool("nghttp", ["-v", "https://127.0.0.1:\(server.localPort)/a",
                                                        "https://127.0.0.1:\(server.localPort)/b"]))
            #expect(r.status == 0, "\(r.output)")
            #expect(r.output.components(separatedBy: ":status: 200").count - 1 == 2)
            #expect(r.output.contains("ok GET /a") && r.output.contains("ok GET /b"))
        }
        try withServer(handler: detailsHandler) { server in
            let r = try #require(try runTool("nghttp", ["-v", "http://127.0.0.1:\(server.localPort)/c"]))
            #expect(r.status == 0, "\(r.output)")
            #expect(r.output.contains(":status: 200"))
            #expect(r.output.contains("ok GET /c"))
        }
    }

    @Test func hundredConcurrentStreamsOnOneConnection() throws {
        guard findTool("h2load") != nil else { print(missingToolMessage("h2load")); return }
        let peak = Mutex((current: 0, max: 0))
        // Answers from another thread after a short delay so streams really overlap.
        let handler: HTTPHandler = { _, res in
            peak.withLock { $0.current += 1; $0.max = max($0.max, $0.current) }
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(5)) {
                peak.withLock { $0.current -= 1 }
                res.respond(HTTPReply(status: 200, body: Array("x".utf8)))
            }
        }
        try withServer(handler: handler) { server in
            let r = try #require(try runTool("h2load", ["-n", "1000", "-c", "1", "-m", "100",
                                                        "http://127.0.0.1:\(server.localPort)/"]))
            #expect(r.output.contains("1000 succeeded, 0 failed, 0 errored"), "\(r.output)")
            #expect(peak.withLock { $0.max } > 10)
            #expect(server.metrics.connectionsTotal == 1)
        }
    }

    @Test func mutualTLSReportsPeerAndRefusesClientsWithoutCertificate() throws {
        guard case .success(let certs) = TestCertificates.shared, findTool("curl") != nil else {
            print(missingToolMessage("curl or openssl")); return
        }
        try withServer(tlsConfiguration(certs, clientCA: true), handler: detailsHandler) { server in
            let url = "https://127.0.0.1:\(server.localPort)/"
            let ok = try #require(try runTool("curl", ["-sS", "--cacert", certs.caCert, "--cert", certs.clientCert,
                                                       "--key", certs.clientKey, "-D", "-", url]))
            #expect(ok.status == 0, "\(ok.output)")
            #expect(ok.output.contains("x-peer: /CN=accessory-1"))
            let refused = try #require(try runTool("curl", ["-sS", "--cacert", certs.caCert, url]))
            #expect(refused.status != 0)
            #expect(server.metrics.tlsHandshakeFailures >= 1 || refused.output.contains("alert"))
        }
    }

    @Test func plainTextToTLSPortCountsAHandshakeFailure() throws {
        guard case .success(let certs) = TestCertificates.shared else { print(missingToolMessage("openssl")); return }
        try withServer(tlsConfiguration(certs), handler: detailsHandler) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(c.waitForClose())
            #expect(server.metrics.tlsHandshakeFailures == 1)
        }
    }

    @Test func badCertificatePathIsAClearError() {
        var c = HTTPServerConfiguration()
        c.tls = TLSConfiguration(certificatePath: "/nonexistent/cert.pem", privateKeyPath: "/nonexistent/key.pem")
        #expect {
            _ = try HTTPServer(configuration: c, handler: echoHandler)
        } throws: { error in
            "\(error)".contains("/nonexistent/cert.pem")
        }
    }
}

// MARK: Raw h2c frames (GOAWAY, SETTINGS, stalls)

/// Minimal HTTP/2 client over a raw socket: sends frames, reads frames. HPACK is avoided by
/// using static-table indexes only (:method GET = 0x82, :scheme http = 0x86, :path / = 0x84)
/// plus literal :path and :authority values without indexing.
final class RawH2Client {
    let socket: RawClient
    private var buffer: [UInt8] = []

    struct Frame { var type: UInt8; var flags: UInt8; var stream: UInt32; var payload: [UInt8] }

    init(port: Int) throws {
        socket = try RawClient(port: port)
        try socket.send(Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + Self.frame(type: 4, flags: 0, stream: 0, []))
    }

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
        let n = payload.count
        return [UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff), type, flags,
                UInt8(stream >> 24 & 0x7f), UInt8(stream >> 16 & 0xff), UInt8(stream >> 8 & 0xff), UInt8(stream & 0xff)] + payload
    }

    /// GET <path> on `stream` with END_STREAM|END_HEADERS.
    func get(_ path: String, stream: UInt32) throws {
        var block: [UInt8] = [0x82, 0x86]
        // Literal header field without indexing, name = static index 4 (:path).
        block += [0x04, UInt8(path.utf8.count)] + Array(path.utf8)
        // nghttp2 requires :authority or host (static index 1).
        block += [0x01, 0x01, UInt8(ascii: "t")]
        try socket.send(Self.frame(type: 1, flags: 0x5, stream: stream, block))
    }

    /// Reads frames until `match` accepts one (returned) or the connection ends (nil).
    func read(until match: (Frame) -> Bool) -> Frame? {
        while true {
            while buffer.count >= 9 {
                let len = Int(buffer[0]) << 16 | Int(buffer[1]) << 8 | Int(buffer[2])
                guard buffer.count >= 9 + len else { break }
                let f = Frame(type: buffer[3], flags: buffer[4],
                              stream: UInt32(buffer[5] & 0x7f) << 24 | UInt32(buffer[6]) << 16 | UInt32(buffer[7]) << 8 | UInt32(buffer[8]),
                              payload: Array(buffer[9..<(9 + len)]))
                buffer.removeFirst(9 + len)
                if f.type == 4 && f.flags & 1 == 0 {
                    try? socket.send(Self.frame(type: 4, flags: 1, stream: 0, []))   // ACK SETTINGS
                }
                if match(f) { return f }
            }
            guard let more = socket.readSome() else { return nil }
            buffer += more
        }
    }
}

extension RawClient {
    /// Bytes from one recv, nil on close or timeout.
    func readSome() -> [UInt8]? {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return n > 0 ? Array(chunk[0..<n]) : nil
    }
}

@Suite struct ServerHTTP2FrameTests {
    @Test func shutdownSendsGoAwayAndWaitsForTheOpenStream() throws {
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        let handler: HTTPHandler = { _, res in
            entered.signal()
            DispatchQueue.global().async {
                gate.wait()
                res.respond(HTTPReply(status: 200))
            }
        }
        let server = try HTTPServer(configuration: HTTPServerConfiguration(), handler: handler)
        try server.start()
        let c = try RawH2Client(port: server.localPort)
        try c.get("/slow", stream: 1)
        #expect(entered.wait(timeout: .now() + 5) == .success)
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async { server.stop(grace: .seconds(3)); done.signal() }
        let goAway = c.read { $0.type == 7 }
        #expect(goAway != nil)
        if let g = goAway {
            let last = UInt32(g.payload[0] & 0x7f) << 24 | UInt32(g.payload[1]) << 16 | UInt32(g.payload[2]) << 8 | UInt32(g.payload[3])
            #expect(last == 1)
            #expect(g.payload[4..<8].allSatisfy { $0 == 0 })   // NO_ERROR
        }
        gate.signal()
        let headers = c.read { $0.type == 1 && $0.stream == 1 }
        #expect(headers?.payload.first == 0x88)   // :status 200 (static index 8)
        #expect(done.wait(timeout: .now() + 5) == .success)
        #expect(c.read { _ in false } == nil)   // then closed
    }

    @Test func goAwayActionNamesTheStreamAndSettingsChangeIsSent() throws {
        let handler: HTTPHandler = { req, res in
            switch req.path {
            case "/settings":
                res.setMaxConcurrentStreams(7)
                res.respond(HTTPReply(status: 200))
            case "/goaway": res.respond(HTTPReply(status: 200), then: .goAway)
            default: res.respond(HTTPReply(status: 204))
            }
        }
        try withServer(handler: handler) { server in
            let c = try RawH2Client(port: server.localPort)
            try c.get("/settings", stream: 1)
            let settings = c.read { f in
                f.type == 4 && f.flags == 0 && stride(from: 0, to: f.payload.count, by: 6).contains { i in
                    f.payload[i] == 0 && f.payload[i + 1] == 3 && f.payload[i + 5] == 7 && f.payload[i + 4] == 0
                }
            }
            #expect(settings != nil, "no SETTINGS with MAX_CONCURRENT_STREAMS=7")
            try c.get("/goaway", stream: 3)
            let g = c.read { $0.type == 7 }
            #expect(g.map { Int($0.payload[3]) } == 3)
            #expect(c.read { _ in false } == nil, "connection not closed after GOAWAY")
        }
    }

    @Test func stalledStreamDoesNotBlockShutdown() throws {
        let entered = DispatchSemaphore(value: 0)
        let handler: HTTPHandler = { _, _ in entered.signal() }   // never answers
        let server = try HTTPServer(configuration: HTTPServerConfiguration(), handler: handler)
        try server.start()
        let c = try RawH2Client(port: server.localPort)
        try c.get("/stall", stream: 1)
        #expect(entered.wait(timeout: .now() + 5) == .success)
        let start = ContinuousClock.now
        server.stop(grace: .milliseconds(300))
        #expect(ContinuousClock.now - start < .seconds(3))
        #expect(c.read { _ in false } == nil)
    }
}

@Suite struct ServerHTTP2LimitTests {
    @Test func oversizedH2BodyGets413OnItsStream() throws {
        guard findTool("curl") != nil else { print(missingToolMessage("curl")); return }
        var config = HTTPServerConfiguration()
        config.limits.maxBodyBytes = 64 * 1024
        try withServer(config, handler: detailsHandler) { server in
            let dir = NSTemporaryDirectory() + "h2-413-\(UInt32.random(in: 0...UInt32.max))"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            try Data(count: 200 * 1024).write(to: URL(fileURLWithPath: dir + "/up"))
            let r = try #require(try runTool("curl", ["-sS", "--http2-prior-knowledge", "--data-binary", "@" + dir + "/up",
                                                      "-w", " %{http_code}", "http://127.0.0.1:\(server.localPort)/echo"]))
            #expect(r.output.hasSuffix(#"{"error":"body_too_large"} 413"#), "\(r.output)")
            #expect(server.metrics.parseErrorsByKind["h2_body_too_large"] == 1)
            // The connection and server stay usable.
            let ok = try #require(try runTool("curl", ["-sS", "--http2-prior-knowledge", "http://127.0.0.1:\(server.localPort)/x"]))
            #expect(ok.output == "ok GET /x")
        }
    }

    /// A stream whose request never completes used to stay open, with its body buffered, for as
    /// long as the client liked: no timeout ran while any stream was open (10 such connections
    /// of 100 streams held 32 MB of the relay). Now it is reset once headerTimeout + bodyTimeout
    /// have passed since its HEADERS; a stream a handler is working on is not, and the
    /// connection carries on.
    @Test func halfSentStreamIsResetAfterTheRequestTimeouts() throws {
        var config = HTTPServerConfiguration()
        config.limits.headerTimeout = .milliseconds(100)
        config.limits.bodyTimeout = .milliseconds(200)
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        let handler: HTTPHandler = { req, res in
            guard req.path == "/slow" else { return echoHandler(req, res) }
            entered.signal()
            DispatchQueue.global().async {
                gate.wait()
                res.respond(HTTPReply(status: 200))
            }
        }
        try withServer(config, handler: handler) { server in
            let c = try RawH2Client(port: server.localPort)
            try c.get("/slow", stream: 1)
            #expect(entered.wait(timeout: .now() + 5) == .success)
            // POST /echo on stream 3: HEADERS (END_HEADERS only), part of a body, then nothing.
            let block: [UInt8] = [0x83, 0x86, 0x04, 5] + Array("/echo".utf8) + [0x01, 0x01, UInt8(ascii: "t")]
            try c.socket.send(RawH2Client.frame(type: 1, flags: 0x4, stream: 3, block)
                              + RawH2Client.frame(type: 0, flags: 0, stream: 3, [UInt8](repeating: 0x61, count: 1000)))
            let reset = c.read { $0.type == 3 }
            #expect(reset?.stream == 3, "stream 3 was not reset")
            #expect(reset?.payload == [0, 0, 0, 8])   // CANCEL
            #expect(server.metrics.timeouts == 1)
            // The handler's stream is still answered, and the connection takes new streams.
            gate.signal()
            let slow = c.read { $0.type == 1 }
            #expect(slow?.stream == 1)
            #expect(slow?.payload.first == 0x88)   // :status 200
            try c.get("/after", stream: 5)
            let after = c.read { $0.type == 0 && $0.stream == 5 }
            #expect(after.map { String(decoding: $0.payload, as: UTF8.self) } == "GET /after 0")
            #expect(server.metrics.timeouts == 1)
        }
    }

    /// Bodies of streams not yet handed to the handler are capped per connection at twice
    /// maxBodyBytes (HTTP/1 holds one body per connection; h2 held up to 100): the stream that
    /// would pass the cap is refused (REFUSED_STREAM), the others go on, and the count drops
    /// again as bodies reach the handler.
    @Test func bufferedBodiesAreCappedPerConnection() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxBodyBytes = 32 * 1024   // cap 64 KiB
        try withServer(config) { server in
            let c = try RawH2Client(port: server.localPort)
            func post(_ stream: UInt32) -> [UInt8] {
                RawH2Client.frame(type: 1, flags: 0x4, stream: stream, [0x83, 0x86, 0x04, 5] + Array("/echo".utf8) + [0x01, 0x01, UInt8(ascii: "t")])
            }
            // 30,000 bytes in two DATA frames (the frame size limit is 16 KiB).
            func part(_ stream: UInt32, end: Bool = false) -> [UInt8] {
                RawH2Client.frame(type: 0, flags: 0, stream: stream, [UInt8](repeating: 0x61, count: 15_000))
                    + RawH2Client.frame(type: 0, flags: end ? 1 : 0, stream: stream, [UInt8](repeating: 0x61, count: 15_000))
            }
            // Three half-sent bodies of 30,000 bytes: the third would hold 90,000.
            try c.socket.send(post(1) + part(1) + post(3) + part(3) + post(5) + part(5))
            let refused = c.read { $0.type == 3 }
            #expect(refused?.stream == 5)
            #expect(refused?.payload == [0, 0, 0, 7])   // REFUSED_STREAM
            #expect(server.metrics.parseErrorsByKind["h2_buffered_body_limit"] == 1)
            // Stream 1 ends: its body reaches the handler whole, and its share is free again.
            try c.socket.send(RawH2Client.frame(type: 0, flags: 1, stream: 1, []))
            var echoed = 0
            _ = c.read { f in
                if f.type == 0 && f.stream == 1 { echoed += f.payload.count }
                return f.type == 0 && f.stream == 1 && f.flags & 1 != 0
            }
            #expect(echoed == 30_000)
            try c.socket.send(post(7) + part(7, end: true))
            var echoed7 = 0
            let end = c.read { f in
                if f.type == 0 && f.stream == 7 { echoed7 += f.payload.count }
                return (f.type == 0 && f.stream == 7 && f.flags & 1 != 0) || (f.type == 3 && f.stream == 7)
            }
            #expect(end?.type == 0 && echoed7 == 30_000)
            #expect(server.metrics.parseErrorsByKind["h2_buffered_body_limit"] == 1)
        }
    }

    /// A client that opens no flow-control window gets its response's HEADERS but never its
    /// DATA; the stream stayed open, and an open stream switched the idle timeout off, so the
    /// connection was held for ever (90 s+ on relay-server). Answered streams waiting on the
    /// peer now leave the idle timeout running.
    @Test func streamStalledByTheClientsWindowDoesNotHoldTheConnection() throws {
        var config = HTTPServerConfiguration()
        config.limits.idleTimeout = .milliseconds(300)
        try withServer(config) { server in
            let c = try RawH2Client(port: server.localPort)
            try c.socket.send(RawH2Client.frame(type: 4, flags: 0, stream: 0, [0, 4, 0, 0, 0, 0]))   // INITIAL_WINDOW_SIZE 0
            try c.get("/x", stream: 1)
            let headers = c.read { $0.type == 1 }
            #expect(headers?.stream == 1)
            #expect(c.read { $0.type == 0 } == nil, "DATA sent through a zero window, or the connection was not closed")
            #expect(server.metrics.timeouts == 1)
        }
    }

    /// PING (or SETTINGS, WINDOW_UPDATE) without requests is not activity: a client pinging
    /// every 100 ms is closed by a 300 ms idle timeout, while one sending a request as often
    /// keeps its connection.
    @Test func pingsAloneDoNotHoldAnIdleConnection() throws {
        var config = HTTPServerConfiguration()
        config.limits.idleTimeout = .milliseconds(300)
        try withServer(config) { server in
            let pinger = try RawH2Client(port: server.localPort)
            let requester = try RawH2Client(port: server.localPort)
            var closedAfter: Int?
            for i in 1...12 {   // 1.2 s: four idle timeouts
                try? pinger.socket.send(RawH2Client.frame(type: 6, flags: 0, stream: 0, [UInt8](repeating: UInt8(i), count: 8)))
                try? pinger.socket.send(RawH2Client.frame(type: 8, flags: 0, stream: 0, [0, 0, 0, 1]))   // WINDOW_UPDATE
                let answer = pinger.read { $0.type == 6 && $0.flags & 1 != 0 || $0.type == 7 }   // PING ACK or GOAWAY
                if answer == nil || answer?.type == 7 { closedAfter = i; break }
                try requester.get("/x", stream: UInt32(2 * i - 1))
                let done = requester.read { $0.stream == UInt32(2 * i - 1) && $0.flags & 1 != 0 }
                #expect(done != nil, "request \(i): the requesting connection was closed")
                usleep(100_000)
            }
            #expect(closedAfter != nil, "the pinging connection outlived four idle timeouts")
            #expect(server.metrics.timeouts >= 1)
        }
    }

    @Test func ipv6LoopbackListenerReportsBracketedAddress() throws {
        guard findTool("curl") != nil else { print(missingToolMessage("curl")); return }
        var config = HTTPServerConfiguration()
        config.host = "::1"
        let server = try HTTPServer(configuration: config) { req, res in
            res.respond(HTTPReply(status: 200, body: Array(req.remoteAddress.utf8)))
        }
        do {
            try server.start()
        } catch {
            print("IPv6 loopback unavailable here (\(error)): skipping")
            return
        }
        defer { server.stop(grace: .zero) }
        let r = try #require(try runTool("curl", ["-sS", "-g", "http://[::1]:\(server.localPort)/"]))
        #expect(r.output.hasPrefix("[::1]:"), "\(r.output)")
    }
}
