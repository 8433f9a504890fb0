// PostgresOutboxStore: the ingest batch (set-based statements in one transaction; facts
// gathered here, decided by StoreRules).
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

extension PostgresOutboxStore {
    /// Completes on the ingest thread whatever `executor` says: a batch's answers need no grouping here.
    public func submit(_ request: IngestRequest, on executor: (any ThreadExecutor)?,
                       completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
        guard !options.readOnly else { return completion(.failure(.invalid("store opened read-only"))) }
        let item = PendingIngest(request: request, now: clock.nowMillis(), completion: completion)
        if !ingestWorker.submit(item) { completion(.failure(.closed)) }
    }

    /// Runs on the ingest thread with everything queued. One transaction; outcomes are handed
    /// out only after COMMIT, or every item fails with the batch's error (-> 503, never 202).
    func ingestBatch(_ w: PostgresWorker<PendingIngest>, _ items: [PendingIngest]) {
        let result: (outcomes: [IngestOutcome], inserted: Int, touched: [String: Int64])
        do {
            let settings = ingestSettings
            result = try w.transaction { c in try self.ingest(items, settings, c) }
        } catch {
            let e = (error as? StoreError) ?? .invalid("\(error)")
            for i in items { i.completion(.failure(e)) }
            return
        }
        for (id, at) in result.touched { touchedAt[id] = at }
        adjustPending(result.inserted)
        stats.withLock {
            $0.batches += 1
            $0.jobs += items.count
        }
        // Before the completions, as on SQLite: whoever sees a 202 also sees the wake-up.
        if result.inserted > 0 { channel?.wake() }
        for (i, o) in zip(items, result.outcomes) { i.completion(.success(o)) }
        refreshPendingIfStale()
    }

    private struct Key: Hashable {
        var token: String
        var session: String
        var keyID: [UInt8]
        var index: Int64
        init(_ r: NewResponse) {
            token = r.pushToken
            session = r.sessionIdentifier
            keyID = r.keyID
            index = Int64(r.messageIndex)
        }
    }

    /// One probe of the UNIQUE key per looked-up key. LATERAL ... LIMIT 1 cannot be flattened
    /// into a join, so no cached plan can turn it into a scan of the whole table (a hash join
    /// planned while the table was small read every row of it on each batch).
    static let existingSQL = """
        SELECT k.n, r.id, r.state, r.credential_id
        FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) WITH ORDINALITY AS k(t, s, kid, mi, n)
        CROSS JOIN LATERAL (
            SELECT id, state, credential_id FROM responses
            WHERE push_token = k.t AND session_id = k.s AND key_id = k.kid AND message_index = k.mi LIMIT 1) r
        """

    /// The stored rows holding these keys, by position in `keys`.
    private static func existing(_ keys: [Key], _ c: PostgresConnection) throws -> [Int: ExistingRow] {
        guard !keys.isEmpty else { return [:] }
        let rows = try c.query(existingSQL, [
            .textArray(keys.map(\.token)), .textArray(keys.map(\.session)), .bytesArray(keys.map(\.keyID)), .intArray(keys.map(\.index)),
        ])
        var out: [Int: ExistingRow] = [:]
        for r in rows {
            guard let n = r[0].int, n >= 1, n <= keys.count, let id = r[1].string,
                  let state = r[2].string.flatMap(ResponseState.init(rawValue:)), let cred = r[3].string
            else { throw StoreError.invalid("malformed responses row") }
            out[Int(n) - 1] = ExistingRow(id: id, state: state, credentialID: cred)
        }
        return out
    }

    private func ingest(_ items: [PendingIngest], _ settings: IngestStoreSettings, _ c: PostgresConnection) throws -> (outcomes: [IngestOutcome], inserted: Int, touched: [String: Int64]) {
        // 1. Credentials, in the same transaction: a revocation committed by relayctl (on any
        //    node) takes effect for the very next batch.
        let hashes = Array(Set(items.map(\.request.credentialHash)))
        var creds: [[UInt8]: CredentialFacts] = [:]
        for r in try c.query("SELECT id, hash, apps, revoked_at FROM credentials WHERE hash = ANY($1)", [.bytesArray(hashes)]) {
            guard let id = r[0].string, let h = r[1].bytes else { continue }
            creds[h] = CredentialFacts(id: id, hash: h, apps: Credentials.splitApps(r[2].string ?? ""), revoked: !r[3].isNull)
        }
        var outcomes = [IngestOutcome?](repeating: nil, count: items.count)
        var candidates: [(index: Int, credID: String, app: String)] = []
        var touched: [String: Int64] = [:]
        for (n, item) in items.enumerated() {
            let req = item.request
            switch StoreRules.admit(credential: creds[req.credentialHash], presentedHash: req.credentialHash, requestedApp: req.response.app,
                                    configuredApps: settings.configuredApps) {
            case .refused(let outcome):
                outcomes[n] = outcome
            case .admitted(let credID, let app):
                candidates.append((n, credID, app))
                if StoreRules.lastUsedIsStale(touchedAt: touchedAt[credID], now: item.now) { touched[credID] = max(touched[credID] ?? 0, item.now) }
            }
        }

        // 2. Dedupe against stored rows, then the token checks for what is left.
        let keys = candidates.map { Key(items[$0.index].request.response) }
        let found = try Self.existing(keys, c)
        let tokens = Array(Set(candidates.map { items[$0.index].request.response.pushToken }))
        var unregistered: [String: (reportedAt: Int64, lastSeen: Int64?)] = [:]
        var pacedUntil: [String: Int64] = [:]
        if !tokens.isEmpty {
            for r in try c.query(
                """
                SELECT u.token, u.apns_timestamp, (SELECT max(r.created_at) FROM responses r WHERE r.push_token = u.token)
                FROM unregistered_tokens u WHERE u.token = ANY($1)
                """, [.textArray(tokens)]) {
                if let t = r[0].string, let ts = r[1].int { unregistered[t] = (ts, r[2].int) }
            }
            for r in try c.query("SELECT token, paced_until FROM token_pacing WHERE token = ANY($1)", [.textArray(tokens)]) {
                if let t = r[0].string, let p = r[1].int { pacedUntil[t] = p }
            }
        }

        // 3. Decide each candidate in arrival order, as SQLiteOutboxStore does one by one.
        var capacityUsed = pendingEstimate()
        var firstInBatch: [Key: Int] = [:]  // key -> position in the insert arrays
        var duplicateOf: [Int: (pos: Int, credID: String)] = [:]   // item index -> position in the insert arrays
        var storedAs: [Int: ExistingRow] = [:]  // position -> the row holding its key after the INSERT
        var insertItem: [Int] = []          // position -> item index
        var ids: [String] = [], apps: [String] = [], credIDs: [String] = [], dues: [Int64] = []
        for (k, (cand, key)) in zip(candidates, keys).enumerated() {
            let item = items[cand.index]
            let r = item.request.response
            if let e = found[k] {
                outcomes[cand.index] = StoreRules.dedupe(e, credentialID: cand.credID)
                continue
            }
            if let pos = firstInBatch[key] {
                duplicateOf[cand.index] = (pos, cand.credID)
                continue
            }
            if let u = unregistered[r.pushToken], StoreRules.isUnregistered(cutoff: u.reportedAt, lastSeen: u.lastSeen) {
                outcomes[cand.index] = .unregistered
                continue
            }
            guard capacityUsed < settings.maxPending else {
                outcomes[cand.index] = .overCapacity
                continue
            }
            capacityUsed += 1
            firstInBatch[key] = insertItem.count
            insertItem.append(cand.index)
            ids.append(self.ids.mint(nowMillis: item.now).id)
            apps.append(cand.app)
            credIDs.append(cand.credID)
            dues.append(max(item.now, pacedUntil[r.pushToken] ?? 0))
        }

        // 4. One multi-row INSERT. A row another node inserted meanwhile conflicts (after
        //    waiting for its commit) and is answered as the duplicate it is.
        var inserted = 0
        if !insertItem.isEmpty {
            let rs = insertItem.map { items[$0].request.response }
            let nows = insertItem.map { items[$0].now }
            let returned = try c.query(
                """
                INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                    state, attempts, next_attempt_at, created_at, expires_at, updated_at)
                SELECT u.id, u.app, u.token, u.session, u.kid, u.mi, u.data, u.cred, 'queued', 0, u.due, u.now, u.exp, u.now
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bigint[], $7::bytea[], $8::text[],
                            $9::bigint[], $10::bigint[], $11::bigint[])
                    AS u(id, app, token, session, kid, mi, data, cred, due, now, exp)
                ON CONFLICT (push_token, session_id, key_id, message_index) DO NOTHING
                RETURNING id
                """,
                [.textArray(ids), .textArray(apps), .textArray(rs.map(\.pushToken)), .textArray(rs.map(\.sessionIdentifier)),
                 .bytesArray(rs.map(\.keyID)), .intArray(rs.map { Int64($0.messageIndex) }), .bytesArray(rs.map(\.encryptedData)),
                 .textArray(credIDs), .intArray(dues), .intArray(nows),
                 .intArray(nows.map { $0 + settings.ttlMillis })])
            let stored = Set(returned.compactMap { $0.first?.string })
            inserted = stored.count
            var lost: [Int] = []
            for (pos, n) in insertItem.enumerated() {
                if stored.contains(ids[pos]) {
                    outcomes[n] = .accepted(id: ids[pos])
                    storedAs[pos] = ExistingRow(id: ids[pos], state: .queued, credentialID: credIDs[pos])
                } else {
                    lost.append(pos)
                }
            }
            if !lost.isEmpty {
                let lostKeys = lost.map { Key(items[insertItem[$0]].request.response) }
                let now = try Self.existing(lostKeys, c)
                for (k, pos) in lost.enumerated() {
                    guard let e = now[k] else {
                        // Inserted and gone again within our statement: let the batch retry.
                        throw StoreError.postgres(sqlState: PGState.serializationFailure, message: "conflicting row vanished", context: "ingest")
                    }
                    outcomes[insertItem[pos]] = StoreRules.dedupe(e, credentialID: credIDs[pos])
                    storedAs[pos] = e
                }
            }
        }
        for (n, dup) in duplicateOf {
            if let row = storedAs[dup.pos] { outcomes[n] = StoreRules.dedupe(row, credentialID: dup.credID) }
        }

        // 5. last_used_at, at most once a minute per credential and node; in id order so two
        //    nodes' batches take these row locks in the same order.
        for id in touched.keys.sorted() {
            try c.query("UPDATE credentials SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $1)",
                        [.int(touched[id]!), .text(id)])
        }
        guard outcomes.allSatisfy({ $0 != nil }) else { throw StoreError.invalid("ingest batch left a request undecided") }
        return (outcomes.map { $0! }, inserted, touched)
    }
}
