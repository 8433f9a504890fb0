// PostgresOutboxStore: the dispatcher's SQL (recover, leased claim, apply outcomes) and the row decoder.
import FoundationEssentials
import Glibc
import Synchronization

extension PostgresOutboxStore {
    /// Rows this node left inflight (same node id: a restart) and every expired lease go back
    /// to queued with the same id. Other live nodes' leases are left alone: expiry is judged on
    /// the database's time, and not at all while this node's clock is out of bound.
    public func recoverInflight() throws -> Int {
        let me = options.nodeID
        return try write { [self] c in
            let now = try databaseNow(c)
            let expired = clockOffsetInBound ? "OR lease_owner IS NULL OR lease_expires_at <= $1" : "OR lease_owner IS NULL"
            return try c.run(
                """
                UPDATE responses SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = $1
                WHERE state = 'inflight' AND (lease_owner = $2 \(expired))
                """, [.int(now), .text(me)]).affected
        }
    }

    public func hastenQueued(app: String) throws -> Int {
        let now = clock.nowMillis()
        return try write { c in
            try c.run(StoreStatements.hastenQueued(app: app, now: now)).affected
        }
    }

    static let rowColumns = """
        r.id, r.app, r.push_token, r.session_id, r.key_id, r.message_index, r.encrypted_data, r.credential_id, r.state, r.attempts,
        r.next_attempt_at, r.created_at, r.expires_at, r.last_status, r.last_reason, r.updated_at
        """

    /// The claim: lock candidates without waiting for rows another node is claiming (SKIP
    /// LOCKED), lease them to this node, or fail them as expired past their TTL.
    private static func claimSQL(_ candidates: String) -> String {
        """
        WITH c AS (\(candidates) FOR UPDATE SKIP LOCKED)
        UPDATE responses r SET
            state = CASE WHEN r.expires_at <= $1 THEN 'failed' ELSE 'inflight' END,
            last_reason = CASE WHEN r.expires_at <= $1 THEN 'expired' ELSE r.last_reason END,
            lease_owner = CASE WHEN r.expires_at <= $1 THEN NULL ELSE $3 END,
            lease_expires_at = CASE WHEN r.expires_at <= $1 THEN NULL ELSE $4 END,
            lease_epoch = r.lease_epoch + 1,
            updated_at = $1
        FROM c WHERE r.id = c.id
        RETURNING \(rowColumns), r.lease_epoch
        """
    }

    private static let reclaimSQL = claimSQL(
        "SELECT id FROM responses WHERE state = 'inflight' AND lease_expires_at <= $1 ORDER BY lease_expires_at LIMIT $2")

    /// Due rows go through StoreRules.claimVerdict: sent (leased), failed (expired, or covered
    /// by their token's mark, with its reason, without a push) or put back to their token's pacing end.
    /// The candidates carry the columns the verdict needs (no second join to responses, which a
    /// generic plan made a hash join over the whole table), and the token look-ups probe each
    /// table's key per row (LATERAL ... OFFSET 0) whatever a cached plan expects.
    private static let dueSQL = """
        WITH c AS (SELECT id, push_token, created_at, expires_at FROM responses
                   WHERE state IN ('queued','retry') AND next_attempt_at <= $1 ORDER BY \(StoreRules.claimOrderSQL(tie: "id")) LIMIT $2
                   FOR UPDATE SKIP LOCKED),
        v AS (SELECT r.id, \(StoreRules.claimVerdictSQL) AS verdict, p.paced_until, u.reason AS mark_reason
              FROM c r
              LEFT JOIN LATERAL (SELECT apns_timestamp, reason FROM unregistered_tokens WHERE token = r.push_token OFFSET 0) u ON true
              LEFT JOIN LATERAL (SELECT paced_until FROM token_pacing WHERE token = r.push_token OFFSET 0) p ON true)
        UPDATE responses r SET
            state = CASE v.verdict WHEN 'send' THEN 'inflight' WHEN 'postpone' THEN r.state ELSE 'failed' END,
            last_reason = CASE v.verdict WHEN 'expired' THEN 'expired' WHEN 'unregistered' THEN v.mark_reason ELSE r.last_reason END,
            next_attempt_at = CASE WHEN v.verdict = 'postpone' THEN v.paced_until ELSE r.next_attempt_at END,
            lease_owner = CASE WHEN v.verdict = 'send' THEN $3 ELSE NULL END,
            lease_expires_at = CASE WHEN v.verdict = 'send' THEN $4::bigint ELSE NULL END,
            lease_epoch = r.lease_epoch + 1,
            updated_at = CASE WHEN v.verdict = 'postpone' THEN r.updated_at ELSE $1 END
        FROM v WHERE r.id = v.id
        RETURNING \(rowColumns), r.lease_epoch
        """

    /// A claim's row: rowColumns, then the lease epoch the claim gave it.
    private static func claimedRow(_ columns: PGRow) throws -> OutboxRow {
        var row = try OutboxRow(columns: columns)
        row.leaseEpoch = columns.count > 16 ? columns[16].int ?? 0 : 0
        return row
    }

    public func claimDue(limit: Int) throws -> [OutboxRow] {
        guard limit > 0 else { return [] }
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        // Outcomes kept from a failed write first: their rows may be among this claim's expired
        // leases, and an answer already received must not be pushed for again. They depend on
        // no clock, so they are written even while this node's clock is out of bound.
        // One transaction: a row failed here (expired, or behind its token's 410) gets its
        // event in the same commit.
        let (rows, owners): ([OutboxRow], Set<String>) = try dispatchWorker.perform { [self] w in
            try writeRetainedOutcomes(w)
            return try w.transaction { [self] c in
                // The database's own time decides which leases have ended and which rows are
                // due, read in this transaction (and this node's offset measured with it).
                let now = try databaseNow(c)
                // Not `unavailable`: the connection is fine and must not be dropped for this.
                guard clockOffsetInBound else {
                    throw StoreError.invalid("this node's clock is \(clock.offsetMillis / 1000) s off the database's, past store.maxClockOffsetSeconds (\(options.maxClockOffsetMillis / 1000)): claiming nothing until it is fixed")
                }
                let params: (Int) -> [PGValue] = { [options] n in
                    [.int(now), .int(Int64(n)), .text(options.nodeID), .int(now + options.leaseMillis)]
                }
                // Expired leases first: their rows have waited longest (a node died holding them).
                // RETURNING's order is the UPDATE's, not the candidates': each part sorted again.
                var rows = try c.query(Self.reclaimSQL, params(limit)).map(Self.claimedRow).sorted(by: StoreRules.claimsBefore)
                if rows.count < limit {
                    rows += try c.query(Self.dueSQL, params(limit - rows.count)).map(Self.claimedRow).sorted(by: StoreRules.claimsBefore)
                }
                let owners = try insertResponseEvents(c, responseIDs: rows.filter { $0.state == .failed }.map(\.id), now: now)
                return (rows, Set(owners.compactMap { $0 }))
            }
        }
        let failed = rows.filter { $0.state == .failed }.count
        adjustPending(-failed)
        if failed > 0 {
            eventsCreated.add(.responseFailed, failed)   // each failed row got its event in the commit
            eventsCommitted(owners)
        }
        // In claim order: expired leases first, then due rows (StoreRules.claimsBefore).
        return rows.filter { $0.state == .inflight }.map(toLocal)
    }

    /// Earliest next_attempt_at among queued/retry rows, or an earlier lease expiry (so a
    /// survivor wakes up to take over a dead node's rows, and this node takes back its own rows
    /// whose outcome was lost), or the next try of outcomes kept from a failed write.
    public func nextDueAt() throws -> Int64? {
        // Out of bound, no claim can succeed: measure again (the idle poll brings us here every
        // second), and until the clock is back, the idle poll rather than a loop of refused claims.
        if !clockOffsetInBound {
            _ = try? read { [self] c in try measureClockOffset(c) }
            guard clockOffsetInBound else { return nil }
        }
        let due = try read { c in
            let r = try c.query(
                """
                SELECT (SELECT min(next_attempt_at) FROM responses WHERE state IN ('queued','retry')),
                       (SELECT min(lease_expires_at) FROM responses WHERE state = 'inflight')
                """).first ?? []
            return [r.first?.int, r.last?.int].compactMap { $0 }.min()
        }
        return [due, retainedOutcomesDueAt()].compactMap { $0 }.min().map(clock.toLocal)
    }

    /// The updates' times are the dispatcher's (the node's clock): stored in the database's.
    public func apply(_ updates: [DeliveryUpdate]) throws {
        guard !updates.isEmpty else { return }
        let updates = updates.map(toDatabase)
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        let body = applying(updates)
        try dispatchWorker.perform { [self] w in
            do {
                try writeRetainedOutcomes(w)
                committed(try w.transaction(body))
            } catch {
                retainOutcomes(updates, after: error)
                throw error
            }
        }
    }

    /// Queued on the dispatch connection's thread (in order, behind earlier writes); the
    /// dispatcher thread does not wait for the round trips, as with SQLite's writer.
    public func apply(_ updates: [DeliveryUpdate], completion: @escaping @Sendable (StoreError?) -> Void) {
        guard !updates.isEmpty else { return completion(nil) }
        guard !options.readOnly else { return completion(.invalid("store opened read-only")) }
        let updates = updates.map(toDatabase)
        let body = applying(updates)
        // Half the lease, not requestTimeoutMs: an outcome that waits out a short stall is
        // still recorded (the row is not re-sent after its lease), and one that cannot commit
        // within the lease is moot anyway.
        let queued = dispatchWorker.enqueueDetached(.millis(max(options.timeouts.requestMillis, options.leaseMillis / 2))) { [self] w in
            do {
                try writeRetainedOutcomes(w)
                committed(try w.transaction(body))
                completion(nil)
            } catch {
                // Kept (before the completion, so before any later job of this thread) and
                // written again ahead of the next claim or outcome write.
                retainOutcomes(updates, after: error)
                completion((error as? StoreError) ?? .invalid("\(error)"))
                throw error   // the worker notes the failure (reconnect back-off)
            }
        }
        if !queued { completion(.closed) }
    }

    /// The outcome writes as one transaction's body; returns how many rows it finished.
    /// What an outcome transaction finished: rows made terminal, and the events written.
    struct Applied {
        var finished = 0
        var events: [EventType: Int] = [:]
        /// The events' credentials (the feed's polls to read again).
        var credentials: Set<String> = []
    }

    /// After an outcome transaction's COMMIT.
    func committed(_ applied: Applied) {
        adjustPending(-applied.finished)
        if applied.finished > 0 {
            eventsCreated.add(applied.events)
            eventsCommitted(applied.credentials)
        }
    }

    /// Not shared with SQLite (a held statement per row and outcome shape there): one statement
    /// per batch over unnest arrays, under the lease.
    /// `again`: outcomes kept from a write that failed, which may have committed unseen: an
    /// attempt already recorded (same row, time and node) is not recorded twice.
    func applying(_ updates: [DeliveryUpdate], again: Bool = false) -> (PostgresConnection) throws -> Applied {
        let now = clock.nowMillis()
        let me = options.nodeID
        var ids: [String?] = [], states: [String?] = [], counted: [Int64?] = [], next: [Int64?] = [], status: [Int64?] = [], reasons: [String?] = []
        var epochs: [Int64?] = [], keepLast: [Int64?] = []
        var pace: [String: Int64] = [:]
        var marking: [String: [(reason: String, apnsTimestamp: Int64, id: String)]] = [:]
        for u in updates {
            // The columns from the rule both backends apply (StoreRules.outcomeColumns).
            let cols = StoreRules.outcomeColumns(u.outcome, attempt: u.attempt)
            ids.append(u.id)
            epochs.append(u.leaseEpoch)
            states.append(cols.state.rawValue)
            counted.append(cols.attemptsAdded)
            next.append(cols.nextAttemptAt)
            keepLast.append(cols.last == nil ? 1 : 0)
            status.append(cols.last?.status)
            reasons.append(cols.last?.reason)
            switch u.outcome {
            case .unregistered(let why, let ts):
                marking[u.pushToken, default: []].append((why, ts, u.id))
            case .retry(_, let until):
                if let until { pace[u.pushToken] = max(pace[u.pushToken] ?? .min, until) }
            case .delivered, .failed, .requeue, .release:
                break
            }
        }
        let attempts = updates.compactMap(\.attempt)
        let unreg = marking.compactMapValues { StoreRules.markFrom($0.map { ($0.reason, $0.apnsTimestamp) }) }
        let unregTokens = unreg.keys.sorted()
        return { [self] c in
            // The 410's tokens locked first (before any row lock of this transaction): an ingest
            // write holding one of them commits first, and its rows count in the cutoff below;
            // one that comes later finds the record in its INSERT's re-check (ingestLocksSQL).
            if !unregTokens.isEmpty { try c.query(Self.unregisteredLocksSQL, [.textArray(unregTokens)]) }
            if !attempts.isEmpty {
                // The attempt happened even if our lease was lost meanwhile: always recorded.
                try c.query(
                    """
                    INSERT INTO attempts (\(StoreStatements.attemptColumns), node)
                    SELECT a.rid, a.at, a.status, a.reason, a.ts, a.lat, $7
                    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[]) AS a(rid, at, status, reason, ts, lat)
                    \(again ? "WHERE NOT EXISTS (SELECT 1 FROM attempts x WHERE x.response_id = a.rid AND x.attempted_at = a.at AND x.node = $7)" : "")
                    """,
                    [.textArray(attempts.map(\.responseID)), .intArray(attempts.map(\.attemptedAt)),
                     .intArray(attempts.map { $0.status.map { Int64($0) } }), .textArray(attempts.map(\.reason)),
                     .intArray(attempts.map(\.apnsTimestamp)), .intArray(attempts.map(\.latencyMicros)), .text(me)])
            }
            // Only rows whose lease this node still holds, under the epoch the push was claimed
            // with: after an expired lease another claim (another node's, or this node's own
            // again) owns the row and its outcome stands. A probe's 200 (a row its token's mark does not
            // cover, StoreRules.deliveredClearsMark) removes the mark in the same statement.
            let changed = try c.query(
                """
                WITH done AS (UPDATE responses r SET
                    state = u.state,
                    attempts = r.attempts + u.counted,
                    next_attempt_at = COALESCE(u.next, r.next_attempt_at),
                    last_status = CASE WHEN u.keep = 1 THEN r.last_status ELSE u.status END,
                    last_reason = CASE WHEN u.keep = 1 THEN r.last_reason ELSE u.reason END,
                    lease_owner = NULL, lease_expires_at = NULL, updated_at = $7
                FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], $9::bigint[], $10::bigint[])
                    AS u(id, state, counted, next, status, reason, epoch, keep)
                WHERE r.id = u.id AND r.state = 'inflight' AND r.lease_owner = $8 AND (u.epoch IS NULL OR r.lease_epoch = u.epoch)
                RETURNING u.state, r.push_token, r.created_at, r.id),
                cleared AS (DELETE FROM unregistered_tokens m USING done
                            WHERE done.state = 'delivered' AND m.token = done.push_token AND NOT (\(StoreRules.coveredSQL(row: "done", mark: "m"))))
                SELECT state, id FROM done
                """,
                [.textArray(ids), .textArray(states), .intArray(counted), .intArray(next), .intArray(status), .textArray(reasons),
                 .int(now), .text(me), .intArray(epochs), .intArray(keepLast)])
            // Shared pacing and unregistered tokens, in token order so nodes lock rows alike.
            for token in pace.keys.sorted() {
                let until = pace[token]!
                try c.query(
                    """
                    INSERT INTO token_pacing (token, paced_until, updated_at) VALUES ($1, $2, $3)
                    ON CONFLICT (token) DO UPDATE SET paced_until = GREATEST(token_pacing.paced_until, excluded.paced_until),
                        updated_at = excluded.updated_at
                    """, [.text(token), .int(until), .int(now)])
                // The token's other rows wait when they are claimed (StoreRules.claimVerdict),
                // on any node: no walk over them here.
            }
            try writeMarks(c, unregTokens, unreg, now: now)
            // The events of the rows this commit finishes (those whose lease this node held).
            let finished = changed.filter { $0.first?.string == "delivered" || $0.first?.string == "failed" }.compactMap { $0[1].string }
            let owners = try insertResponseEvents(c, responseIDs: finished, now: now)
            let delivered = changed.filter { $0.first?.string == "delivered" }.count
            var applied = Applied(finished: finished.count,
                                  events: [.responseDelivered: delivered, .responseFailed: finished.count - delivered],
                                  credentials: Set(owners.compactMap { $0 }))
            try writeTokenEvents(c, unregTokens, marking, finished: Set(finished), now: now, into: &applied)
            return applied
        }
    }

    /// The 410 marks of this outcome batch, in the transaction that failed the rows (after their
    /// UPDATE): an ingest batch on any node either committed before (its rows count as waiting)
    /// or sees the record.
    private func writeMarks(_ c: PostgresConnection, _ unregTokens: [String],
                            _ unreg: [String: (reason: String, apnsTimestamp: Int64)], now: Int64) throws {
        for token in unregTokens {
            let waiting = try c.query(
                "SELECT max(created_at) FROM responses WHERE push_token = $1 AND state IN ('queued','inflight','retry')",
                [.text(token)]).first?.first?.int
            try c.query(
                """
                INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at, reason) VALUES ($1, $2, $3, $4)
                ON CONFLICT (token) DO UPDATE SET apns_timestamp = GREATEST(unregistered_tokens.apns_timestamp, excluded.apns_timestamp),
                    recorded_at = excluded.recorded_at, reason = excluded.reason
                """, [.text(token), .int(StoreRules.markCutoff(apnsTimestamp: unreg[token]!.apnsTimestamp, newestPendingCreatedAt: waiting, now: now)),
                      .int(now), .text(unreg[token]!.reason)])
        }
    }

    /// token.unregistered per StoreRules.tokenUnregisteredEvents, over the answered rows' owners.
    private func writeTokenEvents(_ c: PostgresConnection, _ unregTokens: [String],
                                  _ marking: [String: [(reason: String, apnsTimestamp: Int64, id: String)]],
                                  finished finishedIDs: Set<String>, now: Int64, into applied: inout Applied) throws {
        for token in unregTokens {
            let answers = marking[token] ?? []
            var owner: [String: (credential: String, app: String)] = [:]
            for r in try c.query("SELECT id, credential_id, app FROM responses WHERE id = ANY($1::text[])", [.textArray(answers.map(\.id))]) {
                if let id = r[0].string { owner[id] = (r[1].string ?? "", r[2].string ?? "") }
            }
            let facts = answers.compactMap { a in
                owner[a.id].map { StoreRules.MarkingAnswer(reason: a.reason, apnsTimestamp: a.apnsTimestamp, credentialID: $0.credential, app: $0.app,
                                                           finished: finishedIDs.contains(a.id)) }
            }
            guard let events = StoreRules.tokenUnregisteredEvents(facts) else { continue }
            try insertTokenEvents(c, token: token, owners: events.owners, unregisteredAt: events.unregisteredAt, now: now)
            applied.events[.tokenUnregistered, default: 0] += events.owners.count
            applied.credentials.formUnion(events.owners.map(\.credentialID))
        }
    }
}
