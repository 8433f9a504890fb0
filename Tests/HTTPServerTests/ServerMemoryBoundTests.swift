// Memory bounds against peers that send and do not read: queued output per connection and in
// total, a write timeout that trickling cannot renew, and HTTP/2 handler work that outlives a
// stream reset.
import Foundation
import HTTPServer
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Polls `value` every 50 ms until it stays the same for `stableFor` polls or `seconds` pass.
private func settled(seconds: Double = 10, stableFor: Int = 10, _ value: () -> Int) -> Int {
    var last = value()
    var same = 0
    let deadline = Date().addingTimeInterval(seconds)
    while same < stableFor && Date() < deadline {
        Thread.sleep(forTimeInterval: 0.05)
        let now = value()
        same = now == last ? same + 1 : 0
        last = now
    }
    return last
}

/// A client socket with small kernel buffers, so a server's output backs up in the server.
private func smallBufferClient(port: Int) throws -> RawClient {
    let c = try RawClient(port: port)
    var small: Int32 = 4096
    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
    return c
}

@Suite(.serialized) struct ServerMemoryBoundTests {
    /// Each answer is 1 KiB; 2,000 are requested at once and none is read. The connection must
    /// stop reading requests once 64 KiB of output are queued (it used to go on to 1 MiB).
    @Test func queuedOutputPerConnectionStopsReadingAt64KiB() throws {
        var config = HTTPServerConfiguration()
        config.limits.socketSendBufferBytes = 4096
        config.limits.maxQueuedOutputBytesTotal = 0
        let answered = Atomic<Int>(0)
        let body = [UInt8](repeating: 0x61, count: 1000)
        try withServer(config, handler: { _, res in
            answered.add(1, ordering: .relaxed)
            res.respond(HTTPReply(status: 200, body: body))
        }) { server in
            let c = try smallBufferClient(port: server.localPort)
            try c.send(String(repeating: "GET / HTTP/1.1\r\nHost: t\r\n\r\n", count: 2000))
            let n = settled { answered.load(ordering: .relaxed) }
            let queued = server.metrics.queuedOutputBytes
            // 64 KiB queued plus what the two kernels hold (~8 KiB each way) and one read's
            // answers past the mark: about 90 answers; at 1 MiB it was over 1,000.
            #expect(n > 40 && n < 200, "\(n) answers produced")
            #expect(queued > 0 && queued <= 64 * 1024 + 64 * 1100, "\(queued) bytes queued")
        }
    }

    /// Four connections that never read, with a server-wide budget of 100 KiB: once the total
    /// passes it, connections with anything queued stop reading, so the total stays near the
    /// budget instead of 4 x 64 KiB; a client that reads is still served.
    @Test func queuedOutputOverAllConnectionsStaysNearTheBudget() throws {
        var config = HTTPServerConfiguration()
        config.limits.socketSendBufferBytes = 4096
        config.limits.maxQueuedOutputBytesTotal = 100 * 1024
        let body = [UInt8](repeating: 0x61, count: 1000)
        try withServer(config, handler: { _, res in res.respond(HTTPReply(status: 200, body: body)) }) { server in
            var clients: [RawClient] = []
            for _ in 0..<4 {
                let c = try smallBufferClient(port: server.localPort)
                try c.send(String(repeating: "GET / HTTP/1.1\r\nHost: t\r\n\r\n", count: 2000))
                clients.append(c)
            }
            let queued = settled { server.metrics.queuedOutputBytes }
            #expect(queued > 100 * 1024 && queued < 180 * 1024, "\(queued) bytes queued")
            let reader = try RawClient(port: server.localPort)
            try reader.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(reader.readResponse()?.status == 200)
            _ = clients
        }
    }

    /// A peer that asks for 1 KiB and reads 200 bytes every 20 ms takes output all the time
    /// (a small MSS makes its window open in small steps), so each write completion used to
    /// restart the write timeout and the connection lived on with a growing backlog. Now every
    /// write must drain within writeTimeout of being queued: 64 KiB queued at ~10 KB/s do not
    /// (closed after about 5.5 s here; with the old renewal still open after 10.5 s).
    @Test func tricklingReaderCannotRenewTheWriteTimeout() throws {
        var config = HTTPServerConfiguration()
        config.limits.socketSendBufferBytes = 4096
        config.limits.writeTimeout = .milliseconds(4000)
        let body = [UInt8](repeating: 0x61, count: 1000)
        try withServer(config, handler: { _, res in res.respond(HTTPReply(status: 200, body: body)) }) { server in
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var mss: Int32 = 1000
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_MAXSEG, &mss, socklen_t(MemoryLayout<Int32>.size))
            var rcv: Int32 = 16384
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, socklen_t(MemoryLayout<Int32>.size))
            var tv = timeval(tv_sec: 0, tv_usec: 20_000)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_port = UInt16(server.localPort).bigEndian
            inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr)
            let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            try #require(rc == 0)
            let request = Array("GET / HTTP/1.1\r\nHost: t\r\n\r\n".utf8)
            var closed = false
            var received = 0
            var chunk = [UInt8](repeating: 0, count: 200)
            for _ in 0..<500 where !closed {   // at most ~20 s; about 7 s when the timeout holds
                if request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) <= 0 { closed = true; break }
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n > 0 { received += n }
                if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { closed = true }
                Thread.sleep(forTimeInterval: 0.02)
            }
            #expect(received > 20_000, "the client did not read all along")
            #expect(closed, "the trickling reader kept its connection")
            #expect(server.metrics.timeouts == 1)
        }
    }
}

@Suite struct ServerHTTP2HandlerBoundTests {
    /// The client sends a request and resets its stream at once, again and again, while the
    /// handler holds every request. A reset stream closes and used to stop counting, so the
    /// handler got as many requests as the client cared to send; now requests at the handler
    /// count until answered and the 101st is refused (REFUSED_STREAM).
    @Test func resetStreamsKeepCountingUntilTheirHandlerAnswers() throws {
        let held = Mutex<[HTTPReplyWriter]>([])
        try withServer(handler: { req, res in
            if req.path == "/hold" { held.withLock { $0.append(res) } } else { echoHandler(req, res) }
        }) { server in
            let c = try RawH2Client(port: server.localPort)
            var frames: [UInt8] = []
            for i in 0..<101 {
                let stream = UInt32(1 + 2 * i)
                var block: [UInt8] = [0x82, 0x86, 0x04, 5] + Array("/hold".utf8) + [0x01, 0x01, UInt8(ascii: "t")]
                frames += RawH2Client.frame(type: 1, flags: 0x5, stream: stream, block)
                frames += RawH2Client.frame(type: 3, flags: 0, stream: stream, [0, 0, 0, 8])   // RST_STREAM CANCEL
                block = []
            }
            try c.socket.send(frames)
            let refused = c.read { $0.type == 3 }
            #expect(refused?.stream == 201)
            #expect(refused?.payload == [0, 0, 0, 7])   // REFUSED_STREAM
            #expect(held.withLock { $0.count } == 100)
            #expect(server.metrics.parseErrorsByKind["h2_unanswered_limit"] == 1)
            // Once the handler answers, new requests are taken again.
            for r in held.withLock({ $0 }) { r.respond(HTTPReply(status: 200)) }
            try c.get("/after", stream: 203)
            let after = c.read { $0.type == 0 && $0.stream == 203 }
            #expect(after.map { String(decoding: $0.payload, as: UTF8.self) } == "GET /after 0")
        }
    }

    /// nghttp2's incoming RST_STREAM limit is set explicitly (burst 200, 33/s): 250 streams
    /// opened and reset at once end the connection with GOAWAY (the library default, 1000,
    /// let them all through).
    @Test func streamResetFloodEndsTheConnection() throws {
        try withServer { server in
            let c = try RawH2Client(port: server.localPort)
            var frames: [UInt8] = []
            for i in 0..<250 {
                let stream = UInt32(1 + 2 * i)
                // HEADERS without END_STREAM (the request never reaches the handler), then RST.
                frames += RawH2Client.frame(type: 1, flags: 0x4, stream: stream,
                                            [0x83, 0x86, 0x04, 5] + Array("/echo".utf8) + [0x01, 0x01, UInt8(ascii: "t")])
                frames += RawH2Client.frame(type: 3, flags: 0, stream: stream, [0, 0, 0, 8])
            }
            try c.socket.send(frames)
            let goAway = c.read { $0.type == 7 }
            #expect(goAway != nil, "no GOAWAY after 250 resets")
        }
    }

    /// A trailer section (a second HEADERS frame, ending the stream) is never merged into the
    /// request's headers: an `authorization` that arrives only in a trailer must not reach the
    /// handler as if it were a header (RFC 9110 6.5.1; HTTP/1.1 drops trailers too).
    @Test func trailerFieldsAreNotMergedIntoTheHeaders() throws {
        try withServer(handler: { req, res in
            let seen = req.headers["authorization"] ?? "none"
            res.respond(HTTPReply(status: 200, body: Array("\(seen) \(req.body.count)".utf8)))
        }) { server in
            let c = try RawH2Client(port: server.localPort)
            let head: [UInt8] = [0x83, 0x86, 0x04, 5] + Array("/echo".utf8) + [0x01, 0x01, UInt8(ascii: "t")]
            // Literal field without indexing, new name: authorization: Bearer trailer.
            let name = Array("authorization".utf8), value = Array("Bearer trailer".utf8)
            let trailer: [UInt8] = [0x00, UInt8(name.count)] + name + [UInt8(value.count)] + value
            try c.socket.send(RawH2Client.frame(type: 1, flags: 0x4, stream: 1, head)
                              + RawH2Client.frame(type: 0, flags: 0, stream: 1, Array("abc".utf8))
                              + RawH2Client.frame(type: 1, flags: 0x5, stream: 1, trailer))
            let data = c.read { $0.type == 0 && $0.stream == 1 }
            #expect(data.map { String(decoding: $0.payload, as: UTF8.self) } == "none 3")
        }
    }
}

@Suite struct ServerAbsoluteFormTests {
    /// RFC 9112 3.2.2: a server must accept an absolute-form target; the request's path is its
    /// path, and its authority replaces Host. It used to reach the handler as the path
    /// "http://...", which the relay answered 404.
    @Test func absoluteFormTargetHasItsPathAndAuthority() throws {
        try withServer(handler: { req, res in
            res.respond(HTTPReply(status: 200, body: Array("\(req.path) \(req.target) \(req.headers["host"] ?? "-")".utf8)))
        }) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST http://relay.example:8080/v1/responses?x=1 HTTP/1.1\r\nHost: other\r\nContent-Length: 0\r\n\r\n")
            #expect(c.readResponse()?.text == "/v1/responses http://relay.example:8080/v1/responses?x=1 relay.example:8080")
            try c.send("GET HTTPS://relay.example HTTP/1.1\r\nHost: relay.example\r\n\r\n")
            #expect(c.readResponse()?.text == "/ HTTPS://relay.example relay.example")
            try c.send("GET /plain?q HTTP/1.1\r\nHost: h\r\n\r\n")
            #expect(c.readResponse()?.text == "/plain /plain?q h")
        }
    }
}
