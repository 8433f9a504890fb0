// The one way into the dispatcher thread. The store tells it of its commits (it is the store's
// OutboxCommitObserver: rows inserted `inflight` in the room it offered, or just "queued rows
// committed"); push answers and the stop request arrive here too. Nothing calls the
// dispatcher: its thread drains this inbox and sends. RelayService owns one, registers it with
// the store and gives it to the Dispatcher.
import FoundationEssentials
import POSIXThreads

public final class DispatchChannel: OutboxCommitObserver, @unchecked Sendable {
    // @unchecked Sendable: every mutable field is guarded by `condition`.
    private enum Phase { case closed, open, stopping, finished }

    private let condition = Condition()
    private var phase = Phase.closed
    /// dispatch.maxInflight, set when the dispatcher opens the channel.
    private var capacity = 0
    /// Rows posted or sent and not answered yet.
    private var inflight = 0
    private var inbox = DispatchInbox()
    private var queuedSignals = 0

    public init() {}

    // MARK: the store's side (OutboxCommitObserver, on the store's thread)

    /// Free slots, read by the store before a write transaction: it inserts up to this many
    /// due rows `inflight` and posts them after COMMIT (saving their claim). 0 while the
    /// dispatcher is not running or is stopping. Nothing is reserved: a claim sized while that
    /// batch runs may count the same slots, and maxInflight is then exceeded by at most the
    /// smaller of the two (a soft bound, as it was with the reservation, whose race was a claim
    /// sized before the INSERT).
    public var roomForDueRows: Int {
        condition.withLock { phase == .open ? max(0, capacity - inflight) : 0 }
    }

    /// After a COMMIT: the rows inserted `inflight` for this channel, and whether the commit also
    /// made rows due that wait for a claim. Handed-off rows always wake the dispatcher; queued
    /// rows only when it could claim them: with every slot taken the flag waits for the next
    /// answer, which wakes it anyway (no futex wake and context switch per COMMIT while a backlog
    /// drains). A row posted after the dispatcher exited stays `inflight` in the database and is
    /// requeued at the next start.
    public func committed(_ commit: OutboxCommit) {
        post(handedOff: commit.handedOff, queued: commit.queuedDue)
    }

    private func post(handedOff rows: [OutboxRow], queued: Bool) {
        guard !rows.isEmpty || queued else { return }
        condition.lock()
        defer { condition.unlock() }
        guard phase != .finished else { return }
        inflight += rows.count
        if inbox.rows.isEmpty { inbox.rows = rows } else { inbox.rows += rows }
        if queued { inbox.mayHaveDue = true }
        let wakes = !rows.isEmpty || phase == .stopping || inflight < capacity
        if wakes {
            condition.signal()
            if queued { queuedSignals += 1 }
        }
    }

    /// Something may be due (a row written by another process, a test's clock moved): claim now
    /// instead of at the next poll.
    public func wake() { post(handedOff: [], queued: true) }

    /// The app's credentials were reloaded: end its pause (if any) and send its rows again.
    public func resume(app: String) {
        condition.lock()
        defer { condition.unlock() }
        guard phase != .finished else { return }
        inbox.resumeApps.insert(app)
        inbox.mayHaveDue = true
        condition.signal()
    }

    /// How many times queued rows woke the dispatcher thread (for tests).
    var queuedWakeSignals: Int { condition.withLock { queuedSignals } }

    /// Pushes waiting for an APNs answer, handed-off rows included.
    public var inflightCount: Int { condition.withLock { inflight } }

    // MARK: the dispatcher's side

    /// The dispatcher started: the store may hand rows off.
    func open(capacity: Int) {
        condition.withLock {
            self.capacity = capacity
            phase = .open
        }
    }

    var isRunning: Bool { condition.withLock { phase == .open || phase == .stopping } }

    /// Rows the dispatcher claimed and is about to send.
    func occupy(_ count: Int) { condition.withLock { inflight += count } }

    /// Rows counted in flight that will never be answered (their app has no transport).
    func vacate(_ count: Int) { condition.withLock { inflight = max(0, inflight - count) } }

    /// An APNs answer (any thread). Its slot is free at once, as the store's next transaction sees.
    func answered(_ push: FinishedPush) {
        condition.lock()
        defer { condition.unlock() }
        guard phase != .finished else { return }   // late: the requeue at stop stands
        inflight = max(0, inflight - 1)
        var push = push
        push.duringStop = phase == .stopping
        inbox.answers.append(push)
        condition.signal()
    }

    /// Stops hand-offs (no more room offered) and tells the thread to drain; false when the dispatcher is
    /// not running or already stopping.
    func requestStop() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard phase == .open else { return false }
        phase = .stopping
        inbox.stopRequested = true
        condition.signal()
        return true
    }

    /// The stop's grace period ended: what is still unanswered goes back to queued.
    func endGrace() {
        condition.withLock {
            inbox.graceOver = true
            condition.signal()
        }
    }

    /// The dispatcher thread exited: later posts and answers are dropped.
    func finish() {
        condition.withLock {
            phase = .finished
            inbox = DispatchInbox()
        }
    }

    /// Everything posted since the last call, waiting for something first when the inbox is
    /// empty: up to `waitingMillis` (nil: until something arrives; 0: not at all).
    func take(waitingMillis: Int64?) -> DispatchInbox {
        condition.lock()
        defer { condition.unlock() }
        if inbox.isEmpty {
            if let ms = waitingMillis {
                if ms > 0 { _ = condition.wait(until: Date().addingTimeInterval(Double(ms) / 1000)) }
            } else {
                condition.wait()
            }
        }
        var taken = inbox
        inbox = DispatchInbox()
        taken.freeSlots = max(0, capacity - inflight)
        return taken
    }
}

/// One APNs answer on its way to the dispatcher thread, with what deciding it needs (its time
/// and random draw are taken where it arrived, so the state machine stays pure).
struct FinishedPush: Sendable, Equatable {
    var row: OutboxRow
    var answer: PushAnswer
    /// When it arrived (RelayClock ms): the attempt's time and the policy's now.
    var at: Int64
    var latencyMicros: Int64
    /// The full-jitter draw for a back-off.
    var random: Double
    /// Arrived after stop was requested: a missing answer is then a requeue, not an attempt.
    var duringStop = false
}

/// What the dispatcher thread takes from the channel in one go.
struct DispatchInbox: Sendable, Equatable {
    var rows: [OutboxRow] = []
    var mayHaveDue = false
    var answers: [FinishedPush] = []
    /// Apps whose pause ends now (a reload gave them new credentials).
    var resumeApps: Set<String> = []
    var stopRequested = false
    var graceOver = false
    /// Slots free when it was taken (capacity minus in-flight rows).
    var freeSlots = 0
    /// When it was taken (RelayClock ms; set by the dispatcher, which owns the clock).
    var takenAt: Int64 = 0

    var isEmpty: Bool { rows.isEmpty && !mayHaveDue && answers.isEmpty && resumeApps.isEmpty && !stopRequested && !graceOver }
}
