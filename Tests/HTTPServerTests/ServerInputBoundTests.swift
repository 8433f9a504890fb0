// Input a connection can make the server hold, in every connection state: a client that sends
// without reading drives the state, then streams bytes for as long as the socket takes them.
// The invariant: one connection never holds more than maxHeaderBytes + maxBodyBytes + one read
// (64 KiB) on HTTP/1 (h2: its streams' cap plus one read), whatever it sends. Before the fix, a
// connection that had sent `Connection: close` kept reading and buffering: 1 GiB in 3.4 s.
import Foundation
import HTTPServer
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

private let maxHeaderBytes = 4096
private let maxBodyBytes = 8192
/// HTTP/1: head + body + one read (EventLoop.readBufferSize) + a line of slack.
private let http1Bound = maxHeaderBytes + maxBodyBytes + 65536 + 1024

private func boundedConfig() -> HTTPServerConfiguration {
    var c = HTTPServerConfiguration()
    c.limits.maxHeaderBytes = maxHeaderBytes
    c.limits.maxBodyBytes = maxBodyBytes
    c.limits.socketSendBufferBytes = 4096
    return c
}

/// Sends `chunk` over and over without ever reading, until the socket has taken nothing for
/// `quietMs` or `seconds` passed. Returns the bytes the kernel took.
private func streamWithoutReading(_ fd: Int32, _ chunk: [UInt8], seconds: Double = 2, quietMs: Int = 400) -> Int {
    var total = 0
    var quiet = 0
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline && quiet < quietMs {
        let n = chunk.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if n > 0 {
            total += n
            quiet = 0
        } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
            usleep(10_000)
            quiet += 10
        } else {
            break   // reset or closed: nothing more is held for it either
        }
    }
    return total
}

/// Sends `bytes` once (as far as the socket takes them within `seconds`).
private func sendOnce(_ fd: Int32, _ bytes: [UInt8], seconds: Double = 1) {
    var offset = 0
    let deadline = Date().addingTimeInterval(seconds)
    while offset < bytes.count && Date() < deadline {
        let n = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if n > 0 { offset += n } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { usleep(5_000) } else { return }
    }
}

/// An HPACK string literal (no Huffman): 7-bit prefix length, then the bytes.
private func hpackString(_ bytes: [UInt8]) -> [UInt8] {
    var out: [UInt8] = []
    if bytes.count < 127 {
        out.append(UInt8(bytes.count))
    } else {
        out.append(0x7f)
        var rest = bytes.count - 127
        while rest >= 128 { out.append(UInt8(rest & 0x7f) | 0x80); rest >>= 7 }
        out.append(UInt8(rest))
    }
    return out + bytes
}

/// A client whose kernel receive buffer is small, so the server's answers back up.
private func nonReadingClient(_ port: Int) throws -> RawClient {
    let c = try RawClient(port: port)
    var small: Int32 = 4096
    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
    return c
}

private let junk = [UInt8](repeating: UInt8(ascii: "x"), count: 65536)
private let pipelinedGets = Array(String(repeating: "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", count: 2000).utf8)

/// Drives one HTTP/1 state with `prefix`, then streams `tail` without reading; checks the
/// connection's held input against the bound and that the server stopped taking bytes.
private func checkHTTP1State(_ name: String, config: HTTPServerConfiguration = boundedConfig(),
                             handler: @escaping HTTPHandler = echoHandler,
                             prefix: [UInt8], tail: [UInt8] = junk,
                             during: ((HTTPServer) -> Void)? = nil) throws {
    try withServer(config, handler: handler) { server in
        let c = try nonReadingClient(server.localPort)
        sendOnce(c.fd, prefix)
        during?(server)
        let sent = streamWithoutReading(c.fd, tail)
        let m = server.metrics
        #expect(m.largestConnectionInputBytes <= http1Bound,
                "\(name): one connection held \(m.largestConnectionInputBytes) bytes of input")
        #expect(m.bufferedInputBytes <= http1Bound, "\(name): \(m.bufferedInputBytes) bytes held now")
        // The kernel's buffers take a few MiB at most once the server stops reading; a server
        // that goes on reading takes hundreds of MiB in 2 s on loopback.
        #expect(sent < 32 << 20, "\(name): the server kept taking input (\(sent) bytes)")
    }
}

@Suite(.serialized) struct ServerInputBoundTests {
    /// The sequence: 520 pipelined GETs not read, `Connection: close`, then a stream,
    /// with the answers stuck in the server's output queue (below its limit, which is raised
    /// here so the last answer fits: the server then waits for the peer to read before it
    /// closes, and used to read and buffer input all that time).
    @Test func afterAClosingRequest() throws {
        var config = boundedConfig()
        config.limits.maxQueuedOutputBytes = 8 << 20
        config.limits.maxQueuedOutputBytesTotal = 0
        let big = [UInt8](repeating: 0x61, count: 4 << 20)
        let prefix = Array(String(repeating: "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n", count: 520).utf8)
            + Array("GET /last HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".utf8)
        try checkHTTP1State("Connection: close", config: config, handler: { req, res in
            res.respond(req.path == "/last" ? HTTPReply(status: 200, body: big) : HTTPReply(status: 404))
        }, prefix: prefix)
        // The same with a parse error as the last thing parsed.
        try checkHTTP1State("refusal after queued output", config: config, handler: { req, res in
            res.respond(HTTPReply(status: 200, body: big))
        }, prefix: Array("GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n".utf8))
    }

    /// The closing request's handler has not answered yet while the peer streams.
    @Test func whileAClosingRequestIsAtTheHandler() throws {
        let held = Mutex<[HTTPReplyWriter]>([])
        try checkHTTP1State("closing request held", handler: { _, res in held.withLock { $0.append(res) } },
                            prefix: Array("GET /hold HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".utf8))
        for r in held.withLock({ $0 }) { r.respond(HTTPReply(status: 204)) }
    }

    @Test func afterAParseError() throws {
        try checkHTTP1State("obs-fold", prefix: Array("GET / HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n".utf8))
        try checkHTTP1State("bad request line", prefix: Array("\u{1}\u{2}\u{3} junk\r\n".utf8))
    }

    @Test func afterABodyTooLarge() throws {
        try checkHTTP1State("413", prefix: Array("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 999999\r\n\r\n".utf8))
        try checkHTTP1State("413 chunked", prefix: Array("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFF\r\n".utf8))
    }

    @Test func afterExpectationFailed() throws {
        try checkHTTP1State("417", prefix: Array("POST / HTTP/1.1\r\nHost: t\r\nExpect: 200-ok\r\nContent-Length: 5\r\n\r\n".utf8))
    }

    @Test func afterTheConnectionsLastRequest() throws {
        var config = boundedConfig()
        config.limits.maxRequestsPerConnection = 3
        try checkHTTP1State("request limit", config: config, prefix: pipelinedGets)
    }

    /// A head or a body in progress: the parser's own limits end them (431 / 413), then the
    /// connection reads nothing more.
    @Test func inAnEndlessHeadOrBody() throws {
        try checkHTTP1State("endless header line", prefix: Array("GET / HTTP/1.1\r\nHost: t\r\nX-A: ".utf8))
        try checkHTTP1State("endless body", prefix: Array("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 8000\r\n\r\n".utf8),
                            tail: junk)
    }

    /// Paused states that were already bounded stay so: 128 requests at a handler that holds
    /// them, and a peer that never reads its answers.
    @Test func whilePausedForPipeliningOrOutput() throws {
        let held = Mutex<[HTTPReplyWriter]>([])
        try checkHTTP1State("pipeline full", handler: { _, res in held.withLock { $0.append(res) } }, prefix: pipelinedGets,
                            tail: pipelinedGets)
        for r in held.withLock({ $0 }) { r.respond(HTTPReply(status: 204)) }
        let big = [UInt8](repeating: 0x61, count: 4000)
        try checkHTTP1State("output backed up", handler: { _, res in res.respond(HTTPReply(status: 200, body: big)) },
                            prefix: pipelinedGets, tail: pipelinedGets)
    }

    /// Shutdown begins while a request is at the handler: the connection answers it and
    /// parses nothing more, so it must not read either.
    @Test func duringShutdown() throws {
        let held = Mutex<[HTTPReplyWriter]>([])
        let entered = DispatchSemaphore(value: 0)
        let stopped = DispatchSemaphore(value: 0)
        try checkHTTP1State("shutdown", handler: { _, res in held.withLock { $0.append(res) }; entered.signal() },
                            prefix: Array("GET /hold HTTP/1.1\r\nHost: t\r\n\r\n".utf8),
                            during: { server in
                                #expect(entered.wait(timeout: .now() + 5) == .success)
                                DispatchQueue.global().async { server.stop(grace: .seconds(4)); stopped.signal() }
                                usleep(200_000)
                            })
        for r in held.withLock({ $0 }) { r.respond(HTTPReply(status: 204)) }
        _ = stopped.wait(timeout: .now() + 6)
    }

    /// After a lingering close starts, input is discarded and capped, never parsed or kept.
    @Test func whileLingering() throws {
        try checkHTTP1State("lingering", prefix: Array("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".utf8))
    }

    /// TLS: a closing request held at the handler while openssl s_client streams more (it
    /// reads and discards what the server sends, so only the input side is exercised).
    @Test func afterAClosingRequestOverTLS() throws {
        let certs: TestCertificates
        switch TestCertificates.shared {
        case .success(let c): certs = c
        case .failure(let e): print("skipped: \(e)"); return
        }
        var config = tlsConfiguration(certs)
        config.limits.maxHeaderBytes = maxHeaderBytes
        config.limits.maxBodyBytes = maxBodyBytes
        let held = Mutex<[HTTPReplyWriter]>([])
        defer { for r in held.withLock({ $0 }) { r.respond(HTTPReply(status: 204)) } }
        try withServer(config, handler: { _, res in held.withLock { $0.append(res) } }) { server in
            let p = Process()
            p.executableURL = URL(fileURLWithPath: findTool("openssl")!)
            p.arguments = ["s_client", "-connect", "127.0.0.1:\(server.localPort)", "-quiet", "-alpn", "http/1.1"]
            let input = Pipe()
            p.standardInput = input
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            try p.run()
            defer {
                try? input.fileHandleForWriting.close()
                kill(p.processIdentifier, SIGKILL)
                p.waitUntilExit()
            }
            let w = input.fileHandleForWriting.fileDescriptor
            let prefix = Array("GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".utf8)
            _ = prefix.withUnsafeBytes { write(w, $0.baseAddress, $0.count) }
            _ = fcntl(w, F_SETFL, fcntl(w, F_GETFL) | O_NONBLOCK)
            var sent = 0
            let deadline = Date().addingTimeInterval(2)
            while Date() < deadline {
                let n = junk.withUnsafeBytes { write(w, $0.baseAddress, $0.count) }
                if n > 0 { sent += n } else if errno == EAGAIN { usleep(5_000) } else { break }
            }
            let m = server.metrics
            #expect(held.withLock { $0.count } == 1, "the request did not reach the handler")
            #expect(m.largestConnectionInputBytes <= http1Bound, "held \(m.largestConnectionInputBytes) bytes")
            #expect(m.bufferedInputBytes <= http1Bound)
            #expect(sent < 32 << 20, "the server kept taking input over TLS (\(sent) bytes)")
        }
    }
}

@Suite(.serialized) struct ServerHTTP2InputBoundTests {
    /// After the server's GOAWAY (a handler's `.goAway` on stream 1) the client goes on opening
    /// streams and sending DATA: nothing of it is kept, and the connection ends.
    @Test func afterGoAway() throws {
        var config = boundedConfig()
        config.limits.maxBodyBytes = 32 * 1024
        try withServer(config, handler: { _, res in res.respond(HTTPReply(status: 200), then: .goAway) }) { server in
            let c = try RawH2Client(port: server.localPort)
            try c.get("/goaway", stream: 1)
            _ = c.read { $0.type == 7 }
            var flood: [UInt8] = []
            for i in 0..<40 {
                let stream = UInt32(3 + 2 * i)
                flood += RawH2Client.frame(type: 1, flags: 0x4, stream: stream, [0x83, 0x86, 0x04, 5] + Array("/echo".utf8) + [0x01, 0x01, UInt8(ascii: "t")])
                flood += RawH2Client.frame(type: 0, flags: 0, stream: stream, [UInt8](repeating: 0x61, count: 16_000))
            }
            let sent = streamWithoutReading(c.socket.fd, flood, seconds: 1.5)
            let m = server.metrics
            #expect(m.largestConnectionInputBytes <= 2 * 32 * 1024 + 65536, "held \(m.largestConnectionInputBytes)")
            #expect(sent < 32 << 20, "\(sent) bytes taken after GOAWAY")
        }
    }

    /// Streams with large header sections that never end: their headers count in the
    /// connection's buffered-request cap with their bodies, so 60 of them cannot hold 60 x
    /// 4 KiB + bodies; the streams past the cap are refused.
    @Test func openStreamsHeadersCountInTheCap() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxBodyBytes = 16 * 1024   // cap max(32 KiB, 64 KiB) = 64 KiB
        try withServer(config) { server in
            let c = try RawH2Client(port: server.localPort)
            var frames: [UInt8] = []
            let value = [UInt8](repeating: UInt8(ascii: "v"), count: 3000)
            for i in 0..<60 {
                let stream = UInt32(1 + 2 * i)
                // :method POST, :scheme https, :path /echo, host t, x-big: 3,000 bytes (literal,
                // new name, without indexing).
                var block: [UInt8] = [0x83, 0x87, 0x04, 5] + Array("/echo".utf8) + [0x01, 0x01, UInt8(ascii: "t")]
                block += [0x00] + hpackString(Array("x-big".utf8)) + hpackString(value)
                frames += RawH2Client.frame(type: 1, flags: 0x4, stream: stream, block)
            }
            try c.socket.send(frames)
            _ = c.read { $0.type == 3 }
            usleep(200_000)
            let m = server.metrics
            #expect(m.parseErrorsByKind["h2_buffered_body_limit", default: 0] > 0, "no stream refused: \(m.parseErrorsByKind)")
            #expect(m.largestConnectionInputBytes <= 64 * 1024, "held \(m.largestConnectionInputBytes)")
        }
    }
}

@Suite(.serialized) struct ServerInputBudgetTests {
    /// Four connections each hold a 50,000-byte partial body against a server-wide budget of
    /// 120,000: the reads that pass the budget close the connection holding most, so the total
    /// stays near the budget, and a new client is still served.
    @Test func greediestConnectionIsClosedWhenTheBudgetIsSpent() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxBodyBytes = 60_000
        config.limits.maxBufferedInputBytesTotal = 120_000
        try withServer(config) { server in
            var clients: [RawClient] = []
            for _ in 0..<4 {
                let c = try RawClient(port: server.localPort)
                try c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\n")
                try c.send([UInt8](repeating: 0x61, count: 50_000))
                c.setReceiveTimeout(milliseconds: 500)
                clients.append(c)
                usleep(100_000)
            }
            usleep(200_000)
            let m = server.metrics
            #expect(m.connectionsClosedForInputBudget >= 1)
            #expect(m.bufferedInputBytes <= 120_000, "\(m.bufferedInputBytes) held after the budget was spent")
            let closed = clients.filter { $0.waitForClose() }.count
            #expect(closed == m.connectionsClosedForInputBudget)
            let fresh = try RawClient(port: server.localPort)
            try fresh.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(fresh.readResponse()?.status == 200)
        }
    }
}
