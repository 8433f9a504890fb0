// HTTP/1.1 over raw loopback sockets: keep-alive, pipelining order, chunked bodies,
// 100-continue, malformed requests, limits, timeouts, writer actions and metrics.
import Foundation
import HTTPServer
import POSIXThreads
import Synchronization
import Testing

@Suite(.serialized) struct ServerHTTP1Tests {
    /// 128 requests at a handler that holds them stop the reading; once they are answered the
    /// connection reads again and answers what the client sent meanwhile.
    @Test func readingResumesOnceAFullPipelineIsAnswered() throws {
        let held = Mutex<[HTTPReplyWriter]>([])
        try withServer(handler: { req, res in
            if req.path == "/hold" { held.withLock { $0.append(res) } } else { echoHandler(req, res) }
        }) { server in
            let c = try RawClient(port: server.localPort)
            try c.send(String(repeating: "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n", count: 128))
            let writers = heldWriters(held, count: 128)
            try #require(writers.count == 128)
            try c.send("GET /after HTTP/1.1\r\nHost: t\r\n\r\n")   // sent while the server does not read
            for r in writers { r.respond(HTTPReply(status: 204)) }
            for i in 0..<128 { #expect(c.readResponse()?.status == 204, "held \(i)") }
            let after = c.readResponse()
            #expect(after?.status == 200 && after?.text == "GET /after 0", "\(after?.status ?? 0)")
        }
    }

    /// A reply handed over from another thread as a source is built on the connection's loop
    /// (the thread that ran the handler), not on the thread that answered.
    @Test func aReplySourceIsBuiltOnTheLoop() throws {
        final class Source: HTTPReplySource {
            let built = Mutex<[UInt]>([])
            func makeReply() -> HTTPReply {
                built.withLock { $0.append(UInt(pthread_self())) }
                return HTTPReply(status: 202, body: Array("built".utf8))
            }
        }
        let threads = Mutex<(loop: UInt, answerer: UInt)>((0, 0))
        let source = Source()
        try withServer(handler: { _, res in
            threads.withLock { $0.loop = UInt(pthread_self()) }
            Thread.detachNewThread {
                threads.withLock { $0.answerer = UInt(pthread_self()) }
                res.respond(building: source)
            }
        }) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
            let r = try #require(c.readResponse())
            #expect(r.status == 202 && r.text == "built")
        }
        let t = threads.withLock { $0 }
        #expect(t.loop != 0 && t.answerer != 0 && t.loop != t.answerer)
        #expect(source.built.withLock { $0 } == [t.loop])
    }

    /// A reply source handed over after the server stopped is still built once (where it was
    /// handed over), so what building it records is not lost; nothing is sent.
    @Test func aReplySourceHandedOverAfterStopIsStillBuilt() throws {
        final class Source: HTTPReplySource {
            let built = Mutex<[UInt]>([])
            func makeReply() -> HTTPReply {
                built.withLock { $0.append(UInt(pthread_self())) }
                return HTTPReply(status: 202)
            }
        }
        let parked = Mutex<HTTPReplyWriter?>(nil)
        let server = try HTTPServer(configuration: HTTPServerConfiguration(), handler: { _, res in parked.withLock { $0 = res } })
        try server.start()
        let c = try RawClient(port: server.localPort)
        try c.send("GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        for _ in 0..<1000 where parked.withLock({ $0 == nil }) { usleep(10_000) }
        let writer = try #require(parked.withLock { $0 }, "the handler ran")
        server.stop(grace: .milliseconds(100))
        let source = Source()
        writer.respond(building: source)
        #expect(source.built.withLock { $0 } == [UInt(pthread_self())])
        #expect(c.readResponse() == nil)
    }

    @Test func keepAliveServesSeveralRequestsOnOneConnection() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET /a?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            let r1 = try #require(c.readResponse())
            try c.send("POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
            let r2 = try #require(c.readResponse())
            #expect(r1.status == 200)
            #expect(r1.text == "GET /a?x=1 0")
            #expect(r2.text == "POST /b 5")
            #expect(r1.header("x-connection-id") == r2.header("x-connection-id"))
            #expect(r1.header("content-length") == "12")
            #expect(r1.header("date")?.hasSuffix(" GMT") == true)
            #expect(r1.header("connection") == nil)
        }
    }

    @Test func pipelinedResponsesKeepRequestOrderWhenHandlersAnswerOutOfOrder() throws {
        // /slow/N answers after N*30 ms from another thread: the first request answers last.
        let handler: HTTPHandler = { req, res in
            let n = Int(req.path.split(separator: "/").last ?? "0") ?? 0
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(n * 30)) {
                res.respond(HTTPReply(status: 200, body: Array(req.path.utf8)))
            }
        }
        try withServer(handler: handler) { server in
            let c = try RawClient(port: server.localPort)
            let paths = ["/slow/5", "/slow/1", "/slow/3", "/slow/0", "/slow/2"]
            try c.send(paths.map { "GET \($0) HTTP/1.1\r\nHost: t\r\n\r\n" }.joined())
            var got: [String] = []
            for _ in paths { got.append(try #require(c.readResponse()).text) }
            #expect(got == paths)
        }
    }

    @Test func chunkedUploadIsReassembled() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            try c.send("6\r\n world\r\n0\r\n\r\n")
            let r = try #require(c.readResponse())
            #expect(r.status == 200)
            #expect(r.text == "hello world")
        }
    }

    @Test func expectContinueGetsInterimResponseBeforeBody() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
            let interim = try #require(c.readResponse(headOnly: true))
            #expect(interim.status == 100)
            try c.send("data")
            let r = try #require(c.readResponse())
            #expect(r.status == 200)
            #expect(r.text == "data")
        }
    }

    @Test func connectionCloseIsHonoured() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            let r = try #require(c.readResponse())
            #expect(r.header("connection") == "close")
            #expect(c.waitForClose())
        }
    }

    /// Lingering close: bytes the client pipelined after a `Connection: close` request must not
    /// make the server's kernel answer with a RST, which would drop the response still queued
    /// in its send buffer. The response is large, so the server stops reading (too much output
    /// queued) before the extra bytes arrive and they are still unread when the last write
    /// completes; without lingering the close then resets the connection mid-response.
    @Test func connectionCloseWithMoreBytesInFlightStillDeliversTheWholeResponse() throws {
        let size = 16 << 20
        let handler: HTTPHandler = { _, res in
            res.respond(HTTPReply(status: 200, body: [UInt8](repeating: 0x61, count: size)))
        }
        try withServer(handler: handler) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET /big HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            // The server answered (and paused reading, its output being queued): now pipeline more.
            var first = [UInt8](repeating: 0, count: 1)
            let n = first.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, 1, Int32(MSG_PEEK)) }
            #expect(n == 1)
            try c.send("GET /next HTTP/1.1\r\nHost: t\r\n\r\n" + String(repeating: "x", count: 8192))
            let r = try #require(c.readResponse())
            #expect(r.status == 200)
            #expect(r.header("connection") == "close")
            #expect(r.body.count == size)
            #expect(c.readUntilEnd() == 0)   // FIN, not ECONNRESET
            #expect(c.pendingBytes.isEmpty)  // the pipelined request was discarded, not answered
        }
    }

    @Test func http10WithoutKeepAliveCloses() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET / HTTP/1.0\r\n\r\n")
            let r = try #require(c.readResponse())
            #expect(r.status == 200)
            #expect(c.waitForClose())
        }
    }

    @Test func headResponseCarriesLengthButNoBody() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("HEAD /x HTTP/1.1\r\nHost: t\r\n\r\nGET /y HTTP/1.1\r\nHost: t\r\n\r\n")
            let head = try #require(c.readResponse(headOnly: true))
            #expect(head.header("content-length") == "9")
            let next = try #require(c.readResponse())
            #expect(next.text == "GET /y 0")
        }
    }

    /// The strict parser's own malformed table (HTTP1MalformedCases), replayed over sockets:
    /// each case on a fresh connection gets its status, `{"error":"<kind>"}` and a close.
    /// h2c sniffing is off so the "h2 preface on the HTTP/1 parser" case reaches the parser.
    @Test func malformedRequestsGetStatusAndClose() throws {
        var config = HTTPServerConfiguration()
        config.cleartextHTTP2 = false
        let cases = HTTP1MalformedCases.all
        #expect(cases.count > 20)
        try withServer(config) { server in
            for m in cases {
                let c = try RawClient(port: server.localPort)
                try c.send(m.bytes)
                let r = c.readResponse()
                #expect(r?.status == m.status, "\(m.name)")
                #expect(r?.header("connection") == "close", "\(m.name)")
                #expect(r?.text == #"{"error":"\#(m.kind)"}"#, "\(m.name)")
                #expect(c.waitForClose(), "\(m.name): connection stayed open")
            }
            let byKind = server.metrics.parseErrorsByKind
            #expect(byKind.values.reduce(0, +) == cases.count)
            for kind in Set(cases.map(\.kind)) {
                #expect(byKind[kind] == cases.filter { $0.kind == kind }.count, "\(kind)")
            }
        }
    }

    @Test func h2PrefaceIsSniffedWhenCleartextHTTP2IsOn() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send(Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0])
            let first = c.readSome()
            #expect(first.map { $0.count >= 9 && $0[3] == 4 } == true, "expected a SETTINGS frame")
        }
    }

    @Test func transferEncodingOtherThanChunkedIsRefused() throws {
        try withServer { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n")
            let r = try #require(c.readResponse())
            #expect(r.status >= 400 && r.status < 600)
            #expect(c.waitForClose())
        }
    }

    @Test func bodyOverLimitGets413AndClose() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxBodyBytes = 100
        try withServer(config) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n")
            #expect(c.readResponse()?.status == 413)
            #expect(c.waitForClose())
            let chunked = try RawClient(port: server.localPort)
            try chunked.send("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n\(String(repeating: "a", count: 100))\r\n1\r\nb\r\n0\r\n\r\n")
            #expect(chunked.readResponse()?.status == 413)
            #expect(chunked.waitForClose())
        }
    }

    @Test func headerSectionOverLimitGets431AndClose() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxHeaderBytes = 1024
        try withServer(config) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET / HTTP/1.1\r\nHost: t\r\nX-Big: \(String(repeating: "a", count: 2000))\r\n\r\n")
            #expect(c.readResponse()?.status == 431)
            #expect(c.waitForClose())
        }
    }

    @Test func connectionsBeyondMaxAreRefused() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxConnections = 2
        try withServer(config) { server in
            let a = try RawClient(port: server.localPort)
            let b = try RawClient(port: server.localPort)
            try a.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            try b.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(a.readResponse()?.status == 200)
            #expect(b.readResponse()?.status == 200)
            let c = try RawClient(port: server.localPort)
            #expect(c.waitForClose(), "third connection was not refused")
            #expect(server.metrics.connectionsRefused == 1)
            // Still serving the first two.
            try a.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(a.readResponse()?.status == 200)
        }
    }

    @Test func addressSharesAreIPv4AddressesAndIPv6Slash64s() {
        func v6(_ text: String) -> PeerKey {
            var a = in6_addr()
            inet_pton(AF_INET6, text, &a)
            return withUnsafeBytes(of: a) { PeerKey(ipv6: $0) }
        }
        #expect(v6("::ffff:192.0.2.7") == PeerKey(ipv4: 0xC000_0207))   // IPv4 on a dual-stack listener
        #expect(v6("2001:db8:1:2::1") == v6("2001:db8:1:2:ffff:ffff:ffff:ffff"))   // one /64
        #expect(v6("2001:db8:1:2::1") != v6("2001:db8:1:3::1"))
        #expect(PeerKey(ipv4: 0) != v6("::1"))   // 0.0.0.0 is not the ::/64 prefix
        #expect(PeerKey(ipv4: 0x7F00_0001) != PeerKey(ipv4: 0x7F00_0002))
        // From remoteAddress text, and as text.
        #expect(PeerKey(address: "192.0.2.7:51234") == PeerKey(ipv4: 0xC000_0207))
        #expect(PeerKey(address: "[::ffff:192.0.2.7]:1")?.text == "192.0.2.7")
        #expect(PeerKey(address: "[2001:db8::1]:443")?.text == "20010db800000000/64")
        #expect(PeerKey(address: "2001:db8::1") == v6("2001:db8::1"))   // bare IPv6: no port to cut
        #expect(PeerKey(address: "unknown") == nil && PeerKey(address: "[nope]:1") == nil)
    }

    @Test func requestsCarryTheirConnectionsClientKey() throws {
        let handler: HTTPHandler = { req, res in res.respond(HTTPReply(status: 200, body: Array(req.clientKey.utf8))) }
        try withServer(handler: handler) { server in
            let c = try RawClient(port: server.localPort, from: "127.0.0.2")
            try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(c.readResponse()?.text == "127.0.0.2")
        }
    }

    @Test func connectionsBeyondTheAddressShareAreRefusedOthersServed() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxConnectionsPerAddress = 2
        try withServer(config) { server in
            let a = try RawClient(port: server.localPort, from: "127.0.0.1")
            let b = try RawClient(port: server.localPort, from: "127.0.0.1")
            for c in [a, b] {
                try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                #expect(c.readResponse()?.status == 200)
            }
            // A third from the same address is closed at accept; another address is served.
            let third = try RawClient(port: server.localPort, from: "127.0.0.1")
            #expect(third.waitForClose(), "third connection from one address was not refused")
            let other = try RawClient(port: server.localPort, from: "127.0.0.2")
            try other.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(other.readResponse()?.status == 200)
            #expect(server.metrics.connectionsRefused == 1 && server.metrics.connectionsRefusedPerAddress == 1)
            // A closed connection gives its share back.
            try a.send("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            #expect(a.readResponse()?.status == 200)
            #expect(a.waitForClose())
            shutdown(a.fd, Int32(SHUT_WR))   // our FIN ends the server's lingering close
            var served = false
            for _ in 0..<100 where !served {   // the server notices the close on its loop
                let again = try RawClient(port: server.localPort, from: "127.0.0.1")
                try? again.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                served = again.readResponse()?.status == 200
                if !served { usleep(10_000) }
            }
            #expect(served, "the freed share was not given back")
        }
    }

    @Test func maxRequestsPerConnectionClosesAfterTheLast() throws {
        var config = HTTPServerConfiguration()
        config.limits.maxRequestsPerConnection = 2
        try withServer(config) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET /1 HTTP/1.1\r\nHost: t\r\n\r\nGET /2 HTTP/1.1\r\nHost: t\r\n\r\nGET /3 HTTP/1.1\r\nHost: t\r\n\r\n")
            let r1 = try #require(c.readResponse())
            let r2 = try #require(c.readResponse())
            #expect(r1.header("connection") == nil)
            #expect(r2.header("connection") == "close")
            #expect(c.readResponse() == nil)
        }
    }

    @Test func slowHeaderIsCutAtTheHeaderDeadline() throws {
        var config = HTTPServerConfiguration()
        config.limits.headerTimeout = .milliseconds(300)
        try withServer(config) { server in
            let c = try RawClient(port: server.localPort)
            // A slowloris client: keeps sending header bytes, never finishes the head.
            try c.send("GET / HTTP/1.1\r\nHost: t\r\n")
            c.setReceiveTimeout(milliseconds: 100)
            var closed = false
            for i in 0..<30 {   // up to 3 s; each byte resets no deadline
                try? c.send("X-\(i): y\r\n")
                if c.waitForClose() { closed = true; break }
            }
            #expect(closed)
            #expect(String(decoding: c.pendingBytes, as: UTF8.self).hasPrefix("HTTP/1.1 408"))
            #expect(server.metrics.timeouts >= 1)
        }
    }

    @Test func idleKeepAliveConnectionIsClosed() throws {
        var config = HTTPServerConfiguration()
        config.limits.idleTimeout = .milliseconds(200)
        try withServer(config) { server in
            let c = try RawClient(port: server.localPort, timeoutSeconds: 3)
            try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(c.readResponse()?.status == 200)
            #expect(c.waitForClose())
        }
    }

    @Test func responderActionsCloseAndAbort() throws {
        let handler: HTTPHandler = { req, res in
            switch req.path {
            case "/close": res.respond(HTTPReply(status: 200, body: Array("bye".utf8)), then: .close)
            case "/goaway": res.respond(HTTPReply(status: 200), then: .goAway)
            case "/abort": res.abortConnection()
            default:
                res.respond(HTTPReply(status: 200))
                res.respond(HTTPReply(status: 500))   // ignored: first answer wins
            }
        }
        try withServer(handler: handler) { server in
            let a = try RawClient(port: server.localPort)
            try a.send("GET /close HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(a.readResponse()?.text == "bye")
            #expect(a.waitForClose())

            let g = try RawClient(port: server.localPort)
            try g.send("GET /goaway HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(g.readResponse()?.header("connection") == "close")
            #expect(g.waitForClose())

            let b = try RawClient(port: server.localPort)
            try b.send("GET /abort HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(b.waitForClose())
            #expect(b.pendingBytes.isEmpty)

            let d = try RawClient(port: server.localPort)
            try d.send("GET /twice HTTP/1.1\r\nHost: t\r\n\r\nGET /twice HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(d.readResponse()?.status == 200)
            #expect(d.readResponse()?.status == 200)
        }
    }

    @Test func unsafeResponseHeadersBecome500() throws {
        let handler: HTTPHandler = { _, res in
            var h = HTTPHeaders()
            h.add("x-evil", "a\r\nset-cookie: x")
            res.respond(HTTPReply(status: 200, headers: h))
        }
        try withServer(handler: handler) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            let r = try #require(c.readResponse())
            #expect(r.status == 500)
            #expect(r.header("set-cookie") == nil)
        }
    }

    @Test func metricsCountConnectionsAndStatusClasses() throws {
        let handler: HTTPHandler = { req, res in
            res.respond(HTTPReply(status: req.path == "/missing" ? 404 : 204))
        }
        try withServer(handler: handler) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\nGET /missing HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(c.readResponse()?.status == 204)
            #expect(c.readResponse()?.status == 404)
            let m = server.metrics
            #expect(m.requestsByStatusClass[2] == 1)
            #expect(m.requestsByStatusClass[4] == 1)
            #expect(m.connectionsOpen == 1)
            #expect(m.connectionsTotal == 1)
        }
    }

    @Test func shutdownWaitsForInFlightAndClosesIdle() throws {
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        let handler: HTTPHandler = { req, res in
            entered.signal()
            if req.path == "/stall" { return }   // never answers
            DispatchQueue.global().async {
                gate.wait()
                res.respond(HTTPReply(status: 200, body: Array("late".utf8)))
            }
        }
        let server = try HTTPServer(configuration: HTTPServerConfiguration(), handler: handler)
        try server.start()
        let port = server.localPort
        let idle = try RawClient(port: port)
        let busy = try RawClient(port: port)
        let stalled = try RawClient(port: port)
        try busy.send("GET /work HTTP/1.1\r\nHost: t\r\n\r\n")
        try stalled.send("GET /stall HTTP/1.1\r\nHost: t\r\n\r\n")
        // Both requests reached their handlers before shutdown starts.
        #expect(entered.wait(timeout: .now() + 5) == .success)
        #expect(entered.wait(timeout: .now() + 5) == .success)
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            server.stop(grace: .seconds(1))
            done.signal()
        }
        #expect(idle.waitForClose(), "idle connection not closed on shutdown")
        gate.signal()
        let r = busy.readResponse()
        #expect(r?.text == "late")
        #expect(r?.header("connection") == "close")
        #expect(done.wait(timeout: .now() + 5) == .success, "shutdown did not finish")
        #expect(stalled.waitForClose())
        #expect((try? RawClient(port: port)) == nil, "still accepting after shutdown")
    }
}

@Suite struct ServerLifecycleTests {
    @Test func respondingAfterShutdownIsHarmless() throws {
        let parked = Mutex<[HTTPReplyWriter]>([])
        let server = try HTTPServer(configuration: HTTPServerConfiguration()) { _, res in
            parked.withLock { $0.append(res) }
        }
        try server.start()
        let c = try RawClient(port: server.localPort)
        try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        while parked.withLock({ $0.isEmpty }) { Thread.sleep(forTimeInterval: 0.01) }
        server.stop(grace: .milliseconds(100))
        #expect(c.waitForClose())
        let writers = parked.withLock { $0 }
        // From another thread, after the loop is gone: dropped, no crash.
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            writers.forEach { $0.respond(HTTPReply(status: 200)); $0.setMaxConcurrentStreams(1); $0.abortConnection() }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 5) == .success)
        #expect(writers.allSatisfy { $0.hasResponded })
    }

    @Test func severalLoopThreadsShareOnePort() throws {
        var config = HTTPServerConfiguration()
        config.loopThreads = 3
        try withServer(config) { server in
            var ids = Set<String>()
            for _ in 0..<12 {
                let c = try RawClient(port: server.localPort)
                try c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                let r = try #require(c.readResponse())
                #expect(r.status == 200)
                ids.insert(r.header("x-connection-id") ?? "")
            }
            #expect(ids.count == 12)   // connection IDs stay unique across loops
            #expect(server.metrics.connectionsTotal == 12)
        }
    }

    @Test func startTwiceAndBadAddressAreErrors() throws {
        var config = HTTPServerConfiguration()
        config.host = "not-an-ip"
        let bad = try HTTPServer(configuration: config, handler: echoHandler)
        #expect(throws: HTTPServerError.self) { try bad.start() }
        try withServer { server throws -> Void in
            #expect(throws: HTTPServerError.self) { try server.start() }
        }
    }

    @Test func portInUseIsAClearError() throws {
        try withServer { server throws -> Void in
            var config = HTTPServerConfiguration()
            config.port = server.localPort
            let second = try HTTPServer(configuration: config, handler: echoHandler)
            #expect {
                try second.start()
            } throws: { error in
                "\(error)".contains("\(server.localPort)")
            }
        }
    }
}

@Suite struct ServerBackpressureTests {
    @Test func peerThatNeverReadsIsCutByTheWriteTimeout() throws {
        var config = HTTPServerConfiguration()
        config.limits.writeTimeout = .milliseconds(300)
        let big = [UInt8](repeating: 0x61, count: 1 << 20)
        try withServer(config, handler: { _, res in res.respond(HTTPReply(status: 200, body: big)) }) { server in
            let c = try RawClient(port: server.localPort)
            // 40 MiB of responses requested; the client reads none of them.
            try c.send(String(repeating: "GET / HTTP/1.1\r\nHost: t\r\n\r\n", count: 40))
            // The timeout is counted when it fires, the connection once its handles have closed
            // (a loop iteration later): wait for both before looking.
            var waited = 0
            while (server.metrics.timeouts == 0 || server.metrics.connectionsOpen != 0) && waited < 600 {
                Thread.sleep(forTimeInterval: 0.05)
                waited += 1
            }
            #expect(server.metrics.timeouts == 1)
            #expect(server.metrics.connectionsOpen == 0)
            // Output was throttled: far fewer than 40 responses were produced.
            #expect(server.metrics.requestsByStatusClass[2] < 40)
        }
    }
}
