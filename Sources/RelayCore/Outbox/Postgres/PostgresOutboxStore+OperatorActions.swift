// PostgresOutboxStore: operator actions (requeue, purge, forget a token); never touch inflight rows.
import FoundationEssentials
import Glibc
import Synchronization

extension PostgresOutboxStore {
    public func requeue(ids: [String]) throws -> Int {
        guard !ids.isEmpty else { return 0 }
        let now = clock.nowMillis()
        let wanted = ids.map { $0.lowercased() }
        let previous: [String] = try write { c in
            try c.query(
                """
                WITH old AS (SELECT id, state FROM responses WHERE id = ANY($1) AND state IN \(StoreRules.requeueableSQL) FOR UPDATE)
                UPDATE responses r SET state = 'queued', next_attempt_at = $2, expires_at = GREATEST(r.expires_at, $3), updated_at = $2,
                    lease_owner = NULL, lease_expires_at = NULL
                FROM old WHERE r.id = old.id
                RETURNING old.state
                """, [.textArray(wanted), .int(now), .int(StoreRules.requeueExpiryFloor(now: now))]
            ).compactMap { $0.first?.string }
        }
        adjustPending(previous.filter { $0 == "failed" }.count)
        return previous.count
    }

    /// Rows per requeue statement: each batch is its own short transaction, so requeueing a
    /// million failed rows never holds a million row locks (or one huge WAL record) at once.
    static let requeueBatch = 1_000

    public func requeueFailed(reason: String?) throws -> Int {
        try requeueFailed(reason: reason, batch: Self.requeueBatch)
    }

    /// In batches of `batch` rows (SKIP LOCKED: a row another session is purging or requeueing
    /// is passed over, not waited for) until a batch finds fewer.
    func requeueFailed(reason: String?, batch: Int) throws -> Int {
        let now = clock.nowMillis()
        let filter = reason == nil ? "" : " AND last_reason = $4"
        let sql = """
            WITH b AS (SELECT id FROM responses WHERE state = 'failed'\(filter) ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED)
            UPDATE responses r SET state = 'queued', next_attempt_at = $1, expires_at = GREATEST(r.expires_at, $2), updated_at = $1
            FROM b WHERE r.id = b.id
            """
        var params: [PGValue] = [.int(now), .int(StoreRules.requeueExpiryFloor(now: now)), .int(Int64(max(1, batch)))]
        if let reason { params.append(.text(reason)) }
        var total = 0
        while true {
            let n = try write { c in try c.run(sql, params).affected }
            total += n
            adjustPending(n)
            if n < batch { return total }
        }
    }

    /// The callers' times (olderThan, before) are their node's clock: compared in the database's.
    public func purge(state s: ResponseState, olderThan: Int64, dryRun: Bool) throws -> Int {
        try StoreRules.checkPurgeable(s)
        if dryRun {
            let count = try StoreStatements.purgeCount(state: s, olderThan: clock.toDatabase(olderThan))
            return try read { c in Int(try c.query(count).first?.first?.int ?? 0) }
        }
        return try PurgeBatches.run(self, state: s, olderThan: olderThan)
    }

    public func purgeBatch(state s: ResponseState, olderThan: Int64, limit: Int) throws -> Int {
        try StoreRules.checkPurgeable(s)
        let olderThan = clock.toDatabase(olderThan)
        return try writeTransaction { c in
            // Rows another node is deleting (or relayctl is requeueing) are skipped, not waited for.
            let ids: [String?] = try c.query(
                "SELECT id FROM responses WHERE state = $1 AND updated_at < $2 ORDER BY updated_at LIMIT $3 FOR UPDATE SKIP LOCKED",
                [.text(s.rawValue), .int(olderThan), .int(Int64(max(0, limit)))]).map { $0.first?.string }
            guard !ids.isEmpty else { return 0 }
            try c.query("DELETE FROM attempts WHERE response_id = ANY($1)", [.textArray(ids)])
            return try c.run("DELETE FROM responses WHERE id = ANY($1)", [.textArray(ids)]).affected
        }
    }

    /// A fast node must not end another node's pacing early: `before` in the database's time.
    public func pruneEndedPacing(before: Int64, limit: Int) throws -> Int {
        let before = clock.toDatabase(before)
        return try write { c in
            // The outer condition again: another node may have raised a row's pacing meanwhile.
            try c.run("""
                DELETE FROM token_pacing WHERE paced_until < $1
                    AND token IN (SELECT token FROM token_pacing WHERE paced_until < $1 LIMIT $2)
                """, [.int(before), .int(Int64(max(0, limit)))]).affected
        }
    }

    /// As pruneEndedPacing: a fast node must not prune another node's marks early, so `now`
    /// is read in the database's time (the marks' times are stored in it).
    public func pruneStaleMarks(now: Int64, limit: Int) throws -> Int {
        let b = StoreRules.staleMarkBounds(now: clock.toDatabase(now), settings: ingestSettings)
        let stale = StoreRules.staleMarkSQL(mark: "m", unregisteredBefore: "$1", badDeviceTokenBefore: "$2", cutoffBefore: "$3")
        return try write { c in
            // The condition again in the DELETE: another node may have re-armed a mark (a probe).
            try c.run("""
                DELETE FROM unregistered_tokens m WHERE \(stale)
                    AND token IN (SELECT token FROM unregistered_tokens m WHERE \(stale) LIMIT $4)
                """, [.int(b.unregisteredRecordedBefore), .int(b.badDeviceTokenRecordedBefore), .int(b.cutoffBefore), .int(Int64(max(0, limit)))]).affected
        }
    }

    public func forgetToken(_ token: String) throws -> Bool {
        try write { c in try c.run(StoreStatements.forgetToken(token)).affected > 0 }
    }
}
