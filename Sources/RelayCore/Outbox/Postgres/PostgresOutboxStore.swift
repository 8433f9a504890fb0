// OutboxStore on PostgreSQL, so several relay-server nodes share one queue (docs/postgres.md).
//
// Same schema semantics as SQLiteOutboxStore, plus a lease (owner node + expiry) on inflight rows:
// - ingest: group commit on one connection owned by the ingest thread. Everything queued runs
//   as ONE transaction of set-based statements (credential lookup, dedupe, unregistered and
//   pacing checks, one multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING), so a batch costs
//   a handful of round trips and one WAL flush however many requests it holds. Completions (and
//   so 202s) run only after COMMIT returned.
// - dispatch: rows are claimed with FOR UPDATE SKIP LOCKED into a lease; apply only changes rows
//   whose lease this node still holds; expired leases (a dead node's) are reclaimed by any node.
// - reads (GET, relayctl, metrics) use a third connection, so they never wait behind a batch.
// Each connection lives on its own store-owned thread (PostgresWorker) and reconnects with
// back-off; while the database is away every call fails fast with StoreError.unavailable.
import FoundationEssentials
import Glibc
import Synchronization

public struct PostgresStoreOptions: Sendable {
    /// libpq connection URI or key=value string (may carry sslmode, options=-csearch_path=...).
    public var url: String
    /// This node's name in leases. Two live nodes must never share one. A name that stays the
    /// same across restarts lets `recoverInflight` take back this node's own leases at once;
    /// otherwise they return to the queue when they expire.
    public var nodeID: String
    /// How long a claimed row stays leased to this node. Longer than the APNs request timeout,
    /// so a live node's push is never reclaimed while its answer is on the way.
    public var leaseMillis: Int64
    public var maxBatch: Int
    /// Do not migrate; refuse writes (relayctl status/list next to running nodes).
    public var readOnly: Bool
    /// How often the shared outbox-bound estimate is recounted from the database.
    public var pendingRefreshMillis: Int64

    public init(url: String, nodeID: String? = nil, leaseMillis: Int64 = 60_000, maxBatch: Int = 1024,
                readOnly: Bool = false, pendingRefreshMillis: Int64 = 1_000) {
        self.url = url
        self.nodeID = nodeID ?? Self.defaultNodeID()
        self.leaseMillis = leaseMillis
        self.maxBatch = maxBatch
        self.readOnly = readOnly
        self.pendingRefreshMillis = pendingRefreshMillis
    }

    /// host-pid: unique among live processes, new on every start.
    public static func defaultNodeID() -> String {
        "\(ProcessInfo.processInfo.hostName)-\(getpid())"
    }
}

public final class PostgresOutboxStore: OutboxStore, @unchecked Sendable {
    // @unchecked Sendable: every connection is confined to its worker's thread; `touchedAt` and
    // `ids` are only used inside ingest batches (ingest thread); shared counters live in Mutexes.
    public static let schemaVersion = 1
    /// pg_advisory_lock key serialising migrations between nodes starting at once.
    static let migrationLockKey: Int64 = 0x5245_4C41_594D_4947  // "RELAYMIG"

    struct PendingIngest {
        let request: IngestRequest
        let now: Int64
        let completion: @Sendable (Result<IngestOutcome, StoreError>) -> Void
    }

    private struct Pending {
        var estimate = 0
        var adjustments: Int64 = 0
        var lastRefresh: Int64 = 0
        var refreshing = false
    }

    public let options: PostgresStoreOptions
    private let clock: any RelayClock
    private let logger: RelayLogger?
    private let ingestWorker: PostgresWorker<PendingIngest>
    private let dispatchWorker: PostgresWorker<Void>
    private let queryWorker: PostgresWorker<Void>
    private let pending = Mutex(Pending())
    private let commitHook = Mutex<(@Sendable () -> Void)?>(nil)
    private let stats = Mutex((batches: 0, jobs: 0))
    private var touchedAt: [String: Int64] = [:]
    /// Response ids (UUIDv7, as SQLiteOutboxStore mints them), minted on the ingest thread only.
    private var ids = TimeOrderedIDs()

    public var nodeID: String { options.nodeID }

    /// Wakes whoever waits for new rows (the dispatcher) after each ingest commit.
    public var onCommit: (@Sendable () -> Void)? {
        get { commitHook.withLock { $0 } }
        set { commitHook.withLock { $0 = newValue } }
    }

    /// Connects, runs migrations under an advisory lock (or, read-only, checks the version) and
    /// counts pending rows. Throws when the database cannot be reached or is newer than us.
    public init(options: PostgresStoreOptions, clock: any RelayClock = SystemRelayClock(), logger: RelayLogger? = nil) throws {
        guard !options.nodeID.isEmpty else { throw StoreError.invalid("node id must not be empty") }
        self.options = options
        self.clock = clock
        self.logger = logger
        ingestWorker = PostgresWorker(name: "pg-ingest", url: options.url, logger: logger, maxBatch: options.maxBatch)
        dispatchWorker = PostgresWorker(name: "pg-dispatch", url: options.url, logger: logger)
        queryWorker = PostgresWorker(name: "pg-query", url: options.url, logger: logger)
        ingestWorker.start { [unowned self] w, items in self.ingestBatch(w, items) }
        dispatchWorker.start()
        queryWorker.start()
        do {
            if options.readOnly {
                let v = try queryWorker.perform { w in try Self.schemaVersion(w.connection()) }
                guard v == Self.schemaVersion else {
                    throw StoreError.invalid("database has schema version \(v), expected \(Self.schemaVersion) (start relay-server once to migrate)")
                }
            } else {
                try dispatchWorker.perform { w in try Self.migrate(w.connection()) }
            }
            let n = try queryWorker.perform { w in try Self.countPending(w.connection()) }
            pending.withLock {
                $0.estimate = n
                $0.lastRefresh = monotonicMicros() / 1000
            }
        } catch {
            close()
            throw error
        }
    }

    deinit { close() }

    public func close() {
        ingestWorker.close()
        dispatchWorker.close()
        queryWorker.close()
    }

    // MARK: schema

    /// Index i is the migration to version i+1. Each backend numbers its own migrations: this
    /// v1 creates what SQLite reached in five steps (its v2-v5 changed only SQLite storage: the
    /// pending counter, CHECK and index forms, the id_high row key), so version numbers are not
    /// comparable across backends. Both hold the same tables and columns; PostgreSQL adds the
    /// lease columns and partial indexes for the claim (StoreContractTests compare them).
    static let migrations: [String] = [
        // v1
        """
        CREATE TABLE responses (
            id text PRIMARY KEY,
            app text NOT NULL,
            push_token text NOT NULL,
            session_id text NOT NULL,
            key_id bytea NOT NULL,
            message_index bigint NOT NULL,
            encrypted_data bytea NOT NULL,
            credential_id text NOT NULL,
            state text NOT NULL CHECK (state IN ('queued','inflight','retry','delivered','failed')),
            attempts bigint NOT NULL DEFAULT 0,
            next_attempt_at bigint NOT NULL,
            created_at bigint NOT NULL,
            expires_at bigint NOT NULL,
            last_status bigint,
            last_reason text,
            updated_at bigint NOT NULL,
            lease_owner text,
            lease_expires_at bigint,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        CREATE INDEX responses_due ON responses (next_attempt_at) WHERE state IN ('queued','retry');
        CREATE INDEX responses_lease ON responses (lease_expires_at) WHERE state = 'inflight';
        CREATE INDEX responses_updated ON responses (state, updated_at);
        CREATE TABLE attempts (
            id bigserial PRIMARY KEY,
            response_id text NOT NULL,
            attempted_at bigint NOT NULL,
            status bigint,
            reason text,
            apns_timestamp bigint,
            latency_us bigint,
            node text
        );
        CREATE INDEX attempts_response ON attempts (response_id, id);
        CREATE TABLE credentials (
            id text PRIMARY KEY,
            name text NOT NULL,
            hash bytea NOT NULL UNIQUE,
            apps text NOT NULL,
            created_at bigint NOT NULL,
            last_used_at bigint,
            revoked_at bigint
        );
        CREATE TABLE unregistered_tokens (
            token text PRIMARY KEY,
            apns_timestamp bigint NOT NULL,
            recorded_at bigint NOT NULL
        );
        CREATE TABLE token_pacing (
            token text PRIMARY KEY,
            paced_until bigint NOT NULL,
            updated_at bigint NOT NULL
        );
        """,
    ]

    static func schemaVersion(_ c: PostgresConnection) throws -> Int {
        let exists = try c.query("SELECT to_regclass('relay_schema_version') IS NOT NULL").first?.first?.bool ?? false
        guard exists else { return 0 }
        return Int(try c.query("SELECT max(version) FROM relay_schema_version").first?.first?.int ?? 0)
    }

    /// Applies every migration above the stored version, each in its own transaction, while
    /// holding a session advisory lock: nodes starting together migrate one after the other
    /// (the later ones find nothing to do). Refuses a database written by a newer relay.
    static func migrate(_ c: PostgresConnection) throws {
        try c.query("SELECT pg_advisory_lock($1)", [.int(migrationLockKey)])
        defer { _ = try? c.query("SELECT pg_advisory_unlock($1)", [.int(migrationLockKey)]) }
        try c.execute("CREATE TABLE IF NOT EXISTS relay_schema_version (version bigint NOT NULL)")
        let current = try schemaVersion(c)
        guard current <= migrations.count else {
            throw StoreError.invalid("database schema version \(current) is newer than this relay (\(migrations.count))")
        }
        for v in current..<migrations.count {
            do {
                try c.execute("BEGIN")
                try c.execute(migrations[v])
                try c.execute("DELETE FROM relay_schema_version")
                try c.query("INSERT INTO relay_schema_version (version) VALUES ($1)", [.int(Int64(v + 1))])
                try c.execute("COMMIT")
            } catch {
                if c.isOK && !c.isIdle { try? c.execute("ROLLBACK") }
                throw error
            }
        }
    }

    static func countPending(_ c: PostgresConnection) throws -> Int {
        Int(try c.query("SELECT count(*) FROM responses WHERE state IN ('queued','inflight','retry')").first?.first?.int ?? 0)
    }

    // MARK: the shared outbox bound

    /// Rows still to deliver, as last counted plus this node's own changes since. Other nodes'
    /// changes show up at the next recount (every `pendingRefreshMillis`), so with N nodes the
    /// bound can be overshot by what the others accepted in that window (docs/postgres.md).
    private func pendingEstimate() -> Int { pending.withLock { $0.estimate } }

    private func adjustPending(_ n: Int) {
        guard n != 0 else { return }
        pending.withLock {
            $0.estimate += n
            $0.adjustments += Int64(n)
        }
    }

    private func refreshPendingIfStale() {
        let now = monotonicMicros() / 1000
        let start: Int64? = pending.withLock {
            guard !$0.refreshing, now - $0.lastRefresh >= options.pendingRefreshMillis else { return nil }
            $0.refreshing = true
            return $0.adjustments
        }
        guard let before = start else { return }
        // On the query thread, so the ingest batch never waits for the count.
        queryWorker.enqueueDetached { [unowned self] w in
            let counted = try? w.withConnection(Self.countPending)
            self.pending.withLock {
                if let counted { $0.estimate = counted + Int($0.adjustments - before) }
                $0.lastRefresh = monotonicMicros() / 1000
                $0.refreshing = false
            }
        }
    }

    // MARK: ingest

    public func submit(_ request: IngestRequest, completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
        guard !options.readOnly else { return completion(.failure(.invalid("store opened read-only"))) }
        let item = PendingIngest(request: request, now: clock.nowMillis(), completion: completion)
        if !ingestWorker.submit(item) { completion(.failure(.closed)) }
    }

    /// Runs on the ingest thread with everything queued. One transaction; outcomes are handed
    /// out only after COMMIT, or every item fails with the batch's error (-> 503, never 202).
    private func ingestBatch(_ w: PostgresWorker<PendingIngest>, _ items: [PendingIngest]) {
        let result: (outcomes: [IngestOutcome], inserted: Int, touched: [String: Int64])
        do {
            result = try w.transaction { c in try self.ingest(items, c) }
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
        for (i, o) in zip(items, result.outcomes) { i.completion(.success(o)) }
        if result.inserted > 0 { onCommit?() }
        refreshPendingIfStale()
    }

    private struct Key: Hashable {
        var token: String
        var session: String
        var keyID: [UInt8]
        var index: Int64
        init(token: String, session: String, keyID: [UInt8], index: Int64) {
            self.token = token
            self.session = session
            self.keyID = keyID
            self.index = index
        }
        init(_ r: NewResponse) {
            token = r.pushToken
            session = r.sessionIdentifier
            keyID = r.keyID
            index = Int64(r.messageIndex)
        }
    }

    private static let existingSQL = """
        SELECT r.id, r.state, r.push_token, r.session_id, r.key_id, r.message_index, r.credential_id FROM responses r
        JOIN unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) AS k(t, s, kid, mi)
          ON r.push_token = k.t AND r.session_id = k.s AND r.key_id = k.kid AND r.message_index = k.mi
        """

    private static func existing(_ keys: [Key], _ c: PostgresConnection) throws -> [Key: ExistingRow] {
        guard !keys.isEmpty else { return [:] }
        let rows = try c.query(existingSQL, [
            .textArray(keys.map(\.token)), .textArray(keys.map(\.session)), .bytesArray(keys.map(\.keyID)), .intArray(keys.map(\.index)),
        ])
        var out: [Key: ExistingRow] = [:]
        for r in rows {
            guard let id = r[0].string, let state = r[1].string.flatMap(ResponseState.init(rawValue:)),
                  let t = r[2].string, let s = r[3].string, let k = r[4].bytes, let i = r[5].int, let cred = r[6].string
            else { throw StoreError.invalid("malformed responses row") }
            out[Key(token: t, session: s, keyID: k, index: i)] = ExistingRow(id: id, state: state, credentialID: cred)
        }
        return out
    }

    private func ingest(_ items: [PendingIngest], _ c: PostgresConnection) throws -> (outcomes: [IngestOutcome], inserted: Int, touched: [String: Int64]) {
        // 1. Credentials, in the same transaction: a revocation committed by relayctl (on any
        //    node) takes effect for the very next batch.
        let hashes = Array(Set(items.map(\.request.credentialHash)))
        var creds: [[UInt8]: CredentialFacts] = [:]
        for r in try c.query("SELECT id, hash, apps, revoked_at FROM credentials WHERE hash = ANY($1)", [.bytesArray(hashes)]) {
            guard let id = r[0].string, let h = r[1].bytes else { continue }
            creds[h] = CredentialFacts(id: id, hash: h, apps: SQLiteOutboxStore.splitApps(r[2].string ?? ""), revoked: !r[3].isNull)
        }
        var outcomes = [IngestOutcome?](repeating: nil, count: items.count)
        var candidates: [(index: Int, credID: String, app: String)] = []
        var touched: [String: Int64] = [:]
        for (n, item) in items.enumerated() {
            let req = item.request
            switch StoreRules.admit(credential: creds[req.credentialHash], presentedHash: req.credentialHash, requestedApp: req.response.app,
                                    configuredApps: req.configuredApps) {
            case .refused(let outcome):
                outcomes[n] = outcome
            case .admitted(let credID, let app):
                candidates.append((n, credID, app))
                if (touchedAt[credID] ?? 0) < item.now - 60_000 { touched[credID] = max(touched[credID] ?? 0, item.now) }
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
        for (cand, key) in zip(candidates, keys) {
            let item = items[cand.index]
            let r = item.request.response
            if let e = found[key] {
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
            guard capacityUsed < item.request.maxPending else {
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
                 .intArray(zip(insertItem, nows).map { $1 + items[$0].request.ttlMillis })])
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
                for (pos, key) in zip(lost, lostKeys) {
                    guard let e = now[key] else {
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

    // MARK: dispatcher

    private func write<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        return try dispatchWorker.perform { w in try w.withConnection(body) }
    }

    private func writeTransaction<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        return try dispatchWorker.perform { w in try w.transaction(body) }
    }

    private func read<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        try queryWorker.perform { w in try w.withConnection(body) }
    }

    /// Rows this node left inflight (same node id: a restart) and every expired lease go back
    /// to queued with the same id. Other live nodes' leases are left alone.
    public func recoverInflight() throws -> Int {
        let now = clock.nowMillis()
        let me = options.nodeID
        return try write { c in
            try c.run(
                """
                UPDATE responses SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = $1
                WHERE state = 'inflight' AND (lease_owner = $2 OR lease_owner IS NULL OR lease_expires_at <= $1)
                """, [.int(now), .text(me)]).affected
        }
    }

    static let rowColumns = """
        r.id, r.app, r.push_token, r.session_id, r.key_id, r.message_index, r.encrypted_data, r.credential_id, r.state, r.attempts,
        r.next_attempt_at, r.created_at, r.expires_at, r.last_status, r.last_reason, r.updated_at
        """

    static func decodeRow(_ c: PGRow) throws -> OutboxRow {
        guard c.count == 16, let id = c[0].string, let state = c[8].string.flatMap(ResponseState.init(rawValue:)) else {
            throw StoreError.invalid("malformed responses row")
        }
        return OutboxRow(
            id: id, app: c[1].string ?? "", pushToken: c[2].string ?? "", sessionIdentifier: c[3].string ?? "",
            keyID: c[4].bytes ?? [], messageIndex: UInt32(truncatingIfNeeded: c[5].int ?? 0), encryptedData: c[6].bytes ?? [],
            credentialID: c[7].string ?? "", state: state, attempts: Int(c[9].int ?? 0), nextAttemptAt: c[10].int ?? 0,
            createdAt: c[11].int ?? 0, expiresAt: c[12].int ?? 0, lastStatus: c[13].int.map { Int($0) }, lastReason: c[14].string,
            updatedAt: c[15].int ?? 0)
    }

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
            updated_at = $1
        FROM c WHERE r.id = c.id
        RETURNING \(rowColumns)
        """
    }

    private static let reclaimSQL = claimSQL(
        "SELECT id FROM responses WHERE state = 'inflight' AND lease_expires_at <= $1 ORDER BY lease_expires_at LIMIT $2")
    private static let dueSQL = claimSQL(
        "SELECT id FROM responses WHERE state IN ('queued','retry') AND next_attempt_at <= $1 ORDER BY next_attempt_at LIMIT $2")

    public func claimDue(limit: Int) throws -> [OutboxRow] {
        guard limit > 0 else { return [] }
        let now = clock.nowMillis()
        let params: (Int) -> [PGValue] = { [options] n in
            [.int(now), .int(Int64(n)), .text(options.nodeID), .int(now + options.leaseMillis)]
        }
        let rows: [OutboxRow] = try write { c in
            // Expired leases first: their rows have waited longest (a node died holding them).
            var rows = try c.query(Self.reclaimSQL, params(limit)).map(Self.decodeRow)
            if rows.count < limit {
                rows += try c.query(Self.dueSQL, params(limit - rows.count)).map(Self.decodeRow)
            }
            return rows
        }
        adjustPending(-rows.filter { $0.state == .failed }.count)
        return rows.filter { $0.state == .inflight }.sorted { ($0.nextAttemptAt, $0.createdAt) < ($1.nextAttemptAt, $1.createdAt) }
    }

    /// Earliest next_attempt_at among queued/retry rows, or an earlier expiry of another node's
    /// lease (so a survivor wakes up to take over a dead node's rows).
    public func nextDueAt() throws -> Int64? {
        let me = options.nodeID
        return try read { c in
            let r = try c.query(
                """
                SELECT (SELECT min(next_attempt_at) FROM responses WHERE state IN ('queued','retry')),
                       (SELECT min(lease_expires_at) FROM responses WHERE state = 'inflight' AND lease_owner <> $1)
                """, [.text(me)]).first ?? []
            return [r.first?.int, r.last?.int].compactMap { $0 }.min()
        }
    }

    public func apply(_ updates: [DeliveryUpdate]) throws {
        guard !updates.isEmpty else { return }
        let now = clock.nowMillis()
        let me = options.nodeID
        var ids: [String?] = [], states: [String?] = [], counted: [Int64?] = [], next: [Int64?] = [], status: [Int64?] = [], reasons: [String?] = []
        var pace: [String: Int64] = [:]
        var unreg: [String: Int64] = [:]
        for u in updates {
            let s = u.attempt?.status.map { Int64($0) }
            ids.append(u.id)
            counted.append(u.attempt == nil ? 0 : 1)
            status.append(s)
            switch u.outcome {
            case .delivered:
                states.append("delivered"); next.append(nil); reasons.append(nil)
            case .failed(let why):
                states.append("failed"); next.append(nil); reasons.append(why)
            case .unregistered(let why, let ts):
                states.append("failed"); next.append(nil); reasons.append(why)
                unreg[u.pushToken] = max(unreg[u.pushToken] ?? .min, ts)
            case .retry(let at, let until):
                states.append("retry"); next.append(at); reasons.append(u.attempt?.reason)
                if let until { pace[u.pushToken] = max(pace[u.pushToken] ?? .min, until) }
            case .requeue:
                states.append("queued"); next.append(nil); reasons.append(nil)
            }
        }
        let attempts = updates.compactMap(\.attempt)
        let finished: Int = try writeTransaction { c in
            if !attempts.isEmpty {
                // The attempt happened even if our lease was lost meanwhile: always recorded.
                try c.query(
                    """
                    INSERT INTO attempts (response_id, attempted_at, status, reason, apns_timestamp, latency_us, node)
                    SELECT a.rid, a.at, a.status, a.reason, a.ts, a.lat, $7
                    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[]) AS a(rid, at, status, reason, ts, lat)
                    """,
                    [.textArray(attempts.map(\.responseID)), .intArray(attempts.map(\.attemptedAt)),
                     .intArray(attempts.map { $0.status.map { Int64($0) } }), .textArray(attempts.map(\.reason)),
                     .intArray(attempts.map(\.apnsTimestamp)), .intArray(attempts.map(\.latencyMicros)), .text(me)])
            }
            // Only rows whose lease this node still holds: after an expired lease another node
            // owns the row and its outcome stands.
            let changed = try c.query(
                """
                UPDATE responses r SET
                    state = u.state,
                    attempts = r.attempts + u.counted,
                    next_attempt_at = COALESCE(u.next, r.next_attempt_at),
                    last_status = CASE WHEN u.state = 'queued' THEN r.last_status ELSE u.status END,
                    last_reason = CASE WHEN u.state = 'queued' THEN r.last_reason ELSE u.reason END,
                    lease_owner = NULL, lease_expires_at = NULL, updated_at = $7
                FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[]) AS u(id, state, counted, next, status, reason)
                WHERE r.id = u.id AND r.state = 'inflight' AND r.lease_owner = $8
                RETURNING u.state
                """,
                [.textArray(ids), .textArray(states), .intArray(counted), .intArray(next), .intArray(status), .textArray(reasons),
                 .int(now), .text(me)])
            // Shared pacing and unregistered tokens, in token order so nodes lock rows alike.
            for token in pace.keys.sorted() {
                let until = pace[token]!
                try c.query(
                    """
                    INSERT INTO token_pacing (token, paced_until, updated_at) VALUES ($1, $2, $3)
                    ON CONFLICT (token) DO UPDATE SET paced_until = GREATEST(token_pacing.paced_until, excluded.paced_until),
                        updated_at = excluded.updated_at
                    """, [.text(token), .int(until), .int(now)])
                // Rows being claimed by another node right now are skipped, not waited for:
                // they get their own 429 and pace themselves.
                try c.query(
                    """
                    UPDATE responses SET next_attempt_at = $1 WHERE id IN (
                        SELECT id FROM responses WHERE push_token = $2 AND state IN ('queued','retry') AND next_attempt_at < $1
                        FOR UPDATE SKIP LOCKED)
                    """, [.int(until), .text(token)])
            }
            // In the transaction that failed the rows (after their UPDATE): an ingest batch on any
            // node either committed before (its rows count as waiting) or sees the record.
            for token in unreg.keys.sorted() {
                let waiting = try c.query(
                    "SELECT max(created_at) FROM responses WHERE push_token = $1 AND state IN ('queued','inflight','retry')",
                    [.text(token)]).first?.first?.int
                try c.query(
                    """
                    INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at) VALUES ($1, $2, $3)
                    ON CONFLICT (token) DO UPDATE SET apns_timestamp = GREATEST(unregistered_tokens.apns_timestamp, excluded.apns_timestamp),
                        recorded_at = excluded.recorded_at
                    """, [.text(token), .int(StoreRules.unregisteredCutoff(apnsTimestamp: unreg[token]!, newestPendingCreatedAt: waiting)), .int(now)])
            }
            return changed.filter { $0.first?.string == "delivered" || $0.first?.string == "failed" }.count
        }
        adjustPending(-finished)
    }

    // MARK: queries

    public func response(id: String) throws -> OutboxRow? {
        try read { c in
            try c.query("SELECT \(Self.rowColumns) FROM responses r WHERE r.id = $1", [.text(id.lowercased())]).first.map(Self.decodeRow)
        }
    }

    public func attempts(responseID: String) throws -> [AttemptRecord] {
        try read { c in
            try c.query(
                "SELECT response_id, attempted_at, status, reason, apns_timestamp, latency_us FROM attempts WHERE response_id = $1 ORDER BY id",
                [.text(responseID.lowercased())]
            ).map { r in
                AttemptRecord(responseID: r[0].string ?? "", attemptedAt: r[1].int ?? 0, status: r[2].int.map { Int($0) },
                              reason: r[3].string, apnsTimestamp: r[4].int, latencyMicros: r[5].int)
            }
        }
    }

    /// Which node made each attempt of a response (tests and `relayctl show` diagnostics).
    public func attemptNodes(responseID: String) throws -> [String?] {
        try read { c in
            try c.query("SELECT node FROM attempts WHERE response_id = $1 ORDER BY id", [.text(responseID.lowercased())]).map { $0[0].string }
        }
    }

    public func list(_ filter: OutboxFilter) throws -> [OutboxRow] {
        var clauses: [String] = []
        var binds: [PGValue] = []
        func bind(_ v: PGValue) -> String {
            binds.append(v)
            return "$\(binds.count)"
        }
        if let s = filter.state { clauses.append("r.state = " + bind(.text(s.rawValue))) }
        if let a = filter.app { clauses.append("r.app = " + bind(.text(a))) }
        if let p = filter.tokenPrefix { clauses.append("starts_with(r.push_token, " + bind(.text(p.lowercased())) + ")") }
        if let since = filter.createdSince { clauses.append("r.created_at >= " + bind(.int(since))) }
        let whereSQL = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        let limit = bind(.int(Int64(max(0, filter.limit))))
        let sql = "SELECT \(Self.rowColumns) FROM responses r \(whereSQL) ORDER BY r.created_at DESC, r.id LIMIT \(limit)"
        let params = binds
        return try read { c in try c.query(sql, params).map(Self.decodeRow) }
    }

    public func counts() throws -> OutboxCounts {
        try read { c in
            var by: [ResponseState: Int] = [:]
            for s in ResponseState.allCases { by[s] = 0 }
            for r in try c.query("SELECT state, count(*) FROM responses GROUP BY state") {
                if let s = r[0].string.flatMap(ResponseState.init(rawValue:)) { by[s] = Int(r[1].int ?? 0) }
            }
            let oldest = try c.query("SELECT min(created_at) FROM responses WHERE state IN ('queued','retry')").first?.first?.int
            return OutboxCounts(byState: by, oldestPendingCreatedAt: oldest)
        }
    }

    public func recentOutcomes(since: Int64) throws -> [(state: ResponseState, reason: String?, count: Int)] {
        try read { c in
            try c.query(
                """
                SELECT state, last_reason, count(*) FROM responses WHERE state IN ('delivered','failed') AND updated_at >= $1
                GROUP BY state, last_reason ORDER BY state, last_reason NULLS FIRST
                """, [.int(since)]
            ).compactMap { r in
                guard let s = r[0].string.flatMap(ResponseState.init(rawValue:)) else { return nil }
                return (s, r[1].string, Int(r[2].int ?? 0))
            }
        }
    }

    // MARK: operator actions (never touch inflight rows)

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

    public func requeueFailed(reason: String?) throws -> Int {
        let now = clock.nowMillis()
        let n: Int = try write { c in
            let set = "state = 'queued', next_attempt_at = $1, expires_at = GREATEST(expires_at, $2), updated_at = $1"
            if let reason {
                return try c.run("UPDATE responses SET \(set) WHERE state = 'failed' AND last_reason = $3",
                                 [.int(now), .int(StoreRules.requeueExpiryFloor(now: now)), .text(reason)]).affected
            }
            return try c.run("UPDATE responses SET \(set) WHERE state = 'failed'", [.int(now), .int(StoreRules.requeueExpiryFloor(now: now))]).affected
        }
        adjustPending(n)
        return n
    }

    public func purge(state s: ResponseState, olderThan: Int64, dryRun: Bool) throws -> Int {
        guard s.isTerminal else { throw StoreError.invalid("only delivered or failed rows can be purged") }
        if dryRun {
            return try read { c in
                Int(try c.query("SELECT count(*) FROM responses WHERE state = $1 AND updated_at < $2",
                                [.text(s.rawValue), .int(olderThan)]).first?.first?.int ?? 0)
            }
        }
        return try PurgeBatches.run(self, state: s, olderThan: olderThan)
    }

    public func purgeBatch(state s: ResponseState, olderThan: Int64, limit: Int) throws -> Int {
        guard s.isTerminal else { throw StoreError.invalid("only delivered or failed rows can be purged") }
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

    public func unregisteredTokens() throws -> [UnregisteredToken] {
        try read { c in
            try c.query("SELECT token, apns_timestamp, recorded_at FROM unregistered_tokens ORDER BY recorded_at DESC, token").map {
                UnregisteredToken(token: $0[0].string ?? "", apnsTimestamp: $0[1].int ?? 0, recordedAt: $0[2].int ?? 0)
            }
        }
    }

    public func forgetToken(_ token: String) throws -> Bool {
        try write { c in try c.run("DELETE FROM unregistered_tokens WHERE token = $1", [.text(token.lowercased())]).affected > 0 }
    }

    // MARK: credentials

    public func createCredential(name: String, apps: [String]) throws -> CreatedCredential {
        guard !name.isEmpty else { throw StoreError.invalid("credential name must not be empty") }
        guard !apps.isEmpty, apps.allSatisfy({ !$0.isEmpty && !$0.contains(",") }) else {
            throw StoreError.invalid("credential needs at least one app (bundle ID without commas)")
        }
        let secret = Credentials.generateSecret()
        let hash = Credentials.hash(secret: secret)
        let id = Credentials.generateID()
        let now = clock.nowMillis()
        _ = try write { c in
            try c.query("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ($1, $2, $3, $4, $5)",
                        [.text(id), .text(name), .bytes(hash), .text(apps.joined(separator: ",")), .int(now)])
        }
        return CreatedCredential(record: CredentialRecord(id: id, name: name, apps: apps, createdAt: now, lastUsedAt: nil, revokedAt: nil), secret: secret)
    }

    static func decodeCredential(_ r: PGRow) -> CredentialRecord {
        CredentialRecord(id: r[0].string ?? "", name: r[1].string ?? "", apps: SQLiteOutboxStore.splitApps(r[2].string ?? ""),
                         createdAt: r[3].int ?? 0, lastUsedAt: r[4].int, revokedAt: r[5].int)
    }

    public func credentials() throws -> [CredentialRecord] {
        try read { c in
            try c.query("SELECT id, name, apps, created_at, last_used_at, revoked_at FROM credentials ORDER BY created_at, id").map(Self.decodeCredential)
        }
    }

    public func revokeCredential(id: String) throws -> Bool {
        let now = clock.nowMillis()
        return try write { c in
            try c.run("UPDATE credentials SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL", [.int(now), .text(id)]).affected > 0
        }
    }

    public func authenticate(secret: String) throws -> CredentialRecord? {
        let hash = Credentials.hash(secret: secret)
        return try read { c in
            guard let r = try c.query("SELECT id, name, apps, created_at, last_used_at, revoked_at, hash FROM credentials WHERE hash = $1",
                                      [.bytes(hash)]).first,
                  let stored = r[6].bytes, RelayCrypto.constantTimeEqual(stored, hash)
            else { return nil }
            let record = Self.decodeCredential(r)
            return record.isRevoked ? nil : record
        }
    }

    public func credentialKeys(unlessAt known: CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?) {
        try read { c in
            let g = try c.query("SELECT count(*), count(revoked_at), coalesce(max(created_at), 0) FROM credentials")[0]
            let generation = CredentialGeneration(count: Int(g[0].int ?? 0), revoked: Int(g[1].int ?? 0), newestCreatedAt: g[2].int ?? 0)
            guard generation != known else { return (generation, nil) }
            let keys = try c.query("SELECT id, hash, revoked_at FROM credentials").map {
                CredentialKey(id: $0[0].string ?? "", hash: $0[1].bytes ?? [], revoked: $0[2].int != nil)
            }
            return (generation, keys)
        }
    }

    // MARK: health

    /// True when the ingest connection reaches a writable primary (readyz).
    public func checkWritable() -> Bool {
        guard !options.readOnly else { return false }
        return (try? ingestWorker.perform { w in
            try w.withConnection { c in try c.query("SELECT NOT pg_is_in_recovery()").first?.first?.bool ?? false }
        }) ?? false
    }

    /// Ingest group-commit statistics for /metrics: committed batches and ingests.
    public var writerStats: (batches: Int, jobs: Int) { stats.withLock { $0 } }
}
