import Basics
import Foundation
import Synchronization
import POSIXThreads
import Ratchet
@testable import RelayCore
import Testing

@Suite struct TimeFormatTests {
    @Test func iso8601UTCMatchesFoundationsFormatter() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        formatter.timeZone = TimeZone(identifier: "UTC")
        // Epoch, leap day, end of a year, far future, a millisecond before the epoch.
        for ms: Int64 in [0, 1, 999, 1_709_164_800_123, 1_798_761_599_999, 4_102_444_800_000, -1] {
            let expected = formatter.string(from: Date(timeIntervalSince1970: Double(ms) / 1000))
            #expect(iso8601UTC(millis: ms) == expected, "\(ms)")
        }
        #expect(iso8601UTC(millis: 1_709_164_800_123) == "2024-02-29T00:00:00.123Z")
        #expect(iso8601UTC(millis: -1) == "1969-12-31T23:59:59.999Z")
    }
}

@Suite struct POSIXThreadsTests {
    @Test func threadRunsItsBodyAndConditionWakesTheWaiter() {
        let condition = Condition()
        let state = Box()
        let thread = OSThread {
            condition.withLock { state.value = 42; condition.broadcast() }
        }
        thread.name = "test-thread"
        condition.lock()
        thread.start()
        let deadline = Date().addingTimeInterval(10)
        while state.value == 0 && Date() < deadline { condition.wait(until: deadline) }
        condition.unlock()
        #expect(state.value == 42)
    }

    @Test func timedWaitReturnsFalseAtItsDeadline() {
        let condition = Condition()
        let deadline = Date().addingTimeInterval(0.05)
        // Nobody signals, so only the deadline ends the loop (a spurious wake-up returns true
        // and waits again); the bound on rounds keeps a broken wait from spinning forever.
        var rounds = 0
        condition.lock()
        while rounds < 1000, condition.wait(until: deadline) { rounds += 1 }
        condition.unlock()
        #expect(rounds < 1000)
        #expect(Date() >= deadline.addingTimeInterval(-0.002))
        // A deadline in the past returns at once instead of waiting forever.
        condition.withLock { #expect(!condition.wait(until: Date(timeIntervalSince1970: 0))) }
    }

    /// `take` decides the batches; close() serves what is queued, refuses more, returns after
    /// the threads exit and releases `serve` (and what it captured).
    @Test func jobQueueServesBatchesDrainsOnCloseAndReleasesItsHandler() {
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        let batches = Mutex<[[Int]]>([])
        final class Owner: Sendable {}
        weak var weakOwner: Owner?
        let queue = JobQueue<Int>(name: "test-jobs") { q in min(q.count, 3) }
        do {
            let owner = Owner()
            weakOwner = owner
            queue.start { jobs in
                _ = owner
                if jobs == [0] { entered.signal(); gate.wait() }   // hold the thread while 1...7 queue up
                batches.withLock { $0.append(jobs) }
            }
        }
        #expect(queue.enqueue(0))
        entered.wait()
        for i in 1..<8 { #expect(queue.enqueue(i)) }
        gate.signal()
        queue.close()
        #expect(batches.withLock { $0 } == [[0], [1, 2, 3], [4, 5, 6], [7]])
        #expect(!queue.enqueue(8))
        queue.close()   // again: returns at once
        #expect(weakOwner == nil)
    }

    @Test func workerPoolRunsJobsOnItsThreadsAndInlineAfterClose() {
        let pool = WorkerPool(name: "test-pool", threads: 2)
        let ran = Mutex(0)
        let done = DispatchSemaphore(value: 0)
        for _ in 0..<10 { pool.submit { ran.withLock { $0 += 1 }; done.signal() } }
        for _ in 0..<10 { done.wait() }
        pool.close()
        pool.submit { ran.withLock { $0 += 100 } }   // inline, not dropped
        #expect(ran.withLock { $0 } == 110)
    }

    /// The one spawner: a joinable thread runs its body under its name (truncated to the
    /// kernel's 15 bytes) and pthread_join returns after it.
    @Test func startThreadRunsANamedJoinableThread() throws {
        let seen = Mutex<String?>(nil)
        let tid = try startThread(name: "test-spawner-long-name") {
            seen.withLock { $0 = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8) }
        }
        #expect(pthread_join(tid, nil) == 0)
        #expect(seen.withLock { $0 } == "test-spawner-lo\n")
    }

    /// Parts start in order and stop in reverse, each with the grace it was started with; a
    /// part whose start throws is not stopped; stopAll twice stops nothing the second time.
    @Test func lifecycleListStopsInReverseOrderWithEachGrace() {
        let log = Mutex<[String]>([])
        struct Part: Lifecycle {
            let name: String
            let fails: Bool
            let log: @Sendable (String) -> Void
            func start() throws {
                log("start \(name)")
                if fails { throw CancellationError() }
            }
            func stop(grace: Duration) { log("stop \(name) \(grace)") }
        }
        let record: @Sendable (String) -> Void = { line in log.withLock { $0.append(line) } }
        let list = LifecycleList()
        list.adopt(StopAction { grace in record("stop store \(grace)") })
        #expect(throws: Never.self) { try list.start(Part(name: "a", fails: false, log: record), grace: .seconds(2)) }
        #expect(throws: Never.self) { try list.start(Part(name: "b", fails: false, log: record)) }
        #expect(throws: CancellationError.self) { try list.start(Part(name: "c", fails: true, log: record), grace: .seconds(9)) }
        list.stopAll()
        list.stopAll()
        #expect(log.withLock { $0 } == ["start a", "start b", "start c", "stop b 0.0 seconds", "stop a 2.0 seconds", "stop store 0.0 seconds"])
    }

    /// Written and read only under the test's condition lock.
    final class Box: @unchecked Sendable { var value = 0 }
}

@Suite struct TimedValueTests {
    /// One read per period; the period's end, and a clock that went back, read again.
    @Test func readsAtMostOncePerPeriod() {
        let v = TimedValue<Int>(maxAge: 1000)
        var reads = 0
        func get(_ now: Int64) -> Int { v.value(now: now) { reads += 1; return reads } }
        #expect(get(5000) == 1)
        #expect(get(5999) == 1)
        #expect(get(6000) == 2)
        #expect(get(6500) == 2)
        #expect(get(4000) == 3)   // clock went back: not trusted
        #expect(reads == 3)
    }
}

@Suite struct SHA256Tests {
    // FIPS 180-2 appendix B vectors and the empty string.
    static let vectors: [(String, String)] = [
        ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    ]

    @Test(arguments: vectors) func knownDigests(input: String, hex: String) {
        #expect(RelayCrypto.sha256(Array(input.utf8)).hexString == hex)
        #expect(Array(input.utf8).withUnsafeBytes { RelayCrypto.sha256($0) }.hexString == hex)
    }

    @Test func aMillionAsAcrossNonContiguousAndContiguousInput() {
        // FIPS 180-2 B.3; a lazy collection (no contiguous storage) takes the copying path.
        let hex = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        #expect(RelayCrypto.sha256(repeatElement(UInt8(ascii: "a"), count: 1_000_000)).hexString == hex)
        #expect(RelayCrypto.sha256([UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000)).hexString == hex)
    }

    @Test func theIngestBearerHashIsTheStoredCredentialHash() {
        let secret = "rk_" + String(repeating: "x", count: 43)
        #expect(IngestService.bearerHash("Bearer \(secret)") == Credentials.hash(secret: secret))
        #expect(IngestService.bearerHash("Basic \(secret)") == nil)
    }
}

@Suite struct MetricsTests {
    @Test func ingestDurationIsACumulativeHistogramOfTimedRequestsOnly() {
        let m = RelayMetrics()
        m.ingest(status: 202, seconds: 0.0003)
        m.ingest(status: 202, seconds: 0.002)
        m.ingest(status: 400)   // not timed (e.g. another path)
        let text = m.render()
        #expect(text.contains("relay_ingest_requests_total{status=\"202\"} 2\n"))
        #expect(text.contains("relay_ingest_requests_total{status=\"400\"} 1\n"))
        #expect(text.contains("relay_ingest_duration_seconds_bucket{le=\"0.00025\"} 0\n"))
        #expect(text.contains("relay_ingest_duration_seconds_bucket{le=\"0.0005\"} 1\n"))
        #expect(text.contains("relay_ingest_duration_seconds_bucket{le=\"0.001\"} 1\n"))
        #expect(text.contains("relay_ingest_duration_seconds_bucket{le=\"0.0025\"} 2\n"))
        #expect(text.contains("relay_ingest_duration_seconds_bucket{le=\"+Inf\"} 2\n"))
        #expect(text.contains("relay_ingest_duration_seconds_count 2\n"))
        #expect(text.contains("# TYPE relay_ingest_duration_seconds histogram\n"))
        // The push histogram keeps its own (millisecond) buckets.
        #expect(text.contains("relay_push_duration_seconds_bucket{le=\"0.001\"} 0\n"))
        #expect(!text.contains("relay_push_duration_seconds_bucket{le=\"0.0001\"}"))
    }
}
