import Testing
@testable import RelayCore

/// The rules both stores call (StoreRules); StoreContractTests check each store applies them.
@Suite struct StoreRulesTests {
    /// What each outcome writes to its row (both backends' apply SQL takes these columns).
    @Test func outcomeColumns() {
        typealias C = StoreRules.OutcomeColumns
        let a = AttemptRecord(responseID: "r", attemptedAt: 5, status: 503, reason: "ServiceUnavailable")
        let none = AttemptRecord(responseID: "r", attemptedAt: 5, status: nil, reason: "timeout")
        #expect(StoreRules.outcomeColumns(.delivered, attempt: AttemptRecord(responseID: "r", attemptedAt: 5, status: 200, reason: nil))
                == C(state: .delivered, attemptsAdded: 1, nextAttemptAt: nil, last: .init(status: 200, reason: nil)))
        #expect(StoreRules.outcomeColumns(.failed(reason: "BadTopic"), attempt: a)
                == C(state: .failed, attemptsAdded: 1, nextAttemptAt: nil, last: .init(status: 503, reason: "BadTopic")))
        #expect(StoreRules.outcomeColumns(.failed(reason: "expired"), attempt: nil)
                == C(state: .failed, attemptsAdded: 0, nextAttemptAt: nil, last: .init(status: nil, reason: "expired")))
        #expect(StoreRules.outcomeColumns(.unregistered(reason: "Unregistered", apnsTimestamp: 3), attempt: a)
                == C(state: .failed, attemptsAdded: 1, nextAttemptAt: nil, last: .init(status: 503, reason: "Unregistered")))
        #expect(StoreRules.outcomeColumns(.retry(at: 99, paceTokenUntil: 120), attempt: none)
                == C(state: .retry, attemptsAdded: 1, nextAttemptAt: 99, last: .init(status: nil, reason: "timeout")))
        // Put back unsent: attempts and the last answer stand.
        #expect(StoreRules.outcomeColumns(.requeue, attempt: nil) == C(state: .queued, attemptsAdded: 0, nextAttemptAt: nil, last: nil))
        #expect(StoreRules.outcomeColumns(.release(at: 77), attempt: nil) == C(state: .queued, attemptsAdded: 0, nextAttemptAt: 77, last: nil))
    }

    let hash: [UInt8] = Array(repeating: 7, count: 32)
    func cred(apps: [String], revoked: Bool = false) -> CredentialFacts {
        CredentialFacts(id: "cred_1", hash: hash, apps: apps, revoked: revoked)
    }

    @Test func admission() {
        let apps: Set<String> = ["a", "b"]
        #expect(StoreRules.admit(credential: nil, presentedHash: hash, requestedApp: nil, configuredApps: apps) == .refused(.unauthorized))
        #expect(StoreRules.admit(credential: cred(apps: ["a"], revoked: true), presentedHash: hash, requestedApp: nil, configuredApps: apps) == .refused(.unauthorized))
        // A row found under another hash (never by the index, but the rule does not trust it).
        #expect(StoreRules.admit(credential: cred(apps: ["a"]), presentedHash: Array(repeating: 8, count: 32), requestedApp: nil, configuredApps: apps) == .refused(.unauthorized))
        #expect(StoreRules.admit(credential: cred(apps: ["a"]), presentedHash: hash, requestedApp: nil, configuredApps: apps) == .admitted(credentialID: "cred_1", app: "a"))
        #expect(StoreRules.admit(credential: cred(apps: ["c"]), presentedHash: hash, requestedApp: nil, configuredApps: apps) == .refused(.unknownApp("c")))
        #expect(StoreRules.admit(credential: cred(apps: ["a", "b"]), presentedHash: hash, requestedApp: nil, configuredApps: apps) == .refused(.appRequired))
        #expect(StoreRules.admit(credential: cred(apps: ["a", "b"]), presentedHash: hash, requestedApp: "b", configuredApps: apps) == .admitted(credentialID: "cred_1", app: "b"))
        #expect(StoreRules.admit(credential: cred(apps: ["a"]), presentedHash: hash, requestedApp: "b", configuredApps: apps) == .refused(.forbidden(app: "b")))
        #expect(StoreRules.admit(credential: cred(apps: ["a"]), presentedHash: hash, requestedApp: "z", configuredApps: apps) == .refused(.unknownApp("z")))
    }

    /// The app rule alone, as ingest asks it (from its cached credential) before charging the
    /// push-token bucket: the same answers admit gives a live credential.
    @Test func appResolution() {
        let apps: Set<String> = ["a", "b"]
        #expect(StoreRules.app(credentialApps: ["a"], requestedApp: nil, configuredApps: apps) == .app("a"))
        #expect(StoreRules.app(credentialApps: ["a", "b"], requestedApp: "b", configuredApps: apps) == .app("b"))
        #expect(StoreRules.app(credentialApps: ["a", "b"], requestedApp: nil, configuredApps: apps) == .refused(.appRequired))
        #expect(StoreRules.app(credentialApps: ["a"], requestedApp: "b", configuredApps: apps) == .refused(.forbidden(app: "b")))
        #expect(StoreRules.app(credentialApps: ["c"], requestedApp: nil, configuredApps: apps) == .refused(.unknownApp("c")))
        #expect(StoreRules.app(credentialApps: ["a", "z"], requestedApp: "z", configuredApps: apps) == .refused(.unknownApp("z")))
    }

    @Test func dedupeAnswersOnlyTheOwnCredential() {
        let row = ExistingRow(id: "0190", state: .delivered, credentialID: "cred_b", encryptedData: [1, 2, 3])
        #expect(StoreRules.dedupe(row, credentialID: "cred_b", encryptedData: [1, 2, 3]) == .duplicate(id: "0190", state: .delivered))
        #expect(StoreRules.dedupe(row, credentialID: "cred_a", encryptedData: [1, 2, 3]) == .conflict)
        // Another sealed box at the credential's own key: refused with its id; from another
        // credential still only a conflict (the other row's box is not compared).
        #expect(StoreRules.dedupe(row, credentialID: "cred_b", encryptedData: [1, 2, 4]) == .indexReused(id: "0190"))
        #expect(StoreRules.dedupe(row, credentialID: "cred_b", encryptedData: [1, 2]) == .indexReused(id: "0190"))
        #expect(StoreRules.dedupe(row, credentialID: "cred_a", encryptedData: [9]) == .conflict)
    }

    /// The cutoff a mark records, and the one rule every row meets it by, in any state.
    @Test func markCutoffCoversEveryRowAcceptedUpToIt() {
        #expect(StoreRules.markCutoff(apnsTimestamp: 10, newestPendingCreatedAt: nil, now: 50) == 10)
        #expect(StoreRules.markCutoff(apnsTimestamp: 10, newestPendingCreatedAt: 12, now: 50) == 12)
        #expect(StoreRules.markCutoff(apnsTimestamp: 10, newestPendingCreatedAt: 3, now: 50) == 10)
        // APNs' clock ahead of ours: the cutoff stops at now, so the probes that follow are pushed.
        #expect(StoreRules.markCutoff(apnsTimestamp: 900, newestPendingCreatedAt: 12, now: 50) == 50)
        // (createdAt, cutoff) -> covered: a pending row fails at claim, a delivered one keeps the mark.
        let table: [(created: Int64, cutoff: Int64, covered: Bool)] = [(9, 10, true), (10, 10, true), (11, 10, false), (.min, 0, true)]
        for t in table {
            #expect(StoreRules.isCovered(createdAt: t.created, cutoff: t.cutoff) == t.covered)
            #expect(StoreRules.deliveredClearsMark(createdAt: t.created, cutoff: t.cutoff) == !t.covered)
            #expect((StoreRules.claimVerdict(createdAt: t.created, expiresAt: .max, now: 0, unregisteredCutoff: t.cutoff, pacedUntil: nil) == .unregistered)
                    == t.covered)
        }
        #expect(StoreRules.coveredSQL(row: "r", mark: "u") == "r.created_at <= u.apns_timestamp")
    }

    /// Ingest for a marked token: refused during the hold, then one probe (the store restarts the
    /// hold with it); a 410 hold of 0 refuses until forgotten, a BadDeviceToken hold of 0 holds nothing.
    @Test func markAdmissionHoldsThenLetsOneProbeThrough() {
        let s = IngestStoreSettings(unregisteredQuarantineMillis: 1_000, badDeviceTokenHoldMillis: 500)
        let strict = IngestStoreSettings(unregisteredQuarantineMillis: 0, badDeviceTokenHoldMillis: 0)
        let rows: [(reason: String, recorded: Int64, now: Int64, settings: IngestStoreSettings, want: StoreRules.MarkAdmission)] = [
            ("Unregistered", 100, 100, s, .refused(.unregistered)),
            ("Unregistered", 100, 1_099, s, .refused(.unregistered)),
            ("Unregistered", 100, 1_100, s, .probe),
            ("ExpiredToken", 100, 1_099, s, .refused(.unregistered)),
            ("BadDeviceToken", 100, 599, s, .refused(.badDeviceToken)),
            ("BadDeviceToken", 100, 600, s, .probe),
            ("Unregistered", 100, .max, strict, .refused(.unregistered)),
            ("BadDeviceToken", 100, 100, strict, .open),
            ("Unregistered", .max - 10, .max, s, .refused(.unregistered)),   // no overflow into a probe
        ]
        for r in rows {
            #expect(StoreRules.markAdmission(reason: r.reason, recordedAt: r.recorded, now: r.now, settings: r.settings) == r.want,
                    "\(r.reason) recorded \(r.recorded) now \(r.now)")
        }
    }

    @Test func requeueRules() {
        #expect(StoreRules.requeueableStates == [.failed, .retry])
        #expect(StoreRules.requeueableSQL == "('failed','retry')")
        #expect(StoreRules.requeueExpiryFloor(now: 1000) == 3_601_000)
    }

    @Test func onlyTerminalRowsArePurged() throws {
        try StoreRules.checkPurgeable(.delivered)
        try StoreRules.checkPurgeable(.failed)
        for s in [ResponseState.queued, .inflight, .retry] {
            #expect(throws: StoreError.self) { try StoreRules.checkPurgeable(s) }
        }
    }

    @Test func lastUsedIsWrittenOncePerMinute() {
        #expect(StoreRules.lastUsedIsStale(touchedAt: nil, now: 1_000_000))
        #expect(!StoreRules.lastUsedIsStale(touchedAt: 1_000_000, now: 1_059_999))
        #expect(!StoreRules.lastUsedIsStale(touchedAt: 1_000_000, now: 1_060_000))
        #expect(StoreRules.lastUsedIsStale(touchedAt: 1_000_000, now: 1_060_001))
    }

    @Test func aClaimFailsRowsUpToTheCutoffAndPutsBackPacedOrScanningTokens() {
        func v(created: Int64 = 100, expires: Int64 = 10_000, now: Int64 = 1_000, cutoff: Int64? = nil, paced: Int64? = nil,
               scan: Int64? = nil) -> StoreRules.ClaimVerdict {
            StoreRules.claimVerdict(createdAt: created, expiresAt: expires, now: now, unregisteredCutoff: cutoff, pacedUntil: paced, scanStartedAt: scan)
        }
        #expect(v() == .send)
        #expect(v(expires: 1_000, cutoff: 500) == .expired)           // expiry first, as before a push
        #expect(v(cutoff: 100) == .unregistered)                      // accepted at the cutoff: refused then too
        #expect(v(cutoff: 99) == .send)                               // accepted after it: seen since
        #expect(v(cutoff: 100, paced: 5_000) == .unregistered)
        #expect(v(paced: 5_000) == .postpone(until: 5_000))
        #expect(v(paced: 1_000) == .send)                             // pacing over
        #expect(v(scan: 900) == .postpone(until: 2_000))              // at least a second
        #expect(v(now: 9_000, scan: 4_000) == .postpone(until: 14_000))
        #expect(StoreRules.scanHoldUntil(scanStartedAt: 4_000, now: 9_000) == 14_000)   // as long as the scan has run
    }

    @Test func tokenUnregisteredEventsAreThe410sFinishedRowsOwners() {
        typealias A = StoreRules.MarkingAnswer
        let bad = StoreRules.badDeviceTokenReason
        #expect(StoreRules.tokenUnregisteredEvents([]) == nil)
        // Only finished 410 rows count; owners once each, sorted; the newest 410 timestamp.
        let r = StoreRules.tokenUnregisteredEvents([
            A(reason: "Unregistered", apnsTimestamp: 5, credentialID: "c2", app: "x", finished: true),
            A(reason: "ExpiredToken", apnsTimestamp: 9, credentialID: "c1", app: "x", finished: true),
            A(reason: "Unregistered", apnsTimestamp: 7, credentialID: "c2", app: "x", finished: true),
            A(reason: "Unregistered", apnsTimestamp: 99, credentialID: "c3", app: "x", finished: false),
            A(reason: bad, apnsTimestamp: 100, credentialID: "c4", app: "x", finished: true),
        ])
        #expect(r?.unregisteredAt == 9)
        #expect(r?.owners.map { "\($0.credentialID)/\($0.app)" } == ["c1/x", "c2/x"])
        #expect(StoreRules.tokenUnregisteredEvents([A(reason: bad, apnsTimestamp: 1, credentialID: "c", app: "x", finished: true)]) == nil)
        #expect(StoreRules.tokenUnregisteredEvents([A(reason: "Unregistered", apnsTimestamp: 1, credentialID: "c", app: "x", finished: false)]) == nil)
        // The mark: the newest timestamp's reason, the later answer on a tie.
        #expect(StoreRules.markFrom([]) == nil)
        #expect(StoreRules.markFrom([("Unregistered", 5), (bad, 5), ("ExpiredToken", 3)])! == (bad, 5))
    }
}
