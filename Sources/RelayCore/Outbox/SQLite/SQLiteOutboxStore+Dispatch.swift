// SQLiteOutboxStore: the dispatcher's SQL (recover, claim, apply outcomes) and the row decoder.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads

extension SQLiteOutboxStore {
    public func recoverInflight() throws -> Int {
        let now = clock.nowMillis()
        return try write { db in
            try db.run("UPDATE responses SET state = 'queued', updated_at = ? WHERE state = 'inflight'", [.integer(now)])
        }
    }

    static let rowColumns = """
        id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state, attempts,
        next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at
        """

    /// A claim's SELECT of one claimable state's due rows (binds: now, limit), in the claim order.
    static func claimSelectSQL(_ state: ResponseState) -> String {
        "SELECT \(rowColumns), rowid FROM responses WHERE state = '\(state.rawValue)' AND next_attempt_at <= ? ORDER BY \(StoreRules.claimOrderSQL(tie: "id_high")) LIMIT ?"
    }

    public func claimDue(limit: Int) throws -> [OutboxRow] {
        let now = clock.nowMillis()
        let state = writerState
        return try write { db in
            Self.scheduleTokenScan(state)   // after a failed step: retried at the dispatcher's pace
            // One query per state so each walks the partial index responses_claim (state,
            // next_attempt_at, rowid) in order without a sort (a state literal lets the planner
            // use it; `state IN (...)` would sort every due row), merged here in the claim
            // order (StoreRules.claimsBefore): at most `limit` rows are read and decoded, plus
            // one look-ahead per state.
            var rows: [OutboxRow] = []
            var rowids: [Int64] = []
            rows.reserveCapacity(limit)
            rowids.reserveCapacity(limit)
            let queued = try db.held(&state.statements.claimQueued, Self.claimSelectSQL(.queued))
            defer { queued.reset() }
            let retry = try db.held(&state.statements.claimRetry, Self.claimSelectSQL(.retry))
            defer { retry.reset() }
            for st in [queued, retry] {
                try st.bind(1, now)
                try st.bind(2, Int64(limit))
            }
            var hasQueued = try queued.next()
            var hasRetry = try retry.next()
            while rows.count < limit, hasQueued || hasRetry {
                // Columns 10 (next_attempt_at) and 16 (rowid) decide; only the chosen row is decoded.
                let takeQueued = !hasRetry || (hasQueued && StoreRules.claimsBefore(dueAt: queued.int64(10), tie: queued.int64(16),
                                                                                   dueAt: retry.int64(10), tie: retry.int64(16)))
                let st = takeQueued ? queued : retry
                rows.append(try OutboxRow(columns: st))
                rowids.append(st.int64(16))
                if takeQueued { hasQueued = try queued.next() } else { hasRetry = try retry.next() }
            }
            // By rowid (id_high, read with the row in the same transaction): no id text to parse or compare.
            let markInflight = try db.held(&state.statements.markInflight, "UPDATE responses SET state = 'inflight', updated_at = ? WHERE rowid = ?")
            let markExpired = try db.held(&state.statements.markExpired, "UPDATE responses SET state = 'failed', last_reason = 'expired', updated_at = ? WHERE rowid = ?")
            var claimed: [OutboxRow] = []
            claimed.reserveCapacity(rows.count)
            var tokens: [String: TokenFacts] = [:]
            for (var row, rowid) in zip(rows, rowids) {
                // Only a watched token has a cutoff or pacing to read (one look-up per token and claim).
                var facts = TokenFacts()
                if !state.watchedTokens.isEmpty, state.watchedTokens.contains(row.pushToken) {
                    if let known = tokens[row.pushToken] { facts = known } else {
                        facts = try Self.tokenFacts(row.pushToken, db: db)
                        tokens[row.pushToken] = facts
                    }
                }
                switch StoreRules.claimVerdict(createdAt: row.createdAt, expiresAt: row.expiresAt, now: now, unregisteredCutoff: facts.cutoff,
                                               pacedUntil: facts.paced, scanStartedAt: state.scans.startedAt(row.pushToken)) {
                case .send:
                    break
                case .expired:
                    try markExpired.bind(1, now)
                    try markExpired.bind(2, rowid)
                    try markExpired.stepOnce()
                    state.pending.count -= 1
                    try Self.recordResponseEvent(rowid: rowid, delivered: false, now: now, db: db, state: state)
                    continue
                case .unregistered:
                    try db.run("UPDATE responses SET state = 'failed', last_reason = ?, updated_at = ? WHERE rowid = ?",
                               [.text(facts.reason), .integer(now), .integer(rowid)])
                    state.pending.count -= 1
                    try Self.recordResponseEvent(rowid: rowid, delivered: false, now: now, db: db, state: state)
                    continue
                case .postpone(let until):
                    try db.run("UPDATE responses SET next_attempt_at = ? WHERE rowid = ?", [.integer(until), .integer(rowid)])
                    continue
                }
                try markInflight.bind(1, now)
                try markInflight.bind(2, rowid)
                try markInflight.stepOnce()
                row.state = .inflight
                row.updatedAt = now
                claimed.append(row)
            }
            return claimed
        }
    }

    public func hastenQueued(app: String) throws -> Int {
        let now = clock.nowMillis()
        return try write { db in
            try db.run(StoreStatements.hastenQueued(app: app, now: now))
        }
    }

    public func nextDueAt() throws -> Int64? {
        try read { db in
            let a = try db.scalar("SELECT min(next_attempt_at) FROM responses WHERE state = 'queued'").int
            let b = try db.scalar("SELECT min(next_attempt_at) FROM responses WHERE state = 'retry'").int
            switch (a, b) {
            case let (x?, y?): return min(x, y)
            default: return a ?? b
            }
        }
    }

    /// Returns once every outcome is written, a 410's with its token's cutoff.
    public func apply(_ updates: [DeliveryUpdate]) throws {
        guard !updates.isEmpty else { return }
        let slot = ResultBox<StoreError?>()
        let done = DispatchSemaphore(value: 0)
        apply(updates) { error in
            slot.value = error
            done.signal()
        }
        done.wait()
        if let error = slot.value ?? nil { throw error }
    }

    /// Queued behind the writer's current batch; the dispatcher thread does not wait for it.
    /// `completion` runs once everything is written (a 410 after its token's cutoff scan).
    public func apply(_ updates: [DeliveryUpdate], completion: @escaping @Sendable (StoreError?) -> Void) {
        guard !updates.isEmpty else { return completion(nil) }
        guard let writer else { return completion(.invalid("store opened read-only")) }
        let scans = updates.filter { if case .unregistered = $0.outcome { true } else { false } }.count
        // One answer per part: the job, and each 410 once its scan wrote it.
        let parts = Countdown(scans + 1, completion)
        writer.enqueue(applying(updates, written: parts.done)) { result in
            if case .failure(let error) = result { parts.done(error) } else { parts.done(nil) }
        }
    }

    /// The outcome writes as one writer job. A 410 waits for its token's cutoff scan
    /// (SQLiteOutboxStore+TokenScan.swift), which writes it.
    private func applying(_ updates: [DeliveryUpdate], written: @escaping (StoreError?) -> Void) -> (SQLiteDatabase) throws -> Void {
        let now = clock.nowMillis()
        let state = writerState
        return { db in
            for u in updates {
                if case .unregistered = u.outcome {
                    try Self.beginTokenScan(u, db: db, state: state, written: written)
                } else {
                    try Self.applyOutcome(u, now: now, db: db, state: state)
                }
            }
        }
    }

    static let outcomeShapes = 5 * 4
    static func outcomeShape(_ c: StoreRules.OutcomeColumns) -> Int {
        let s = switch c.state { case .queued: 0; case .inflight: 1; case .retry: 2; case .delivered: 3; case .failed: 4 }
        return s * 4 + (c.nextAttemptAt == nil ? 0 : 2) + (c.last == nil ? 0 : 1)
    }
    /// The UPDATE for one shape of `StoreRules.outcomeColumns` (binds: 1 attempts added,
    /// 2 next_attempt_at, 3 and 4 last status and reason, 5 now, 6 and 7 the row's key and id).
    /// Not shared: PostgreSQL writes a batch's outcomes in one UPDATE over unnest arrays, with leases.
    static func outcomeSQL(_ c: StoreRules.OutcomeColumns) -> String {
        "UPDATE responses SET state = '\(c.state.rawValue)', attempts = attempts + ?1"
            + (c.nextAttemptAt == nil ? "" : ", next_attempt_at = ?2")
            + (c.last == nil ? "" : ", last_status = ?3, last_reason = ?4")
            + ", updated_at = ?5 WHERE id_high = ?6 AND id = ?7 AND state = 'inflight'"
    }

    /// A token's mark (unregistered_tokens: cutoff and reason) and pacing (token_pacing), if any.
    struct TokenFacts {
        var cutoff: Int64?
        var reason = StoreRules.unregisteredReason
        var paced: Int64?
    }

    static func tokenFacts(_ token: String, db: SQLiteDatabase) throws -> TokenFacts {
        let mark = try db.query("SELECT apns_timestamp, reason FROM unregistered_tokens WHERE token = ?", [.text(token)]).first
        return TokenFacts(cutoff: mark?[0].int, reason: mark?[1].string ?? StoreRules.unregisteredReason,
                          paced: try db.query("SELECT paced_until FROM token_pacing WHERE token = ?", [.text(token)]).first?[0].int)
    }

    /// One outcome's writes: its attempt and its row (inflight only). A 410's cutoff is written
    /// by the scan that calls this; a TooManyRequests paces the token's other rows when they
    /// are claimed (StoreRules.claimVerdict), not by a walk over them here. Returns whether the
    /// row changed (it was inflight).
    @discardableResult
    static func applyOutcome(_ u: DeliveryUpdate, now: Int64, db: SQLiteDatabase, state: WriterState) throws -> Bool {
        // A row is found by its key and id (schema v5); an id that is not a UUID has no row.
        guard let high = UUIDText.high64(u.id) else { return false }
        if let a = u.attempt {
            // Typed binds on held statements: this and the delivered UPDATE run once per push.
            let st = try db.held(&state.statements.insertAttempt,
                "INSERT INTO attempts (\(StoreStatements.attemptColumns)) VALUES (?, ?, ?, ?, ?, ?)")
            try st.bind(1, a.responseID)
            try st.bind(2, a.attemptedAt)
            try st.bind(3, a.status.map(Int64.init))
            try st.bind(4, a.reason)
            try st.bind(5, a.apnsTimestamp)
            try st.bind(6, a.latencyMicros)
            try st.stepOnce()
        }
        // The columns from the rule both backends apply (StoreRules.outcomeColumns), written by
        // a held statement per shape (this runs once per push): the state a literal, only the
        // columns the outcome sets (a bound state and CASEs cost ~0.8 % of a response).
        let cols = StoreRules.outcomeColumns(u.outcome, attempt: u.attempt)
        let st = try db.held(&state.statements.applyOutcome[outcomeShape(cols)], outcomeSQL(cols))
        try st.bind(1, cols.attemptsAdded)
        if let next = cols.nextAttemptAt { try st.bind(2, next) }
        if let last = cols.last {
            try st.bind(3, last.status)
            try st.bind(4, last.reason)
        }
        try st.bind(5, now)
        try st.bind(6, high)
        try st.bind(7, u.id)
        try st.stepOnce()
        let changed = db.changes
        switch u.outcome {
        case .delivered:
            state.pending.count -= changed
            // A probe's 200 (a row accepted after its token's cutoff) proves the token valid again.
            if changed > 0, !state.watchedTokens.isEmpty, state.watchedTokens.contains(u.pushToken),
               let cutoff = try db.query("SELECT apns_timestamp FROM unregistered_tokens WHERE token = ?", [.text(u.pushToken)]).first?[0].int,
               let created = try db.query("SELECT created_at FROM responses WHERE id_high = ?", [.integer(high)]).first?[0].int,
               StoreRules.deliveredClearsMark(createdAt: created, cutoff: cutoff) {
                try db.run("DELETE FROM unregistered_tokens WHERE token = ?", [.text(u.pushToken)])
            }
            if changed > 0 { try recordResponseEvent(rowid: high, delivered: true, now: now, db: db, state: state) }
        case .failed, .unregistered:
            state.pending.count -= changed
            if changed > 0 { try recordResponseEvent(rowid: high, delivered: false, now: now, db: db, state: state) }
        case .retry(_, let paceUntil):
            if let until = paceUntil {
                state.watchedTokens.insert(u.pushToken)
                // Not shared: SQLite's two-argument max() is PostgreSQL's GREATEST.
                try db.run(
                    """
                    INSERT INTO token_pacing (token, paced_until, updated_at) VALUES (?, ?, ?)
                    ON CONFLICT (token) DO UPDATE SET paced_until = max(paced_until, excluded.paced_until), updated_at = excluded.updated_at
                    """, [.text(u.pushToken), .integer(until), .integer(now)])
            }
        case .requeue, .release:
            break
        }
        return changed > 0
    }
}

/// Completes once after `count` parts, with the first error. Writer thread only (the job's
/// completion and the scans' run there); @unchecked Sendable for the closures that carry it.
final class Countdown: @unchecked Sendable {
    private var remaining: Int
    private var error: StoreError?
    private let completion: (StoreError?) -> Void

    init(_ count: Int, _ completion: @escaping (StoreError?) -> Void) {
        remaining = count
        self.completion = completion
    }

    func done(_ e: StoreError?) {
        if error == nil { error = e }
        remaining -= 1
        if remaining == 0 { completion(error) }
    }
}
