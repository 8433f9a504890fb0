// OutboxStore on PostgreSQL, so several relay-server nodes share one queue (docs/postgres.md).
//
// Same schema semantics as SQLiteOutboxStore, plus a lease (owner node + expiry) on inflight rows:
// - ingest: group commit. Everything queued is one batch of set-based statements in two
//   pipelined round trips (read the facts; INSERT ... ON CONFLICT DO NOTHING RETURNING and
//   commit), so a batch costs two round trips and one WAL flush however many requests it holds.
//   Two batches are in flight on two connections. Completions (and so 202s) run only after
//   the commit was confirmed.
// - dispatch: rows are claimed with FOR UPDATE SKIP LOCKED into a lease; apply only changes rows
//   whose lease this node still holds; expired leases (a dead node's) are reclaimed by any node.
// - reads (GET, relayctl, metrics) use their own connection, so they never wait behind a batch.
// Each connection lives on its own store-owned thread (PostgresWorker) and reconnects with
// back-off; while the database is away every call fails fast with StoreError.unavailable.
// This file: state, opening, the shared outbox bound and the connections; each job is in
// PostgresOutboxStore+<job>.swift (Schema, Ingest, Dispatch, Queries, OperatorActions, Credentials).
import FoundationEssentials
import Glibc
import Synchronization

public final class PostgresOutboxStore: OutboxStore, @unchecked Sendable {
    // @unchecked Sendable: every connection is confined to the worker thread holding it; shared
    // state (counters, `touchedAt`, `ids`) lives in Mutexes.
    public static let schemaVersion = 10
    /// pg_advisory_lock key serialising migrations between nodes starting at once.
    static let migrationLockKey: Int64 = 0x5245_4C41_594D_4947  // "RELAYMIG"
    /// Transaction advisory lock over the credentials: every ingest write holds it shared, and
    /// every change of a credential takes it exclusive (schema v4's BEFORE trigger, whoever
    /// writes), so a revocation commits before the insert's re-check or after its commit, never
    /// between (docs/postgres.md "One write transaction"). The trigger has this number written
    /// in it: changing it needs a migration.
    static let credentialsLockKey: Int64 = 0x5245_4C41_5943_5244  // "RELAYCRD"
    /// Transaction advisory locks over push tokens, one per bucket of hashtext(token): shared by
    /// each ingest write for its tokens, exclusive while a 410 is recorded. 256 buckets bound the
    /// locks one batch holds (PostgreSQL's lock table is max_locks_per_transaction x
    /// connections); a 410 also waits for batches holding another token of its bucket.
    static let tokenLockBase: Int64 = 0x5245_4C41_5954_4B00  // "RELAYTK" + bucket
    static func tokenLockSQL(_ token: String) -> String { "(\(tokenLockBase)::bigint + (hashtext(\(token)) & 255))" }
    /// Test hook: runs on the ingest thread after a batch's read and before its write.
    let ingestWillWrite = Mutex<(@Sendable () -> Void)?>(nil)

    struct PendingIngest {
        let request: IngestRequest
        let now: Int64
        /// Monotonic ms: not committed by then, the request is answered 503 (queued ones without
        /// running).
        let deadline: Int64
        let completion: @Sendable (Result<IngestOutcome, StoreError>) -> Void
    }

    private struct Pending {
        var estimate = 0
        var adjustments: Int64 = 0
        var lastRefresh: Int64 = 0
        var refreshing = false
    }

    public let options: PostgresStoreOptions
    /// The database's time (the node's clock plus the measured offset): every time this store
    /// writes or compares (PostgresOutboxStore+Clock).
    let clock: DatabaseClock
    /// Tests: the database's clock, read instead of clock_timestamp().
    let databaseClock: (any RelayClock)?
    let logger: RelayLogger?
    let ingestWorker: PostgresWorker<PendingIngest>
    let dispatchWorker: PostgresWorker<Void>
    private let queryWorker: PostgresWorker<Void>
    /// The admin listener's connection (/readyz's check, /metrics' counts), so neither queues
    /// behind ingest, credential reads or the dispatcher, and readiness answers within
    /// PostgresTimeouts.readinessMillis.
    private let adminWorker: PostgresWorker<Void>
    /// relay-server (exclusiveNode): the connection that holds this node id's session lock and
    /// runs nothing else, so no deadline of another call ever drops the lock.
    private let nodeWorker: PostgresWorker<Void>?
    private let pending = Mutex(Pending())
    let stats = Mutex((batches: 0, jobs: 0))
    private let settings = Mutex(IngestStoreSettings())
    let sharedEventSettings = Mutex(EventStoreSettings())
    /// Told after each COMMIT (OutboxCommit.swift). No room is taken: rows are always
    /// inserted `queued` here, and a claim takes the lease.
    let observers = CommitObservers()
    /// The webhooks whose cursors this process made sure of (PostgresOutboxStore+Events).
    let cursorsReadyFor = Mutex<[WebhookSubscription]>([])
    /// Events this node committed, by type (relay_events_created_total).
    public let eventsCreated = EventTally()
    /// When this node last wrote each credential's last_used_at.
    let touchedAt = Mutex<[String: Int64]>([:])
    /// Outcome writes that failed while the database was away, written again before the next
    /// claim or outcome write (PostgresOutboxStore+RetainedOutcomes).
    let retainedOutcomes = Mutex(RetainedOutcomes())
    /// Response ids (UUIDv7, as SQLiteOutboxStore mints them), one generator for every ingest thread.
    let ids = Mutex(TimeOrderedIDs())

    public var nodeID: String { options.nodeID }

    /// Read once per ingest batch.
    public var ingestSettings: IngestStoreSettings {
        get { settings.withLock { $0 } }
        set { settings.withLock { $0 = newValue } }
    }

    /// Connects, runs migrations under an advisory lock (or, read-only, checks the version),
    /// measures the clock offset and counts pending rows. Throws when the database cannot be
    /// reached or is newer than us. `clock`: the node's; `databaseClock` (tests): the database's,
    /// instead of its clock_timestamp().
    public init(options: PostgresStoreOptions, clock: any RelayClock = SystemRelayClock(), logger: RelayLogger? = nil,
                databaseClock: (any RelayClock)? = nil) throws {
        guard !options.nodeID.isEmpty else { throw StoreError.invalid("node id must not be empty") }
        self.options = options
        self.clock = DatabaseClock(local: clock)
        self.databaseClock = databaseClock
        self.logger = logger
        let t = options.timeouts
        ingestWorker = PostgresWorker(name: "pg-ingest", url: options.url, logger: logger, maxBatch: options.maxBatch,
                                      connections: options.ingestConnections, timeouts: t)
        dispatchWorker = PostgresWorker(name: "pg-dispatch", url: options.url, logger: logger, timeouts: t)
        queryWorker = PostgresWorker(name: "pg-query", url: options.url, logger: logger, timeouts: t)
        adminWorker = PostgresWorker(name: "pg-admin", url: options.url, logger: logger, timeouts: t)
        nodeWorker = options.exclusiveNode ? PostgresWorker(name: "pg-node", url: options.url, logger: logger, timeouts: t) : nil
        // Every connection made after the start's own check re-reads the schema version: a node
        // that reconnects after another node migrated further stops writing (503, logged)
        // instead of running statements prepared for another schema.
        let started = Mutex(false)
        let check: (PostgresConnection) throws -> Void = { c in
            guard started.withLock({ $0 }) else { return }
            do { try Self.requireSchemaVersion(c) } catch StoreError.invalid(let why) { throw StoreError.unavailable(why) }
        }
        ingestWorker.onConnect(check)
        dispatchWorker.onConnect(check)
        queryWorker.onConnect(check)
        adminWorker.onConnect(check)
        // relay-server: pg-node holds this node id's session lock for as long as it lives, and
        // takes it again whenever it is replaced (checked with each /readyz).
        let nodeID = options.nodeID
        nodeWorker?.onConnect { c in
            // At start, a predecessor's session that is still ending (a restart, a kill -9 a
            // moment ago) gets a few seconds to go; later, the check answers at once.
            try Self.takeNodeLock(c, nodeID: nodeID, waitMillis: started.withLock { $0 } ? 0 : 3_000)
        }
        ingestWorker.start { [unowned self] w, items in self.ingestBatch(w, items) }
        dispatchWorker.start()
        queryWorker.start()
        adminWorker.start()
        nodeWorker?.start()
        do {
            // First, before migrations or any recovery: a second live process with this
            // node id stops here.
            try nodeWorker?.perform { w in _ = try w.connection() }
            if options.readOnly {
                try queryWorker.perform { w in try Self.requireSchemaVersion(w.connection()) }
            } else {
                // As long as it takes (an index build on a large table; another node's migration
                // holding the lock), without the session's statement and lock timeouts.
                try dispatchWorker.perform(.unbounded) { w in
                    let c = try w.connection()
                    try c.execute("SET statement_timeout = 0; SET lock_timeout = 0")
                    try Self.migrate(c)
                    try c.execute(t.sessionSQL)
                }
            }
            _ = try queryWorker.perform { [unowned self] w in try measureClockOffset(w.connection()) }
            started.withLock { $0 = true }
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
        // Outcomes kept after a failed write are recorded now: left unwritten, their rows stay
        // inflight under this node and are pushed again after the restart (recoverInflight).
        if !options.readOnly && !retainedOutcomes.withLock({ $0.isEmpty }) {
            _ = try? dispatchWorker.perform(.millis(max(1_000, options.timeouts.requestMillis))) { [self] w in try writeRetainedOutcomes(w) }
            let left = retainedOutcomes.withLock { $0.take().count }
            if left > 0 {
                logger?.error("kept push outcomes not recorded at shutdown: their rows are sent again after the restart", ["count": left])
            }
        }
        if let nodeWorker {
            // Frees the node id before this process's sessions end (a restart's successor may
            // already be starting); ending the session would free it too, a moment later.
            let key = Self.nodeLockKey(options.nodeID)
            _ = try? nodeWorker.perform(.millis(1_000)) { w in
                try w.currentConnection().map { c in try c.query("SELECT pg_advisory_unlock($1)", [.int(key)]) }
            }
        }
        ingestWorker.close()
        dispatchWorker.close()
        queryWorker.close()
        adminWorker.close()
        nodeWorker?.close()
    }

    // MARK: the shared outbox bound

    /// Rows still to deliver, as last counted plus this node's own changes since. Other nodes'
    /// changes show up at the next recount (every `pendingRefreshMillis`), so with N nodes the
    /// bound can be overshot by what the others accepted in that window (docs/postgres.md).
    func pendingEstimate() -> Int { pending.withLock { $0.estimate } }

    /// Takes up to `wanted` places below `limit` (the outbox bound) and returns how many: the
    /// first that many of a batch's requests, in arrival order, are stored. Under one lock, so
    /// batches in flight at once never overshoot the bound together.
    func reservePending(_ wanted: Int, limit: Int) -> Int {
        guard wanted > 0 else { return 0 }
        return pending.withLock { p in
            let n = min(wanted, max(0, limit - p.estimate))
            p.estimate += n
            p.adjustments += Int64(n)
            return n
        }
    }

    func adjustPending(_ n: Int) {
        guard n != 0 else { return }
        pending.withLock {
            $0.estimate += n
            $0.adjustments += Int64(n)
        }
    }

    func refreshPendingIfStale() {
        let now = monotonicMicros() / 1000
        let start: Int64? = pending.withLock {
            guard !$0.refreshing, now - $0.lastRefresh >= options.pendingRefreshMillis else { return nil }
            $0.refreshing = true
            return $0.adjustments
        }
        guard let before = start else { return }
        // On the query thread, so the ingest batch never waits for the count.
        queryWorker.enqueueDetached { [unowned self] w in
            let counted = try? w.withConnection(idempotent: true, Self.countPending)
            self.pending.withLock {
                if let counted { $0.estimate = counted + Int($0.adjustments - before) }
                $0.lastRefresh = monotonicMicros() / 1000
                $0.refreshing = false
            }
        }
    }

    /// One autocommit statement (or several) on the dispatch connection. Not re-run when the
    /// connection is lost before its answer: it may have committed (the caller sees the error).
    func write<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        return try dispatchWorker.perform { w in try w.withConnection(idempotent: false, body) }
    }

    func writeTransaction<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        return try dispatchWorker.perform { w in try w.transaction(body) }
    }

    func read<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        try queryWorker.perform { w in try w.withConnection(idempotent: true, body) }
    }

    /// A read on the admin connection (/metrics' counts, relayctl status): a scan of a large
    /// table there never holds up credential reads, GETs or the dispatcher.
    func adminRead<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        try adminWorker.perform { w in try w.withConnection(idempotent: true, body) }
    }

    // MARK: health

    /// True when a connection reaches a writable primary within
    /// PostgresTimeouts.readinessMillis (readyz). On its own connection: it never waits behind
    /// the ingest queue, and a stalled database fails it in that time.
    public func checkWritable() -> Bool {
        guard !options.readOnly else { return false }
        // The node lock's connection still open (or reopened with the lock taken again).
        if let nodeWorker, (try? nodeWorker.perform(.millis(options.timeouts.readinessMillis)) { w in _ = try w.connection() }) == nil {
            return false
        }
        return (try? adminWorker.perform(.millis(options.timeouts.readinessMillis)) { w in
            try w.withConnection(idempotent: true) { c in
                // A standby, or a session that defaults to read-only: not ready, and the
                // connection is replaced (PGState.needsNewConnection) so the next check asks anew.
                guard try c.query("SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'").first?.first?.bool == true else {
                    throw StoreError.postgres(sqlState: PGState.readOnlyTransaction, message: "the server is a standby or read-only", context: "readyz")
                }
                return true
            }
        }) ?? false
    }

    // MARK: one live process per node id

    /// The session advisory lock key of a node id (FNV-1a 64 of a prefixed name; the fixed
    /// keys above are far from any such hash).
    static func nodeLockKey(_ nodeID: String) -> Int64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in "relay-node\u{0}\(nodeID)".utf8 {
            h ^= UInt64(b)
            h &*= 0x0000_0100_0000_01b3
        }
        return Int64(bitPattern: h)
    }

    /// Takes this node id's session lock on `c`, or throws naming the session that holds it.
    /// Two live processes with one node id would each take back the other's leases as their
    /// own at start (recoverInflight) and write outcomes for rows the other is sending.
    static func takeNodeLock(_ c: PostgresConnection, nodeID: String, waitMillis: Int64) throws {
        let key = nodeLockKey(nodeID)
        let until = monotonicMillis() + waitMillis
        while true {
            if try c.query("SELECT pg_try_advisory_lock($1)", [.int(key)]).first?.first?.bool == true { return }
            guard monotonicMillis() + 200 < until else { break }
            usleep(200_000)
        }
        let bits = UInt64(bitPattern: key)
        let holder = try? c.query("""
            SELECT a.pid::bigint, coalesce(host(a.client_addr), 'local socket'), a.application_name,
                   to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 1
            """, [.int(Int64(bits >> 32)), .int(Int64(bits & 0xFFFF_FFFF))]).first
        let who = holder.map { r in
            "database session \(r[0].int ?? 0) from \(r[1].string ?? "?") (\(r[2].string ?? "?"), connected \(r[3].string ?? "?"))"
        } ?? "another session"
        throw StoreError.invalid("""
            store.nodeId "\(nodeID)" is in use by another live relay-server (\(who)): give each node its own nodeId. \
            If that process is gone (its host crashed), end its session: SELECT pg_terminate_backend(<pid>)
            """)
    }

    /// Ingest group-commit statistics for /metrics: committed batches and ingests.
    public var writerStats: (batches: Int, jobs: Int) { stats.withLock { $0 } }
}
