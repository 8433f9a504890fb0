// Delivers committed events to the configured webhooks (docs/events.md, "Webhooks"). One thread
// ("webhooks") owns one libcurl multi handle for all of them; nothing here runs on the ingest
// loop or the dispatcher's threads, and the only shared resource is the store (WebhookOutbox).
//
// Per webhook, each turn of the loop: collect finished transfers; in one store transaction,
// record their results (a failed new event gets its retry row), advance the webhook's cursor
// over the finished prefix of the new events it holds, and (when its next claim is due and it
// has room) take due retry rows, then the next new events after the cursor, up to
// `maxConcurrent` in flight; render, sign and start them here, off the store's writer.
// The thread runs at a lower scheduling priority (`niceness`): under a load that saturates
// the CPUs, ingest and dispatch go first and events trail, to catch up when the load eases.
// 2xx is delivered; anything else, or no answer within the timeout, is retried after
// WebhookRetryPolicy's back-off until `retryFor` from the first attempt, then dead.
// A failing receiver is probed one delivery at a time, after a pause that doubles up to
// WebhookRetryPolicy.pauseCapMillis, so a receiver down for hours costs a few attempts a minute
// and no memory: what waits stays in the store. When nothing is due the thread sleeps in
// curl_multi_poll for `idlePollMillis` (or until `wake()`), then asks the store again.
import Glibc
import POSIXThreads
import Synchronization

public final class WebhookSender: Lifecycle, Sendable {
    /// One webhook as the sender needs it.
    public struct Endpoint: Sendable {
        public var name: String
        public var url: String
        /// Each signs every attempt (two while rotating).
        public var secrets: [WebhookSecret]
        public var caFile: String?
        public var timeoutMillis: Int
        public var maxConcurrent: Int
        public var retry: WebhookRetryPolicy

        public init(name: String, url: String, secrets: [WebhookSecret], caFile: String? = nil, timeoutMillis: Int = 10_000,
                    maxConcurrent: Int = 8, retry: WebhookRetryPolicy = WebhookRetryPolicy()) {
            self.name = name
            self.url = url
            self.secrets = secrets
            self.caFile = caFile
            self.timeoutMillis = timeoutMillis
            self.maxConcurrent = maxConcurrent
            self.retry = retry
        }
    }

    private let endpoints: [Endpoint]
    private let outbox: any WebhookOutbox
    private let metrics: WebhookMetrics
    private let logger: RelayLogger
    private let clock: any RelayClock
    private let random: any RandomSource
    /// How long the thread sleeps when nothing is due (or the store cannot be read).
    public let idlePollMillis: Int
    /// How often the backlog gauge asks the store.
    public let backlogRefreshMillis: Int64
    /// When a delivery that could not be set up here (libcurl out of memory...) is tried again.
    static let localRetryMillis: Int64 = 1000
    /// The webhooks thread's nice value (setpriority on its thread id; 0 keeps the process's).
    /// Chosen by measurement (docs/events.md "Cost of a webhook").
    public static let defaultNiceness: Int32 = 10
    private let niceness: Int32
    /// Tests: makes the transport's request setup fail as out of memory would.
    private let setupFault: (@Sendable () -> String?)?

    private struct Running {
        var thread: pthread_t
        var transport: WebhookTransport
    }
    private let running = Mutex<Running?>(nil)
    private let stopping = Atomic<Bool>(false)
    private let woken = Atomic<Bool>(false)
    private let graceMillis = Atomic<Int>(0)

    public convenience init(endpoints: [Endpoint], outbox: any WebhookOutbox, metrics: WebhookMetrics, logger: RelayLogger,
                clock: any RelayClock = SystemRelayClock(), random: any RandomSource = SystemRandom(),
                idlePollMillis: Int = 500, backlogRefreshMillis: Int64 = 10_000, niceness: Int32 = WebhookSender.defaultNiceness) {
        self.init(endpoints: endpoints, outbox: outbox, metrics: metrics, logger: logger, clock: clock, random: random,
                  idlePollMillis: idlePollMillis, backlogRefreshMillis: backlogRefreshMillis, niceness: niceness, setupFault: nil)
    }

    init(endpoints: [Endpoint], outbox: any WebhookOutbox, metrics: WebhookMetrics, logger: RelayLogger, clock: any RelayClock = SystemRelayClock(),
         random: any RandomSource = SystemRandom(), idlePollMillis: Int = 500, backlogRefreshMillis: Int64 = 10_000,
         niceness: Int32 = WebhookSender.defaultNiceness, setupFault: (@Sendable () -> String?)?) {
        self.setupFault = setupFault
        self.niceness = niceness
        self.endpoints = endpoints
        self.outbox = outbox
        self.metrics = metrics
        self.logger = logger
        self.clock = clock
        self.random = random
        self.idlePollMillis = idlePollMillis
        self.backlogRefreshMillis = backlogRefreshMillis
    }

    /// The relay's `events.webhooks`, their secret files read now (errors name the key).
    public convenience init(configuration: RelayConfig, outbox: any WebhookOutbox, metrics: WebhookMetrics, logger: RelayLogger) throws {
        var endpoints: [Endpoint] = []
        for (i, w) in configuration.events.webhooks.enumerated() {
            endpoints.append(Endpoint(name: w.name, url: w.url, secrets: try configuration.webhookSecrets(i), caFile: w.caFile,
                                      timeoutMillis: w.timeoutMillis, maxConcurrent: w.maxConcurrent,
                                      retry: WebhookRetryPolicy(retryForMillis: Int64(w.retryForSeconds) * 1000)))
        }
        self.init(endpoints: endpoints, outbox: outbox, metrics: metrics, logger: logger, niceness: Int32(configuration.events.senderNiceness))
    }

    /// Loads libcurl and starts the thread (no thread without endpoints).
    public func start() throws {
        guard !endpoints.isEmpty else { return }
        try running.withLock { r in
            guard r == nil else { return }
            let transport = try WebhookTransport(setupFault: setupFault)
            stopping.store(false, ordering: .sequentiallyConsistent)
            let thread = try startThread(name: "webhooks") { [self] in run(transport) }
            r = Running(thread: thread, transport: transport)
        }
        logger.info("webhook sender started", ["webhooks": endpoints.map(\.name).joined(separator: ",")])
    }

    /// Claims nothing new; attempts in flight get up to `grace` to finish and be recorded, the
    /// rest are aborted (sent again: a retry row after its lease, a new event from the cursor,
    /// which this stop releases: at least once).
    public func stop(grace: Duration) {
        guard let r = running.withLock({ r -> Running? in defer { r = nil }; return r }) else { return }
        let (seconds, attoseconds) = grace.components
        graceMillis.store(Int(seconds) * 1000 + Int(attoseconds / 1_000_000_000_000_000), ordering: .sequentiallyConsistent)
        stopping.store(true, ordering: .sequentiallyConsistent)
        r.transport.wakeup()
        pthread_join(r.thread, nil)
        r.transport.close()
    }

    /// Something was committed: claim now instead of at the next idle poll. Any thread; cheap.
    public func wake() {
        woken.store(true, ordering: .sequentiallyConsistent)
        running.withLock { $0?.transport.wakeup() }
    }

    // MARK: the thread

    /// A result waiting for the store, with what its metrics need once it is recorded.
    private struct Finished {
        var record: WebhookAttemptRecord
        var eventCreatedAt: Int64
    }

    /// What the thread knows of one webhook. Bounded: at most `maxConcurrent` deliveries.
    private struct WebhookState {
        var inFlight: [Int: WebhookDelivery] = [:]
        var results: [Finished] = []
        var nextClaimAt: Int64 = 0
        var consecutiveFailures = 0
        var localFailures = 0
        /// Local failures since a request last reached the receiver: while any, one delivery at a
        /// time and no wake cuts the `localRetryMillis` wait (a failure that persists, e.g. a
        /// libcurl without a needed feature, must not turn every commit into a failed turn).
        var localFailuresInARow = 0
        var nextBacklogAt: Int64 = 0
        /// The cursor this sender holds for the webhook (nil: not yet, or another node does).
        var cursor: WebhookCursorGrant?
    }

    private func run(_ transport: WebhookTransport) {
        lowerPriority()
        var states = Array(repeating: WebhookState(), count: endpoints.count)
        var nextKey = 0
        var stopDeadline: Int64?
        while true {
            var now = clock.nowMillis()
            if stopping.load(ordering: .sequentiallyConsistent), stopDeadline == nil {
                stopDeadline = now + Int64(graceMillis.load(ordering: .sequentiallyConsistent))
            }
            if let deadline = stopDeadline, transport.inFlight == 0 || now >= deadline { break }
            if woken.exchange(false, ordering: .sequentiallyConsistent) {
                for i in states.indices where states[i].consecutiveFailures == 0 && states[i].localFailuresInARow == 0 { states[i].nextClaimAt = 0 }
            }
            for (key, outcome) in transport.perform() {
                now = clock.nowMillis()
                guard let i = states.firstIndex(where: { $0.inFlight[key] != nil }), let delivery = states[i].inFlight.removeValue(forKey: key) else { continue }
                finish(i, &states[i], delivery, outcome, now: now)
            }
            for i in endpoints.indices {
                // A wall clock stepped back must not postpone claims by the size of the step.
                states[i].nextClaimAt = min(states[i].nextClaimAt, now + maxClaimDelay(i))
                exchange(i, &states[i], transport, now: now, claiming: stopDeadline == nil, nextKey: &nextKey)
                if stopDeadline == nil, now >= states[i].nextBacklogAt {
                    states[i].nextBacklogAt = now + backlogRefreshMillis
                    metrics.backlog(endpoints[i].name, try? outbox.pendingWebhookDeliveries(webhook: endpoints[i].name))
                }
            }
            // Sleep until the next claim is due (at most idlePollMillis); curl_multi_poll also
            // returns for socket activity and curl's own timers while transfers run.
            var wait = Int64(idlePollMillis)
            if stopDeadline == nil {
                for (i, s) in states.enumerated() where s.inFlight.count < limit(i, s) { wait = min(wait, max(0, s.nextClaimAt - now)) }
            }
            if wait > 0 || transport.inFlight > 0 { transport.poll(timeoutMillis: Int(wait)) }
        }
        for i in endpoints.indices { exchange(i, &states[i], transport, now: clock.nowMillis(), claiming: false, release: true, nextKey: &nextKey) }
    }

    /// This thread only: on Linux a nice value belongs to a thread, and `who` 0 is the calling
    /// one (setpriority(2), NOTES). A failure is logged, not fatal: the sender then competes
    /// with ingest at the process's priority.
    private func lowerPriority() {
        guard niceness != 0 else { return }
        if setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, niceness) != 0 {
            logger.warning("webhooks thread priority not lowered", ["niceness": Int(niceness), "error": String(cString: strerror(errno))])
        }
    }

    /// The longest a claim is ever put off: the idle poll or the receiver pause's cap.
    private func maxClaimDelay(_ i: Int) -> Int64 {
        max(Int64(idlePollMillis), endpoints[i].retry.pauseCapMillis)
    }

    /// A failing receiver gets one probe at a time.
    private func limit(_ i: Int, _ s: WebhookState) -> Int {
        s.consecutiveFailures > 0 || s.localFailuresInARow > 0 ? 1 : endpoints[i].maxConcurrent
    }

    /// The turn's one store call per webhook: records its results, advances the cursor over
    /// the finished new events and, when a claim is due and there is room, claims the next
    /// deliveries in the same transaction (on SQLite one writer job), then signs and starts
    /// them. If the store refuses, the results are kept for the next turn (at most the
    /// deliveries that were in flight: nothing new is claimed meanwhile).
    private func exchange(_ i: Int, _ s: inout WebhookState, _ transport: WebhookTransport, now: Int64, claiming: Bool, release: Bool = false,
                          nextKey: inout Int) {
        let endpoint = endpoints[i]
        let room = claiming && now >= s.nextClaimAt ? max(0, limit(i, s) - s.inFlight.count) : 0
        guard room > 0 || !s.results.isEmpty || release else { return }
        // Longer than any attempt can take (connect + transfer are each bounded by the timeout),
        // so a delivery comes back to a later claim only if this sender died holding it.
        // The cursor's lease is renewed once a quarter is used (WebhookCursorRules.renewedLease):
        // at least 45 s left, past the receiver pause's cap, between two turns of a live sender.
        let leaseUntil = now + 2 * Int64(endpoint.timeoutMillis) + 60_000
        let results = s.results
        s.results.removeAll(keepingCapacity: true)
        let position = s.cursor.map { g in
            WebhookCursorPosition(epoch: g.epoch, through: WebhookCursorRules.through(
                claimedThrough: g.claimedThrough, inFlight: s.inFlight.values.lazy.filter { $0.fromCursor && $0.claim == g.epoch }.map(\.sequence)),
                claimedThrough: g.claimedThrough)
        }
        let exchanged: WebhookExchange
        do {
            exchanged = try outbox.recordAndClaimWebhookDeliveries(webhook: endpoint.name, results: results.map(\.record), cursor: position, now: now,
                                                                   leaseUntil: leaseUntil, limit: room, releaseCursor: release)
        } catch {
            if !results.isEmpty {
                s.results = results + s.results
                logger.error("webhook results not recorded yet; tried again next turn", ["webhook": endpoint.name, "count": results.count, "error": "\(error)"])
            }
            if room > 0 {
                logger.error("webhook claim failed", ["webhook": endpoint.name, "error": "\(error)"])
                s.nextClaimAt = now + Int64(idlePollMillis)
            }
            return
        }
        countRecorded(i, results, stale: exchanged.staleResults)
        s.cursor = exchanged.cursor
        noteStale(i, exchanged.stale)
        // Fewer than asked: nothing more is due now; look again after the idle poll.
        if room > 0, exchanged.claimed.count < room { s.nextClaimAt = now + Int64(idlePollMillis) }
        for delivery in exchanged.claimed {
            // Rendered here, on this thread, from the columns the claim returned.
            let event = delivery.event
            let headers = WebhookSigning.headers(id: event.id, timestamp: now / 1000, body: event.body, secrets: endpoint.secrets)
            let key = nextKey
            nextKey &+= 1
            do {
                try transport.add(WebhookRequest(key: key, url: endpoint.url, headers: headers.map { $0.name + ": " + $0.value },
                                                 body: event.body, timeoutMillis: endpoint.timeoutMillis, caFile: endpoint.caFile))
                s.inFlight[key] = delivery
            } catch {
                finish(i, &s, delivery, .local(error.description), now: now)
            }
        }
    }

    private func finish(_ i: Int, _ s: inout WebhookState, _ delivery: WebhookDelivery, _ outcome: WebhookTransferOutcome, now: Int64) {
        let endpoint = endpoints[i]
        let error: String
        if case .local = outcome {} else { s.localFailuresInARow = 0 }
        switch outcome {
        case .status(let status) where (200..<300).contains(status):
            s.results.append(Finished(record: WebhookAttemptRecord(delivery, .delivered(at: now)), eventCreatedAt: delivery.eventCreatedAt))
            s.consecutiveFailures = 0
            metrics.failing(endpoint.name, consecutiveFailures: 0)
            return
        case .status(let status): error = "HTTP \(status)"
        case .failed(let text): error = text
        case .local(let text):
            notSent(i, &s, delivery, text, now: now)
            return
        }
        let result = endpoint.retry.afterFailure(attemptsBefore: delivery.attempts, firstAttemptAt: delivery.firstAttemptAt, now: now,
                                                 error: error, random: random.unit())
        s.results.append(Finished(record: WebhookAttemptRecord(delivery, result), eventCreatedAt: delivery.eventCreatedAt))
        s.consecutiveFailures += 1
        s.nextClaimAt = max(s.nextClaimAt, now + endpoint.retry.receiverPause(failures: s.consecutiveFailures))
        metrics.failing(endpoint.name, consecutiveFailures: s.consecutiveFailures)
        if case .dead = result {
            logger.error("webhook event dead", ["webhook": endpoint.name, "event": delivery.eventID, "attempts": delivery.attempts + 1, "error": error])
        } else {
            metrics.failedAttempt(endpoint.name)
            if s.consecutiveFailures == 1 || s.consecutiveFailures % 100 == 0 {
                logger.warning("webhook attempt failed", ["webhook": endpoint.name, "event": delivery.eventID, "error": error,
                                                          "consecutiveFailures": s.consecutiveFailures])
            }
        }
    }

    /// A failure here, not the receiver's: not an attempt (the retry window and the receiver's
    /// pause are untouched), sent again after `localRetryMillis`, and claims wait as long (the
    /// next ones would most likely fail alike).
    private func notSent(_ i: Int, _ s: inout WebhookState, _ delivery: WebhookDelivery, _ error: String, now: Int64) {
        let endpoint = endpoints[i]
        s.results.append(Finished(record: WebhookAttemptRecord(delivery, .notSent(failedAt: now, at: now + Self.localRetryMillis, error: error)),
                                  eventCreatedAt: delivery.eventCreatedAt))
        s.nextClaimAt = max(s.nextClaimAt, now + Self.localRetryMillis)
        s.localFailures += 1
        s.localFailuresInARow += 1
        metrics.localFailure(endpoint.name)
        if s.localFailures == 1 || s.localFailures % 100 == 0 {
            logger.error("webhook request not sent: local failure, not the receiver's; tried again", ["webhook": endpoint.name, "event": delivery.eventID,
                                                                                                     "error": error, "localFailures": s.localFailures])
        }
    }

    /// Sent and dead count results the store committed (a failed commit keeps them for the next
    /// turn, counted once that one commits), not those it dropped as stale (the newer claim's
    /// result is counted instead): the counters never run ahead of the store.
    private func countRecorded(_ i: Int, _ results: [Finished], stale: [Int]) {
        var stale = stale.makeIterator(), nextStale = stale.next()
        for (at, f) in results.enumerated() {
            if at == nextStale { nextStale = stale.next(); continue }
            switch f.record.result {
            case .delivered(let at): metrics.sent(endpoints[i].name, latencySeconds: Double(max(0, at - f.eventCreatedAt)) / 1000)
            case .dead: metrics.dead(endpoints[i].name)
            case .retry, .notSent: break
            }
        }
    }

    /// Results of an earlier claim (the lease ended and the delivery was claimed again, or it was
    /// replayed) are not recorded: the later claim's result stands.
    private func noteStale(_ i: Int, _ stale: Int) {
        guard stale > 0 else { return }
        metrics.staleResults(endpoints[i].name, stale)
        logger.debug("webhook results of an earlier claim not recorded", ["webhook": endpoints[i].name, "count": stale])
    }
}

extension WebhookSender: OutboxCommitObserver {
    /// A commit of this process that wrote events (other nodes' are found by the idle poll).
    public func committed(_ commit: OutboxCommit) {
        if commit.events != nil { wake() }
    }
}
