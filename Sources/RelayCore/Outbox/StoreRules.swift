// The rules both OutboxStore backends apply, as pure functions over facts each store reads in
// its own transaction: SQLite and PostgreSQL call these instead of writing the rule twice, so
// they cannot drift (StoreRulesTests test the rules; StoreContractTests test both stores).

/// A credentials row as ingest needs it.
struct CredentialFacts: Sendable, Equatable {
    var id: String
    var hash: [UInt8]
    var apps: [String]
    var revoked: Bool
}

/// An existing row with the same dedupe key (app, pushToken, sessionIdentifier, keyID,
/// messageIndex). Read only when a key matches, so new rows never pay for `encryptedData`.
struct ExistingRow: Sendable, Equatable {
    var id: String
    var state: ResponseState
    var credentialID: String
    var encryptedData: [UInt8]
}

enum StoreRules {
    /// Ingest requests that may wait for a store (SQLite's writer queue, PostgreSQL's ingest
    /// queue) before the next is refused with 503 `storage_unavailable`: each holds a validated
    /// request (up to a few KiB), and without a bound a load the disk or the database cannot
    /// follow grows the relay's memory without end. Eight full SQLite batches.
    static let maxWaitingIngests = 8192

    /// Credential and app scope: either the refusal, or who stores the row under which app.
    enum Admission: Equatable {
        case refused(IngestOutcome)
        case admitted(credentialID: String, app: String)
    }

    /// `credential`: the row found by the presented hash (nil: none). The stored hash is
    /// compared again in constant time so a lookup index never decides alone.
    static func admit(credential: CredentialFacts?, presentedHash: [UInt8], requestedApp: String?, configuredApps: Set<String>) -> Admission {
        guard let c = credential, RelayCrypto.constantTimeEqual(c.hash, presentedHash), !c.revoked else { return .refused(.unauthorized) }
        switch app(credentialApps: c.apps, requestedApp: requestedApp, configuredApps: configuredApps) {
        case .app(let app): return .admitted(credentialID: c.id, app: app)
        case .refused(let outcome): return .refused(outcome)
        }
    }

    enum AppChoice: Equatable {
        case app(String)
        /// 400 `unknown_app` or `app_required`, or 403.
        case refused(IngestOutcome)
    }

    /// The app a live credential's request goes to. IngestService asks it too, from its cached
    /// copy of the credential: the push-token bucket is per app and charges admitted requests only.
    static func app(credentialApps: [String], requestedApp: String?, configuredApps: Set<String>) -> AppChoice {
        if let named = requestedApp {
            guard configuredApps.contains(named) else { return .refused(.unknownApp(named)) }
            guard credentialApps.contains(named) else { return .refused(.forbidden(app: named)) }
            return .app(named)
        }
        guard credentialApps.count == 1 else { return .refused(.appRequired) }
        guard configuredApps.contains(credentialApps[0]) else { return .refused(.unknownApp(credentialApps[0])) }
        return .app(credentialApps[0])
    }

    /// Dedupe is scoped to the credential: its own retry (the same sealed box) gets the stored id
    /// and state; the same key from another credential is a conflict that says nothing about the
    /// other row, whatever its box. Another box at the credential's own key is refused with the
    /// stored id: an accessory persists (chainKey, messageIndex) before it sends, so an index
    /// carries a second box only when a message key was reused or its state restored from a
    /// copy, and that box must not be pushed.
    static func dedupe(_ existing: ExistingRow, credentialID: String, encryptedData: [UInt8]) -> IngestOutcome {
        guard existing.credentialID == credentialID else { return .conflict }
        return existing.encryptedData == encryptedData ? .duplicate(id: existing.id, state: existing.state) : .indexReused(id: existing.id)
    }

    // MARK: token marks (table unregistered_tokens, one row per token: cutoff, reason, recorded_at)
    //
    // APNs' answer for one push can speak for its token: 410 Unregistered or ExpiredToken ("the
    // last time at which APNs confirmed that the device token was no longer valid for the
    // topic. Stop pushing notifications until the device registers a token with a later
    // timestamp"), and 400 BadDeviceToken (a token of the other APNs environment, or not a
    // token: every push to it gets the same 400, and error answers count against the
    // connection). Either marks the token (docs/api.md "Token marks"). The relay never sees a
    // registration: the accessory presenting the token again is the nearest thing, so a mark
    // refuses ingest for a hold, then lets ONE response through as a probe (and holds again);
    // the probe's own answer settles it: 200 removes the mark, 410/400 renews it.

    /// The reason rows covered by a BadDeviceToken mark fail with; any other reason is a 410 mark.
    static let badDeviceTokenReason = "BadDeviceToken"

    /// The cutoff a mark records, in the transaction that fails the answered rows: APNs' timestamp
    /// (the answer's own time for BadDeviceToken), no later than `now` (a clock ahead of ours must
    /// not cover the probes that follow), raised to the newest row of the token still waiting
    /// then. Those were accepted before the relay knew and must not be pushed either.
    static func markCutoff(apnsTimestamp: Int64, newestPendingCreatedAt: Int64?, now: Int64) -> Int64 {
        max(min(apnsTimestamp, now), newestPendingCreatedAt ?? .min)
    }

    /// THE cutoff rule, whatever the row's state: a row accepted at or before its token's cutoff
    /// is covered by the mark. A covered pending row fails at its claim with the mark's reason,
    /// without a push; a covered row's 200 (pushed before the mark was recorded, beside the push
    /// that drew it) leaves the mark as it is. A row accepted after the cutoff is a probe: it is
    /// pushed, and its 200 proves the token valid again (`deliveredClearsMark`).
    static func isCovered(createdAt: Int64, cutoff: Int64) -> Bool { createdAt <= cutoff }
    /// `isCovered` in SQL (both dialects), for `row` (responses) and `mark` (unregistered_tokens).
    static func coveredSQL(row: String, mark: String) -> String { "\(row).created_at <= \(mark).apns_timestamp" }
    /// A delivered row removes its token's mark only when it was not covered by it.
    static func deliveredClearsMark(createdAt: Int64, cutoff: Int64) -> Bool { !isCovered(createdAt: createdAt, cutoff: cutoff) }

    /// What ingest does with a response for a marked token.
    enum MarkAdmission: Equatable {
        /// Refused: 410 `push_token_unregistered` or 400 `bad_device_token`.
        case refused(IngestOutcome)
        /// The hold is over: this response is stored and pushed as the probe, and the hold starts
        /// again from now (recorded_at), so one response per hold reaches APNs.
        case probe
        /// A BadDeviceToken mark while dispatch.badDeviceTokenHoldSeconds is 0: not held.
        case open
    }

    /// `recordedAt`: when the mark's hold last started (its answer recorded, or a probe let
    /// through). Holds (IngestStoreSettings): a 410 mark's quarantine, 0 = refused until
    /// `relayctl tokens forget`; a BadDeviceToken mark's hold, 0 = not held.
    static func markAdmission(reason: String, recordedAt: Int64, now: Int64, settings: IngestStoreSettings) -> MarkAdmission {
        let bad = reason == badDeviceTokenReason
        let hold = bad ? settings.badDeviceTokenHoldMillis : settings.unregisteredQuarantineMillis
        guard hold > 0 else { return bad ? .open : .refused(.unregistered) }
        let (end, overflow) = recordedAt.addingReportingOverflow(hold)
        if !overflow && now >= end { return .probe }
        return .refused(bad ? .badDeviceToken : .unregistered)
    }

    /// PostgreSQL's INSERT checks again, under the token's lock, what its read decided about a
    /// mark: a mark recorded (a 410 or BadDeviceToken) or re-armed (another node's probe) since
    /// the read refuses the row, as `markAdmission` would now (its hold starts again at
    /// recorded_at), except a BadDeviceToken mark while those hold nothing. `mark` is an
    /// unregistered_tokens alias, `seen` the recorded_at the read saw (-1: none), `badHold`
    /// dispatch.badDeviceTokenHoldSeconds in ms (SQL expressions).
    static func markRecordedSinceReadSQL(mark: String, seen: String, badHold: String) -> String {
        "\(mark).recorded_at > \(seen) AND (\(mark).reason <> '\(badDeviceTokenReason)' OR \(badHold) > 0)"
    }

    /// The webhook backlog gauge counts at most this many pending deliveries (reported as this
    /// many above it): a count reads every entry of the pending index, every 10 s per webhook
    /// per node, and a full one over the 1,000,000 a backlog may hold took the reader that long.
    static let webhookBacklogCountCap = 100_000

    /// How long past its hold a mark is kept before retention deletes it (`markIsStale`).
    static let staleMarkMillis: Int64 = 30 * 86_400_000

    /// Bounds of `markIsStale` at one time, for both stores' DELETE (`staleMarkSQL`).
    struct StaleMarkBounds: Equatable {
        /// A 410 mark is stale when recorded before this; Int64.min (none is) while the
        /// quarantine is 0: refused until `relayctl tokens forget`.
        var unregisteredRecordedBefore: Int64
        var badDeviceTokenRecordedBefore: Int64
        /// And its cutoff before this: every row it covers is past ingest.ttlSeconds.
        var cutoffBefore: Int64
    }

    static func staleMarkBounds(now: Int64, settings: IngestStoreSettings) -> StaleMarkBounds {
        func before(_ hold: Int64) -> Int64 {
            let (a, o1) = now.subtractingReportingOverflow(hold)
            let (b, o2) = a.subtractingReportingOverflow(staleMarkMillis)
            return o1 || o2 ? .min : b
        }
        return StaleMarkBounds(unregisteredRecordedBefore: settings.unregisteredQuarantineMillis > 0 ? before(settings.unregisteredQuarantineMillis) : .min,
                               badDeviceTokenRecordedBefore: before(settings.badDeviceTokenHoldMillis),
                               cutoffBefore: { let (c, o) = now.subtractingReportingOverflow(settings.ttlMillis); return o ? .min : c }())
    }

    /// A mark that no longer changes anything, which retention deletes (unregistered_tokens
    /// otherwise keeps every token APNs ever refused): its hold ended `staleMarkMillis` ago with
    /// no probe since (a probe let through restarts the hold, recorded_at), and every row its
    /// cutoff covers is past its time to live. Without it the next response for the token is
    /// simply accepted instead of being the probe of a hold that ended a month ago. A 410 mark
    /// while the quarantine is 0 stays (refused until `relayctl tokens forget`).
    static func markIsStale(reason: String, recordedAt: Int64, cutoff: Int64, bounds b: StaleMarkBounds) -> Bool {
        guard cutoff < b.cutoffBefore else { return false }
        return recordedAt < (reason == badDeviceTokenReason ? b.badDeviceTokenRecordedBefore : b.unregisteredRecordedBefore)
    }

    /// `markIsStale` in SQL (both dialects) over the unregistered_tokens alias `mark`, with the
    /// bounds as parameters (`StaleMarkBounds` fields, in that order).
    static func staleMarkSQL(mark: String, unregisteredBefore: String, badDeviceTokenBefore: String, cutoffBefore: String) -> String {
        "\(mark).apns_timestamp < \(cutoffBefore) AND \(mark).recorded_at < CASE WHEN \(mark).reason = '\(badDeviceTokenReason)' THEN \(badDeviceTokenBefore) ELSE \(unregisteredBefore) END"
    }

    /// One token-marking answer (410 Unregistered / ExpiredToken, or 400 BadDeviceToken) in the
    /// transaction that records the token's mark: its row's owner, and whether this
    /// transaction's outcome UPDATE finished the row (it was still inflight, under this node's
    /// lease: an answer applied twice, or for a row another node took over, finishes nothing).
    struct MarkingAnswer: Equatable {
        var reason: String
        var apnsTimestamp: Int64
        var credentialID: String
        var app: String
        var finished: Bool
    }

    /// The mark the answers of one transaction record: the newest APNs timestamp's answer (the
    /// later one on a tie) gives its reason; the cutoff starts from that timestamp (`markCutoff`).
    static func markFrom(_ answers: [(reason: String, apnsTimestamp: Int64)]) -> (reason: String, apnsTimestamp: Int64)? {
        answers.reduce(nil) { newest, a in a.apnsTimestamp >= (newest?.apnsTimestamp ?? .min) ? a : newest }
    }

    /// The token.unregistered events of one transaction's answers for one token: one per
    /// credential and app (sorted) whose rows a 410 answered AND this transaction finished, with
    /// the newest 410 timestamp as `unregisteredAt`. A BadDeviceToken answer says nothing about
    /// the token's registration (its rows get their own response.failed). A repeated 410 writes
    /// the event again (a new answer of APNs), one for a row already finished does not, and
    /// neither the mark's cutoff nor an ingest newer than the 410 changes what is written.
    static func tokenUnregisteredEvents(_ answers: [MarkingAnswer]) -> (unregisteredAt: Int64, owners: [(credentialID: String, app: String)])? {
        let gone = answers.filter { $0.finished && $0.reason != badDeviceTokenReason }
        guard let at = gone.map(\.apnsTimestamp).max() else { return nil }
        var owners: [(credentialID: String, app: String)] = []
        for a in gone where !owners.contains(where: { $0 == (a.credentialID, a.app) }) { owners.append((a.credentialID, a.app)) }
        owners.sort { ($0.credentialID, $0.app) < ($1.credentialID, $1.app) }
        return (at, owners)
    }

    /// Token-wide work after an APNs answer reads or changes at most this many of the token's
    /// rows per writer transaction, so a token with a million queued rows never holds the
    /// writer (and the ingest batches queued behind it) for more than one such step
    /// (docs/benchmarks.md "Token walk").
    static let tokenWalkChunk = 1000
    /// How far a due row of a token whose 410 is still being recorded (its cutoff scan is under
    /// way) is put back: it waits for the cutoff instead of drawing another 410. At least a
    /// second, and as long as the scan has run so far, so a long scan puts each row back a few
    /// times (the wait doubles), not once a second (docs/benchmarks.md "Token walk").
    static let tokenScanHoldMillis: Int64 = 1000
    static func scanHoldUntil(scanStartedAt: Int64, now: Int64) -> Int64 {
        now + max(tokenScanHoldMillis, now - scanStartedAt)
    }
    /// The reason a 410 mark recorded before schema v8 (SQLite; v4 PostgreSQL) carries: rows
    /// covered by a mark fail with the mark's reason (APNs' reason for the answer that drew it,
    /// so `relayctl retry --reason` finds both alike).
    static let unregisteredReason = "Unregistered"

    /// What a claim does with a due row (queued or retry). `unregisteredCutoff`: the token's
    /// unregistered_tokens cutoff, if any; `pacedUntil`: its token_pacing entry, if any;
    /// `scanStartedAt`: a 410 for the token is being recorded since then (its cutoff not
    /// committed yet).
    enum ClaimVerdict: Equatable {
        case send
        /// Past its TTL: failed "expired" (as before a push).
        case expired
        /// Covered by its token's mark (`isCovered`): APNs has said the token is gone or bad, so
        /// it fails as its own push would have, with the mark's reason, without one.
        case unregistered
        /// Its token is paced (TooManyRequests) or its 410 is being recorded: due again then.
        case postpone(until: Int64)
    }

    static func claimVerdict(createdAt: Int64, expiresAt: Int64, now: Int64, unregisteredCutoff: Int64?, pacedUntil: Int64?,
                             scanStartedAt: Int64? = nil) -> ClaimVerdict {
        if expiresAt <= now { return .expired }
        if let cutoff = unregisteredCutoff, isCovered(createdAt: createdAt, cutoff: cutoff) { return .unregistered }
        if let started = scanStartedAt { return .postpone(until: scanHoldUntil(scanStartedAt: started, now: now)) }
        if let until = pacedUntil, until > now { return .postpone(until: until) }
        return .send
    }

    // MARK: claim order

    /// THE order due rows are claimed in, whatever their state (queued or retry): by due time
    /// (next_attempt_at), a tie by id (UUIDv7: the order rows were accepted in). A retry that
    /// fell due long ago goes before the rows accepted since, so a flood of new responses
    /// cannot starve it (and a retry due later than they waits its turn). PostgreSQL takes
    /// expired leases (rows a stopped node held: waiting longest) before any due row, in
    /// lease-expiry order; SQLite has no leases. StoreContractTests check both backends.
    static func claimsBefore<Tie: Comparable>(dueAt a: Int64, tie ta: Tie, dueAt b: Int64, tie tb: Tie) -> Bool {
        (a, ta) < (b, tb)
    }
    static func claimsBefore(_ a: OutboxRow, _ b: OutboxRow) -> Bool {
        claimsBefore(dueAt: a.nextAttemptAt, tie: a.id, dueAt: b.nextAttemptAt, tie: b.id)
    }
    /// `claimsBefore` as an ORDER BY list (both dialects); `tie` is how the backend spells the
    /// id: PostgreSQL `id`; SQLite `id_high` (the rowid: the id's first 64 bits, in the id's
    /// order for the store's UUIDv7 ids, and the claim index's own order within one due time,
    /// so no sort).
    static func claimOrderSQL(tie: String) -> String { "next_attempt_at, \(tie)" }

    /// `claimVerdict` for PostgreSQL's set-based claim (no scan there: an index gives the
    /// cutoff at once): a CASE over `r` (the row), `u` (its unregistered_tokens row, if any) and
    /// `p` (its token_pacing row, if any), `$1` = now, giving 'send', 'expired', 'unregistered'
    /// (failed with u.reason) or 'postpone' (until p.paced_until). Same order as above; StoreContractTests run both.
    static let claimVerdictSQL = """
        CASE WHEN r.expires_at <= $1 THEN 'expired'
             WHEN u.apns_timestamp IS NOT NULL AND \(coveredSQL(row: "r", mark: "u")) THEN 'unregistered'
             WHEN p.paced_until > $1 THEN 'postpone'
             ELSE 'send' END
        """

    // MARK: outcome columns

    /// What one outcome writes to its row (an inflight row this node still holds), both
    /// backends: the rule once, each backend only spells the UPDATE. Also updated_at = now, and
    /// PostgreSQL clears the lease.
    struct OutcomeColumns: Equatable {
        /// last_status and last_reason, set together (either may be NULL).
        struct Last: Equatable {
            var status: Int64?
            var reason: String?
        }
        var state: ResponseState
        /// Added to attempts: 1 for an attempt recorded with the outcome, 0 without one.
        var attemptsAdded: Int64
        /// The new next_attempt_at; nil keeps it.
        var nextAttemptAt: Int64?
        /// The new last status and reason; nil keeps both (a row put back unsent: its last
        /// answer still stands).
        var last: Last?
    }

    static func outcomeColumns(_ outcome: DeliveryOutcome, attempt: AttemptRecord?) -> OutcomeColumns {
        let counted: Int64 = attempt == nil ? 0 : 1
        let status = attempt?.status.map { Int64($0) }
        switch outcome {
        case .delivered:
            return OutcomeColumns(state: .delivered, attemptsAdded: counted, last: .init(status: status, reason: nil))
        case .failed(let why), .unregistered(let why, _):
            return OutcomeColumns(state: .failed, attemptsAdded: counted, last: .init(status: status, reason: why))
        case .retry(let at, _):
            return OutcomeColumns(state: .retry, attemptsAdded: counted, nextAttemptAt: at, last: .init(status: status, reason: attempt?.reason))
        case .requeue:
            // Not attempted (shutdown): attempts unchanged (DeliveryOutcome.requeue).
            return OutcomeColumns(state: .queued, attemptsAdded: 0)
        case .release(let at):
            return OutcomeColumns(state: .queued, attemptsAdded: 0, nextAttemptAt: at)
        }
    }

    /// An operator requeue (relayctl retry) moves only these: inflight belongs to the
    /// dispatcher, a delivered row requeued would be pushed twice, a queued row is already due.
    static let requeueableStates: [ResponseState] = [.failed, .retry]
    /// `requeueableStates` as an SQL list of literals (both dialects; literals let SQLite's
    /// planner prove a partial index).
    static let requeueableSQL = "(" + requeueableStates.map { "'\($0.rawValue)'" }.joined(separator: ",") + ")"

    /// A requeued row lives at least this long from the requeue, so an operator's retry of an
    /// old failed row is not expired again at once.
    static let requeueTTLExtensionMillis: Int64 = 3_600_000
    static func requeueExpiryFloor(now: Int64) -> Int64 { now + requeueTTLExtensionMillis }

    /// A new credential needs a name and at least one app; a comma would split an app in the
    /// stored list (Credentials.joinApps).
    static func checkNewCredential(name: String, apps: [String]) throws {
        guard !name.isEmpty else { throw StoreError.invalid("credential name must not be empty") }
        guard !apps.isEmpty, apps.allSatisfy({ !$0.isEmpty && !$0.contains(",") }) else {
            throw StoreError.invalid("credential needs at least one app (bundle ID without commas)")
        }
    }

    /// Only terminal rows are purged (by relayctl purge or retention): a pending row is owed a
    /// delivery.
    static func checkPurgeable(_ state: ResponseState) throws {
        guard state.isTerminal else { throw StoreError.invalid("only delivered or failed rows can be purged") }
    }

    /// credentials.last_used_at is kept to the minute: a write per credential and minute, not
    /// per request. `touchedAt`: when this process last wrote it (nil: not yet).
    static let lastUsedResolutionMillis: Int64 = 60_000
    static func lastUsedIsStale(touchedAt: Int64?, now: Int64) -> Bool {
        (touchedAt ?? 0) < now - lastUsedResolutionMillis
    }
}
