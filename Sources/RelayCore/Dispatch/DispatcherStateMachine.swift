// Every decision of the dispatcher loop as a pure state machine: events in (an inbox taken
// from the DispatchChannel, a claim's rows, the next due time), actions out (send, apply,
// claim, look up the next due time, wait, exit). No threads, clocks or I/O: the Dispatcher
// drives it and tests call it directly.

struct DispatcherStateMachine {
    enum Phase: Equatable {
        case running
        /// Stop requested: no more claims; answers are recorded until none is left in flight
        /// or the grace period ends.
        case stopping
        case stopped
    }

    enum Action: Equatable {
        /// Hand each row to its app's transport (they are in flight from now on).
        case send([OutboxRow])
        /// Write outcomes back (one transaction).
        case apply([DeliveryUpdate])
        /// Count and log one recorded answer.
        case report(FinishedPush, DeliveryOutcome)
        /// Rows the channel counted in flight that will never be answered.
        case vacate(Int)
        /// `claimDue(limit:)`, then `claimed(_:limit:)` or `claimFailed()`.
        case claim(limit: Int)
        /// `nextDueAt()`, then `nextDue(_:now:)`.
        case findNextDue
        /// Take the channel's inbox, waiting up to this long when it is empty (nil: until
        /// something arrives), then `received(_:)`.
        case wait(millis: Int64?)
        /// Return these unanswered rows to queued, then end the thread.
        case exit(requeue: [DeliveryUpdate])
        /// The app is paused from now (log it once; /readyz and the gauge follow `paused`).
        case paused(app: String, reason: String, detail: String)
        /// The app's pause ended (`why`: "probe accepted" or "reload"). After a reload its
        /// released rows are made due now (`hastenQueued`), so they need not wait for a probe time.
        case resumed(app: String, why: String)
    }

    let claimBatch: Int
    /// Longest wait when nothing is due (also bounds how late a row written by another process
    /// is noticed).
    let idlePollMillis: Int64
    let policy: DeliveryPolicy
    /// Apps with a transport; a row for another app fails with "app_not_configured".
    let apps: Set<String>
    let pause: PauseSchedule
    /// Apps whose answers said their credentials or configuration are wrong (AppPause.swift):
    /// their rows are released unsent, one probe per PauseSchedule step.
    private(set) var paused: [String: PausedApp] = [:]
    /// The RelayClock time last seen (inbox taken, next due looked up): a claim's rows are
    /// routed against it.
    private var now: Int64 = 0

    private(set) var phase = Phase.running
    /// Whether a claim could find anything. Cleared when a claim came back short; set again by
    /// a wake (queued rows committed) or when the next due time has passed. With every ingest
    /// handed off, finishing pushes do not each cost an empty claim transaction.
    private(set) var mayHaveDue = true
    /// Sent and not answered: id -> push token and lease epoch, all a requeue at stop needs (the
    /// answer brings its row back in FinishedPush, so the row itself is not kept here).
    private(set) var inflight: [String: (token: String, epoch: Int64)] = [:]
    /// Free slots when the inbox was last taken (what a claim may fill).
    private var freeSlots = 0
    /// The next due time last looked up, and until when it stands (RelayClock ms). Answers and
    /// handed-off rows leave it as it is, so they cost no store query each; a wake (queued rows
    /// committed, a retry written) or a wait that ended empty (the idle poll, which notices rows
    /// another process wrote) drop it. Only read while `mayHaveDue` is false, which only a short
    /// claim sets, and that claim's `findNextDue` replaces it. nil: look it up.
    private var knownDue: (at: Int64?, until: Int64)?

    init(claimBatch: Int, idlePollMillis: Int64, policy: DeliveryPolicy, apps: Set<String>, pause: PauseSchedule = PauseSchedule()) {
        self.claimBatch = claimBatch
        self.idlePollMillis = idlePollMillis
        self.policy = policy
        self.apps = apps
        self.pause = pause
    }

    /// The inbox: answers, handed-off rows, wake, stop, end of grace.
    mutating func received(_ inbox: DispatchInbox) -> [Action] {
        guard phase != .stopped else { return [] }
        var actions: [Action] = []
        var updates: [DeliveryUpdate] = []
        now = max(now, inbox.takenAt)
        for app in inbox.resumeApps.sorted() where paused.removeValue(forKey: app) != nil {
            actions.append(.resumed(app: app, why: "reload"))
        }
        // Handed-off rows first: they wait for nothing but this send.
        let (sendable, failed) = route(inbox.rows)
        if !sendable.isEmpty { actions.append(.send(sendable)) }
        if !failed.isEmpty { actions.append(.vacate(failed.count)) }
        updates += failed
        for push in inbox.answers {
            // Not in flight: answered after the stop returned it to queued, and the requeue stands.
            guard inflight.removeValue(forKey: push.row.id) != nil else { continue }
            let (update, events) = settle(push)
            actions += events
            actions.append(.report(push, update.outcome))
            updates.append(update)
        }
        if !updates.isEmpty { actions.append(.apply(updates)) }
        if inbox.mayHaveDue { mayHaveDue = true }
        if inbox.mayHaveDue || inbox.isEmpty { knownDue = nil }
        if inbox.stopRequested && phase == .running { phase = .stopping }
        guard phase == .running else { return actions + stopping(graceOver: inbox.graceOver) }
        freeSlots = inbox.freeSlots + failed.count
        return actions + claimOrWait(now: inbox.takenAt)
    }

    /// What a claim of `limit` rows returned (already counted in flight by the driver).
    /// `now`: the RelayClock after the claim (a paused app's rows due by the store's clock are
    /// due for its probe too).
    mutating func claimed(_ rows: [OutboxRow], limit: Int, now: Int64? = nil) -> [Action] {
        if let now { self.now = max(self.now, now) }
        if rows.count < limit { mayHaveDue = false }
        var actions: [Action] = []
        let (sendable, failed) = route(rows)
        if !sendable.isEmpty { actions.append(.send(sendable)) }
        if !failed.isEmpty { actions += [.vacate(failed.count), .apply(failed)] }
        // A full claim: more may be due, go round again without waiting.
        return actions + [rows.count == limit ? .wait(millis: 0) : .findNextDue]
    }

    /// The claim failed (logged by the driver): sleep until the next due time, as after a short one.
    mutating func claimFailed() -> [Action] { [.findNextDue] }

    /// The earliest queued/retry row's due time (nil: none, or it could not be read); `now` on
    /// the RelayClock.
    mutating func nextDue(_ at: Int64?, now: Int64) -> [Action] {
        self.now = max(self.now, now)
        knownDue = (at, now + idlePollMillis)
        return waitUntilDue(at, now: now)
    }

    private mutating func waitUntilDue(_ at: Int64?, now: Int64) -> [Action] {
        var wakeAt = now + idlePollMillis
        if let at {
            if at <= now { mayHaveDue = true }
            wakeAt = min(wakeAt, max(at, now))
        }
        return [.wait(millis: max(0, wakeAt - now))]
    }

    private mutating func claimOrWait(now: Int64) -> [Action] {
        guard freeSlots > 0 else { return [.wait(millis: idlePollMillis)] }  // the next answer wakes us
        guard mayHaveDue else {
            if let known = knownDue, now < known.until { return waitUntilDue(known.at, now: now) }
            return [.findNextDue]
        }
        return [.claim(limit: min(freeSlots, claimBatch))]
    }

    private mutating func stopping(graceOver: Bool) -> [Action] {
        if inflight.isEmpty || graceOver {
            let requeue = inflight.map { DeliveryUpdate(id: $0.key, pushToken: $0.value.token, outcome: .requeue, attempt: nil, leaseEpoch: $0.value.epoch) }
            inflight.removeAll()
            phase = .stopped
            return [.exit(requeue: requeue)]
        }
        return [.wait(millis: nil)]   // an answer or the end of the grace period
    }

    /// Rows with a transport become in flight; the others fail with "app_not_configured" (the
    /// app was removed from the configuration after the row was accepted). A paused app's row
    /// goes out as its probe when one is due and none is out; otherwise it is released unsent.
    private mutating func route(_ rows: [OutboxRow]) -> (send: [OutboxRow], failed: [DeliveryUpdate]) {
        guard !paused.isEmpty || rows.contains(where: { !apps.contains($0.app) }) else {
            for row in rows { inflight[row.id] = (row.pushToken, row.leaseEpoch) }
            return (rows, [])
        }
        var send: [OutboxRow] = [], failed: [DeliveryUpdate] = []
        for row in rows {
            if !apps.contains(row.app) {
                failed.append(DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .failed(reason: "app_not_configured"), attempt: nil,
                                             leaseEpoch: row.leaseEpoch))
            } else if var p = paused[row.app] {
                if p.probe == nil && now >= p.probeAt {
                    p.probe = row.id
                    paused[row.app] = p
                    inflight[row.id] = (row.pushToken, row.leaseEpoch)
                    send.append(row)
                } else {
                    failed.append(Self.release(row, at: p.probe == nil ? p.probeAt : now + pause.holdMillis))
                }
            } else {
                inflight[row.id] = (row.pushToken, row.leaseEpoch)
                send.append(row)
            }
        }
        return (send, failed)
    }

    /// One answer's update, and the pause or resume it causes. An answer PauseRule names
    /// pauses the app (or, for its probe, moves to the next probe step) and releases the row
    /// unsent; any other answer below 500 while paused shows APNs accepted the credentials:
    /// resumed. A 5xx or no answer says nothing about them: a probe's moves to the next step.
    private mutating func settle(_ push: FinishedPush) -> (DeliveryUpdate, [Action]) {
        let row = push.row, answer = push.answer
        if let reason = PauseRule.reason(status: answer.status, reason: answer.reason) {
            var events: [Action] = []
            var p: PausedApp
            if let known = paused[row.app] {
                p = known
                if p.probe == row.id {
                    p.step += 1
                    p.probe = nil
                    p.probeAt = push.at + pause.delay(step: p.step, random: push.random)
                    // Still paused, for another reason now (e.g. a new key with the wrong topic):
                    // a state change of its own, said once.
                    if p.reason != reason {
                        p.reason = reason
                        events.append(.paused(app: row.app, reason: reason, detail: answer.reason ?? ""))
                    }
                }
            } else {
                p = PausedApp(reason: reason, step: 0, probeAt: push.at + pause.delay(step: 0, random: push.random), probe: nil)
                events.append(.paused(app: row.app, reason: reason, detail: answer.reason ?? ""))
            }
            paused[row.app] = p
            return (Self.release(row, at: p.probe == nil ? p.probeAt : push.at + pause.holdMillis), events)
        }
        var events: [Action] = []
        if var p = paused[row.app] {
            if let status = answer.status, status < 500 {
                paused[row.app] = nil
                events.append(.resumed(app: row.app, why: "probe accepted"))
            } else if p.probe == row.id {
                // No answer (connect, TLS, timeout) or a 5xx: nothing about the credentials;
                // the row retries as usual and the next probe waits a step longer.
                p.step += 1
                p.probe = nil
                p.probeAt = push.at + pause.delay(step: p.step, random: push.random)
                paused[row.app] = p
            }
        }
        return (Self.update(for: push, policy: policy), events)
    }

    /// Back to queued as if never sent (no attempt), due at `at`; while paused a row fails only
    /// by its TTL ("expired").
    static func release(_ row: OutboxRow, at: Int64) -> DeliveryUpdate {
        if at >= row.expiresAt {
            return DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .failed(reason: "expired"), attempt: nil, leaseEpoch: row.leaseEpoch)
        }
        return DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .release(at: at), attempt: nil, leaseEpoch: row.leaseEpoch)
    }

    /// The outcome of one answer and its attempt record. A missing answer during a stop
    /// (shutdown, or a connection dropped while draining) is a requeue, not an attempt.
    static func update(for push: FinishedPush, policy: DeliveryPolicy) -> DeliveryUpdate {
        let row = push.row, answer = push.answer
        var outcome = policy.decide(answer, row: row, now: push.at, random: push.random)
        if push.duringStop && answer.status == nil { outcome = .requeue }
        let attempt = outcome == .requeue ? nil : AttemptRecord(
            responseID: row.id, attemptedAt: push.at, status: answer.status, reason: answer.reason,
            apnsTimestamp: answer.apnsTimestamp, latencyMicros: push.latencyMicros)
        return DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: outcome, attempt: attempt, leaseEpoch: row.leaseEpoch)
    }
}
