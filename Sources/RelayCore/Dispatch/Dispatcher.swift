// The dispatcher: one thread that drives DispatcherStateMachine. It takes what the
// DispatchChannel collected (rows the store handed off, answers, wake, stop), claims due rows
// (queued/retry -> inflight), hands each to its app's PushTransport with bounded concurrency and
// writes the decided outcomes back in batches. Decisions are the state machine's; this file
// only runs its actions.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

public struct DispatcherOptions: Sendable {
    /// Most pushes waiting for an APNs answer at once.
    public var maxInflight: Int = 256
    /// Rows claimed per transaction.
    public var claimBatch: Int = 256
    /// Longest sleep when nothing is due (also bounds how late a row written by another
    /// process, e.g. `relayctl retry`, is noticed).
    public var idlePollMillis: Int64 = 1_000
    public var policy = DeliveryPolicy()
    /// Probe times of a paused app (AppPause.swift).
    public var pause = PauseSchedule()
    public init(maxInflight: Int = 256, claimBatch: Int = 256, idlePollMillis: Int64 = 1_000, policy: DeliveryPolicy = .init(),
                pause: PauseSchedule = .init()) {
        self.maxInflight = maxInflight
        self.claimBatch = claimBatch
        self.idlePollMillis = idlePollMillis
        self.policy = policy
        self.pause = pause
    }
}

public final class Dispatcher: @unchecked Sendable {
    // @unchecked Sendable: `thread` is written once in start(); everything shared with other
    // threads goes through `channel` (its own lock); the state machine lives on the thread.
    private let store: any OutboxStore
    private let transports: [String: any PushTransport]
    private let options: DispatcherOptions
    /// Where the store's hand-offs, the answers and the stop request arrive.
    public let channel: DispatchChannel
    private let clock: any RelayClock
    private let random: any RandomSource
    private let metrics: RelayMetrics
    private let logger: RelayLogger
    private var thread: OSThread?
    private let exited = DispatchSemaphore(value: 0)
    /// Outcome writes queued on the store and not finished yet (waited for before exit).
    private let applying = DispatchGroup()
    /// Paused apps and why (app -> APNs reason or "credential_file"): /readyz and /metrics read it.
    private let pausedApps = Mutex<[String: String]>([:])

    /// `channel`: the one registered with the store (`addCommitObserver`), for the hand-off; one
    /// no store knows of means no hand-off (every row is claimed).
    public init(store: any OutboxStore, transports: [String: any PushTransport], options: DispatcherOptions = .init(),
                channel: DispatchChannel = DispatchChannel(), clock: any RelayClock = SystemRelayClock(),
                random: any RandomSource = SystemRandom(), metrics: RelayMetrics = RelayMetrics(), logger: RelayLogger = RelayLogger()) {
        self.store = store
        self.transports = transports
        self.options = options
        self.channel = channel
        self.clock = clock
        self.random = random
        self.metrics = metrics
        self.logger = logger
    }

    /// Requeues rows a previous process left inflight, then starts the dispatch thread.
    public func start() throws {
        let recovered = try store.recoverInflight()
        if recovered > 0 { logger.info("recovered inflight rows", ["count": recovered]) }
        channel.open(capacity: options.maxInflight)
        let machine = DispatcherStateMachine(claimBatch: options.claimBatch, idlePollMillis: options.idlePollMillis,
                                             policy: options.policy, apps: Set(transports.keys), pause: options.pause)
        let t = OSThread { [self] in
            self.run(machine)
        }
        t.name = "relay-dispatcher"
        thread = t
        t.start()
    }

    public var isRunning: Bool { channel.isRunning }

    /// Look for due work now instead of at the next poll.
    public func wake() { channel.wake() }

    public var inflightCount: Int { channel.inflightCount }

    /// Apps paused now, with the reason (docs/pushclient.md "Paused apps").
    public var paused: [String: String] { pausedApps.withLock { $0 } }

    /// A reload gave `app` new credentials: end its pause now, without waiting for a probe.
    public func resume(app: String) { channel.resume(app: app) }

    /// relay_app_paused{app,reason}: 1 while paused (reason set), 0 otherwise (reason "").
    public func collectPauseMetrics(into r: inout PrometheusRegistry) {
        let now = paused
        r.declare("relay_app_paused", .gauge,
                  help: "1 while the app is paused by a credential or configuration answer (reason: the APNs reason, or credential_file); its rows wait, unsent and uncounted.")
        for app in transports.keys.sorted() {
            r.sample("relay_app_paused", ["app": app, "reason": now[app] ?? ""], now[app] == nil ? 0 : 1)
        }
    }

    /// Stops claiming; waits up to `grace` for pushes in flight, returns the rest to queued,
    /// and shuts the transports down. Blocking.
    public func stop(grace: Duration = .seconds(5)) {
        guard channel.requestStop() else { return }
        let nanos = grace.components.seconds * 1_000_000_000 + grace.components.attoseconds / 1_000_000_000
        if exited.wait(timeout: .now() + .nanoseconds(Int(max(0, nanos)))) == .timedOut {
            channel.endGrace()
            exited.wait()
        }
        for t in transports.values { t.shutdown() }
    }

    private func run(_ start: DispatcherStateMachine) {
        var machine = start
        func take(waitingMillis millis: Int64?) -> DispatchInbox {
            var inbox = channel.take(waitingMillis: millis)
            inbox.takenAt = clock.nowMillis()
            return inbox
        }
        var actions = machine.received(take(waitingMillis: 0))
        while !actions.isEmpty {
            var next: [DispatcherStateMachine.Action] = []
            for action in actions {
                switch action {
                case .send(let rows):
                    for row in rows { send(row) }
                case .apply(let updates):
                    apply(updates)
                case .report(let push, let outcome):
                    report(push, outcome)
                case .vacate(let count):
                    channel.vacate(count)
                case .claim(let limit):
                    do {
                        let rows = try store.claimDue(limit: limit)
                        channel.occupy(rows.count)
                        next = machine.claimed(rows, limit: limit, now: clock.nowMillis())
                    } catch {
                        logger.limited(.error, "claim failed", ["error": "\(error)"])
                        next = machine.claimFailed()
                    }
                case .findNextDue:
                    next = machine.nextDue(try? store.nextDueAt(), now: clock.nowMillis())
                case .wait(let millis):
                    next = machine.received(take(waitingMillis: millis))
                case .paused(let app, let reason, let detail):
                    pausedApps.withLock { $0[app] = reason }
                    logger.error("app paused: APNs refuses its credentials or configuration; its responses wait (not failed, no attempt counted), one probe per back-off step",
                                 ["app": app, "reason": reason, "detail": detail])
                case .resumed(let app, let why):
                    pausedApps.withLock { $0[app] = nil }
                    logger.info("app resumed", ["app": app, "why": why])
                    if why == "reload" {
                        applying.wait()   // the releases written first, then made due
                        do { _ = try store.hastenQueued(app: app) } catch {
                            logger.error("could not make the resumed app's responses due (they go out at their probe time)", ["app": app, "error": "\(error)"])
                        }
                    }
                case .exit(let requeue):
                    applying.wait()
                    do {
                        try store.apply(requeue)
                    } catch {
                        logger.error("could not requeue inflight rows at shutdown (they are requeued at next start)", ["error": "\(error)"])
                    }
                    if !requeue.isEmpty { logger.info("returned unanswered pushes to queued", ["count": requeue.count]) }
                }
            }
            actions = next
        }
        channel.finish()
        exited.signal()
    }

    /// Queues the outcome writes and goes on: handed-off rows that arrive meanwhile are sent
    /// without waiting for the writer's next COMMIT. A retry's due time is seen by the next
    /// nextDueAt only once written, so its completion wakes the thread to look again.
    private func apply(_ updates: [DeliveryUpdate]) {
        let retries = updates.contains {
            switch $0.outcome {
            case .retry, .release: true
            default: false
            }
        }
        applying.enter()
        store.apply(updates) { [channel, logger, applying] error in
            if let error {
                // The rows stay inflight in the database. PostgreSQL keeps the outcomes and writes
                // them before its next claim; SQLite's rows are requeued at the next start.
                logger.limited(.error, "could not record push outcomes", ["error": "\(error)", "count": updates.count])
            } else if retries {
                channel.wake()
            }
            applying.leave()
        }
    }

    private func send(_ row: OutboxRow) {
        guard let transport = transports[row.app] else { return }   // the state machine routed it
        let sentAt = monotonicMicros()
        transport.send(row) { [channel, clock, random] answer in
            channel.answered(FinishedPush(row: row, answer: answer, at: clock.nowMillis(), latencyMicros: monotonicMicros() - sentAt,
                                          random: random.unit()))
        }
    }

    private func report(_ push: FinishedPush, _ outcome: DeliveryOutcome) {
        let row = push.row, answer = push.answer
        let sinceIngest = row.attempts == 0 ? Double(push.at - row.createdAt) / 1000 : nil
        metrics.push(status: answer.status, reason: answer.reason, latencySeconds: Double(push.latencyMicros) / 1e6, sinceIngestSeconds: sinceIngest)
        if case .retry = outcome { metrics.retry() }
        switch outcome {
        case .delivered:
            logger.debug("delivered", ["id": row.id, "app": row.app])
        case .failed(let reason):
            logger.info("push failed", ["id": row.id, "app": row.app, "token": redactToken(row.pushToken), "status": answer.status ?? 0, "reason": reason])
        case .unregistered(let reason, _):
            // The token's queued responses fail with it and ingest refuses it for its hold.
            logger.info("push failed, token marked", ["id": row.id, "app": row.app, "token": redactToken(row.pushToken), "status": answer.status ?? 0, "reason": reason])
        case .retry(let at, let pace):
            logger.info("push retry scheduled", ["id": row.id, "status": answer.status ?? 0, "reason": answer.reason ?? "", "in_ms": at - push.at, "paced": pace != nil])
        case .requeue, .release:
            break
        }
    }
}
