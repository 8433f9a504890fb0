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
    public static let schemaVersion = 7
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
        let completion: @Sendable (Result<IngestOutcome, StoreError>) -> Void
    }

    private struct Pending {
        var estimate = 0
        var adjustments: Int64 = 0
        var lastRefresh: Int64 = 0
        var refreshing = false
    }

    public let options: PostgresStoreOptions
    let clock: any RelayClock
    private let logger: RelayLogger?
    let ingestWorker: PostgresWorker<PendingIngest>
    let dispatchWorker: PostgresWorker<Void>
    private let queryWorker: PostgresWorker<Void>
    private let pending = Mutex(Pending())
    let stats = Mutex((batches: 0, jobs: 0))
    private let settings = Mutex(IngestStoreSettings())
    let sharedEventSettings = Mutex(EventStoreSettings())
    let eventObservers = Mutex<[@Sendable (EventsCommitted) -> Void]>([])
    /// Events this node committed, by type (relay_events_created_total).
    public let eventsCreated = EventTally()
    /// When this node last wrote each credential's last_used_at.
    let touchedAt = Mutex<[String: Int64]>([:])
    /// Response ids (UUIDv7, as SQLiteOutboxStore mints them), one generator for every ingest thread.
    let ids = Mutex(TimeOrderedIDs())

    public var nodeID: String { options.nodeID }

    /// Read once per ingest batch.
    public var ingestSettings: IngestStoreSettings {
        get { settings.withLock { $0 } }
        set { settings.withLock { $0 = newValue } }
    }

    /// Told after each ingest COMMIT that inserted rows (nil: no dispatcher). Rows are always
    /// inserted `queued` here: a claim takes the lease.
    let channel: DispatchChannel?

    /// Connects, runs migrations under an advisory lock (or, read-only, checks the version) and
    /// counts pending rows. Throws when the database cannot be reached or is newer than us.
    public init(options: PostgresStoreOptions, clock: any RelayClock = SystemRelayClock(), logger: RelayLogger? = nil,
                channel: DispatchChannel? = nil) throws {
        guard !options.nodeID.isEmpty else { throw StoreError.invalid("node id must not be empty") }
        self.options = options
        self.channel = channel
        self.clock = clock
        self.logger = logger
        ingestWorker = PostgresWorker(name: "pg-ingest", url: options.url, logger: logger, maxBatch: options.maxBatch,
                                      connections: options.ingestConnections)
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
            let counted = try? w.withConnection(Self.countPending)
            self.pending.withLock {
                if let counted { $0.estimate = counted + Int($0.adjustments - before) }
                $0.lastRefresh = monotonicMicros() / 1000
                $0.refreshing = false
            }
        }
    }

    func write<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        return try dispatchWorker.perform { w in try w.withConnection(body) }
    }

    func writeTransaction<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        guard !options.readOnly else { throw StoreError.invalid("store opened read-only") }
        return try dispatchWorker.perform { w in try w.transaction(body) }
    }

    func read<T>(_ body: @escaping (PostgresConnection) throws -> T) throws -> T {
        try queryWorker.perform { w in try w.withConnection(body) }
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
