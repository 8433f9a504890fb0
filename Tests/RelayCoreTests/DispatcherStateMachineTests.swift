import Testing
@testable import RelayCore

/// The dispatcher's decisions without threads, clocks or a store: events in, actions out.
@Suite struct DispatcherStateMachineTests {
    typealias Action = DispatcherStateMachine.Action

    func machine(claimBatch: Int = 10, idle: Int64 = 1000, apps: Set<String> = ["com.example.app"]) -> DispatcherStateMachine {
        DispatcherStateMachine(claimBatch: claimBatch, idlePollMillis: idle,
                               policy: DeliveryPolicy(backoffBaseMillis: 1000, backoffCapMillis: 4000), apps: apps)
    }

    func row(_ n: Int, app: String = "com.example.app", attempts: Int = 0) -> OutboxRow {
        OutboxRow(id: "id-\(n)", app: app, pushToken: String(repeating: "ab", count: 32), sessionIdentifier: "S", keyID: [1, 2, 3, 4],
                  messageIndex: UInt32(n), encryptedData: [0], credentialID: "cred_1", state: .inflight, attempts: attempts,
                  nextAttemptAt: 0, createdAt: 0, expiresAt: 1_000_000, lastStatus: nil, lastReason: nil, updatedAt: 0,
                  leaseEpoch: 40 + Int64(n))   // each row's own lease: every update must carry it back
    }

    func inbox(free: Int, rows: [OutboxRow] = [], due: Bool = false, answers: [FinishedPush] = [], stop: Bool = false,
               graceOver: Bool = false, at: Int64 = 0) -> DispatchInbox {
        DispatchInbox(rows: rows, mayHaveDue: due, answers: answers, stopRequested: stop, graceOver: graceOver, freeSlots: free,
                      takenAt: at)
    }

    func answer(_ r: OutboxRow, status: Int? = 200, at: Int64 = 100, duringStop: Bool = false) -> FinishedPush {
        let a: PushAnswer
        switch status {
        case 200: a = PushAnswer(status: 200, reason: nil, classification: .done)
        case 503: a = PushAnswer(status: 503, reason: "ServiceUnavailable", classification: .backOff)
        default: a = PushAnswer(status: status, reason: "shutdown", classification: .backOff)
        }
        return FinishedPush(row: r, answer: a, at: at, latencyMicros: 7, random: 0.5, duringStop: duringStop)
    }

    func delivered(_ r: OutboxRow, at: Int64 = 100) -> DeliveryUpdate {
        DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .delivered,
                       attempt: AttemptRecord(responseID: r.id, attemptedAt: at, status: 200, reason: nil, latencyMicros: 7), leaseEpoch: r.leaseEpoch)
    }

    func requeue(_ r: OutboxRow) -> DeliveryUpdate { DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .requeue, attempt: nil, leaseEpoch: r.leaseEpoch) }

    // MARK: capacity

    @Test func theFirstTurnClaimsUpToTheFreeSlotsAndTheBatch() {
        var m = machine(claimBatch: 10)
        #expect(m.received(inbox(free: 4)) == [.claim(limit: 4)])
        var n = machine(claimBatch: 10)
        #expect(n.received(inbox(free: 256)) == [.claim(limit: 10)])
    }

    @Test func withEverySlotTakenItWaitsTheIdlePollWithoutClaimingOrAskingWhenRowsAreDue() {
        var m = machine(idle: 1000)
        #expect(m.received(inbox(free: 0, due: true)) == [.wait(millis: 1000)])
        #expect(m.mayHaveDue)   // kept for when a slot frees
        // An answer frees a slot: the pending wake makes it claim.
        let r = row(1)
        _ = m.claimed([r], limit: 1)
        #expect(m.received(inbox(free: 1, answers: [answer(r)])) == [.report(answer(r), .delivered), .apply([delivered(r)]), .claim(limit: 1)])
    }

    @Test func aFullClaimGoesRoundAgainAndAShortOneLooksUpTheNextDueTime() {
        var m = machine(claimBatch: 2)
        #expect(m.received(inbox(free: 5)) == [.claim(limit: 2)])
        let rows = [row(1), row(2)]
        #expect(m.claimed(rows, limit: 2) == [.send(rows), .wait(millis: 0)])
        #expect(m.mayHaveDue)
        #expect(m.received(inbox(free: 3)) == [.claim(limit: 2)])
        #expect(m.claimed([row(3)], limit: 2) == [.send([row(3)]), .findNextDue])
        #expect(!m.mayHaveDue)
        #expect(m.inflight.count == 3)
    }

    // MARK: mayHaveDue

    @Test func afterAShortClaimOnlyAWakeOrADueRowMakesItClaimAgain() {
        var m = machine(claimBatch: 10, idle: 1000)
        _ = m.received(inbox(free: 10))
        #expect(m.claimed([], limit: 10) == [.findNextDue])
        // Nothing queued: sleep the idle poll, then answers alone do not claim.
        #expect(m.nextDue(nil, now: 5_000) == [.wait(millis: 1000)])
        #expect(m.received(inbox(free: 10)) == [.findNextDue])
        // A row due later: sleep until then, without claiming.
        #expect(m.nextDue(5_300, now: 5_000) == [.wait(millis: 300)])
        #expect(!m.mayHaveDue)
        // Its time came: claim without waiting.
        #expect(m.nextDue(5_300, now: 5_300) == [.wait(millis: 0)])
        #expect(m.mayHaveDue)
        #expect(m.received(inbox(free: 10)) == [.claim(limit: 10)])
        // Queued rows committed (a wake) also make it claim.
        _ = m.claimed([], limit: 10)
        #expect(m.received(inbox(free: 10, due: true)) == [.claim(limit: 10)])
    }

    @Test func answersAndHandedOffRowsReuseTheKnownDueTimeInsteadOfAskingTheStoreEachTime() {
        var m = machine(claimBatch: 10, idle: 1000)
        _ = m.received(inbox(free: 10, at: 5_000))
        #expect(m.claimed([], limit: 10) == [.findNextDue])
        #expect(m.nextDue(5_300, now: 5_000) == [.wait(millis: 300)])
        // A handed-off row and then its answer: sleep on towards the same due time, no lookup.
        let r = row(1)
        #expect(m.received(inbox(free: 9, rows: [r], at: 5_100)) == [.send([r]), .wait(millis: 200)])
        let done = answer(r, at: 5_200)
        #expect(m.received(inbox(free: 10, answers: [done], at: 5_200))
                == [.report(done, .delivered), .apply([delivered(r, at: 5_200)]), .wait(millis: 100)])
        #expect(!m.mayHaveDue)
        // The known time came: claim without a lookup.
        let r2 = row(2)
        #expect(m.received(inbox(free: 9, rows: [r2], at: 5_300)) == [.send([r2]), .wait(millis: 0)])
        #expect(m.mayHaveDue)
        #expect(m.received(inbox(free: 9, at: 5_300)) == [.claim(limit: 9)])
    }

    @Test func theKnownDueTimeIsDroppedByTheIdlePollAnEmptyWaitOrAWake() {
        var m = machine(claimBatch: 10, idle: 1000)
        _ = m.received(inbox(free: 10, at: 5_000))
        _ = m.claimed([], limit: 10)
        _ = m.nextDue(nil, now: 5_000)
        #expect(m.received(inbox(free: 9, rows: [row(1)], at: 5_500)) == [.send([row(1)]), .wait(millis: 1000)])
        // The idle poll's length later it is looked up again (rows another process wrote).
        #expect(m.received(inbox(free: 8, rows: [row(2)], at: 6_000)) == [.send([row(2)]), .findNextDue])
        // A wait that ended with nothing in the inbox: looked up again.
        _ = m.nextDue(nil, now: 6_000)
        #expect(m.received(inbox(free: 8, at: 6_100)) == [.findNextDue])
        // A wake (queued rows or a retry committed): claim, and after the short claim look up.
        _ = m.nextDue(nil, now: 6_100)
        #expect(m.received(inbox(free: 8, due: true, at: 6_200)) == [.claim(limit: 8)])
        #expect(m.claimed([row(3)], limit: 8) == [.send([row(3)]), .findNextDue])
    }

    @Test func aFailedClaimKeepsTheFlagAndSleepsUntilTheNextDueTime() {
        var m = machine()
        _ = m.received(inbox(free: 3))
        #expect(m.claimFailed() == [.findNextDue])
        #expect(m.mayHaveDue)
    }

    // MARK: hand-off and answers

    @Test func handedOffRowsAreSentFirstAndRowsOfAnUnconfiguredAppFail() {
        var m = machine(apps: ["com.example.app"])
        _ = m.received(inbox(free: 10))
        _ = m.claimed([], limit: 10)
        let ok = row(1), gone = row(2, app: "com.example.removed")
        let failed = DeliveryUpdate(id: gone.id, pushToken: gone.pushToken, outcome: .failed(reason: "app_not_configured"), attempt: nil,
                                    leaseEpoch: gone.leaseEpoch)
        #expect(m.received(inbox(free: 8, rows: [ok, gone])) == [.send([ok]), .vacate(1), .apply([failed]), .findNextDue])
        #expect(m.inflight.keys.sorted() == [ok.id])
        // The same for a claimed row.
        let claimedGone = row(3, app: "com.example.removed")
        let failed3 = DeliveryUpdate(id: claimedGone.id, pushToken: claimedGone.pushToken, outcome: .failed(reason: "app_not_configured"),
                                     attempt: nil, leaseEpoch: claimedGone.leaseEpoch)
        _ = m.received(inbox(free: 8, due: true))
        #expect(m.claimed([claimedGone], limit: 8) == [.vacate(1), .apply([failed3]), .findNextDue])
    }

    @Test func answersAreDecidedByThePolicyAndAppliedTogether() {
        var m = machine()
        _ = m.received(inbox(free: 2))
        let a = row(1), b = row(2)
        _ = m.claimed([a, b], limit: 2)
        let actions = m.received(inbox(free: 2, answers: [answer(a), answer(b, status: 503, at: 200)]))
        let retry = DeliveryUpdate(id: b.id, pushToken: b.pushToken, outcome: .retry(at: 700, paceTokenUntil: nil),
                                   attempt: AttemptRecord(responseID: b.id, attemptedAt: 200, status: 503, reason: "ServiceUnavailable", latencyMicros: 7),
                                   leaseEpoch: b.leaseEpoch)
        #expect(actions == [.report(answer(a), .delivered), .report(answer(b, status: 503, at: 200), .retry(at: 700, paceTokenUntil: nil)),
                            .apply([delivered(a), retry]), .claim(limit: 2)])
        #expect(m.inflight.isEmpty)
    }

    @Test func anAnswerForARowNotInFlightIsIgnored() {
        var m = machine()
        _ = m.received(inbox(free: 1))
        _ = m.claimed([], limit: 1)
        #expect(m.received(inbox(free: 1, answers: [answer(row(9))])) == [.findNextDue])
    }

    // MARK: stop

    @Test func stopWithNothingInFlightExitsAtOnce() {
        var m = machine()
        _ = m.received(inbox(free: 1))
        _ = m.claimed([], limit: 1)
        #expect(m.received(inbox(free: 1, due: true, stop: true)) == [.exit(requeue: [])])
        #expect(m.phase == .stopped)
        #expect(m.received(inbox(free: 1, due: true)) == [])
    }

    @Test func stopWaitsForAnswersWithoutClaimingThenExits() {
        var m = machine()
        _ = m.received(inbox(free: 2))
        let a = row(1), b = row(2)
        _ = m.claimed([a, b], limit: 2)
        #expect(m.received(inbox(free: 0, stop: true)) == [.wait(millis: nil)])
        #expect(m.phase == .stopping)
        // Queued rows committed meanwhile: no claim while stopping.
        #expect(m.received(inbox(free: 1, due: true, answers: [answer(a)])) == [.report(answer(a), .delivered), .apply([delivered(a)]), .wait(millis: nil)])
        // A row handed off before the stop is still sent, and waited for.
        let c = row(3)
        #expect(m.received(inbox(free: 1, rows: [c])) == [.send([c]), .wait(millis: nil)])
        #expect(m.received(inbox(free: 0, answers: [answer(b), answer(c)])) ==
                [.report(answer(b), .delivered), .report(answer(c), .delivered), .apply([delivered(b), delivered(c)]), .exit(requeue: [])])
    }

    @Test func theEndOfTheGraceRequeuesWhatIsUnansweredAndLateAnswersAreIgnored() {
        var m = machine()
        _ = m.received(inbox(free: 2))
        let a = row(1), b = row(2)
        _ = m.claimed([a, b], limit: 2)
        #expect(m.received(inbox(free: 0, stop: true)) == [.wait(millis: nil)])
        let actions = m.received(inbox(free: 0, answers: [answer(a)], graceOver: true))
        #expect(actions == [.report(answer(a), .delivered), .apply([delivered(a)]), .exit(requeue: [requeue(b)])])
        #expect(m.phase == .stopped && m.inflight.isEmpty)
        // b answers after its requeue: the requeue stands.
        #expect(m.received(inbox(free: 0, answers: [answer(b)])) == [])
    }

    @Test func aMissingAnswerDuringTheStopIsARequeueNotAnAttempt() {
        var m = machine()
        _ = m.received(inbox(free: 2))
        let a = row(1), b = row(2)
        _ = m.claimed([a, b], limit: 2)
        _ = m.received(inbox(free: 0, stop: true))
        // A transport failure before the stop is an attempt to retry; during it, a requeue.
        let before = answer(a, status: nil, duringStop: false), during = answer(b, status: nil, duringStop: true)
        let actions = m.received(inbox(free: 0, answers: [before, during]))
        guard case .report(_, .retry) = actions[0] else { Issue.record("not a retry: \(actions)"); return }
        #expect(actions[1] == .report(during, .requeue))
        guard case .apply(let updates) = actions[2] else { Issue.record("no apply: \(actions)"); return }
        #expect(updates[0].attempt?.status == nil && updates[0].attempt != nil)
        #expect(updates[1] == requeue(b))
        #expect(actions.last == .exit(requeue: []))
    }
}
