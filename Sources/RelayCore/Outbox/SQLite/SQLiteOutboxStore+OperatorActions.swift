// SQLiteOutboxStore: operator actions (requeue, purge, forget a token), on the writer.
import FoundationEssentials
import Glibc
import POSIXThreads

extension SQLiteOutboxStore {
    // Not shared (requeue, requeueFailed, purgeBatch, the prunes): PostgreSQL locks with FOR UPDATE
    // SKIP LOCKED, clears leases and works on id arrays; SQLite finds rows by id_high and keeps
    // the writer's pending count and watched tokens.
    public func requeue(ids: [String]) throws -> Int {
        let now = clock.nowMillis()
        let state = writerState
        return try write { db in
            var n = 0
            for id in ids {
                let id = id.lowercased()
                guard let high = UUIDText.high64(id) else { continue }   // not a UUID: no such row
                let wasTerminal = try db.scalar("SELECT state = 'failed' FROM responses WHERE id_high = ? AND id = ?", [.integer(high), .text(id)]).int == 1
                // StoreRules.requeueableStates, checked in the same transaction as the update.
                let changed = try db.run(
                    "UPDATE responses SET state = 'queued', next_attempt_at = ?, expires_at = max(expires_at, ?), updated_at = ? WHERE id_high = ? AND id = ? AND state IN \(StoreRules.requeueableSQL)",
                    [.integer(now), .integer(StoreRules.requeueExpiryFloor(now: now)), .integer(now), .integer(high), .text(id)])
                if changed > 0 && wasTerminal { state.pending.count += 1 }
                n += changed
            }
            return n
        }
    }

    public func requeueFailed(reason: String?) throws -> Int {
        let now = clock.nowMillis()
        let state = writerState
        return try write { db in
            let n: Int
            if let reason {
                n = try db.run(
                    "UPDATE responses SET state = 'queued', next_attempt_at = ?, expires_at = max(expires_at, ?), updated_at = ? WHERE state = 'failed' AND last_reason = ?",
                    [.integer(now), .integer(StoreRules.requeueExpiryFloor(now: now)), .integer(now), .text(reason)])
            } else {
                n = try db.run(
                    "UPDATE responses SET state = 'queued', next_attempt_at = ?, expires_at = max(expires_at, ?), updated_at = ? WHERE state = 'failed'",
                    [.integer(now), .integer(StoreRules.requeueExpiryFloor(now: now)), .integer(now)])
            }
            state.pending.count += n
            return n
        }
    }

    public func purge(state s: ResponseState, olderThan: Int64, dryRun: Bool) throws -> Int {
        try StoreRules.checkPurgeable(s)
        if dryRun {
            let count = try StoreStatements.purgeCount(state: s, olderThan: olderThan)
            return try read { db in Int(try db.query(count).first?.first?.int ?? 0) }
        }
        return try PurgeBatches.run(self, state: s, olderThan: olderThan)
    }

    public func pruneEndedPacing(before: Int64, limit: Int) throws -> Int {
        try pruneTokens("SELECT token FROM token_pacing WHERE paced_until < ?1 LIMIT ?2", [.integer(before)], limit: limit,
                        from: "token_pacing", stillWatchedBy: "unregistered_tokens")
    }

    public func pruneStaleMarks(now: Int64, limit: Int) throws -> Int {
        let b = StoreRules.staleMarkBounds(now: now, settings: ingestSettings)
        let stale = StoreRules.staleMarkSQL(mark: "m", unregisteredBefore: "?1", badDeviceTokenBefore: "?2", cutoffBefore: "?3")
        return try pruneTokens("SELECT token FROM unregistered_tokens m WHERE \(stale) LIMIT ?4",
                               [.integer(b.unregisteredRecordedBefore), .integer(b.badDeviceTokenRecordedBefore), .integer(b.cutoffBefore)],
                               limit: limit, from: "unregistered_tokens", stillWatchedBy: "token_pacing")
    }

    /// Deletes the tokens `select` finds (its last parameter is the limit) from `table`; a token
    /// no longer in `other` either leaves the writer's watched set (it mirrors both tables), and
    /// comes back if the batch rolls back (IngestBatch.unwatch).
    private func pruneTokens(_ select: String, _ binds: [SQLValue], limit: Int, from table: String, stillWatchedBy other: String) throws -> Int {
        let state = writerState
        return try write { db in
            let tokens = try db.query(select, binds + [.integer(Int64(max(0, limit)))]).compactMap { $0[0].string }
            for token in tokens {
                try db.run("DELETE FROM \(table) WHERE token = ?", [.text(token)])
                if try db.query("SELECT 1 FROM \(other) WHERE token = ?", [.text(token)]).isEmpty {
                    state.watchedTokens.remove(token)
                    state.batch.unwatch(token)
                }
            }
            return tokens.count
        }
    }

    public func purgeBatch(state s: ResponseState, olderThan: Int64, limit: Int) throws -> Int {
        try StoreRules.checkPurgeable(s)
        let state = writerState
        return try write { db in
            // The state is a literal (a terminal enum value, not client input) so the planner can
            // use the partial index responses_done, which a bound parameter would not prove.
            let rows = try db.query("""
                SELECT id_high, id, app, push_token, session_id, key_id, message_index FROM responses
                WHERE state = '\(s.rawValue)' AND updated_at < ? ORDER BY updated_at LIMIT ?
                """, [.integer(olderThan), .integer(Int64(max(0, limit)))])
            for r in rows {
                try db.run("DELETE FROM attempts WHERE response_id = ?", [r[1]])
                try db.run("DELETE FROM responses WHERE id_high = ?", [r[0]])
                // Its dedupe entry (none yet while the row is in an ingesting store's tail: that
                // store's merge leaves deleted rows out).
                let h = state.dedupe.hasher.hash(r[2].string ?? "", r[3].string ?? "", r[4].string ?? "", r[5].bytes ?? [],
                                          UInt32(truncatingIfNeeded: r[6].int ?? 0))
                try db.run("DELETE FROM response_keys WHERE h = ? AND id_high = ?", [.integer(h), r[0]])
            }
            return rows.count
        }
    }
    public func forgetToken(_ token: String) throws -> Bool {
        try write { db in try db.run(StoreStatements.forgetToken(token)) > 0 }
    }
}
