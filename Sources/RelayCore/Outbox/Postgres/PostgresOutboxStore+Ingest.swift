// PostgresOutboxStore: the ingest batch. Two round trips (libpq pipelines), facts gathered by
// set-based statements, decided by StoreRules:
//   1. read: credentials, stored rows with the batch's keys, token marks, pacing;
//   2. write, one implicit transaction that commits at the pipeline's Sync: the credentials
//      lock and the batch's token locks (shared), one multi-row INSERT that checks again, under
//      those locks, that each row's credential is not revoked and that no token mark was
//      recorded since the read (a revocation, a 410 or a BadDeviceToken committed meanwhile),
//      ON CONFLICT DO NOTHING, and the credentials' last_used_at.
// Completions (and so 202s) run only once the Sync answered, i.e. after the commit.
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

extension PostgresOutboxStore {
    public func addCommitObserver(_ observer: any OutboxCommitObserver) { observers.add(observer) }

    /// Completes on the ingest thread after the batch's commit.
    public func submit(_ request: IngestRequest,
                       completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
        guard !options.readOnly else { return completion(.failure(.invalid("store opened read-only"))) }
        let item = PendingIngest(request: request, now: clock.nowMillis(), deadline: monotonicMillis() + options.timeouts.requestMillis,
                                 completion: completion)
        switch ingestWorker.submit(item) {
        case .queued: break
        case .full: completion(.failure(.unavailable("the ingest queue is full (\(ingestWorker.maxQueuedItems) requests)")))
        case .closed: completion(.failure(.closed))
        }
    }

    /// Runs on an ingest thread with everything queued. Nothing is handed out before the write
    /// pipeline's commit; if it fails, every item fails with its error (-> 503, never 202).
    /// Deadlocks and serialization failures (possible between nodes) are retried a few times.
    /// Items whose deadline passed while they were queued are answered 503 without running; the
    /// rest run under the earliest deadline among them.
    func ingestBatch(_ link: PostgresLink, _ all: [PendingIngest]) {
        let now = monotonicMillis()
        let items = all.filter { $0.deadline > now }
        if items.count < all.count {
            let late = StoreError.unavailable("not stored within store.requestTimeoutMs (\(options.timeouts.requestMillis) ms): PostgreSQL is slow or unreachable")
            for i in all where i.deadline <= now { i.completion(.failure(late)) }
        }
        guard !items.isEmpty else { return }
        link.deadline = items.lazy.map(\.deadline).min()
        var result: [Result<IngestOutcome, StoreError>]
        var attempt = 0
        while true {
            do {
                let settings = ingestSettings
                // The first round trip only reads: it may run again if the connection died idle.
                result = try link.withConnection(idempotent: true) { c in try self.ingest(items, settings, c) }
                break
            } catch {
                if case .postgres(let state, _, _)? = error as? StoreError, PGState.isRetryable(state), attempt < 3 {
                    attempt += 1
                    continue
                }
                link.noteFailure(error)
                let e = (error as? StoreError) ?? .invalid("\(error)")
                for i in items { i.completion(.failure(e)) }
                return
            }
        }
        stats.withLock {
            $0.batches += 1
            $0.jobs += items.count
        }
        // Before the completions, as on SQLite: whoever sees a 202 also sees the observers told.
        if result.contains(where: { if case .success(.accepted) = $0 { true } else { false } }) {
            observers.committed(OutboxCommit(queuedDue: true))
        }
        for (i, r) in zip(items, result) { i.completion(r) }
        refreshPendingIfStale()
    }

    /// A dedupe key: the app the request was admitted for (StoreRules.admit) and its four fields.
    private struct Key: Hashable, Comparable {
        var app: String
        var token: String
        var session: String
        var keyID: [UInt8]
        var index: Int64
        init(app: String, _ r: NewResponse) {
            self.app = app
            token = r.pushToken
            session = r.sessionIdentifier
            keyID = r.keyID
            index = Int64(r.messageIndex)
        }
        /// The UNIQUE key's column order.
        static func < (a: Key, b: Key) -> Bool {
            if a.token != b.token { return a.token < b.token }
            if a.session != b.session { return a.session < b.session }
            if a.keyID != b.keyID { return a.keyID.lexicographicallyPrecedes(b.keyID) }
            if a.index != b.index { return a.index < b.index }
            return a.app < b.app
        }
    }

    /// One probe of the UNIQUE key's prefix per looked-up response: the rows with its four
    /// fields under every app (one per app at most), since the app a request goes to is only
    /// known once its credential is read in the same round trip. OFFSET 0, like a LIMIT, keeps
    /// the LATERAL subquery from being flattened into a join, so no cached plan can turn it
    /// into a scan of the whole table (a hash join planned while the table was small read every
    /// row of it on each batch).
    static let existingSQL = """
        SELECT k.n, r.id, r.state, r.credential_id, r.app, r.encrypted_data
        FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) WITH ORDINALITY AS k(t, s, kid, mi, n)
        CROSS JOIN LATERAL (
            SELECT id, state, credential_id, app, encrypted_data FROM responses
            WHERE push_token = k.t AND session_id = k.s AND key_id = k.kid AND message_index = k.mi OFFSET 0) r
        """

    private static func existingStatement(_ rs: [NewResponse]) -> (sql: String, params: [PGValue]) {
        (existingSQL, [.textArray(rs.map(\.pushToken)), .textArray(rs.map(\.sessionIdentifier)), .bytesArray(rs.map(\.keyID)),
                       .intArray(rs.map { Int64($0.messageIndex) })])
    }

    /// The stored rows holding the looked-up fields, by position among them and by app.
    private static func existingRows(_ rows: [PGRow], count: Int) throws -> [Int: [String: ExistingRow]] {
        var out: [Int: [String: ExistingRow]] = [:]
        for r in rows {
            guard let n = r[0].int, n >= 1, n <= count, let id = r[1].string,
                  let state = r[2].string.flatMap(ResponseState.init(rawValue:)), let cred = r[3].string, let app = r[4].string,
                  let data = r[5].bytes
            else { throw StoreError.invalid("malformed responses row") }
            out[Int(n) - 1, default: [:]][app] = ExistingRow(id: id, state: state, credentialID: cred, encryptedData: data)
        }
        return out
    }

    /// Taken first in each ingest write, shared: ingest batches never wait for each other. A
    /// credentials change takes credentialsLockKey exclusive (schema v4's trigger) and a 410's
    /// record its token's lock (unregisteredLocksSQL), so neither commits between the
    /// INSERT's re-check and this transaction's commit. One order (ascending keys) everywhere.
    static let ingestLocksSQL = """
        SELECT count(pg_advisory_xact_lock_shared(k)) FROM (
            SELECT k FROM (SELECT \(credentialsLockKey)::bigint AS k UNION SELECT \(tokenLockSQL("t")) FROM unnest($1::text[]) AS t) a
            ORDER BY k OFFSET 0) s
        """

    /// The 410 path's side of ingestLocksSQL: the tokens' locks, exclusive, before their record.
    static let unregisteredLocksSQL = """
        SELECT count(pg_advisory_xact_lock(k)) FROM (
            SELECT DISTINCT \(tokenLockSQL("t")) AS k FROM unnest($1::text[]) AS t ORDER BY k OFFSET 0) s
        """

    /// The rows, in key order, each inserted only if its credential is still live and no mark was
    /// recorded for its token since the read (StoreRules.markRecordedSinceReadSQL) as of this
    /// statement, which runs under the locks above: what the read decided is checked again where
    /// it cannot change before the commit. Returns only the rows not inserted, with why: revoked,
    /// the reason of the mark that refuses it, or neither (another transaction stored the key:
    /// ON CONFLICT). The look-ups probe each table's key
    /// per credential and per token (LATERAL ... OFFSET 0, as existingSQL), whatever a cached
    /// plan made of an empty table.
    static let insertSQL = """
        WITH u AS MATERIALIZED (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bigint[], $7::bytea[], $8::text[],
                                 $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[]) WITH ORDINALITY
                AS u(id, app, token, session, kid, mi, data, cred, due, now, exp, seen, n)),
        live AS (
            SELECT k.cred AS id FROM (SELECT DISTINCT cred FROM u) k
            CROSS JOIN LATERAL (SELECT 1 FROM credentials c WHERE c.id = k.cred AND c.revoked_at IS NULL OFFSET 0) l),
        gone AS (
            SELECT t.token, g.reason FROM (SELECT DISTINCT token, seen FROM u) t
            CROSS JOIN LATERAL (
                SELECT x.reason FROM unregistered_tokens x WHERE x.token = t.token
                AND \(StoreRules.markRecordedSinceReadSQL(mark: "x", seen: "t.seen", badHold: "$13::bigint"))
                OFFSET 0) g),
        ins AS (
            INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                state, attempts, next_attempt_at, created_at, expires_at, updated_at)
            SELECT u.id, u.app, u.token, u.session, u.kid, u.mi, u.data, u.cred, 'queued', 0, u.due, u.now, u.exp, u.now
            FROM u WHERE u.cred IN (SELECT id FROM live) AND u.token NOT IN (SELECT token FROM gone)
            ORDER BY u.n
            ON CONFLICT (push_token, session_id, key_id, message_index, app) DO NOTHING
            RETURNING id)
        SELECT u.n, u.cred NOT IN (SELECT id FROM live), (SELECT g.reason FROM gone g WHERE g.token = u.token LIMIT 1)
        FROM u WHERE u.id NOT IN (SELECT id FROM ins)
        """

    /// What step 1 read: the batch's credentials, the stored rows holding its keys, the token
    /// marks (as read, and as this batch's probes update them) and the tokens' pacing.
    private struct BatchFacts {
        var creds: [[UInt8]: CredentialFacts] = [:]
        var found: [Int: [String: ExistingRow]] = [:]
        var marks: [String: (recordedAt: Int64, reason: String)] = [:]
        var seenMarks: [String: Int64] = [:]
        var pacedUntil: [String: Int64] = [:]
    }

    /// What step 2 decided: an outcome for every request refused or found, the rows to insert
    /// (ids minted, in arrival order), the requests repeating an earlier one of the batch, the
    /// probes, and the credentials whose last_used_at to touch.
    private struct BatchPlan {
        var outcomes: [Result<IngestOutcome, StoreError>?]
        var insert: [(item: Int, credID: String, key: Key, id: String)] = []
        var duplicateOf: [(item: Int, of: Int, credID: String)] = []
        var probes: [Int: String] = [:]   // item -> its token, whose hold starts again if it is stored
        var touched: [String: Int64] = [:]
    }

    private func ingest(_ items: [PendingIngest], _ settings: IngestStoreSettings, _ c: PostgresConnection) throws
        -> [Result<IngestOutcome, StoreError>] {
        let facts = try readFacts(items, c)
        var plan = decide(items, facts, settings)
        let notStored = try write(&plan, items, facts, settings, c)
        return try settle(plan, notStored: notStored, items, c)
    }

    /// 1. The facts, in one round trip. Credentials are read on every batch: a revocation
    ///    committed by relayctl (on any node) takes effect for the very next batch.
    private func readFacts(_ items: [PendingIngest], _ c: PostgresConnection) throws -> BatchFacts {
        let responses = items.map(\.request.response)
        let hashes = Array(Set(items.map(\.request.credentialHash)))
        let tokens = Array(Set(items.map(\.request.response.pushToken)))
        let answers = try c.pipeline([
            ("SELECT id, hash, apps, revoked_at FROM credentials WHERE hash = ANY($1)", [.bytesArray(hashes)]),
            Self.existingStatement(responses),
            ("SELECT token, recorded_at, reason FROM unregistered_tokens WHERE token = ANY($1)", [.textArray(tokens)]),
            ("SELECT token, paced_until FROM token_pacing WHERE token = ANY($1)", [.textArray(tokens)]),
        ])
        var facts = BatchFacts()
        for r in answers[0].rows {
            guard let id = r[0].string, let h = r[1].bytes else { continue }
            facts.creds[h] = CredentialFacts(id: id, hash: h, apps: Credentials.splitApps(r[2].string ?? ""), revoked: !r[3].isNull)
        }
        facts.found = try Self.existingRows(answers[1].rows, count: items.count)
        for r in answers[2].rows {
            if let t = r[0].string, let at = r[1].int { facts.marks[t] = (at, r[2].string ?? StoreRules.unregisteredReason) }
        }
        facts.seenMarks = facts.marks.mapValues(\.recordedAt)   // as read: the INSERT checks nothing changed since
        for r in answers[3].rows {
            if let t = r[0].string, let p = r[1].int { facts.pacedUntil[t] = p }
        }
        return facts
    }

    /// 2. Decide each request in arrival order, as SQLiteOutboxStore does one by one; then the
    ///    outbox bound, the last check: reserved here, in arrival order, so batches in flight on
    ///    other connections count too (given back by step 3 for whatever is not stored).
    private func decide(_ items: [PendingIngest], _ facts: BatchFacts, _ settings: IngestStoreSettings) -> BatchPlan {
        var plan = BatchPlan(outcomes: .init(repeating: nil, count: items.count))
        var marks = facts.marks
        var firstInBatch: [Key: Int] = [:]         // key -> the item that inserts it
        var wanted: [(item: Int, credID: String, key: Key)] = []
        for (n, item) in items.enumerated() {
            let req = item.request
            switch StoreRules.admit(credential: facts.creds[req.credentialHash], presentedHash: req.credentialHash, requestedApp: req.response.app,
                                    configuredApps: settings.configuredApps) {
            case .refused(let outcome):
                plan.outcomes[n] = .success(outcome)
            case .admitted(let credID, let app):
                if StoreRules.lastUsedIsStale(touchedAt: touchedAt.withLock({ $0[credID] }), now: item.now) {
                    plan.touched[credID] = max(plan.touched[credID] ?? 0, item.now)
                }
                let key = Key(app: app, req.response)
                if let e = facts.found[n]?[app] {
                    plan.outcomes[n] = .success(StoreRules.dedupe(e, credentialID: credID, encryptedData: req.response.encryptedData))
                } else if let first = firstInBatch[key] {
                    plan.duplicateOf.append((n, first, credID))
                } else if let m = marks[req.response.pushToken],
                          case .refused(let outcome) = StoreRules.markAdmission(reason: m.reason, recordedAt: m.recordedAt, now: item.now, settings: settings) {
                    plan.outcomes[n] = .success(outcome)
                } else {
                    let token = req.response.pushToken
                    if let m = marks[token], StoreRules.markAdmission(reason: m.reason, recordedAt: m.recordedAt, now: item.now, settings: settings) == .probe {
                        marks[token]?.recordedAt = item.now   // one probe per hold, in this batch too
                        plan.probes[n] = token
                    }
                    firstInBatch[key] = n
                    wanted.append((n, credID, key))
                }
            }
        }
        let granted = reservePending(wanted.count, limit: settings.maxPending)
        ids.withLock { gen in
            for (k, w) in wanted.enumerated() {
                if k < granted {
                    plan.insert.append((w.item, w.credID, w.key, gen.mint(nowMillis: items[w.item].now).id))
                } else {
                    plan.outcomes[w.item] = .success(.overCapacity)
                }
            }
        }
        return plan
    }

    /// 3. One round trip that commits: the locks, the rows (checked again under them), then
    ///    last_used_at (at most once a minute per credential and node). Rows go in key order
    ///    and credentials in id order, so two batches (of this node or another) take their
    ///    row locks in the same order. Returns the rows not inserted, by position in
    ///    `plan.insert`: refused by the re-check, or their key taken.
    private func write(_ plan: inout BatchPlan, _ items: [PendingIngest], _ facts: BatchFacts, _ settings: IngestStoreSettings,
                       _ c: PostgresConnection) throws -> [Int: (revoked: Bool, markReason: String?)] {
        if let hook = ingestWillWrite.withLock({ $0 }) { hook() }
        plan.insert.sort { $0.key < $1.key }
        let insert = plan.insert
        var write: [(sql: String, params: [PGValue])] = []
        if !insert.isEmpty {
            let rs = insert.map { items[$0.item].request.response }
            let nows = insert.map { items[$0.item].now }
            write.append((Self.ingestLocksSQL, [.textArray(Array(Set(rs.map(\.pushToken))))]))
            write.append((Self.insertSQL, [
                .textArray(insert.map(\.id)), .textArray(insert.map(\.key.app)), .textArray(rs.map(\.pushToken)),
                .textArray(rs.map(\.sessionIdentifier)), .bytesArray(rs.map(\.keyID)), .intArray(rs.map { Int64($0.messageIndex) }),
                .bytesArray(rs.map(\.encryptedData)), .textArray(insert.map(\.credID)),
                .intArray(insert.map { max(items[$0.item].now, facts.pacedUntil[items[$0.item].request.response.pushToken] ?? 0) }),
                .intArray(nows), .intArray(nows.map { $0 + settings.ttlMillis }),
                .intArray(rs.map { facts.seenMarks[$0.pushToken] ?? -1 }), .int(settings.badDeviceTokenHoldMillis),
            ]))
        }
        // A probe's hold starts again with it (only if it is stored: it commits with the rows).
        var rearmed: [String: Int64] = [:]
        for row in insert { if let token = plan.probes[row.item] { rearmed[token] = max(rearmed[token] ?? .min, items[row.item].now) } }
        for token in rearmed.keys.sorted() {
            write.append(("UPDATE unregistered_tokens SET recorded_at = $2 WHERE token = $1 AND recorded_at < $2", [.text(token), .int(rearmed[token]!)]))
        }
        let touched = plan.touched
        let touchedIDs = touched.keys.sorted()
        for id in touchedIDs {
            write.append(("UPDATE credentials SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $1) AND revoked_at IS NULL",
                          [.int(touched[id]!), .text(id)]))
        }
        var notStored: [Int: (revoked: Bool, markReason: String?)] = [:]
        guard !write.isEmpty else { return notStored }
        do {
            let answers = try c.pipeline(write)
            if !insert.isEmpty {
                for r in answers[1].rows {
                    guard let n = r[0].int, n >= 1, n <= insert.count, let revoked = r[1].bool
                    else { throw StoreError.invalid("malformed insert answer") }
                    notStored[Int(n) - 1] = (revoked, r[2].string)
                }
            }
        } catch {
            adjustPending(-insert.count)
            throw error
        }
        touchedAt.withLock { t in for id in touchedIDs { t[id] = max(t[id] ?? 0, touched[id]!) } }
        return notStored
    }

    /// 4. Committed. A credential revoked or a token recorded unregistered since the read
    ///    refuses its rows as the read would have. A row another node (or connection) inserted
    ///    meanwhile conflicted, after waiting for its commit, and is answered as the duplicate
    ///    it is. A request repeating an earlier one of the batch shares its fate.
    private func settle(_ plan: BatchPlan, notStored: [Int: (revoked: Bool, markReason: String?)], _ items: [PendingIngest],
                        _ c: PostgresConnection) throws -> [Result<IngestOutcome, StoreError>] {
        var outcomes = plan.outcomes
        var rowOf: [Int: Result<ExistingRow, StoreError>] = [:]   // item -> the row holding its key
        var lost: [(item: Int, credID: String, app: String)] = []
        for (k, row) in plan.insert.enumerated() {
            if let refused = notStored[k] {
                if refused.revoked {
                    outcomes[row.item] = .success(.unauthorized)
                } else if let reason = refused.markReason {
                    outcomes[row.item] = .success(reason == StoreRules.badDeviceTokenReason ? .badDeviceToken : .unregistered)
                } else {
                    lost.append((row.item, row.credID, row.key.app))
                }
            } else {
                outcomes[row.item] = .success(.accepted(id: row.id))
                rowOf[row.item] = .success(ExistingRow(id: row.id, state: .queued, credentialID: row.credID,
                                                       encryptedData: items[row.item].request.response.encryptedData))
            }
        }
        adjustPending(-notStored.count)
        if !lost.isEmpty {
            var holders: Result<[Int: [String: ExistingRow]], StoreError>
            do {
                let st = Self.existingStatement(lost.map { items[$0.item].request.response })
                holders = .success(try Self.existingRows(c.query(st.sql, st.params), count: lost.count))
            } catch {
                holders = .failure((error as? StoreError) ?? .invalid("\(error)"))
            }
            for (k, l) in lost.enumerated() {
                // Gone again already (or the look-up failed): nothing of this request is stored.
                let row = holders.flatMap { $0[k]?[l.app].map { .success($0) } ?? .failure(.unavailable("the stored row with this key vanished; retry")) }
                rowOf[l.item] = row
                outcomes[l.item] = row.map { StoreRules.dedupe($0, credentialID: l.credID, encryptedData: items[l.item].request.response.encryptedData) }
            }
        }
        // The repeat shares the row its first stored (or found), or its refusal by the outbox
        // bound. A 401 is the first one's credential's, not this one's: it may retry.
        for d in plan.duplicateOf {
            let data = items[d.item].request.response.encryptedData
            if let r = rowOf[d.of] {
                outcomes[d.item] = r.map { StoreRules.dedupe($0, credentialID: d.credID, encryptedData: data) }
            } else if case .success(.unauthorized)? = outcomes[d.of], plan.insert.first(where: { $0.item == d.of })?.credID != d.credID {
                outcomes[d.item] = .failure(.unavailable("the request stored first with this key was refused; retry"))
            } else {
                outcomes[d.item] = outcomes[d.of]
            }
        }
        guard outcomes.allSatisfy({ $0 != nil }) else { throw StoreError.invalid("ingest batch left a request undecided") }
        return outcomes.map { $0! }
    }
}
