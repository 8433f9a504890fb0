// The dispatcher: one thread claims due rows (queued/retry -> inflight), hands each to the
// app's PushTransport with bounded concurrency, and writes the decided outcome back in batches.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads

public struct DispatcherOptions: Sendable {
    /// Most pushes waiting for an APNs answer at once.
    public var maxInflight: Int = 256
    /// Rows claimed per transaction.
    public var claimBatch: Int = 256
    /// Longest sleep when nothing is due (also bounds how late a row written by another
    /// process, e.g. `relayctl retry`, is noticed).
    public var idlePollMillis: Int64 = 1_000
    public var policy = DeliveryPolicy()
    public init(maxInflight: Int = 256, claimBatch: Int = 256, idlePollMillis: Int64 = 1_000, policy: DeliveryPolicy = .init()) {
        self.maxInflight = maxInflight
        self.claimBatch = claimBatch
        self.idlePollMillis = idlePollMillis
        self.policy = policy
    }
}

public final class Dispatcher: DispatchHandoff, @unchecked Sendable {
    // @unchecked Sendable: every mutable field below is guarded by `condition`; the store and
    // transports are Sendable; the thread is started once.
    private let store: any OutboxStore
    private let transports: [String: any PushTransport]
    private let options: DispatcherOptions
    private let clock: any RelayClock
    private let random: any RandomSource
    private let metrics: RelayMetrics
    private let logger: RelayLogger

    private let condition = Condition()
    private var woken = false
    private var stopping = false
    private var stopped = false
    private var inflight: [String: (row: OutboxRow, sentAt: Int64)] = [:]
    private var finished: [DeliveryUpdate] = []
    private var thread: OSThread?
    private let exited = DispatchSemaphore(value: 0)
    private var running = false
    /// Slots promised to the store for rows handed off at ingest (see DispatchHandoff).
    private var reserved = 0
    private var wakeSignals = 0

    public init(store: any OutboxStore, transports: [String: any PushTransport], options: DispatcherOptions = .init(),
                clock: any RelayClock = SystemRelayClock(), random: any RandomSource = SystemRandom(),
                metrics: RelayMetrics = RelayMetrics(), logger: RelayLogger = RelayLogger()) {
        self.store = store
        self.transports = transports
        self.options = options
        self.clock = clock
        self.random = random
        self.metrics = metrics
        self.logger = logger
    }

    /// Requeues rows a previous process left inflight, then starts the dispatch thread.
    public func start() throws {
        let recovered = try store.recoverInflight()
        if recovered > 0 { logger.info("recovered inflight rows", ["count": recovered]) }
        condition.lock()
        running = true
        condition.unlock()
        (store as? any HandoffCapableStore)?.setHandoff(self)
        let t = OSThread { [self] in
            self.loop()
        }
        t.name = "relay-dispatcher"
        thread = t
        t.start()
    }

    public var isRunning: Bool {
        condition.lock()
        defer { condition.unlock() }
        return running && !stopped
    }

    /// New rows were committed: look for due work now instead of at the next poll.
    public func wake() {
        condition.lock()
        woken = true
        condition.signal()
        condition.unlock()
    }

    // MARK: DispatchHandoff (called on the store's writer thread)

    public func reserve() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard running, !stopping, inflight.count + reserved < options.maxInflight else { return false }
        reserved += 1
        return true
    }

    public func release(_ count: Int) {
        condition.lock()
        reserved = max(0, reserved - count)
        condition.unlock()
    }

    /// Once per committed batch that queued rows. With every slot taken (APNs slower than
    /// ingest, or stalled) waking the thread would find nothing to do: the flag is set and the
    /// next finishing push (which signals anyway) makes it claim. This saved a futex wake and
    /// a context switch per COMMIT while the outbox drains a backlog.
    public func queuedRowsCommitted() {
        condition.lock()
        woken = true
        if stopping || inflight.count + reserved < options.maxInflight {
            condition.signal()
            wakeSignals += 1
        }
        condition.unlock()
    }

    /// How many times `queuedRowsCommitted` signalled the thread (for tests).
    var queuedWakeSignals: Int { condition.withLock { wakeSignals } }

    public func accept(_ row: OutboxRow) {
        condition.lock()
        reserved = max(0, reserved - 1)
        let gone = stopped
        condition.unlock()
        // After stop() the row stays inflight in the database and is requeued at next start.
        guard !gone else { return }
        send(row)
    }

    public var inflightCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return inflight.count
    }

    /// Stops claiming; waits up to `grace` for pushes in flight, returns the rest to queued,
    /// and shuts the transports down. Blocking.
    public func stop(grace: Duration = .seconds(5)) {
        (store as? any HandoffCapableStore)?.setHandoff(nil)
        condition.lock()
        guard running, !stopping else { condition.unlock(); return }
        stopping = true
        condition.broadcast()
        condition.unlock()
        let deadline = Date().addingTimeInterval(Double(grace.components.seconds) + Double(grace.components.attoseconds) / 1e18)
        condition.lock()
        while !inflight.isEmpty && Date() < deadline { _ = condition.wait(until: deadline) }
        let leftover = inflight.values.map { DeliveryUpdate(id: $0.row.id, pushToken: $0.row.pushToken, outcome: .requeue, attempt: nil) }
        inflight.removeAll()
        stopped = true
        condition.broadcast()
        condition.unlock()
        exited.wait()
        do {
            try store.apply(leftover)
        } catch {
            logger.error("could not requeue inflight rows at shutdown (they are requeued at next start)", ["error": "\(error)"])
        }
        if !leftover.isEmpty { logger.info("returned unanswered pushes to queued", ["count": leftover.count]) }
        for t in transports.values { t.shutdown() }
    }

    private func loop() {
        // Whether a claim could find anything. Cleared when a claim came back short; set again
        // by a wake (queued rows committed, stop) or when nextDueAt says a row is due. With
        // every ingest handed off, pushes completing no longer each cost an empty claim
        // transaction on the writer.
        var mayHaveDue = true
        while true {
            // 1. Write back finished pushes.
            condition.lock()
            let done = finished
            finished.removeAll()
            let isStopping = stopping
            let capacity = options.maxInflight - inflight.count - reserved
            if woken {
                mayHaveDue = true
                woken = false
            }
            condition.unlock()
            if !done.isEmpty {
                do { try store.apply(done) } catch {
                    // The rows stay inflight in the database; they are requeued on restart.
                    logger.error("could not record push outcomes", ["error": "\(error)", "count": done.count])
                }
            }
            if isStopping {
                condition.lock()
                let over = stopped && finished.isEmpty
                if !over && finished.isEmpty { _ = condition.wait(until: Date().addingTimeInterval(0.05)) }
                condition.unlock()
                if over { break }
                continue
            }
            // 2. Claim and send.
            var claimed: [OutboxRow] = []
            if capacity > 0 && mayHaveDue {
                do {
                    claimed = try store.claimDue(limit: min(capacity, options.claimBatch))
                    if claimed.count < min(capacity, options.claimBatch) { mayHaveDue = false }
                } catch {
                    logger.error("claim failed", ["error": "\(error)"])
                }
            }
            for row in claimed { send(row) }
            if claimed.count == min(capacity, options.claimBatch) && capacity > 0 { continue }  // more may be due
            // 3. Sleep until woken, a completion arrives, or the next row is due.
            var wakeAt = clock.nowMillis() + options.idlePollMillis
            if capacity > 0, let next = try? store.nextDueAt() {
                if next <= clock.nowMillis() { mayHaveDue = true }
                wakeAt = min(wakeAt, max(next, clock.nowMillis()))
            }
            let sleepMillis = max(0, wakeAt - clock.nowMillis())
            condition.lock()
            if !woken && finished.isEmpty && !stopping && sleepMillis > 0 {
                _ = condition.wait(until: Date().addingTimeInterval(Double(sleepMillis) / 1000))
            }
            if woken {
                mayHaveDue = true
                woken = false
            }
            condition.unlock()
        }
        exited.signal()
    }

    private func send(_ row: OutboxRow) {
        guard let transport = transports[row.app] else {
            // The app was removed from the configuration after the row was accepted.
            let update = DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .failed(reason: "app_not_configured"),
                                        attempt: nil)
            condition.lock()
            finished.append(update)
            condition.unlock()
            return
        }
        let sentAt = monotonicMicros()
        condition.lock()
        inflight[row.id] = (row, sentAt)
        condition.unlock()
        transport.send(row) { [self] answer in self.complete(row: row, sentAt: sentAt, answer: answer) }
    }

    private func complete(row: OutboxRow, sentAt: Int64, answer: PushAnswer) {
        let now = clock.nowMillis()
        let latency = monotonicMicros() - sentAt
        var outcome = options.policy.decide(answer, row: row, now: now, random: random.unit())
        condition.lock()
        // A late answer after stop() requeued the row: the requeue stands.
        guard inflight.removeValue(forKey: row.id) != nil else {
            condition.unlock()
            return
        }
        if stopping && answer.status == nil {
            outcome = .requeue  // shutdown or a dropped connection during drain: not an attempt
        }
        let attempt = outcome == .requeue ? nil : AttemptRecord(
            responseID: row.id, attemptedAt: now, status: answer.status, reason: answer.reason,
            apnsTimestamp: answer.apnsTimestamp, latencyMicros: latency)
        finished.append(DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: outcome, attempt: attempt))
        condition.broadcast()
        condition.unlock()
        let sinceIngest = row.attempts == 0 ? Double(now - row.createdAt) / 1000 : nil
        metrics.push(status: answer.status, reason: answer.reason, latencySeconds: Double(latency) / 1e6, sinceIngestSeconds: sinceIngest)
        if case .retry = outcome { metrics.retry() }
        switch outcome {
        case .delivered:
            logger.debug("delivered", ["id": row.id, "app": row.app])
        case .failed(let reason), .unregistered(let reason, _):
            logger.info("push failed", ["id": row.id, "app": row.app, "token": redactToken(row.pushToken), "status": answer.status ?? 0, "reason": reason])
        case .retry(let at, let pace):
            logger.info("push retry scheduled", ["id": row.id, "status": answer.status ?? 0, "reason": answer.reason ?? "", "in_ms": at - now, "paced": pace != nil])
        case .requeue:
            break
        }
    }
}
