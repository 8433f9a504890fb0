// The log never blocks its caller (LogQueue): a full queue drops and counts, order is kept, a
// stop drains what is queued within its deadline; and repeated lines are rate-limited
// (RepeatLimiter, RelayLogger.limited) on an injected clock.
import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// A sink that records what it is given and blocks while closed (a stderr nobody reads).
private final class GatedSink: Sendable {
    private let gate = Mutex(false)
    private let written = Mutex<[String]>([])

    init(open: Bool) { gate.withLock { $0 = open } }

    func open() { gate.withLock { $0 = true } }

    var lines: [String] { written.withLock { $0 } }

    func write(_ bytes: UnsafeRawBufferPointer) {
        while !gate.withLock({ $0 }) { usleep(1000) }
        let text = String(decoding: bytes, as: UTF8.self)
        written.withLock { $0 += text.split(separator: "\n").map(String.init) }
    }
}

private func queue(_ sink: GatedSink, lines: Int = 4, bytes: Int = 1000) -> LogQueue {
    LogQueue(bounds: LogQueue.Bounds(bytes: bytes, lines: lines), sink: { sink.write($0) }, dropNotice: { "d\($0)\n" })
}

@Suite struct LogQueueTests {
    @Test func aFullQueueDropsAndCountsThenSaysSoInOrder() {
        let sink = GatedSink(open: false)
        let q = queue(sink)
        defer { q.close() }
        // Four fit (the one the writer may already hold counts: its memory is still in use).
        for l in ["a", "b", "c", "d"] { #expect(q.offer(l + "\n")) }
        #expect(!q.offer("e\n"))
        #expect(!q.offer("f\n"))
        #expect(q.droppedLines == 2)
        sink.open()
        #expect(q.flush(timeout: .seconds(30)))
        #expect(q.offer("g\n"))
        #expect(q.flush(timeout: .seconds(30)))
        #expect(sink.lines == ["a", "b", "c", "d", "d2", "g"])
        #expect(q.droppedLines == 2)
    }

    @Test func theByteBoundCountsToo() {
        let sink = GatedSink(open: false)
        let q = queue(sink, lines: 100, bytes: 10)
        defer { q.close() }
        #expect(q.offer("12345678\n"))  // 9 bytes
        #expect(!q.offer("ab\n"))
        #expect(q.droppedLines == 1)
        sink.open()
        #expect(q.flush(timeout: .seconds(30)))
        #expect(!q.offer("a notice and this are 11+\n"))
        #expect(q.offer("z\n"))
        #expect(q.flush(timeout: .seconds(30)))
        #expect(sink.lines == ["12345678", "d2", "z"])
    }

    @Test func orderIsKeptAcrossThreads() async {
        let sink = GatedSink(open: true)
        let q = queue(sink, lines: 100_000, bytes: 1 << 24)
        defer { q.close() }
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<4 {
                group.addTask { for i in 0..<2000 { q.offer("\(t) \(i)\n") } }
            }
        }
        #expect(q.flush(timeout: .seconds(30)))
        let lines = sink.lines
        #expect(lines.count == 8000)
        for t in 0..<4 {
            let mine = lines.filter { $0.hasPrefix("\(t) ") }.map { Int($0.split(separator: " ")[1])! }
            #expect(mine == Array(0..<2000))
        }
    }

    /// A stop waits for the queue to be written, but only up to its deadline.
    @Test func flushGivesUpAtItsDeadlineOnABlockedSink() {
        let sink = GatedSink(open: false)
        let q = queue(sink)
        #expect(q.offer("last\n"))
        let start = Date()
        #expect(!q.flush(timeout: .milliseconds(200)))
        #expect(Date().timeIntervalSince(start) < 20)  // the bound is 0.2 s; 100x for a loaded CI
        sink.open()
        #expect(q.flush(timeout: .seconds(30)))
        #expect(sink.lines == ["last"])
        q.close()
    }

    /// The relay's logger on a pipe nobody reads: logging returns at once, the overflow is
    /// counted, and once the pipe is read again the log says how many lines are missing.
    @Test func aLoggerOnAnUnreadPipeNeverBlocks() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        let logger = RelayLogger(minimum: .debug, fd: fds[1])
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            // ~200 bytes each: 20x the 64 KiB pipe and 5x the queue's 16,384 lines.
            for i in 0..<80_000 { logger.debug("request", ["i": i, "pad": String(repeating: "x", count: 150)]) }
            done.signal()
        }
        // The old synchronous write blocked here forever once the pipe was full.
        #expect(done.wait(timeout: .now() + 60) == .success)
        let dropped = logger.droppedLines
        #expect(dropped > 0)
        // Read the pipe dry while the writer catches up, then one more line brings the notice.
        _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
        var text: [UInt8] = []
        func drain() {
            var buf = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = buf.withUnsafeMutableBytes { read(fds[0], $0.baseAddress, $0.count) }
                if n <= 0 { return }
                text += buf[0..<n]
            }
        }
        let deadline = Date().addingTimeInterval(60)
        while !logger.flush(timeout: .milliseconds(10)) && Date() < deadline { drain() }
        logger.info("after")
        while !logger.flush(timeout: .milliseconds(10)) && Date() < deadline { drain() }
        drain()
        let lines = String(decoding: text, as: UTF8.self).split(separator: "\n")
        // Every gap is announced with its count (usually one, at the end; more when the writer
        // fell behind before the pipe was full), and they add up to the dropped lines.
        let notices = lines.filter { $0.contains(#""msg":"log lines dropped: stderr did not keep up""#) }
        let announced = notices.map { n in Int(n[n.firstRange(of: #""dropped":"#)!.upperBound...].prefix { $0.isNumber })! }.reduce(0, +)
        #expect(!notices.isEmpty && announced == dropped, "\(notices)")
        #expect(lines.count - notices.count == 80_000 - dropped + 1, "every line accepted is written, and the last one")
        #expect(lines.last?.contains(#""msg":"after""#) == true)
        // Order kept: the request numbers that got through only go up.
        let numbers = lines.compactMap { l in l.firstRange(of: #""i":"#).map { Int(l[$0.upperBound...].prefix { $0.isNumber })! } }
        #expect(numbers.count == 80_000 - dropped && numbers == numbers.sorted())
    }

    /// A clean stop's last lines are on disk when flush returns.
    @Test func flushWritesEverythingToAFile() throws {
        let dir = TempDir()
        let path = dir.path + "/log"
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        defer { close(fd) }
        let logger = RelayLogger(minimum: .info, format: .text, fd: fd)
        for i in 0..<1000 { logger.info("line \(i)") }
        #expect(logger.flush(timeout: .seconds(30)))
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 1000)
        #expect(lines.enumerated().allSatisfy { $1.hasSuffix("INFO line \($0)") })
        #expect(logger.droppedLines == 0)
    }
}

@Suite struct RepeatLimiterTests {
    @Test func oneLinePerWindowThenTheCount() {
        var r = RepeatLimiter<String>(window: 10)
        guard case .log(nil) = r.admit("k", note: "first", now: 100) else { Issue.record("first must log"); return }
        for t in 100..<110 {
            guard case .suppress = r.admit("k", note: "x", now: Int64(t)) else { Issue.record("repeat at \(t) must be suppressed"); return }
        }
        #expect(r.nextExpiry == 110)
        #expect(r.expire(now: 109).isEmpty)
        let reports = r.expire(now: 110)
        #expect(reports.map(\.key) == ["k"] && reports.map(\.count) == [10] && reports.map(\.note) == ["first"])
        #expect(r.nextExpiry == nil)
        // Reported once: the next occurrence opens a fresh window with nothing owed.
        guard case .log(nil) = r.admit("k", note: "again", now: 200) else { Issue.record("must log"); return }
    }

    @Test func aWindowWithoutRepeatsReportsNothing() {
        var r = RepeatLimiter<String>(window: 10)
        _ = r.admit("k", note: "n", now: 0)
        #expect(r.expire(now: 50).isEmpty)
        #expect(r.nextExpiry == nil)
    }

    /// When the next occurrence comes before the report was written, it carries the report.
    @Test func theNextOccurrenceReportsAnEndedWindow() {
        var r = RepeatLimiter<String>(window: 10)
        _ = r.admit("k", note: "n", now: 0)
        _ = r.admit("k", note: "n", now: 5)
        _ = r.admit("k", note: "n", now: 6)
        guard case .log(let previous?) = r.admit("k", note: "m", now: 10) else { Issue.record("must log with the report"); return }
        #expect(previous.count == 2 && previous.note == "n")
        #expect(r.expire(now: 19).isEmpty)
        #expect(r.nextExpiry == 20)
    }

    @Test func keysAreIndependentAndReportedOldestFirst() {
        var r = RepeatLimiter<String>(window: 10)
        _ = r.admit("b", note: "b", now: 3)
        _ = r.admit("a", note: "a", now: 1)
        guard case .suppress = r.admit("a", note: "a", now: 4), case .suppress = r.admit("b", note: "b", now: 4),
              case .log = r.admit("c", note: "c", now: 4) else { Issue.record("keys mixed up"); return }
        #expect(r.nextExpiry == 11)
        #expect(r.expire(now: 20).map(\.key) == ["a", "b"])
    }
}

@Suite struct RelayLoggerRepeatTests {
    @Test func repeatedLinesAreCountedAndReported() {
        let clock = Mutex<Int64>(1_000_000)
        let logger = RelayLogger(minimum: .info, format: .json, capture: true, bounds: .standard, monotonic: { clock.withLock { $0 } })
        for i in 0..<4813 { logger.limited(.warning, "request", key: "request 503 outbox full", ["i": i]) }
        logger.limited(.error, "storage error on ingest")
        logger.limited(.debug, "below the level")  // neither logged nor counted
        #expect(logger.capturedLines.count == 2)
        #expect(logger.capturedLines[0].contains(#""msg":"request","i":0}"#))
        logger.reportRepeats()
        #expect(logger.capturedLines.count == 2)  // the window is still open
        clock.withLock { $0 += 10_000_000 }
        logger.reportRepeats()
        let lines = logger.capturedLines
        #expect(lines.count == 3)
        #expect(lines[2].contains(#""level":"warning","msg":"request (4,812 more in the last 10 s)","repeated":4812,"window_s":10}"#), "\(lines)")
        // The window is over: the next one is logged again.
        logger.limited(.warning, "request", key: "request 503 outbox full", ["i": 1])
        #expect(logger.capturedLines.count == 4)
    }

    @Test func fieldsAreNotBuiltForSuppressedLines() {
        let logger = RelayLogger(minimum: .info, format: .json, capture: true, bounds: .standard, monotonic: { 0 })
        let built = Mutex(0)
        func fields() -> KeyValuePairs<String, any Sendable> {
            built.withLock { $0 += 1 }
            return ["k": 1]
        }
        for _ in 0..<100 { logger.limited(.error, "same", fields()) }
        #expect(built.withLock { $0 } == 1)
    }

    @Test func thousandsAreGrouped() {
        #expect(groupedThousands(0) == "0")
        #expect(groupedThousands(999) == "999")
        #expect(groupedThousands(4812) == "4,812")
        #expect(groupedThousands(1_234_567) == "1,234,567")
        #expect(groupedThousands(-1000) == "-1,000")
    }
}
