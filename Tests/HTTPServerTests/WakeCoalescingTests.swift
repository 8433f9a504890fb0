// WakeCoalescing (POSIXThreads): wake-ups requested in a scope run once per target at its end;
// and the HTTP loop's task queue, fed from such a scope, answers every request after it.
import Foundation
import HTTPServer
import POSIXThreads
import Synchronization
import Testing

@Suite struct WakeCoalescingTests {
    final class Target: Sendable {}

    @Test func wakesInAScopeRunOncePerTargetAtItsEnd() {
        let log = Mutex<[String]>([])
        let a = Target(), b = Target()
        WakeCoalescing.wake(a) { log.withLock { $0.append("outside") } }
        #expect(log.withLock { $0 } == ["outside"], "outside a scope a wake runs at once")
        WakeCoalescing.coalescing {
            WakeCoalescing.wake(a) { log.withLock { $0.append("a1") } }
            WakeCoalescing.wake(b) { log.withLock { $0.append("b") } }
            WakeCoalescing.coalescing {   // nested: belongs to the outer scope
                WakeCoalescing.wake(a) { log.withLock { $0.append("a2") } }
            }
            #expect(log.withLock { $0 } == ["outside"], "nothing runs before the outermost scope ends")
        }
        #expect(log.withLock { $0 } == ["outside", "a1", "b"])
        WakeCoalescing.wake(a) { log.withLock { $0.append("after") } }
        #expect(log.withLock { $0.last } == "after", "the scope is over: at once again")
    }

    /// Replies handed over from a coalescing scope on another thread all reach the client once
    /// the scope ends (the loop was woken once, for all of them), and none before.
    @Test func repliesQueuedInAScopeAreWrittenAfterIt() throws {
        final class Source: HTTPReplySource {
            let n: Int
            init(_ n: Int) { self.n = n }
            func makeReply() -> HTTPReply { HTTPReply(status: 200, body: Array("r\(n)".utf8)) }
        }
        let held = Mutex<[HTTPReplyWriter]>([])
        try withServer(handler: { _, res in held.withLock { $0.append(res) } }) { server in
            let c = try RawClient(port: server.localPort)
            try c.send(String(repeating: "GET /h HTTP/1.1\r\nHost: t\r\n\r\n", count: 3))
            let writers = heldWriters(held, count: 3)
            try #require(writers.count == 3)
            let early = Mutex(false)
            let done = DispatchSemaphore(value: 0)
            let fd = c.fd
            let all = writers
            Thread.detachNewThread {
                WakeCoalescing.coalescing {
                    for (i, w) in all.enumerated() { w.respond(building: Source(i)) }
                    // The loop is idle and not woken: nothing may be written yet.
                    var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                    early.withLock { $0 = poll(&p, 1, 300) > 0 }
                }
                done.signal()
            }
            #expect(done.wait(timeout: .now() + 10) == .success)
            #expect(!early.withLock { $0 }, "a reply was written before the scope ended")
            for i in 0..<3 {
                let r = c.readResponse()
                #expect(r?.status == 200 && r?.text == "r\(i)", "reply \(i)")
            }
        }
    }
}
