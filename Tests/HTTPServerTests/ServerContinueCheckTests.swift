// `Expect: 100-continue` decided by the application (HTTPServerConfiguration.continueCheck):
// the body is invited only when the check proceeds; a refusal is the request's final answer,
// sent before any body byte, and the handler never sees the request.
import Foundation
import HTTPServer
import Synchronization
import Testing

@Suite struct ServerContinueCheckTests {
    private func config(_ check: @escaping HTTPContinueCheck) -> HTTPServerConfiguration {
        var c = HTTPServerConfiguration()
        c.continueCheck = check
        return c
    }

    @Test func refusalIsTheFinalAnswerAndTheBodyIsNotRead() throws {
        let handled = Atomic<Int>(0)
        let checked = Mutex<[String]>([])
        let cfg = config { req, decision in
            checked.withLock { $0.append(req.headers["authorization"] ?? "-") }
            decision.refuse(HTTPReply.json(401, #"{"error":"unauthorized"}"#))
        }
        try withServer(cfg, handler: { req, res in handled.add(1, ordering: .relaxed); echoHandler(req, res) }) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
            let r = c.readResponse()
            #expect(r?.status == 401, "got \(r?.status ?? 0) first")
            #expect(r?.header("connection") == "close")
            #expect(c.waitForClose())
            #expect(handled.load(ordering: .relaxed) == 0)
            #expect(checked.withLock { $0 } == ["Bearer x"])
        }
    }

    @Test func proceedingLaterSendsContinueThenTheHandlerAnswers() throws {
        let pending = Mutex<HTTPContinueDecision?>(nil)
        let cfg = config { _, decision in pending.withLock { $0 = decision } }
        try withServer(cfg) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
            c.setReceiveTimeout(milliseconds: 300)
            #expect(c.readResponse(headOnly: true) == nil, "an answer came before the check decided")
            let decision = try #require(pending.withLock { $0 })
            decision.proceed()
            c.setReceiveTimeout(milliseconds: 5000)
            #expect(c.readResponse(headOnly: true)?.status == 100)
            try c.send("hello")
            let r = c.readResponse()
            #expect(r?.status == 200 && r?.text == "hello")
        }
    }

    /// A client that stops waiting sends the body anyway: the handler answers, and the check's
    /// late answer (either way) changes nothing.
    @Test func aBodyBeforeTheDecisionGoesToTheHandler() throws {
        let pending = Mutex<HTTPContinueDecision?>(nil)
        let cfg = config { _, decision in pending.withLock { $0 = decision } }
        try withServer(cfg) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello")
            let r = c.readResponse()
            #expect(r?.status == 200 && r?.text == "hello")
            pending.withLock { $0 }?.refuse(HTTPReply(status: 401))
            try c.send("GET /after HTTP/1.1\r\nHost: t\r\n\r\n")
            let after = c.readResponse()
            #expect(after?.status == 200 && after?.text == "GET /after 0", "\(after?.status ?? 0) \(after?.text ?? "")")
        }
    }

    /// Pipelined: GET /hold, which the handler holds, then a POST with `Expect: 100-continue`
    /// whose check `check` decides. Nothing may arrive before the held request is answered (204,
    /// sent here once the handler has it); `after` reads what follows that 204.
    private func behindAHeldRequest(_ check: @escaping HTTPContinueCheck, _ after: (RawClient) throws -> Void) throws {
        let held = Mutex<HTTPReplyWriter?>(nil)
        try withServer(config(check), handler: { req, res in
            if req.path == "/hold" { held.withLock { $0 = res } } else { echoHandler(req, res) }
        }) { server in
            let c = try RawClient(port: server.localPort)
            try c.send("GET /hold HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
            c.setReceiveTimeout(milliseconds: 300)
            #expect(c.readResponse(headOnly: true) == nil, "an answer came before the held request's")
            c.setReceiveTimeout(milliseconds: 5000)
            var writer: HTTPReplyWriter?
            for _ in 0..<100 where writer == nil { writer = held.withLock { $0 }; if writer == nil { usleep(10_000) } }
            try #require(writer != nil)
            writer?.respond(HTTPReply(status: 204))
            #expect(c.readResponse()?.status == 204)
            try after(c)
        }
    }

    /// Pipelined: the refusal waits for the answer to the request before it, in order.
    @Test func refusalKeepsPipelineOrder() throws {
        try behindAHeldRequest({ _, decision in decision.refuse(HTTPReply(status: 403)) }) { c in
            #expect(c.readResponse()?.status == 403)
            #expect(c.waitForClose())
        }
    }

    /// Pipelined: a check that proceeds while the request before it waits owes the 100, sent
    /// right after that request's answer.
    @Test func proceedingKeepsPipelineOrder() throws {
        try behindAHeldRequest({ _, decision in decision.proceed() }) { c in
            #expect(c.readResponse(headOnly: true)?.status == 100)
            try c.send("hey")
            let r = c.readResponse()
            #expect(r?.status == 200 && r?.text == "hey")
        }
    }
}
