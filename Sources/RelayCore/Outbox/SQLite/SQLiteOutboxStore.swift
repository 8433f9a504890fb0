// OutboxStore on SQLite (WAL). Writes go through the GroupCommitWriter (one thread, one
// connection); reads use a second connection behind a lock. Schema: docs/storage.md.
// This file: state, opening and the two connections; each job is in SQLiteOutboxStore+<job>.swift
// (Schema, Ingest, Dispatch, Queries, OperatorActions, Credentials).
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

public final class SQLiteOutboxStore: OutboxStore, @unchecked Sendable {
    // @unchecked Sendable: `writer` serialises every write on its own thread; `reader` is only
    // used under `readerLock`; `writerState` is only touched inside writer jobs (writer thread),
    // except its `sharedSettings`, a Mutex.
    public static let schemaVersion = 13

    let writer: GroupCommitWriter?
    let reader: SQLiteDatabase
    let readerLock = Condition()
    let clock: any RelayClock
    let writerState = WriterState()
    public let path: String
    public let freeSpaceGuard: FreeSpaceGuard?
    /// Copies the WAL into the database file off the writer's path (nil when read-only).
    let checkpointer: SQLiteCheckpointer?

    /// Without a commit observer offering room (`addCommitObserver`: the dispatcher's channel)
    /// every row is inserted `queued` and waits for a claim.
    public init(path: String, options: SQLiteStoreOptions = .init(), clock: any RelayClock = SystemRelayClock()) throws {
        self.path = path
        self.clock = clock
        freeSpaceGuard = options.readOnly || options.minFreeBytes <= 0 ? nil
            : FreeSpaceGuard(path: path, minFreeBytes: options.minFreeBytes, probe: options.freeSpaceProbe ?? FreeSpaceGuard.statvfsAvailable)
        if options.readOnly {
            writer = nil
            checkpointer = nil
            reader = try SQLiteDatabase(path: path, readOnly: true, busyTimeoutMillis: options.busyTimeoutMillis)
            let version = try reader.scalar("PRAGMA user_version").int ?? 0
            guard version == Self.schemaVersion else {
                throw StoreError.invalid("database \(path) has schema version \(version), expected \(Self.schemaVersion) (start relay-server once to migrate)")
            }
            return
        }
        let db = try SQLiteDatabase(path: path, busyTimeoutMillis: options.busyTimeoutMillis)
        // synchronous before journal_mode, so no WAL frame is ever written at another level.
        try db.execute("PRAGMA synchronous=\(options.synchronous.rawValue)")
        try db.execute("PRAGMA journal_mode=WAL")
        try Self.migrate(db, onSlowStart: options.onSlowStart, dedupeHash: options.dedupeHash)
        guard let key = try db.scalar("SELECT dedupe_key FROM outbox_stats WHERE id = 1").bytes else {
            throw StoreError.invalid("database \(path) has no dedupe key in outbox_stats (schema v6 sets one)")
        }
        writerState.dedupe.hasher = try DedupeHasher(key: key, override: options.dedupeHash)
        writerState.dedupe.databasePath = path
        writerState.dedupe.logger = options.logger
        writerState.dedupe.mergeRows = max(1, options.dedupeMergeRows)
        // Event ids stay above every stored one, whatever the clock did across a restart.
        if let top = try db.scalar("SELECT max(seq) FROM events").int { writerState.eventIDs.advance(pastHigh: top) }
        for row in try db.query("SELECT token FROM unregistered_tokens UNION SELECT token FROM token_pacing") {
            if let t = row[0].string { writerState.watchedTokens.insert(t) }
        }
        // Checkpoints leave the COMMIT path (SQLiteCheckpointer): the WAL hook replaces
        // wal_autocheckpoint. A WAL that grew past the policy (a reader pinned it) is cut back
        // to twice the restart size when the writer starts it over.
        let pageSize = Int(try db.scalar("PRAGMA page_size").int ?? 4096)
        try db.execute("PRAGMA journal_size_limit=\(2 * options.checkpoint.restartPages * (pageSize + 24))")
        let ckpt = options.backgroundCheckpoints
            ? try SQLiteCheckpointer(path: path, synchronous: options.synchronous, policy: options.checkpoint, logger: options.logger) : nil
        checkpointer = ckpt
        if let ckpt { db.onWALCommit { frames in ckpt.committed(walFrames: frames) } }
        let state = writerState
        state.clock = clock
        state.checkpointer = ckpt
        let w = GroupCommitWriter(db: db, maxBatch: options.maxBatch, observer: state)
        state.writer = w
        writer = w
        reader = try SQLiteDatabase(path: path, busyTimeoutMillis: options.busyTimeoutMillis)
        w.start()
        ckpt?.start()
    }

    deinit { shutdown() }   // no final merge: it would wait on the writer from any thread

    /// Merges the dedupe tail (the next start then has none to rebuild), commits what is
    /// queued, then checkpoints the whole WAL into the database file.
    public func close() {
        let state = writerState
        _ = try? write { _ in state.dedupe.mergeRequested = state.dedupe.isPrepared }
        shutdown()
    }

    private func shutdown() {
        writer?.close()
        if writer != nil { writerState.dedupe.releaseLock() }   // the writer thread has exited
        checkpointer?.stop()
    }
    public func addCommitObserver(_ observer: any OutboxCommitObserver) { writerState.observers.add(observer) }

    func write<T>(_ work: @escaping (SQLiteDatabase) throws -> T) throws -> T {
        guard let writer else { throw StoreError.invalid("store opened read-only") }
        return try writer.perform(work)
    }

    func read<T>(_ body: (SQLiteDatabase) throws -> T) throws -> T {
        readerLock.lock()
        defer { readerLock.unlock() }
        return try body(reader)
    }

    // MARK: health

    public func checkWritable() -> Bool {
        guard writer != nil else { return false }
        return (try? write { db in try db.scalar("SELECT 1").int == 1 }) ?? false
    }

    /// Writer statistics for /metrics: committed batches and jobs.
    public var writerStats: (batches: Int, jobs: Int) {
        (writer?.batchesCommitted ?? 0, writer?.jobsCommitted ?? 0)
    }

    /// Steps run by 410 cutoff scans so far (SQLiteOutboxStore+TokenScan.swift).
    var tokenScanSteps: Int { writerState.scans.steps.load(ordering: .relaxed) }

    /// Microseconds the writer spent inside transactions (BEGIN to the end of COMMIT) so far.
    public var writerTransactionMicros: Int { writer?.transactionTime ?? 0 }

    /// The checkpointer's /metrics samples (WAL size, checkpoints, failures, restarts).
    public func collectCheckpointMetrics(into r: inout PrometheusRegistry) { checkpointer?.collectMetrics(into: &r) }
}
