// OutboxStore on SQLite (WAL). Writes go through the GroupCommitWriter (one thread, one
// connection); reads use a second connection behind a lock. Schema: docs/architecture.md.
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

    /// Where committed rows go to the dispatcher (nil: no dispatcher, nothing handed off).
    let channel: DispatchChannel?

    final class WriterState {
        /// `ingestSettings`, set from any thread; copied into `settings` at each batch start.
        let sharedSettings = Mutex(IngestStoreSettings())
        var settings = IngestStoreSettings()
        /// `eventSettings`, likewise (copied into `events` at each batch start).
        let sharedEventSettings = Mutex(EventStoreSettings())
        var events = EventStoreSettings()
        /// Event ids (their first 64 bits are `events.seq`), minted in commit order.
        var eventIDs = TimeOrderedIDs()
        var insertResponseEvent: SQLiteStatement?
        var insertDelivery: SQLiteStatement?
        var claimWebhookDeliveries: SQLiteStatement?
        var leaseWebhookDelivery: SQLiteStatement?
        var recordWebhookResult: SQLiteStatement?
        var readWebhookCursor: SQLiteStatement?
        var writeWebhookCursor: SQLiteStatement?
        var scanNewEvents: SQLiteStatement?
        /// The webhooks whose cursors this process made sure of (ensureCursors).
        var cursorsReadyFor: [WebhookSubscription] = []
        /// Events this batch wrote: the observers hear of them after COMMIT, and `tally` counts
        /// them by type (delivered, failed, token.unregistered).
        var eventsInBatch = 0
        var eventTypesInBatch = (delivered: 0, failed: 0, unregistered: 0)
        /// The batch's first event (its sequence): the observers are told where its events are.
        var firstEventInBatch: Int64?
        let tally = EventTally()
        let eventObservers = Mutex<[@Sendable (EventsCommitted) -> Void]>([])
        /// queued + inflight + retry rows: read from outbox_stats at each batch start, adjusted
        /// by the batch's jobs, written back before COMMIT (so relayctl's changes from another
        /// process are seen, and start-up needs no count over the whole table).
        var pending = 0
        var pendingAtBatchStart = 0
        var credentialTouched: [String: Int64] = [:]
        /// Credential lookups within the current transaction (a revocation by another process
        /// cannot commit while we hold the write lock, so this is exact).
        var credentials: [[UInt8]: CredentialFacts?] = [:]
        /// The credential looked up last in this batch (same lifetime as `credentials`), and
        /// whether its last_used_at was already checked in this batch.
        var lastCredential: (hash: [UInt8], credential: CredentialFacts?, touchChecked: Bool)?
        /// Tokens present in unregistered_tokens or token_pacing. Only this process inserts
        /// there (relayctl only deletes), so a token outside the set needs no lookup.
        var watchedTokens: Set<String> = []
        /// The dispatcher's channel (set once, before the writer starts).
        var channel: DispatchChannel?
        /// Slots this batch took from the channel, and the rows it inserted `inflight` on them:
        /// posted after COMMIT, given back on ROLLBACK.
        var reservedInBatch = 0
        var handedOff: [OutboxRow] = []
        /// Rows this batch inserted `queued` (not handed off): the dispatcher hears of them once
        /// after COMMIT when there are any.
        var queuedInBatch = 0
        /// Response ids, minted on the writer thread in commit order.
        var ids = TimeOrderedIDs()
        /// The two ingest INSERTs, held here so the hot path skips the connection's statement
        /// cache (a dictionary keyed by the SQL text, hashed at every lookup).
        var insertQueued: SQLiteStatement?
        var insertInflight: SQLiteStatement?
        /// The two statements every delivered push runs (apply), held for the same reason.
        var insertAttempt: SQLiteStatement?
        var applyOutcome = [SQLiteStatement?](repeating: nil, count: SQLiteOutboxStore.outcomeShapes)
        /// The pending counter's read and write, once per batch.
        var readPending: SQLiteStatement?
        var writePending: SQLiteStatement?
        /// The claim's statements (one SELECT per claimable state, the two row updates) and
        /// the credential lookup, held for the same reason as the INSERTs.
        var claimSelect: [ResponseState: SQLiteStatement] = [:]
        var markInflight: SQLiteStatement?
        var markExpired: SQLiteStatement?
        var lookupCredential: SQLiteStatement?
        /// The dedupe index (SQLiteOutboxStore+Dedupe): the hash under this database's key, the
        /// tail of unmerged keys and its watermarks, the ingest lock once taken.
        var hasher: DedupeHasher!
        var tail = DedupeTail()
        var ingestLock: IngestLock?
        var databasePath = ""
        var mergedThrough: Int64 = 0
        /// The highest id_high committed (minted_through), and minted in the open batch.
        var committedHigh: Int64 = 0
        var mintedInBatch: Int64 = 0
        var mergeRows = SQLiteOutboxStore.defaultMergeRows
        var mergeChunk = SQLiteOutboxStore.defaultMergeChunk
        var merge: DedupeMerge?
        var mergeRetryAt = 0
        var tailLimit = 4 * SQLiteOutboxStore.defaultMergeRows
        var mergeRequested = false
        var merges = 0
        var mergeFailures = 0
        /// Tests: runs inside a merge transaction right before its COMMIT (a throw fails it).
        var beforeMergeCommit: (() throws -> Void)?
        var logger: RelayLogger?
        var lookupKey: SQLiteStatement?
        var readKeyRow: SQLiteStatement?
        // Token scans behind 410 cutoffs (SQLiteOutboxStore+TokenScan.swift), oldest first.
        var tokenScans: [String: TokenScan] = [:]
        var tokenScanOrder: [String] = []
        var tokenScanQueued = false
        var tokenScanWritten: [(StoreError?) -> Void] = []
        var tokenWalkChunk = StoreRules.tokenWalkChunk
        var readScanRow: SQLiteStatement?
        /// Scan steps run (read from any thread: tests count the transactions a scan took).
        let tokenScanSteps = Atomic<Int>(0)
        /// For jobs the writer queues itself (the scan's next step); set once before it starts.
        weak var writer: GroupCommitWriter?
        var clock: any RelayClock = SystemRelayClock()
    }

    /// `channel`: the dispatcher's (RelayService gives both the same one); without it every row
    /// is inserted `queued` and waits for a claim.
    public init(path: String, options: SQLiteStoreOptions = .init(), clock: any RelayClock = SystemRelayClock(),
                channel: DispatchChannel? = nil) throws {
        self.path = path
        self.clock = clock
        self.channel = channel
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
        writerState.hasher = try DedupeHasher(key: key, override: options.dedupeHash)
        writerState.databasePath = path
        writerState.logger = options.logger
        writerState.mergeRows = max(1, options.dedupeMergeRows)
        writerState.tailLimit = 4 * writerState.mergeRows
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
        let w = GroupCommitWriter(db: db, maxBatch: options.maxBatch)
        let state = writerState
        state.channel = channel
        state.writer = w
        state.clock = clock
        // The dedupe merge first, so the checkpoint that may follow copies its pages too.
        w.betweenBatches = { db in
            Self.maybeMerge(db, state: state)
            ckpt?.betweenBatches(db)
        }
        w.beforeBatch = {
            state.settings = state.sharedSettings.withLock { $0 }
            state.events = state.sharedEventSettings.withLock { $0 }
            state.credentials.removeAll(keepingCapacity: true)
            state.lastCredential = nil
            state.reservedInBatch = 0
            state.queuedInBatch = 0
            state.eventsInBatch = 0
            state.eventTypesInBatch = (0, 0, 0)
            state.firstEventInBatch = nil
            state.handedOff.removeAll()
        }
        w.afterBatchCommitted = {
            // The array itself is handed over (it is replaced, not emptied in place).
            channel?.committed(handedOff: state.handedOff, queued: state.queuedInBatch > 0)
            state.handedOff = []
            state.tail.batchCommitted()
            state.committedHigh = max(state.committedHigh, state.mintedInBatch)
            state.mintedInBatch = 0
            if state.eventsInBatch > 0 {
                state.eventsInBatch = 0
                let t = state.eventTypesInBatch
                state.eventTypesInBatch = (0, 0, 0)
                state.tally.add(.responseDelivered, t.delivered)
                state.tally.add(.responseFailed, t.failed)
                state.tally.add(.tokenUnregistered, t.unregistered)
                let committed = EventsCommitted(credentials: nil, after: (state.firstEventInBatch ?? 1) - 1, count: t.delivered + t.failed + t.unregistered)
                state.firstEventInBatch = nil
                for observe in state.eventObservers.withLock({ $0 }) { observe(committed) }
            }
        }
        w.afterBegin = { db in
            let read = try db.held(&state.readPending, "SELECT pending FROM outbox_stats WHERE id = 1")
            state.pending = try read.next() ? Int(read.int64(0)) : 0
            read.reset()
            state.pendingAtBatchStart = state.pending
        }
        w.beforeCommit = { db in
            // One row, one page: the counter and the newest id minted (the tail's upper bound).
            if state.pending != state.pendingAtBatchStart || state.mintedInBatch > state.committedHigh {
                let write = try db.held(&state.writePending,
                    "UPDATE outbox_stats SET pending = ?, minted_through = max(minted_through, ?) WHERE id = 1")
                try write.bind(1, Int64(state.pending))
                try write.bind(2, state.mintedInBatch)
                try write.stepOnce()
            }
        }
        w.afterRollback = { _ in
            if state.reservedInBatch > 0 { channel?.release(state.reservedInBatch) }
            state.reservedInBatch = 0
            state.handedOff = []
            state.tail.batchRolledBack()
            state.mintedInBatch = 0
            state.eventsInBatch = 0
            state.eventTypesInBatch = (0, 0, 0)
            state.firstEventInBatch = nil
        }
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
        _ = try? write { _ in state.mergeRequested = state.ingestLock != nil }
        shutdown()
    }

    private func shutdown() {
        writer?.close()
        if writer != nil { writerState.ingestLock = nil }   // the writer thread has exited
        checkpointer?.stop()
    }
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
    var tokenScanSteps: Int { writerState.tokenScanSteps.load(ordering: .relaxed) }

    /// Microseconds the writer spent inside transactions (BEGIN to the end of COMMIT) so far.
    public var writerTransactionMicros: Int { writer?.transactionTime ?? 0 }

    /// The checkpointer's /metrics samples (WAL size, checkpoints, failures, restarts).
    public func collectCheckpointMetrics(into r: inout PrometheusRegistry) { checkpointer?.collectMetrics(into: &r) }
}
