// Bounded disk: finished rows (delivered, failed) and their attempts are deleted after the
// retention period, in small batches, each its own short transaction, so an ingest never waits
// behind a long DELETE (docs/threat_model.md "Disk"). relayctl purge uses the same batches.
import Dispatch
import FoundationEssentials
import POSIXThreads
import Synchronization

/// `store.retention`: seconds a finished row is kept after its last update; 0 keeps it forever.
public struct RetentionPolicy: Sendable, Equatable {
    public var deliveredSeconds: Int64 = 86_400
    public var failedSeconds: Int64 = 604_800

    public init(deliveredSeconds: Int64 = 86_400, failedSeconds: Int64 = 604_800) {
        self.deliveredSeconds = deliveredSeconds
        self.failedSeconds = failedSeconds
    }

    /// The states to sweep with their cutoff (rows last updated before it go), at `now` ms.
    public func cutoffs(now: Int64) -> [(state: ResponseState, olderThan: Int64)] {
        var out: [(ResponseState, Int64)] = []
        if deliveredSeconds > 0 { out.append((.delivered, now - deliveredSeconds * 1000)) }
        if failedSeconds > 0 { out.append((.failed, now - failedSeconds * 1000)) }
        return out
    }

    /// "delivered 86400 s, failed 604800 s" (0: "kept").
    public var summary: String {
        func one(_ s: Int64) -> String { s == 0 ? "kept" : "\(s) s" }
        return "delivered \(one(deliveredSeconds)), failed \(one(failedSeconds))"
    }
}

public enum PurgeBatches {
    /// Rows per delete transaction: 64 rows (with an attempt each) took 0.75 ms p50 on SQLite
    /// without the fsync, where 256 took 8.9 ms (docs/threat_model.md "Disk").
    public static let defaultBatch = 64

    /// Deletes every `state` row last updated before `olderThan` (and its attempts) in batches of
    /// `batch` rows, one transaction each. `pause` runs between batches (the sweeper sleeps there
    /// so that a large backlog does not occupy the writer back to back); returning false stops.
    public static func run(_ store: any OutboxStore, state: ResponseState, olderThan: Int64, batch: Int = defaultBatch,
                           pause: () -> Bool = { true }) throws -> Int {
        var total = 0
        while true {
            let n = try store.purgeBatch(state: state, olderThan: olderThan, limit: batch)
            total += n
            if n < batch || !pause() { return total }
        }
    }
}

/// Runs the retention policy on its own thread: a sweep every `intervalMillis`, each as many
/// small batches as needed. Counts what it removed for /metrics.
public final class RetentionSweeper: Lifecycle {
    private struct State {
        var stopping = false
        var removed: [ResponseState: Int] = [:]
        var eventsRemoved = 0
        var backlogDropped: [String: Int] = [:]
        var deliveriesExpired: [String: Int] = [:]
        var marksPruned = 0
        var failures = 0
    }

    public let policy: RetentionPolicy
    private let store: any OutboxStore
    private let clock: any RelayClock
    private let logger: RelayLogger?
    private let intervalMillis: Int64
    private let pauseMillis: Int64
    private let batch: Int
    private let state = Mutex(State())
    private let wake = Condition()
    private let exited = DispatchSemaphore(value: 0)
    private let started = Mutex(false)

    public init(store: any OutboxStore, policy: RetentionPolicy, clock: any RelayClock = SystemRelayClock(), logger: RelayLogger? = nil,
                intervalMillis: Int64 = 60_000, pauseMillis: Int64 = 5, batch: Int = PurgeBatches.defaultBatch) {
        self.store = store
        self.policy = policy
        self.clock = clock
        self.logger = logger
        self.intervalMillis = intervalMillis
        self.pauseMillis = pauseMillis
        self.batch = batch
    }

    /// One sweep now, on the caller's thread; returns rows removed by state.
    @discardableResult
    public func sweepOnce() -> [ResponseState: Int] {
        var removed: [ResponseState: Int] = [:]
        for (s, olderThan) in policy.cutoffs(now: clock.nowMillis()) {
            do {
                removed[s] = try PurgeBatches.run(store, state: s, olderThan: olderThan, batch: batch) { [self] in
                    // Between batches: give ingest the writer, and stop promptly on shutdown.
                    wake.lock()
                    defer { wake.unlock() }
                    if !isStopping && pauseMillis > 0 { _ = wake.wait(until: Date().addingTimeInterval(Double(pauseMillis) / 1000)) }
                    return !isStopping
                }
            } catch {
                state.withLock { $0.failures += 1 }
                logger?.error("retention sweep failed", ["state": s.rawValue, "error": "\(error)"])
            }
        }
        state.withLock { for (s, n) in removed { $0.removed[s, default: 0] += n } }
        let total = removed.values.reduce(0, +)
        if total > 0 { logger?.info("retention removed finished responses", ["delivered": removed[.delivered] ?? 0, "failed": removed[.failed] ?? 0]) }
        sweepEvents()
        do { _ = try store.pruneEndedPacing(before: clock.nowMillis(), limit: 10_000) } catch {
            state.withLock { $0.failures += 1 }
            logger?.error("retention: pruning ended token pacing failed", ["error": "\(error)"])
        }
        do {
            let n = try store.pruneStaleMarks(now: clock.nowMillis(), limit: 10_000)
            state.withLock { $0.marksPruned += n }
        } catch {
            state.withLock { $0.failures += 1 }
            logger?.error("retention: pruning stale token marks failed", ["error": "\(error)"])
        }
        return removed
    }

    /// The event types that follow a response state's retention (docs/events.md): an event goes
    /// after the same age as the rows it reports, the token's with the failed rows.
    static func eventTypes(_ s: ResponseState) -> [EventType] {
        s == .delivered ? [.responseDelivered] : [.responseFailed, .tokenUnregistered]
    }

    /// Events past retention, then each webhook's backlog bound (the cursor skips the oldest events after it, then retry rows due first are dropped).
    private func sweepEvents() {
        var removed = 0
        var expired: [String: Int] = [:]
        for (s, olderThan) in policy.cutoffs(now: clock.nowMillis()) {
            do {
                while true {
                    let purged = try store.purgeEvents(types: Self.eventTypes(s), olderThan: olderThan, limit: batch)
                    removed += purged.events
                    for (w, n) in purged.pendingDeliveries { expired[w, default: 0] += n }
                    if purged.events < batch || isStopping { break }
                    wake.lock()
                    if !isStopping && pauseMillis > 0 { _ = wake.wait(until: Date().addingTimeInterval(Double(pauseMillis) / 1000)) }
                    wake.unlock()
                }
            } catch {
                state.withLock { $0.failures += 1 }
                logger?.error("retention sweep of events failed", ["state": s.rawValue, "error": "\(error)"])
            }
        }
        let bound = store.eventSettings.maxBacklogPerWebhook
        var dropped: [String: Int] = [:]
        // One pass drops at most `bound` per webhook (its counts stay bounded): another while
        // one was full.
        do {
            var pass: [String: Int]
            repeat {
                pass = try store.trimWebhookBacklogs(max: bound)
                for (w, n) in pass { dropped[w, default: 0] += n }
            } while pass.values.contains(where: { WebhookDeliveryRules.trimPassWasFull(dropped: $0, max: bound) }) && !isStopping
        } catch {
            state.withLock { $0.failures += 1 }
            logger?.error("webhook backlog bound failed", ["error": "\(error)"])
        }
        state.withLock {
            $0.eventsRemoved += removed
            for (w, n) in dropped { $0.backlogDropped[w, default: 0] += n }
            for (w, n) in expired { $0.deliveriesExpired[w, default: 0] += n }
        }
        // Events past retention that a webhook never received (its receiver down or failing for
        // longer than store.retention): they will not be sent. One line per 10 s at most.
        for (w, n) in expired.sorted(by: { $0.key < $1.key }) {
            logger?.limited(.error, "retention deleted events still pending for a webhook: they will not be sent", key: "retention expired deliveries",
                            ["webhook": w, "deliveries": n])
        }
        for (w, n) in dropped.sorted(by: { $0.key < $1.key }) {
            logger?.error("webhook backlog over events.maxBacklogPerWebhook: oldest pending events dropped for it", ["webhook": w, "dropped": n, "max": bound])
        }
    }

    private var isStopping: Bool { state.withLock { $0.stopping } }

    /// Starts the thread (no-op when the policy keeps everything).
    public func start() {
        guard policy.deliveredSeconds > 0 || policy.failedSeconds > 0 || !store.eventSettings.webhooks.isEmpty else { return }
        started.withLock { $0 = true }
        let t = OSThread { [self] in
            while !isStopping {
                sweepOnce()
                wake.lock()
                if !isStopping { _ = wake.wait(until: Date().addingTimeInterval(Double(intervalMillis) / 1000)) }
                wake.unlock()
            }
            exited.signal()
        }
        t.name = "relay-retention"
        t.start()
    }

    /// Stops after the current batch (one short transaction, so `grace` is not needed) and
    /// waits for the thread.
    public func stop(grace: Duration = .zero) {
        state.withLock { $0.stopping = true }
        wake.lock()
        wake.broadcast()
        wake.unlock()
        if started.withLock({ $0 }) { exited.wait() }
    }

    /// Rows removed by state, failed sweeps, the policy.
    public func collectMetrics(into r: inout PrometheusRegistry) {
        let s = state.withLock { $0 }
        r.declare("relay_retention_removed_total", .counter, help: "Finished responses (with their attempts) deleted by store.retention.")
        for st in [ResponseState.delivered, .failed] { r.sample("relay_retention_removed_total", ["state": st.rawValue], s.removed[st] ?? 0) }
        r.counter("relay_retention_failures_total", help: "Retention sweeps that failed (logged).", s.failures)
        r.counter("relay_events_removed_total", help: "Delivery events (with their webhook deliveries) deleted by store.retention.", s.eventsRemoved)
        r.declare("relay_webhook_backlog_dropped_total", .counter, help: "Pending webhook deliveries dropped over events.maxBacklogPerWebhook (the oldest events after the cursor first, then retry rows due first).")
        for w in store.eventSettings.webhooks.map(\.name) { r.sample("relay_webhook_backlog_dropped_total", ["webhook": w], s.backlogDropped[w] ?? 0) }
        r.declare("relay_webhook_deliveries_expired_total", .counter,
                  help: "Pending webhook deliveries (never delivered, or retrying) deleted by store.retention with their events: never sent.")
        for w in Set(store.eventSettings.webhooks.map(\.name)).union(s.deliveriesExpired.keys).sorted() {
            r.sample("relay_webhook_deliveries_expired_total", ["webhook": w], s.deliveriesExpired[w] ?? 0)
        }
        r.counter("relay_token_marks_pruned_total", help: "Token marks (unregistered_tokens) deleted by retention once they no longer change anything (StoreRules.markIsStale).",
                  s.marksPruned)
        r.declare("relay_retention_seconds", .gauge, help: "store.retention by state (0: kept forever).")
        r.sample("relay_retention_seconds", ["state": "delivered"], policy.deliveredSeconds)
        r.sample("relay_retention_seconds", ["state": "failed"], policy.failedSeconds)
    }
}
