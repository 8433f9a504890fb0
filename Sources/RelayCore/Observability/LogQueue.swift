// The log's way out: formatted lines go into a bounded FIFO and one thread of their own writes
// them, so a thread that logs (an HTTP loop, the SQLite writer, the dispatcher) never waits for
// stderr. A blocked stderr (a pipe nobody reads, a stalled journald) fills the queue; after that
// lines are dropped and counted, never waited for (issue 25: a loop thread blocked on its log
// line took ingest down to 22 responses/s).
import FoundationEssentials
import Glibc
import POSIXThreads

final class LogQueue: @unchecked Sendable {
    // @unchecked Sendable: every var below is read and written only with `condition` held; the
    // sink and the tick are called without it.

    /// What may wait to be written: lines and their bytes, the batch being written included (a
    /// blocked write holds its batch's memory as long as it blocks).
    struct Bounds: Sendable, Equatable {
        var bytes: Int
        var lines: Int
        /// 4 MiB and 16,384 lines: at debug (~200-byte request and delivered lines, ~3 MiB)
        /// that is about a second of full-speed ingest, enough to ride out a reader's hiccup;
        /// at info, far more than the relay logs. A reader that stopped costs at most 4 MiB.
        static let standard = Bounds(bytes: 4 << 20, lines: 16_384)
    }

    private let bounds: Bounds
    /// Writes one batch (lines already joined). Blocking is allowed: only the writer thread calls it.
    private let sink: @Sendable (UnsafeRawBufferPointer) -> Void
    /// The line put in place of lines dropped since the last one written ("N log lines dropped").
    private let dropNotice: @Sendable (Int) -> String

    private let condition = Condition()
    private var pending: [String] = []
    private var queuedBytes = 0
    private var queuedLines = 0
    private var accepted: Int64 = 0
    private var written: Int64 = 0
    private var dropped = 0
    private var droppedUnreported = 0
    private var started = false
    private var closed = false
    /// monotonicMicros at which the writer calls `onTick`.
    private var tickAt: Int64?
    /// Called on the writer thread when the deadline given to `tick(at:)` passed (the logger's
    /// rate-limited lines report their counts this way). Returns the next deadline, if any.
    private var onTick: (@Sendable () -> Int64?)?

    init(bounds: Bounds = .standard, sink: @escaping @Sendable (UnsafeRawBufferPointer) -> Void,
         dropNotice: @escaping @Sendable (Int) -> String) {
        self.bounds = bounds
        self.sink = sink
        self.dropNotice = dropNotice
    }

    /// Sets what `tick(at:)` calls (set after init: it refers to the queue's owner, weakly).
    func setTick(_ body: @escaping @Sendable () -> Int64?) {
        condition.withLock { onTick = body }
    }

    /// Lines refused because the queue was full (process lifetime, for /metrics).
    var droppedLines: Int { condition.withLock { dropped } }

    /// Queues `line` (newline included) without waiting; false when it was dropped (queue full
    /// or closed). The first line accepted after drops is preceded by a notice saying how many.
    @discardableResult
    func offer(_ line: String) -> Bool {
        let size = line.utf8.count
        condition.lock()
        if !started { startWriter() }
        guard !closed, queuedLines < bounds.lines, queuedBytes + size <= bounds.bytes else { return drop() }
        var notice: String?
        if droppedUnreported > 0 {
            // Formatted once per gap, when the queue has room again.
            let text = dropNotice(droppedUnreported)
            guard queuedLines + 2 <= bounds.lines, queuedBytes + size + text.utf8.count <= bounds.bytes else { return drop() }
            notice = text
        }
        let bytes = size + (notice?.utf8.count ?? 0)
        let lines = notice == nil ? 1 : 2
        if let notice { pending.append(notice) }
        pending.append(line)
        droppedUnreported = 0
        queuedBytes += bytes
        queuedLines += lines
        accepted += Int64(lines)
        condition.signal()
        condition.unlock()
        return true
    }

    /// With `condition` held; releases it.
    private func drop() -> Bool {
        dropped += 1
        droppedUnreported += 1
        condition.unlock()
        return false
    }

    /// Waits until every line accepted before the call is written, or `timeout` passed (a
    /// blocked stderr): true when drained. For a clean stop: the last lines get out, and a
    /// stop never hangs on a reader that is gone.
    @discardableResult
    func flush(timeout: Duration) -> Bool {
        let deadline = Date().addingTimeInterval(Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18)
        condition.lock()
        defer { condition.unlock() }
        let target = accepted
        while written < target {
            if !condition.wait(until: deadline) && written < target { return false }
        }
        return true
    }

    /// Asks the writer to call `onTick` at `micros` (monotonic), or earlier if already asked.
    func tick(at micros: Int64) {
        condition.withLock {
            if tickAt.map({ micros < $0 }) ?? true {
                tickAt = micros
                if !started { startWriter() }
                condition.signal()
            }
        }
    }

    /// Writes what is queued, then ends the writer thread; later lines are dropped. The logger
    /// calls it when it goes away, so a short-lived logger leaves no thread behind.
    func close() {
        condition.withLock {
            closed = true
            condition.broadcast()
        }
    }

    /// With `condition` held. A thread that cannot be started (out of memory or threads) leaves
    /// the queue to fill and drop: logging must not take the process down.
    private func startWriter() {
        started = true
        do {
            try startThread(name: "relay-log", detached: true) { [self] in run() }
        } catch {
            closed = true
        }
    }

    private func run() {
        condition.lock()
        while true {
            if pending.isEmpty && !closed {
                if let at = tickAt {
                    let wait = at - monotonicMicros()
                    if wait > 0 { condition.wait(until: Date().addingTimeInterval(Double(wait) / 1e6)) }
                } else {
                    condition.wait()
                }
            }
            if let at = tickAt, monotonicMicros() >= at {
                tickAt = nil
                let body = onTick
                condition.unlock()
                let next = body?()  // may offer lines: without the lock
                condition.lock()
                if let next { tickAt = min(tickAt ?? next, next) }
                continue
            }
            if pending.isEmpty {
                if closed { break }
                continue
            }
            let batch = pending
            pending = []
            condition.unlock()
            var bytes: [UInt8] = []
            bytes.reserveCapacity(batch.reduce(0) { $0 + $1.utf8.count })
            for line in batch { bytes.append(contentsOf: line.utf8) }
            bytes.withUnsafeBytes { sink($0) }
            condition.lock()
            queuedBytes -= bytes.count
            queuedLines -= batch.count
            written += Int64(batch.count)
            condition.broadcast()  // flush() waiters
        }
        condition.unlock()
    }
}
