// OutboxStore on SQLite (WAL). Writes go through the GroupCommitWriter (one thread, one
// connection); reads use a second connection behind a lock. Schema: docs/architecture.md.
import FoundationEssentials
import Glibc
import POSIXThreads
import Ratchet

public struct SQLiteStoreOptions: Sendable {
    public enum Synchronous: String, Sendable {
        case full = "FULL", normal = "NORMAL"
    }
    /// FULL (default) survives power loss; NORMAL in WAL mode survives process crashes only.
    public var synchronous: Synchronous = .full
    public var busyTimeoutMillis: Int32 = 5000
    public var maxBatch: Int = 1024
    /// Open only a read connection (relayctl status/list while the server runs).
    public var readOnly: Bool = false
    /// store.minFreeBytes: ingest answers storageFull below it (0 = off); `freeSpaceProbe`
    /// replaces statvfs in tests.
    public var minFreeBytes: Int64 = 0
    public var freeSpaceProbe: FreeSpaceGuard.Probe?
    /// Called about once a second while opening the store takes long (a schema migration that
    /// rebuilds the outbox: ~16 s per million rows), with a human-readable stage. relay-server
    /// uses it to extend systemd's start timeout (EXTEND_TIMEOUT_USEC) and to log progress.
    public var onSlowStart: (@Sendable (String) -> Void)?
    public init(synchronous: Synchronous = .full, busyTimeoutMillis: Int32 = 5000, maxBatch: Int = 1024, readOnly: Bool = false) {
        self.synchronous = synchronous
        self.busyTimeoutMillis = busyTimeoutMillis
        self.maxBatch = maxBatch
        self.readOnly = readOnly
    }
}

public final class SQLiteOutboxStore: HandoffCapableStore, @unchecked Sendable {
    // @unchecked Sendable: `writer` serialises every write on its own thread; `reader` is only
    // used under `readerLock`; `writerState` is only touched inside writer jobs (writer thread).
    public static let schemaVersion = 5

    let writer: GroupCommitWriter?
    private let reader: SQLiteDatabase
    private let readerLock = Condition()
    private let clock: any RelayClock
    private let writerState = WriterState()
    public let path: String
    public let freeSpaceGuard: FreeSpaceGuard?

    /// Wakes whoever waits for new rows (the dispatcher) after each commit.
    public var onCommit: (@Sendable () -> Void)? {
        get { writer?.afterCommit }
        set { writer?.afterCommit = newValue }
    }

    final class WriterState {
        /// queued + inflight + retry rows: read from outbox_stats at each batch start, adjusted
        /// by the batch's jobs, written back before COMMIT (so relayctl's changes from another
        /// process are seen, and start-up needs no count over the whole table).
        var pending = 0
        var pendingAtBatchStart = 0
        var credentialTouched: [String: Int64] = [:]
        /// Credential lookups within the current transaction (a revocation by another process
        /// cannot commit while we hold the write lock, so this is exact).
        var credentials: [[UInt8]: CachedCredential?] = [:]
        /// The credential looked up last in this batch (same lifetime as `credentials`), and
        /// whether its last_used_at was already checked in this batch.
        var lastCredential: (hash: [UInt8], credential: CachedCredential?, touchChecked: Bool)?
        /// Tokens present in unregistered_tokens or token_pacing. Only this process inserts
        /// there (relayctl only deletes), so a token outside the set needs no lookup.
        var watchedTokens: Set<String> = []
        var handoff: (any DispatchHandoff)?
        var reservedInBatch = 0
        /// Rows this batch inserted `queued` (not handed off): the dispatcher is woken once
        /// after COMMIT when there are any.
        var queuedInBatch = 0
        /// Ingest jobs of the current batch whose completion runs on their HTTP loop.
        fileprivate var deferred: [IngestJob] = []
        /// Response ids, minted on the writer thread in commit order.
        var ids = TimeOrderedIDs()
        /// The two ingest INSERTs, held here so the hot path skips the connection's statement
        /// cache (a dictionary keyed by the SQL text: hashing it cost ~2k instructions a row).
        var insertQueued: SQLiteStatement?
        var insertInflight: SQLiteStatement?
        /// The two statements every delivered push runs (apply), held for the same reason.
        var insertAttempt: SQLiteStatement?
        var markDelivered: SQLiteStatement?
        /// The pending counter's read and write, once per batch.
        var readPending: SQLiteStatement?
        var writePending: SQLiteStatement?
        /// The claim's statements (one SELECT per claimable state, the two row updates) and
        /// the credential lookup, held for the same reason as the INSERTs.
        var claimSelect: [ResponseState: SQLiteStatement] = [:]
        var markInflight: SQLiteStatement?
        var markExpired: SQLiteStatement?
        var lookupCredential: SQLiteStatement?
    }

    /// A credentials row as the ingest path needs it, apps already split (once per batch, not
    /// once per request).
    typealias CachedCredential = CredentialFacts

    public init(path: String, options: SQLiteStoreOptions = .init(), clock: any RelayClock = SystemRelayClock()) throws {
        self.path = path
        self.clock = clock
        freeSpaceGuard = options.readOnly || options.minFreeBytes <= 0 ? nil
            : FreeSpaceGuard(path: path, minFreeBytes: options.minFreeBytes, probe: options.freeSpaceProbe ?? FreeSpaceGuard.statvfsAvailable)
        if options.readOnly {
            writer = nil
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
        try Self.migrate(db, onSlowStart: options.onSlowStart)
        for row in try db.query("SELECT token FROM unregistered_tokens UNION SELECT token FROM token_pacing") {
            if let t = row[0].string { writerState.watchedTokens.insert(t) }
        }
        let w = GroupCommitWriter(db: db, maxBatch: options.maxBatch)
        let state = writerState
        w.beforeBatch = {
            state.credentials.removeAll(keepingCapacity: true)
            state.lastCredential = nil
            state.reservedInBatch = 0
            state.queuedInBatch = 0
        }
        w.afterBatch = { Self.completeDeferred(state) }
        w.afterBatchCommitted = {
            if state.queuedInBatch > 0 { state.handoff?.queuedRowsCommitted() }
        }
        w.afterBegin = { db in
            let read = try db.held(&state.readPending, "SELECT pending FROM outbox_stats WHERE id = 1")
            state.pending = try read.next() ? Int(read.int64(0)) : 0
            read.reset()
            state.pendingAtBatchStart = state.pending
        }
        w.beforeCommit = { db in
            if state.pending != state.pendingAtBatchStart {
                let write = try db.held(&state.writePending, "UPDATE outbox_stats SET pending = ? WHERE id = 1")
                try write.bind(1, Int64(state.pending))
                try write.stepOnce()
            }
        }
        w.afterRollback = { _ in
            if state.reservedInBatch > 0 { state.handoff?.release(state.reservedInBatch) }
            state.reservedInBatch = 0
        }
        writer = w
        reader = try SQLiteDatabase(path: path, busyTimeoutMillis: options.busyTimeoutMillis)
        w.start()
    }

    deinit { writer?.close() }

    public func close() { writer?.close() }

    // MARK: schema

    static let migrations: [String] = [
        // v1
        """
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('queued','inflight','retry','delivered','failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        CREATE INDEX responses_claim ON responses (state, next_attempt_at);
        CREATE INDEX responses_updated ON responses (state, updated_at);
        CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            response_id TEXT NOT NULL,
            attempted_at INTEGER NOT NULL,
            status INTEGER,
            reason TEXT,
            apns_timestamp INTEGER,
            latency_us INTEGER
        );
        CREATE INDEX attempts_response ON attempts (response_id, id);
        CREATE TABLE credentials (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            hash BLOB NOT NULL UNIQUE,
            apps TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER,
            revoked_at INTEGER
        );
        CREATE TABLE unregistered_tokens (
            token TEXT PRIMARY KEY,
            apns_timestamp INTEGER NOT NULL,
            recorded_at INTEGER NOT NULL
        );
        CREATE TABLE token_pacing (
            token TEXT PRIMARY KEY,
            paced_until INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
        );
        """,
        // v2: the pending-row counter kept per transaction, so start-up does not count the
        // whole outbox (1M rows: hundreds of milliseconds) to enforce store.maxPending.
        """
        CREATE TABLE outbox_stats (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            pending INTEGER NOT NULL
        );
        INSERT INTO outbox_stats (id, pending)
            SELECT 1, count(*) FROM responses WHERE state IN ('queued','inflight','retry');
        """,
        // v3: a cheaper INSERT per ingest (docs/architecture.md "Performance notes"). The table
        // is rebuilt because SQLite cannot alter a CHECK constraint:
        //  - `state IN (<5 literals>)` made every INSERT/UPDATE build and drop an ephemeral
        //    B-tree to evaluate the CHECK; the same constraint as an OR chain needs none.
        //  - responses_updated only serves purge and "recent outcomes", which ask for terminal
        //    rows: as the partial index responses_done an ingest (queued/inflight) and a claim
        //    no longer touch it.
        // Rows keep their rowid, id and every column; ids minted from now on are time-ordered
        // (UUIDv7), so the id index grows at its right edge instead of at random pages.
        """
        DROP INDEX responses_claim;
        DROP INDEX responses_updated;
        ALTER TABLE responses RENAME TO responses_v2;
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state = 'queued' OR state = 'inflight' OR state = 'retry' OR state = 'delivered' OR state = 'failed'),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        INSERT INTO responses (rowid, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                               attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at)
            SELECT rowid, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                   attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at
            FROM responses_v2 ORDER BY rowid;
        DROP TABLE responses_v2;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at);
        CREATE INDEX responses_done ON responses (state, updated_at) WHERE state = 'delivered' OR state = 'failed';
        """,
        // v4: responses_claim keeps only rows that can still be claimed or are being sent, so a
        // delivery (inflight -> delivered) only deletes its entry instead of moving it, and the
        // index does not grow with the delivered history. Terminal rows are counted through
        // responses_done. Queries name the state as a literal so the planner can use them.
        """
        DROP INDEX responses_claim;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at) WHERE state = 'queued' OR state = 'inflight' OR state = 'retry';
        """,
        // v5: the id's first 64 bits are the row's key (`id_high`, the rowid), and the `id`
        // primary-key index goes: an ingest INSERT writes three B-trees instead of four, and a
        // lookup by id is a rowid descent (`WHERE id_high = ? AND id = ?`, id_high computed in
        // Swift by UUIDText.high64). UUIDv7 high words (timestamp, version 7, counter) increase
        // in commit order, so rows are appended at the table's right edge; v4 ids (version 4)
        // can never share a high word with a v7 id. The column is declared INTEGER PRIMARY KEY,
        // not left as the bare rowid: VACUUM (and relayctl backup's VACUUM INTO) may renumber
        // the rowids of a table without one, and `sqlite3 .dump` does not write them.
        // relay_id_rowid() is defined by migrate(); it refuses ids that are not UUIDs, and two
        // v4 ids sharing their first 64 bits (~2^-60 per pair) fail the INSERT, which migrate()
        // turns into an error naming them. Rows are copied in key order (appends, full pages).
        """
        DROP INDEX responses_claim;
        DROP INDEX responses_done;
        ALTER TABLE responses RENAME TO responses_v4;
        CREATE TABLE responses (
            id_high INTEGER PRIMARY KEY,
            id TEXT NOT NULL,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state = 'queued' OR state = 'inflight' OR state = 'retry' OR state = 'delivered' OR state = 'failed'),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                               attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at)
            SELECT relay_id_rowid(id), id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                   attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at
            FROM responses_v4 ORDER BY 1;
        DROP TABLE responses_v4;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at) WHERE state = 'queued' OR state = 'inflight' OR state = 'retry';
        CREATE INDEX responses_done ON responses (state, updated_at) WHERE state = 'delivered' OR state = 'failed';
        """,
    ]

    /// Schema v5's key of a stored id (its first 64 bits), for the migration's copy.
    struct NotAUUID: Error, CustomStringConvertible {
        var id: String
        var description: String {
            "response id '\(id)' is not a UUID: schema v5 keys each row by its id's first 64 bits, and a relay never minted such an id; delete or correct that row, then start again"
        }
    }

    /// Applies every migration above the file's user_version, each in its own transaction.
    /// Refuses a database written by a newer relay.
    static func migrate(_ db: SQLiteDatabase, onSlowStart: (@Sendable (String) -> Void)? = nil,
                        reportEveryMicros: Int64 = 1_000_000) throws {
        try db.defineFunction("relay_id_rowid") { text in
            guard let text else { throw NotAUUID(id: "NULL") }
            guard let high = UUIDText.high64(text) else { throw NotAUUID(id: String(decoding: text.prefix(64), as: UTF8.self)) }
            return high
        }
        try db.transaction {
            let current = Int(try db.scalar("PRAGMA user_version").int ?? 0)
            guard current <= migrations.count else {
                throw StoreError.invalid("database schema version \(current) is newer than this relay (\(migrations.count))")
            }
            for v in current..<migrations.count {
                var lastReport = monotonicMicros()
                let stage = "migrating the database to schema v\(v + 1)"
                try db.withProgress(everySteps: 100_000, {
                    let now = monotonicMicros()
                    guard let onSlowStart, now - lastReport >= reportEveryMicros else { return }
                    lastReport = now
                    onSlowStart(stage)
                }) {
                    do {
                        try db.execute(migrations[v])
                    } catch let error as StoreError where v == 4 && error.isPrimaryKeyConflict {
                        throw try v5KeyClash(db)
                    }
                }
                try db.execute("PRAGMA user_version = \(v + 1)")
            }
        }
    }

    /// The v5 copy hit two ids with the same first 64 bits (only random v4 ids can: ~2^-60 per
    /// pair). The INSERT was rolled back, responses_v4 is still there (the transaction rolls
    /// back after this): name the ids so an operator can decide which row to delete.
    private static func v5KeyClash(_ db: SQLiteDatabase) throws -> StoreError {
        let groups = try db.query("""
            SELECT group_concat(id, ', ') FROM responses_v4 GROUP BY relay_id_rowid(id) HAVING count(*) > 1 LIMIT 5
            """).compactMap { $0[0].string }
        return .invalid("schema v5 migration: response ids share their first 64 bits, the row key from v5 on (\(groups.map { "{\($0)}" }.joined(separator: " "))); delete all but one of each group, then start again")
    }

    // MARK: ingest

    public func submit(_ request: IngestRequest, completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
        guard let writer else { return completion(.failure(.invalid("store opened read-only"))) }
        // Cached statvfs (once a second at most): the hot path pays a lock and a clock read.
        if let g = freeSpaceGuard, g.isBelowFloor { return completion(.success(.storageFull)) }
        writer.enqueue(IngestJob(request, now: clock.nowMillis(), state: writerState, completion: completion))
    }

    /// One submit in the writer's queue: the request in, the outcome (and the row to hand to
    /// the dispatcher) out. One object per request instead of four closure contexts, a result
    /// box and a Result per job.
    // @unchecked Sendable: a job is touched by one thread at a time. The writer thread runs and
    // finishes it; a deferred job is then handed, inside one executor task, to the HTTP loop,
    // which calls `complete()` once. The hand-over goes through the executor's locked queue.
    fileprivate final class IngestJob: GroupCommitWriter.Job, @unchecked Sendable {
        let request: IngestRequest
        let now: Int64
        let state: WriterState
        let completion: @Sendable (Result<IngestOutcome, StoreError>) -> Void
        var outcome: IngestOutcome?
        var handedOff: OutboxRow?
        var error: StoreError?
        override var refusedWhenQueueFull: Bool { true }

        init(_ request: IngestRequest, now: Int64, state: WriterState, completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
            self.request = request
            self.now = now
            self.state = state
            self.completion = completion
        }

        override func run(_ db: SQLiteDatabase) throws {
            (outcome, handedOff) = try SQLiteOutboxStore.ingest(request, now: now, db: db, state: state)
        }

        override func finish(_ error: StoreError?) {
            // A rolled-back batch gave its dispatcher reservations back in afterRollback.
            self.error = error
            if error == nil, let row = handedOff { state.handoff?.accept(row) }
            // The answer is built and sent on the request's loop (afterBatch hands them over).
            if request.executor != nil { state.deferred.append(self) } else { complete() }
        }

        override func refuse(_ error: StoreError) {
            self.error = error
            complete()
        }

        func complete() {
            if let error { return completion(.failure(error)) }
            if let outcome { completion(.success(outcome)) } else { completion(.failure(.invalid("ingest produced no outcome"))) }
        }
    }

    /// Hands the batch's deferred completions to their loops: one task per loop (one loop
    /// in the default configuration), in commit order within each loop.
    private static func completeDeferred(_ state: WriterState) {
        guard let first = state.deferred.first?.request.executor else { return }
        // The array itself is handed over (emptying it in place would copy a shared buffer).
        let jobs = state.deferred
        state.deferred = []
        // One loop (the default): the batch's array as it is, no grouping.
        if jobs.allSatisfy({ $0.request.executor === first }) {
            first.execute { for job in jobs { job.complete() } }
            return
        }
        var groups: [(executor: any ThreadExecutor, jobs: [IngestJob])] = []
        for job in jobs {
            guard let executor = job.request.executor else { continue }   // only deferred with one
            if let i = groups.firstIndex(where: { $0.executor === executor }) {
                groups[i].jobs.append(job)
            } else {
                groups.append((executor, [job]))
            }
        }
        for group in groups {
            let batch = group.jobs
            group.executor.execute { for job in batch { job.complete() } }
        }
    }

    public func setHandoff(_ handoff: (any DispatchHandoff)?) {
        guard writer != nil else { return }
        let state = writerState
        _ = try? write { _ in state.handoff = handoff }
    }

    private static func insertSQL(state: ResponseState) -> String {
        """
        INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
            state, attempts, next_attempt_at, created_at, expires_at, updated_at)
        VALUES (?12, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, '\(state.rawValue)', 0, ?9, ?10, ?11, ?10)
        ON CONFLICT (push_token, session_id, key_id, message_index) DO NOTHING
        """
    }
    private static let insertQueuedSQL = insertSQL(state: .queued)
    private static let insertInflightSQL = insertSQL(state: .inflight)

    /// Runs on the writer thread inside the batch transaction. Returns the outcome and, when
    /// the row was inserted inflight for the dispatcher, the row to hand over after COMMIT.
    private static func ingest(_ request: IngestRequest, now: Int64, db: SQLiteDatabase, state: WriterState) throws -> (IngestOutcome, OutboxRow?) {
        // Credential: looked up in the same transaction, so a revocation committed by relayctl
        // takes effect for the very next batch.
        let cred: CachedCredential?
        var touchChecked = false
        if let last = state.lastCredential, last.hash == request.credentialHash {
            cred = last.credential   // the common case: a batch from one credential, no hashing
            touchChecked = last.touchChecked
        } else if let cached = state.credentials[request.credentialHash] {
            cred = cached
            state.lastCredential = (request.credentialHash, cached, false)
        } else {
            let lookup = try db.held(&state.lookupCredential, "SELECT id, hash, apps, revoked_at FROM credentials WHERE hash = ?")
            defer { lookup.reset() }
            try lookup.bind(1, request.credentialHash)
            if try lookup.next(), !lookup.isNull(0), !lookup.isNull(1) {
                cred = CachedCredential(id: lookup.text(0), hash: lookup.blob(1), apps: splitApps(lookup.text(2)), revoked: !lookup.isNull(3))
            } else {
                cred = nil
            }
            state.credentials[request.credentialHash] = .some(cred)
            state.lastCredential = (request.credentialHash, cred, false)
        }
        let credID: String, app: String
        switch StoreRules.admit(credential: cred, presentedHash: request.credentialHash, requestedApp: request.response.app,
                                configuredApps: request.configuredApps) {
        case .refused(let outcome): return (outcome, nil)
        case .admitted(let c, let a): (credID, app) = (c, a)
        }
        // last_used_at is kept to the minute: checked once per credential and batch, not per row.
        if !touchChecked {
            if (state.credentialTouched[credID] ?? 0) < now - 60_000 {
                try db.run("UPDATE credentials SET last_used_at = ? WHERE id = ?", [.integer(now), .text(credID)])
                state.credentialTouched[credID] = now
            }
            state.lastCredential?.touchChecked = true
        }
        let r = request.response
        var due = now
        // Slow path (rare): the token was reported unregistered or is paced, or the outbox is
        // at its bound: check duplicates first so a retried POST still gets its 200.
        // isEmpty first: hashing the token for an empty set cost ~1k instructions a row.
        if (!state.watchedTokens.isEmpty && state.watchedTokens.contains(r.pushToken)) || state.pending >= request.maxPending {
            if let dup = try existing(r, db: db) { return (StoreRules.dedupe(dup, credentialID: credID), nil) }
            if let unreg = try db.query("SELECT apns_timestamp FROM unregistered_tokens WHERE token = ?", [.text(r.pushToken)]).first,
               let reportedAt = unreg[0].int {
                let lastSeen = try db.scalar("SELECT max(created_at) FROM responses WHERE push_token = ?", [.text(r.pushToken)]).int
                if StoreRules.isUnregistered(cutoff: reportedAt, lastSeen: lastSeen) { return (.unregistered, nil) }
            }
            guard state.pending < request.maxPending else { return (.overCapacity, nil) }
            if let paced = try db.query("SELECT paced_until FROM token_pacing WHERE token = ?", [.text(r.pushToken)]).first?[0].int, paced > now {
                due = paced
            }
        }
        let handOff = due <= now && (state.handoff?.reserve() ?? false)
        if handOff { state.reservedInBatch += 1 }
        var (id, high) = state.ids.mint(nowMillis: now)
        let expires = now + request.ttlMillis
        // Two statements with the state as a literal, bound without [SQLValue] arrays.
        let insert = handOff ? try db.held(&state.insertInflight, insertInflightSQL) : try db.held(&state.insertQueued, insertQueuedSQL)
        var clashes = 0
        while true {
            try insert.bind(1, id)
            try insert.bind(2, app)
            try insert.bind(3, r.pushToken)
            try insert.bind(4, r.sessionIdentifier)
            try insert.bind(5, r.keyID)
            try insert.bind(6, Int64(r.messageIndex))
            try insert.bind(7, r.encryptedData)
            try insert.bind(8, credID)
            try insert.bind(9, due)
            try insert.bind(10, now)
            try insert.bind(11, expires)
            try insert.bind(12, high)
            do {
                try insert.stepOnce()
                break
            } catch let error as StoreError where error.isPrimaryKeyConflict && clashes < maxKeyClashes {
                // The id's high word is taken: another process on this file minted it in the
                // same millisecond, or this one restarted after the clock stepped back. Only
                // this statement failed (the dedupe conflict target does not cover the key, so
                // it is not taken for a duplicate); move past the highest key of that
                // millisecond (exact: we hold the write lock) and mint again.
                clashes += 1
                let bucket = high & ~0xfff   // same ms, version 7, counter 0
                let top = try db.scalar("SELECT max(id_high) FROM responses WHERE id_high BETWEEN ? AND ?",
                                        [.integer(bucket), .integer(bucket | 0xfff)]).int
                state.ids.advance(pastHigh: top ?? high)
                (id, high) = state.ids.mint(nowMillis: now)
            }
        }
        let inserted = db.changes
        if inserted == 0 {
            // The dedupe key exists: answer with the stored row.
            if handOff {
                state.handoff?.release(1)
                state.reservedInBatch -= 1
            }
            guard let dup = try existing(r, db: db) else { throw StoreError.invalid("insert ignored but no duplicate found") }
            return (StoreRules.dedupe(dup, credentialID: credID), nil)
        }
        state.pending += 1
        guard handOff else {
            state.queuedInBatch += 1
            return (.accepted(id: id), nil)
        }
        let row = OutboxRow(id: id, app: app, pushToken: r.pushToken, sessionIdentifier: r.sessionIdentifier, keyID: r.keyID,
                            messageIndex: r.messageIndex, encryptedData: r.encryptedData, credentialID: credID, state: .inflight,
                            attempts: 0, nextAttemptAt: due, createdAt: now, expiresAt: expires, lastStatus: nil, lastReason: nil, updatedAt: now)
        return (.accepted(id: id), row)
    }

    /// Ingest attempts per row whose id's high word was taken (each moves past a whole
    /// millisecond's keys, so one is almost always enough).
    static let maxKeyClashes = 16

    private static func existing(_ r: NewResponse, db: SQLiteDatabase) throws -> ExistingRow? {
        let rows = try db.query(
            "SELECT id, state, credential_id FROM responses WHERE push_token = ? AND session_id = ? AND key_id = ? AND message_index = ?",
            [.text(r.pushToken), .text(r.sessionIdentifier), .blob(r.keyID), .integer(Int64(r.messageIndex))])
        guard let row = rows.first, let id = row[0].string, let s = row[1].string.flatMap(ResponseState.init(rawValue:)),
              let cred = row[2].string else { return nil }
        return ExistingRow(id: id, state: s, credentialID: cred)
    }

    static func splitApps(_ s: String) -> [String] {
        s.split(separator: ",").map { String($0) }.filter { !$0.isEmpty }
    }

    // MARK: dispatcher

    private func write<T>(_ work: @escaping (SQLiteDatabase) throws -> T) throws -> T {
        guard let writer else { throw StoreError.invalid("store opened read-only") }
        return try writer.perform(work)
    }

    public func recoverInflight() throws -> Int {
        let now = clock.nowMillis()
        return try write { db in
            try db.run("UPDATE responses SET state = 'queued', updated_at = ? WHERE state = 'inflight'", [.integer(now)])
        }
    }

    static let rowColumns = """
        id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state, attempts,
        next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at
        """

    static func decodeRow(_ c: [SQLValue]) throws -> OutboxRow {
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

    /// A `rowColumns` result row read column by column (no [SQLValue] per row).
    static func readRow(_ s: SQLiteStatement) throws -> OutboxRow {
        guard !s.isNull(0), let state = ResponseState(rawValue: s.text(8)) else { throw StoreError.invalid("malformed responses row") }
        return OutboxRow(
            id: s.text(0), app: s.text(1), pushToken: s.text(2), sessionIdentifier: s.text(3), keyID: s.blob(4),
            messageIndex: UInt32(truncatingIfNeeded: s.int64(5)), encryptedData: s.blob(6), credentialID: s.text(7), state: state,
            attempts: Int(s.int64(9)), nextAttemptAt: s.int64(10), createdAt: s.int64(11), expiresAt: s.int64(12),
            lastStatus: s.isNull(13) ? nil : Int(s.int64(13)), lastReason: s.isNull(14) ? nil : s.text(14), updatedAt: s.int64(15))
    }

    public func claimDue(limit: Int) throws -> [OutboxRow] {
        let now = clock.nowMillis()
        let state = writerState
        return try write { db in
            // One query per state so each walks (state, next_attempt_at) in order without a sort.
            var rows: [OutboxRow] = []
            var rowids: [Int64] = []
            rows.reserveCapacity(limit)
            rowids.reserveCapacity(limit)
            // The state is a literal so the partial index responses_claim applies.
            for s in [ResponseState.queued, .retry] where rows.count < limit {
                let select = try db.held(&state.claimSelect[s],
                    "SELECT \(Self.rowColumns), rowid FROM responses WHERE state = '\(s.rawValue)' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?")
                defer { select.reset() }
                try select.bind(1, now)
                try select.bind(2, Int64(limit - rows.count))
                while try select.next() {
                    rows.append(try Self.readRow(select))
                    rowids.append(select.int64(16))
                }
            }
            // By rowid (id_high, read with the row in the same transaction): no id text to parse or compare.
            let markInflight = try db.held(&state.markInflight, "UPDATE responses SET state = 'inflight', updated_at = ? WHERE rowid = ?")
            let markExpired = try db.held(&state.markExpired, "UPDATE responses SET state = 'failed', last_reason = 'expired', updated_at = ? WHERE rowid = ?")
            var claimed: [OutboxRow] = []
            claimed.reserveCapacity(rows.count)
            for (var row, rowid) in zip(rows, rowids) {
                if row.expiresAt <= now {
                    try markExpired.bind(1, now)
                    try markExpired.bind(2, rowid)
                    try markExpired.stepOnce()
                    state.pending -= 1
                    continue
                }
                try markInflight.bind(1, now)
                try markInflight.bind(2, rowid)
                try markInflight.stepOnce()
                row.state = .inflight
                row.updatedAt = now
                claimed.append(row)
            }
            return claimed
        }
    }

    public func nextDueAt() throws -> Int64? {
        try read { db in
            let a = try db.scalar("SELECT min(next_attempt_at) FROM responses WHERE state = 'queued'").int
            let b = try db.scalar("SELECT min(next_attempt_at) FROM responses WHERE state = 'retry'").int
            switch (a, b) {
            case let (x?, y?): return min(x, y)
            default: return a ?? b
            }
        }
    }

    public func apply(_ updates: [DeliveryUpdate]) throws {
        guard !updates.isEmpty else { return }
        let now = clock.nowMillis()
        let state = writerState
        try write { db in
            for u in updates {
                // A row is found by its key and id (schema v5); an id that is not a UUID has no row.
                guard let high = UUIDText.high64(u.id) else { continue }
                if let a = u.attempt {
                    // Typed binds on held statements: this and the delivered UPDATE run once per push.
                    let st = try db.held(&state.insertAttempt,
                        "INSERT INTO attempts (response_id, attempted_at, status, reason, apns_timestamp, latency_us) VALUES (?, ?, ?, ?, ?, ?)")
                    try st.bind(1, a.responseID)
                    try st.bind(2, a.attemptedAt)
                    try st.bind(3, a.status.map(Int64.init))
                    try st.bind(4, a.reason)
                    try st.bind(5, a.apnsTimestamp)
                    try st.bind(6, a.latencyMicros)
                    try st.stepOnce()
                }
                let status: SQLValue = u.attempt?.status.map { .integer(Int64($0)) } ?? .null
                let reason: SQLValue = u.attempt?.reason.map { .text($0) } ?? .null
                let counted = u.attempt == nil ? 0 : 1
                var changed = 0
                switch u.outcome {
                case .delivered:
                    let st = try db.held(&state.markDelivered,
                        "UPDATE responses SET state = 'delivered', attempts = attempts + ?, last_status = ?, last_reason = NULL, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'")
                    try st.bind(1, Int64(counted))
                    try st.bind(2, u.attempt?.status.map(Int64.init))
                    try st.bind(3, now)
                    try st.bind(4, high)
                    try st.bind(5, u.id)
                    try st.stepOnce()
                    changed = db.changes
                    state.pending -= changed
                case .failed(let why):
                    changed = try db.run(
                        "UPDATE responses SET state = 'failed', attempts = attempts + ?, last_status = ?, last_reason = ?, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(Int64(counted)), status, .text(why), .integer(now), .integer(high), .text(u.id)])
                    state.pending -= changed
                case .unregistered(let why, let ts):
                    changed = try db.run(
                        "UPDATE responses SET state = 'failed', attempts = attempts + ?, last_status = ?, last_reason = ?, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(Int64(counted)), status, .text(why), .integer(now), .integer(high), .text(u.id)])
                    state.pending -= changed
                    state.watchedTokens.insert(u.pushToken)
                    // Same transaction as the row's failure: no ingest can commit in between.
                    let waiting = try db.scalar(
                        "SELECT max(created_at) FROM responses WHERE push_token = ? AND state IN ('queued','inflight','retry')", [.text(u.pushToken)]).int
                    try db.run(
                        """
                        INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at) VALUES (?, ?, ?)
                        ON CONFLICT (token) DO UPDATE SET apns_timestamp = max(apns_timestamp, excluded.apns_timestamp), recorded_at = excluded.recorded_at
                        """, [.text(u.pushToken), .integer(StoreRules.unregisteredCutoff(apnsTimestamp: ts, newestPendingCreatedAt: waiting)), .integer(now)])
                case .retry(let at, let paceUntil):
                    try db.run(
                        "UPDATE responses SET state = 'retry', attempts = attempts + ?, next_attempt_at = ?, last_status = ?, last_reason = ?, updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(Int64(counted)), .integer(at), status, reason, .integer(now), .integer(high), .text(u.id)])
                    if let until = paceUntil {
                        state.watchedTokens.insert(u.pushToken)
                        try db.run(
                            """
                            INSERT INTO token_pacing (token, paced_until, updated_at) VALUES (?, ?, ?)
                            ON CONFLICT (token) DO UPDATE SET paced_until = max(paced_until, excluded.paced_until), updated_at = excluded.updated_at
                            """, [.text(u.pushToken), .integer(until), .integer(now)])
                        try db.run(
                            "UPDATE responses SET next_attempt_at = ? WHERE push_token = ? AND state IN ('queued','retry') AND next_attempt_at < ?",
                            [.integer(until), .text(u.pushToken), .integer(until)])
                    }
                case .requeue:
                    try db.run(
                        "UPDATE responses SET state = 'queued', updated_at = ? WHERE id_high = ? AND id = ? AND state = 'inflight'",
                        [.integer(now), .integer(high), .text(u.id)])
                }
            }
        }
    }

    // MARK: queries

    private func read<T>(_ body: (SQLiteDatabase) throws -> T) throws -> T {
        readerLock.lock()
        defer { readerLock.unlock() }
        return try body(reader)
    }

    public func response(id: String) throws -> OutboxRow? {
        let id = id.lowercased()
        guard let high = UUIDText.high64(id) else { return nil }
        return try read { db in
            try db.query("SELECT \(Self.rowColumns) FROM responses WHERE id_high = ? AND id = ?", [.integer(high), .text(id)]).first.map(Self.decodeRow)
        }
    }

    public func attempts(responseID: String) throws -> [AttemptRecord] {
        try read { db in
            try db.query(
                "SELECT response_id, attempted_at, status, reason, apns_timestamp, latency_us FROM attempts WHERE response_id = ? ORDER BY id",
                [.text(responseID.lowercased())]
            ).map { c in
                AttemptRecord(responseID: c[0].string ?? "", attemptedAt: c[1].int ?? 0, status: c[2].int.map { Int($0) },
                              reason: c[3].string, apnsTimestamp: c[4].int, latencyMicros: c[5].int)
            }
        }
    }

    public func list(_ filter: OutboxFilter) throws -> [OutboxRow] {
        var clauses: [String] = []
        var binds: [SQLValue] = []
        if let s = filter.state { clauses.append("state = ?"); binds.append(.text(s.rawValue)) }
        if let a = filter.app { clauses.append("app = ?"); binds.append(.text(a)) }
        if let p = filter.tokenPrefix {
            // Range on the unique index's leading column instead of LIKE (which ignores it).
            clauses.append("push_token >= ? AND push_token < ?")
            binds.append(.text(p.lowercased()))
            binds.append(.text(p.lowercased() + "\u{7f}"))
        }
        if let since = filter.createdSince { clauses.append("created_at >= ?"); binds.append(.integer(since)) }
        let whereSQL = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        binds.append(.integer(Int64(max(0, filter.limit))))
        let sql = "SELECT \(Self.rowColumns) FROM responses \(whereSQL) ORDER BY created_at DESC LIMIT ?"
        return try read { db in try db.query(sql, binds).map(Self.decodeRow) }
    }

    public func counts() throws -> OutboxCounts {
        try read { db in
            var by: [ResponseState: Int] = [:]
            for s in ResponseState.allCases {
                // A literal state: responses_claim (pending states) or responses_done (terminal) covers it.
                by[s] = Int(try db.scalar("SELECT count(*) FROM responses WHERE state = '\(s.rawValue)'").int ?? 0)
            }
            let q = try db.scalar("SELECT min(created_at) FROM responses WHERE state = 'queued'").int
            let r = try db.scalar("SELECT min(created_at) FROM responses WHERE state = 'retry'").int
            let oldest = [q, r].compactMap { $0 }.min()
            return OutboxCounts(byState: by, oldestPendingCreatedAt: oldest)
        }
    }

    public func recentOutcomes(since: Int64) throws -> [(state: ResponseState, reason: String?, count: Int)] {
        try read { db in
            try db.query(
                "SELECT state, last_reason, count(*) FROM responses WHERE (state = 'delivered' OR state = 'failed') AND updated_at >= ? GROUP BY state, last_reason ORDER BY state, last_reason",
                [.integer(since)]
            ).compactMap { c in
                guard let s = c[0].string.flatMap(ResponseState.init(rawValue:)) else { return nil }
                return (s, c[1].string, Int(c[2].int ?? 0))
            }
        }
    }

    // MARK: operator actions

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
                if changed > 0 && wasTerminal { state.pending += 1 }
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
            state.pending += n
            return n
        }
    }

    public func purge(state s: ResponseState, olderThan: Int64, dryRun: Bool) throws -> Int {
        guard s.isTerminal else { throw StoreError.invalid("only delivered or failed rows can be purged") }
        if dryRun {
            return try read { db in
                Int(try db.scalar("SELECT count(*) FROM responses WHERE state = '\(s.rawValue)' AND updated_at < ?", [.integer(olderThan)]).int ?? 0)
            }
        }
        return try PurgeBatches.run(self, state: s, olderThan: olderThan)
    }

    public func purgeBatch(state s: ResponseState, olderThan: Int64, limit: Int) throws -> Int {
        guard s.isTerminal else { throw StoreError.invalid("only delivered or failed rows can be purged") }
        return try write { db in
            // The state is a literal (a terminal enum value, not client input) so the planner can
            // use the partial index responses_done, which a bound parameter would not prove.
            let rows = try db.query("SELECT id_high, id FROM responses WHERE state = '\(s.rawValue)' AND updated_at < ? ORDER BY updated_at LIMIT ?",
                                    [.integer(olderThan), .integer(Int64(max(0, limit)))])
            for r in rows {
                try db.run("DELETE FROM attempts WHERE response_id = ?", [r[1]])
                try db.run("DELETE FROM responses WHERE id_high = ?", [r[0]])
            }
            return rows.count
        }
    }

    public func unregisteredTokens() throws -> [UnregisteredToken] {
        try read { db in
            try db.query("SELECT token, apns_timestamp, recorded_at FROM unregistered_tokens ORDER BY recorded_at DESC").map {
                UnregisteredToken(token: $0[0].string ?? "", apnsTimestamp: $0[1].int ?? 0, recordedAt: $0[2].int ?? 0)
            }
        }
    }

    public func forgetToken(_ token: String) throws -> Bool {
        try write { db in try db.run("DELETE FROM unregistered_tokens WHERE token = ?", [.text(token.lowercased())]) > 0 }
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
        _ = try write { db in
            try db.run(
                "INSERT INTO credentials (id, name, hash, apps, created_at) VALUES (?, ?, ?, ?, ?)",
                [.text(id), .text(name), .blob(hash), .text(apps.joined(separator: ",")), .integer(now)])
        }
        return CreatedCredential(record: CredentialRecord(id: id, name: name, apps: apps, createdAt: now, lastUsedAt: nil, revokedAt: nil), secret: secret)
    }

    static func decodeCredential(_ c: [SQLValue]) -> CredentialRecord {
        CredentialRecord(id: c[0].string ?? "", name: c[1].string ?? "", apps: splitApps(c[2].string ?? ""),
                         createdAt: c[3].int ?? 0, lastUsedAt: c[4].int, revokedAt: c[5].int)
    }

    public func credentials() throws -> [CredentialRecord] {
        try read { db in
            try db.query("SELECT id, name, apps, created_at, last_used_at, revoked_at FROM credentials ORDER BY created_at, id").map(Self.decodeCredential)
        }
    }

    public func revokeCredential(id: String) throws -> Bool {
        let now = clock.nowMillis()
        return try write { db in
            try db.run("UPDATE credentials SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", [.integer(now), .text(id)]) > 0
        }
    }

    public func authenticate(secret: String) throws -> CredentialRecord? {
        let hash = Credentials.hash(secret: secret)
        return try read { db in
            guard let c = try db.query("SELECT id, name, apps, created_at, last_used_at, revoked_at, hash FROM credentials WHERE hash = ?", [.blob(hash)]).first,
                  let stored = c[6].bytes, RelayCrypto.constantTimeEqual(stored, hash)
            else { return nil }
            let record = Self.decodeCredential(c)
            return record.isRevoked ? nil : record
        }
    }

    public func credentialKeys(unlessAt known: CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?) {
        try read { db in
            let g = try db.query("SELECT count(*), count(revoked_at), coalesce(max(created_at), 0) FROM credentials")[0]
            let generation = CredentialGeneration(count: Int(g[0].int ?? 0), revoked: Int(g[1].int ?? 0), newestCreatedAt: g[2].int ?? 0)
            guard generation != known else { return (generation, nil) }
            let keys = try db.query("SELECT id, hash, revoked_at FROM credentials").map {
                CredentialKey(id: $0[0].string ?? "", hash: $0[1].bytes ?? [], revoked: $0[2].int != nil)
            }
            return (generation, keys)
        }
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

    /// Microseconds the writer spent inside transactions (BEGIN to the end of COMMIT) so far.
    public var writerTransactionMicros: Int { writer?.transactionTime ?? 0 }
}

/// Bearer credentials: `rk_` + base64url of 32 random bytes; stored as SHA-256 only.
public enum Credentials {
    public static let prefix = "rk_"

    public static func generateSecret() -> String { prefix + RelayCrypto.randomBytes(32).base64URLString }
    public static func generateID() -> String { "cred_" + RelayCrypto.randomBytes(6).hexString }
    public static func hash(secret: String) -> [UInt8] { RelayCrypto.sha256(Array(secret.utf8)) }
}
