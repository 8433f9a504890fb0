// SQLiteOutboxStore: the dispatcher's SQL (recover, claim, apply outcomes) and the row decoder.
import FoundationEssentials
import Glibc
import POSIXThreads
import Ratchet

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

    public func claimDue(limit: Int) throws -> [OutboxRow] {
        let now = clock.nowMillis()
        let state = writerState
        return try write { db in
            // One query per state so each walks (state, next_attempt_at) in order without a sort.
            var rows: [OutboxRow] = []
            var rowids: [Int64] = []
            rows.reserveCapacity(limit)
            rowids.reserveCapacity(limit)
            // The state is a literal so the partial index responses_claim applies.
            for s in [ResponseState.queued, .retry] where rows.count < limit {
                let select = try db.held(&state.claimSelect[s],
                    "SELECT \(Self.rowColumns), rowid FROM responses WHERE state = '\(s.rawValue)' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?")
                defer { select.reset() }
                try select.bind(1, now)
                try select.bind(2, Int64(limit - rows.count))
                while try select.next() {
                    rows.append(try OutboxRow(columns: select))
                    rowids.append(select.int64(16))
                }
            }
            // By rowid (id_high, read with the row in the same transaction): no id text to parse or compare.
            let markInflight = try db.held(&state.markInflight, "UPDATE responses SET state = 'inflight', updated_at = ? WHERE rowid = ?")
            let markExpired = try db.held(&state.markExpired, "UPDATE responses SET state = 'failed', last_reason = 'expired', updated_at = ? WHERE rowid = ?")
            var claimed: [OutboxRow] = []
            claimed.reserveCapacity(rows.count)
            for (var row, rowid) in zip(rows, rowids) {
                if row.expiresAt <= now {
                    try markExpired.bind(1, now)
                    try markExpired.bind(2, rowid)
                    try markExpired.stepOnce()
                    state.pending -= 1
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

    public func apply(_ updates: [DeliveryUpdate]) throws {
        guard !updates.isEmpty else { return }
        try write(applying(updates))
    }

    /// Queued behind the writer's current batch; the dispatcher thread does not wait for it.
    public func apply(_ updates: [DeliveryUpdate], completion: @escaping @Sendable (StoreError?) -> Void) {
        guard !updates.isEmpty else { return completion(nil) }
        guard let writer else { return completion(.invalid("store opened read-only")) }
        writer.enqueue(applying(updates)) { result in
            if case .failure(let error) = result { completion(error) } else { completion(nil) }
        }
    }

    /// The outcome writes as one writer job.
    private func applying(_ updates: [DeliveryUpdate]) -> (SQLiteDatabase) throws -> Void {
        let now = clock.nowMillis()
        let state = writerState
        return { db in
            for u in updates {
                // A row is found by its key and id (schema v5); an id that is not a UUID has no row.
                guard let high = UUIDText.high64(u.id) else { continue }
                if let a = u.attempt {
                    // Typed binds on held statements: this and the delivered UPDATE run once per push.
                    let st = try db.held(&state.insertAttempt,
                        "INSERT INTO attempts (response_id, attempted_at, status, reason, apns_timestamp, latency_us) VALUES (?, ?, ?, ?, ?, ?)")
                    try st.bind(1, a.responseID)
                    try st.bind(2, a.attemptedAt)
                    try st.bind(3, a.status.map(Int64.init))
                    try st.bind(4, a.reason)
                    try st.bind(5, a.apnsTimestamp)
                    try st.bind(6, a.latencyMicros)
                    try st.stepOnce()
                }
                let status: SQLValue = u.attempt?.status.map { .integer(Int64($0)) } ?? .null
                let reason: SQLValue = u.attempt?.reason.map { .text($0) } ?? .null
                let counted = u.attempt == nil ? 0 : 1
                var changed = 0
                switch u.outcome {
                case .delivered:
                    let st = try db.held(&state.markDelivered,
                        "UPDATE responses SET state = 'delivered', attempts = attempts + ?, last_status = ?, last_reason = NULL, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'")
                    try st.bind(1, Int64(counted))
                    try st.bind(2, u.attempt?.status.map(Int64.init))
                    try st.bind(3, now)
                    try st.bind(4, high)
                    try st.bind(5, u.id)
                    try st.stepOnce()
                    changed = db.changes
                    state.pending -= changed
                case .failed(let why):
                    changed = try db.run(
                        "UPDATE responses SET state = 'failed', attempts = attempts + ?, last_status = ?, last_reason = ?, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(Int64(counted)), status, .text(why), .integer(now), .integer(high), .text(u.id)])
                    state.pending -= changed
                case .unregistered(let why, let ts):
                    changed = try db.run(
                        "UPDATE responses SET state = 'failed', attempts = attempts + ?, last_status = ?, last_reason = ?, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(Int64(counted)), status, .text(why), .integer(now), .integer(high), .text(u.id)])
                    state.pending -= changed
                    state.watchedTokens.insert(u.pushToken)
                    // Same transaction as the row's failure: no ingest can commit in between.
                    let waiting = try Self.newestCreatedAt(of: u.pushToken, pendingOnly: true, db: db, state: state)
                    try db.run(
                        """
                        INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at) VALUES (?, ?, ?)
                        ON CONFLICT (token) DO UPDATE SET apns_timestamp = max(apns_timestamp, excluded.apns_timestamp), recorded_at = excluded.recorded_at
                        """, [.text(u.pushToken), .integer(StoreRules.unregisteredCutoff(apnsTimestamp: ts, newestPendingCreatedAt: waiting)), .integer(now)])
                case .retry(let at, let paceUntil):
                    try db.run(
                        "UPDATE responses SET state = 'retry', attempts = attempts + ?, next_attempt_at = ?, last_status = ?, last_reason = ?, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(Int64(counted)), .integer(at), status, reason, .integer(now), .integer(high), .text(u.id)])
                    if let until = paceUntil {
                        state.watchedTokens.insert(u.pushToken)
                        try db.run(
                            """
                            INSERT INTO token_pacing (token, paced_until, updated_at) VALUES (?, ?, ?)
                            ON CONFLICT (token) DO UPDATE SET paced_until = max(paced_until, excluded.paced_until), updated_at = excluded.updated_at
                            """, [.text(u.pushToken), .integer(until), .integer(now)])
                        for id in try Self.tokenRowIDs(u.pushToken, db: db, state: state) {
                            try db.run(
                                "UPDATE responses SET next_attempt_at = ? WHERE id_high = ? AND push_token = ? AND state IN ('queued','retry') AND next_attempt_at < ?",
                                [.integer(until), .integer(id), .text(u.pushToken), .integer(until)])
                        }
                    }
                case .requeue:
                    try db.run(
                        "UPDATE responses SET state = 'queued', updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(now), .integer(high), .text(u.id)])
                }
            }
        }
    }
}
