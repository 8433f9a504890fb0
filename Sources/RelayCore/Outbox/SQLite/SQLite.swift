// The only file in RelayCore that sees SQLite's C API. One owner class per handle
// (`SQLiteDatabase` owns the `sqlite3*`, `SQLiteStatement` owns each `sqlite3_stmt*`), every
// return code checked and turned into `StoreError.sqlite` carrying sqlite3_errmsg.
import Basics
import FoundationEssentials
internal import CSQLite

/// A value bound to or read from SQLite. Integers are 64-bit; times are milliseconds since 1970.
public enum SQLValue: Sendable, Equatable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])

    public var int: Int64? { if case .integer(let v) = self { return v }; return nil }
    public var string: String? { if case .text(let v) = self { return v }; return nil }
    public var bytes: [UInt8]? {
        switch self {
        case .blob(let b): return b
        case .text(let s): return Array(s.utf8)
        default: return nil
        }
    }
}

/// Errors from storage. What reaches an HTTP client is never this: the ingest layer maps any
/// storage error to 503 without details.
public enum StoreError: Error, Equatable, CustomStringConvertible {
    case sqlite(code: Int32, message: String, context: String)
    /// A PostgreSQL statement failed (sqlState from the server, "" for client-side errors).
    case postgres(sqlState: String, message: String, context: String)
    /// The database cannot be reached right now (connection lost, reconnect backing off).
    case unavailable(String)
    case notFound(String)
    case invalid(String)
    case closed

    public var description: String {
        switch self {
        case .sqlite(let code, let message, let context): return "sqlite error \(code) (\(message)) in \(context)"
        case .postgres(let state, let message, let context): return "postgres error \(state.isEmpty ? "(client)" : state) (\(message)) in \(context)"
        case .unavailable(let why): return "database unavailable: \(why)"
        case .notFound(let what): return "not found: \(what)"
        case .invalid(let what): return "invalid: \(what)"
        case .closed: return "store is closed"
        }
    }
}

extension StoreError {
    /// A duplicate rowid / INTEGER PRIMARY KEY (SQLITE_CONSTRAINT_PRIMARYKEY; extended result
    /// codes are on for every connection). The extended codes are macros Swift cannot import.
    var isPrimaryKeyConflict: Bool {
        if case .sqlite(let code, _, _) = self { return code == SQLITE_CONSTRAINT | (6 << 8) }
        return false
    }
}

/// One SQLite connection. Not thread-safe: exactly one thread uses it at a time (the group
/// commit writer owns the write connection; readers are each owned by one thread or a lock).
/// Carries withProgress's closure through sqlite3_progress_handler's context pointer.
private final class ProgressTick {
    let tick: () -> Void
    init(_ tick: @escaping () -> Void) { self.tick = tick }
}

/// Carries onWALCommit's closure through sqlite3_wal_hook's context pointer.
private final class WALHook {
    let body: (Int) -> Void
    init(_ body: @escaping (Int) -> Void) { self.body = body }
}

/// Carries defineFunction's closure through sqlite3_create_function_v2's user-data pointer;
/// released by SQLite's destructor callback when the function is replaced or the connection closes.
private final class ScalarFunction {
    let body: (UnsafeBufferPointer<UInt8>?) throws -> Int64?
    init(_ body: @escaping (UnsafeBufferPointer<UInt8>?) throws -> Int64?) { self.body = body }
}

public final class SQLiteDatabase {
    private let handle: OpaquePointer
    private var statements: [String: SQLiteStatement] = [:]
    private var walHook: Unmanaged<WALHook>?
    public let path: String

    public init(path: String, readOnly: Bool = false, busyTimeoutMillis: Int32 = 5000) throws {
        // SQLite follows a link at the database's own name (it refuses one at -wal, -shm and
        // -journal by itself, O_NOFOLLOW), and a writable open creates the file: refused here.
        if !readOnly && DurableFile.isSymbolicLink(path) {
            throw StoreError.invalid("the database \(path) is a symbolic link; refusing to open it for writing (give the file's own path)")
        }
        var db: OpaquePointer?
        let flags = readOnly
            ? (SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX)
            : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX)
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let db { sqlite3_close_v2(db) }
            throw StoreError.sqlite(code: rc, message: message, context: "open \(path)")
        }
        // Before the stored properties are set: once they all are, a throw runs deinit, which
        // closes the handle, and closing it here as well was a second sqlite3_close_v2 on freed
        // memory.
        let trc = sqlite3_busy_timeout(db, busyTimeoutMillis)
        guard trc == SQLITE_OK else {
            let error = StoreError.sqlite(code: trc, message: String(cString: sqlite3_errmsg(db)), context: "busy_timeout")
            sqlite3_close_v2(db)
            throw error
        }
        // Extended codes tell SQLITE_IOERR_FSYNC apart from other I/O errors in logs.
        sqlite3_extended_result_codes(db, 1)
        self.handle = db
        self.path = path
    }

    deinit {
        statements.removeAll()  // finalize every cached statement before closing
        sqlite3_close_v2(handle)
        walHook?.release()   // after the close: no hook can run any more
    }

    fileprivate func error(_ code: Int32, _ context: String) -> StoreError {
        .sqlite(code: code, message: String(cString: sqlite3_errmsg(handle)), context: context)
    }

    /// Runs `body` with `tick` called from inside SQLite about every `steps` virtual-machine
    /// instructions (sqlite3_progress_handler), so a statement that runs for seconds (a table
    /// rebuild during migration) can report that it is alive. `tick` must not use this
    /// connection; it cannot interrupt the statement.
    public func withProgress<R>(everySteps steps: Int32, _ tick: @escaping () -> Void, _ body: () throws -> R) rethrows -> R {
        let box = Unmanaged.passRetained(ProgressTick(tick))
        sqlite3_progress_handler(handle, steps, { context in
            Unmanaged<ProgressTick>.fromOpaque(context!).takeUnretainedValue().tick()
            return 0   // non-zero would abort the statement
        }, box.toOpaque())
        defer {
            sqlite3_progress_handler(handle, 0, nil, nil)
            box.release()
        }
        return try body()
    }

    /// Registers `name(x)` on this connection as a deterministic SQL function of one argument:
    /// `body` gets x's UTF-8 text (nil for NULL) and returns an integer or NULL; what it throws
    /// fails the calling statement with the error's description as SQLite's message. Used by
    /// migrations that compute a column SQL cannot (schema v5's rowid from the id text).
    func defineFunction(_ name: String, _ body: @escaping (UnsafeBufferPointer<UInt8>?) throws -> Int64?) throws {
        let box = Unmanaged.passRetained(ScalarFunction(body)).toOpaque()
        // On failure SQLite calls the destructor itself, so the box is released either way.
        let rc = sqlite3_create_function_v2(handle, name, 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, box, { ctx, _, argv in
            let f = Unmanaged<ScalarFunction>.fromOpaque(sqlite3_user_data(ctx)!).takeUnretainedValue()
            let arg = argv![0]
            do {
                let value: Int64?
                if sqlite3_value_type(arg) == SQLITE_NULL {
                    value = try f.body(nil)
                } else {
                    let text = sqlite3_value_text(arg)   // before _bytes: the length of the UTF-8 form
                    let n = Int(sqlite3_value_bytes(arg))
                    value = try f.body(UnsafeBufferPointer(start: text, count: text == nil ? 0 : n))
                }
                if let value { sqlite3_result_int64(ctx, value) } else { sqlite3_result_null(ctx) }
            } catch {
                sqlite3_result_error(ctx, "\(error)", -1)
            }
        }, nil, nil, { box in
            if let box { Unmanaged<ScalarFunction>.fromOpaque(box).release() }
        })
        guard rc == SQLITE_OK else { throw self.error(rc, "define function \(name)") }
    }

    /// What `checkpoint` asks of SQLite (sqlite3_wal_checkpoint_v2's modes). `passive` copies
    /// what no reader still needs and never waits; `truncate` also waits (busy handler) for the
    /// write lock and for readers to leave the WAL, then truncates it to zero bytes.
    enum CheckpointMode: Int32 { case passive = 0, full = 1, restart = 2, truncate = 3 }

    /// One checkpoint of this connection's database. `busy`: another connection held a lock
    /// the mode needed (nothing failed: a later try may finish); `walFrames` are the WAL's
    /// frames and `backfilled` those now copied into the database file (-1 when unknown).
    /// An I/O error (ENOSPC, EIO...) throws; the WAL still holds every committed frame.
    func checkpoint(_ mode: CheckpointMode) throws -> (busy: Bool, walFrames: Int, backfilled: Int) {
        var log: Int32 = -1, done: Int32 = -1
        let rc = sqlite3_wal_checkpoint_v2(handle, nil, mode.rawValue, &log, &done)
        guard rc == SQLITE_OK || rc == SQLITE_BUSY else { throw error(rc, "wal_checkpoint") }
        return (rc == SQLITE_BUSY, Int(log), Int(done))
    }

    /// Calls `body` with the WAL's frame count after every COMMIT of this connection (in the
    /// committing thread, the write lock already released), instead of SQLite's automatic
    /// checkpoint: registering it turns `wal_autocheckpoint` off. nil removes it.
    func onWALCommit(_ body: ((Int) -> Void)?) {
        let old = walHook
        walHook = body.map { Unmanaged.passRetained(WALHook($0)) }
        if let box = walHook {
            sqlite3_wal_hook(handle, { context, _, _, frames in
                Unmanaged<WALHook>.fromOpaque(context!).takeUnretainedValue().body(Int(frames))
                return SQLITE_OK   // an error here would fail a COMMIT that did commit
            }, box.toOpaque())
        } else {
            sqlite3_wal_hook(handle, nil, nil)
        }
        old?.release()
    }

    /// Runs one or more statements without bindings (schema, pragmas, BEGIN/COMMIT).
    public func execute(_ sql: String) throws {
        var errmsg: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &errmsg)
        if rc != SQLITE_OK {
            let message = errmsg.map { String(cString: $0) } ?? String(cString: sqlite3_errmsg(handle))
            sqlite3_free(errmsg)
            throw StoreError.sqlite(code: rc, message: message, context: String(sql.prefix(60)))
        }
    }

    /// The statement in `slot`, prepared into it on first use. Hot paths keep their statements
    /// in such slots: the cache behind `statement(_:)` is a dictionary keyed by the SQL text,
    /// which hashes that text on every lookup.
    func held(_ slot: inout SQLiteStatement?, _ sql: @autoclosure () -> String) throws -> SQLiteStatement {
        if let s = slot { return s }
        let s = try statement(sql())
        slot = s
        return s
    }

    /// A cached prepared statement for `sql`.
    public func statement(_ sql: String) throws -> SQLiteStatement {
        if let cached = statements[sql] { return cached }
        var stmt: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil)
        guard rc == SQLITE_OK, let stmt else { throw error(rc, "prepare: \(sql.prefix(80))") }
        let s = SQLiteStatement(stmt: stmt, db: self, sql: sql)
        statements[sql] = s
        return s
    }

    /// Executes a statement and returns every row.
    @discardableResult
    public func query(_ sql: String, _ binds: [SQLValue] = []) throws -> [[SQLValue]] {
        let s = try statement(sql)
        return try s.rows(binds)
    }

    /// Executes a write statement and returns the number of rows it changed.
    @discardableResult
    public func run(_ sql: String, _ binds: [SQLValue] = []) throws -> Int {
        let s = try statement(sql)
        _ = try s.rows(binds)
        return Int(sqlite3_changes(handle))
    }

    public func scalar(_ sql: String, _ binds: [SQLValue] = []) throws -> SQLValue {
        try query(sql, binds).first?.first ?? .null
    }

    /// Rows changed by the last INSERT/UPDATE/DELETE on this connection.
    public var changes: Int { Int(sqlite3_changes(handle)) }

    /// Runs `body` in a transaction (BEGIN IMMEDIATE takes the write lock up front, so a
    /// concurrent writer such as relayctl waits on busy_timeout instead of failing mid-way).
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    public var isAutocommit: Bool { sqlite3_get_autocommit(handle) != 0 }

    public static var libraryVersion: String { String(cString: sqlite3_libversion()) }
}

/// One prepared statement, finalized when its owner (the connection's cache) drops it.
public final class SQLiteStatement {
    private let stmt: OpaquePointer
    private unowned let db: SQLiteDatabase
    let sql: String
    /// Where the typed binders copy text and blobs so SQLite can take them with SQLITE_STATIC:
    /// SQLITE_TRANSIENT would malloc, copy and later free every value (seven binds per
    /// ingest). The bytes must not change until the statement has
    /// stepped, so the arena is only rewound after a step (stepOnce, reset); values that do not
    /// fit are bound TRANSIENT as before. Allocated on first use. sqlite3_reset keeps bindings,
    /// but the rewound arena is overwritten by the next binds, so `reset()` also clears the
    /// bindings of a statement that used the arena: a parameter not bound again reads NULL
    /// (a NOT NULL error in our tables), never another value's bytes.
    private var arena: UnsafeMutableRawPointer?
    private var arenaUsed = 0
    private static let arenaSize = 4096

    fileprivate init(stmt: OpaquePointer, db: SQLiteDatabase, sql: String) {
        self.stmt = stmt
        self.db = db
        self.sql = sql
    }

    deinit {
        sqlite3_finalize(stmt)  // first: the statement may still point into the arena
        arena?.deallocate()
    }

    private func bind(_ binds: [SQLValue]) throws {
        let expected = Int(sqlite3_bind_parameter_count(stmt))
        guard expected == binds.count else {
            throw StoreError.invalid("statement expects \(expected) parameters, got \(binds.count): \(sql.prefix(60))")
        }
        for (i, value) in binds.enumerated() {
            let index = Int32(i + 1)
            let rc: Int32
            switch value {
            case .null: rc = sqlite3_bind_null(stmt, index)
            case .integer(let v): rc = sqlite3_bind_int64(stmt, index, v)
            case .real(let v): rc = sqlite3_bind_double(stmt, index, v)
            case .text(let v):
                rc = v.withCString { sqlite3_bind_text(stmt, index, $0, -1, csqlite_transient()) }
            case .blob(let v):
                rc = v.withUnsafeBytes { buf in
                    // A zero-length blob needs a non-nil pointer or SQLite binds NULL.
                    sqlite3_bind_blob(stmt, index, buf.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buf.count), csqlite_transient())
                }
            }
            guard rc == SQLITE_OK else { throw db.error(rc, "bind \(index): \(sql.prefix(60))") }
        }
    }

    // Typed binding for the hot paths (ingest INSERT, outcome writes): no [SQLValue] array, no
    // [[SQLValue]] result. Use: bind every parameter, then stepOnce() (which resets). Bind every
    // parameter again before the next use: `reset()` clears the bindings of a statement that
    // bound text or blobs (see `arena`).

    func bind(_ index: Int32, _ v: Int64) throws {
        let rc = sqlite3_bind_int64(stmt, index, v)
        guard rc == SQLITE_OK else { throw db.error(rc, "bind \(index): \(sql.prefix(60))") }
    }

    func bind(_ index: Int32, _ v: String) throws {
        var v = v
        let rc = v.withUTF8 { buf in
            let bytes = UnsafeRawBufferPointer(buf)
            if let kept = keep(bytes) {
                return sqlite3_bind_text(stmt, index, kept.assumingMemoryBound(to: CChar.self), Int32(bytes.count), nil)  // nil = SQLITE_STATIC
            }
            // A zero-length string needs a non-nil pointer or SQLite binds NULL.
            return sqlite3_bind_text(stmt, index, bytes.baseAddress?.assumingMemoryBound(to: CChar.self) ?? UnsafePointer(bitPattern: 1),
                                     Int32(bytes.count), csqlite_transient())
        }
        guard rc == SQLITE_OK else { throw db.error(rc, "bind \(index): \(sql.prefix(60))") }
    }

    func bind(_ index: Int32, _ v: [UInt8]) throws {
        let rc = v.withUnsafeBytes { buf in
            if let kept = keep(buf) {
                return sqlite3_bind_blob(stmt, index, kept, Int32(buf.count), nil)  // nil = SQLITE_STATIC
            }
            return sqlite3_bind_blob(stmt, index, buf.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buf.count), csqlite_transient())
        }
        guard rc == SQLITE_OK else { throw db.error(rc, "bind \(index): \(sql.prefix(60))") }
    }

    /// A copy of `bytes` in the arena that stays valid until the next step's rewind, or nil
    /// when it does not fit (or is empty: SQLite needs a non-nil pointer, which the arena start
    /// would be, but the TRANSIENT path handles that case already).
    private func keep(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawPointer? {
        guard let base = bytes.baseAddress, bytes.count > 0, arenaUsed + bytes.count <= Self.arenaSize else { return nil }
        if arena == nil { arena = .allocate(byteCount: Self.arenaSize, alignment: 16) }
        let at = arena! + arenaUsed
        at.copyMemory(from: base, byteCount: bytes.count)
        arenaUsed += bytes.count
        return UnsafeRawPointer(at)
    }

    /// `v`, or NULL for nil.
    func bind(_ index: Int32, _ v: Int64?) throws {
        if let v { try bind(index, v) } else { try bindNull(index) }
    }

    /// `v`, or NULL for nil.
    func bind(_ index: Int32, _ v: String?) throws {
        if let v { try bind(index, v) } else { try bindNull(index) }
    }

    func bindNull(_ index: Int32) throws {
        let rc = sqlite3_bind_null(stmt, index)
        guard rc == SQLITE_OK else { throw db.error(rc, "bind \(index): \(sql.prefix(60))") }
    }

    /// One step: true = a row is available, false = done. A failure resets the statement.
    private func step() throws -> Bool {
        let rc = sqlite3_step(stmt)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        let e = db.error(rc, "step: \(sql.prefix(60))")
        sqlite3_reset(stmt)
        throw e
    }

    /// Runs a statement that returns no rows to completion, then resets it for reuse.
    func stepOnce() throws {
        defer { reset() }
        while try step() {}
    }

    // Typed reads for the hot paths, without a [[SQLValue]] per result:
    //   bind..., then `while try s.next() { s.int64(0) ... }`, then `s.reset()`.

    /// Steps to the next row: true = a row is available. A failure resets the statement.
    func next() throws -> Bool { try step() }

    /// Ends the current execution so the statement can run again. Bindings are kept, unless
    /// text or blobs were bound into the arena: then every binding is cleared (see `arena`).
    func reset() {
        sqlite3_reset(stmt)
        if arenaUsed > 0 {
            sqlite3_clear_bindings(stmt)
            arenaUsed = 0   // the step that used the arena's bytes is over
        }
    }

    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(stmt, column) }

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(stmt, column) == SQLITE_NULL }

    func text(_ column: Int32) -> String {
        guard let p = sqlite3_column_text(stmt, column) else { return "" }
        let n = Int(sqlite3_column_bytes(stmt, column))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }

    func blob(_ column: Int32) -> [UInt8] {
        let n = Int(sqlite3_column_bytes(stmt, column))
        guard n > 0, let p = sqlite3_column_blob(stmt, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }

    func rows(_ binds: [SQLValue]) throws -> [[SQLValue]] {
        defer {
            reset()
            sqlite3_clear_bindings(stmt)
        }
        try bind(binds)
        var out: [[SQLValue]] = []
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw db.error(rc, "step: \(sql.prefix(60))") }
            let n = sqlite3_column_count(stmt)
            var row: [SQLValue] = []
            row.reserveCapacity(Int(n))
            for c in 0..<n {
                switch sqlite3_column_type(stmt, c) {
                case SQLITE_INTEGER: row.append(.integer(sqlite3_column_int64(stmt, c)))
                case SQLITE_FLOAT: row.append(.real(sqlite3_column_double(stmt, c)))
                case SQLITE_TEXT:
                    if let p = sqlite3_column_text(stmt, c) {
                        row.append(.text(String(cString: p)))
                    } else { row.append(.text("")) }
                case SQLITE_BLOB:
                    let count = Int(sqlite3_column_bytes(stmt, c))
                    if count > 0, let p = sqlite3_column_blob(stmt, c) {
                        row.append(.blob(Array(UnsafeRawBufferPointer(start: p, count: count))))
                    } else { row.append(.blob([])) }
                default: row.append(.null)
                }
            }
            out.append(row)
        }
        return out
    }
}

extension SQLValue: StoreColumnValue {}

/// The current result row of a stepped statement, read column by column (no [SQLValue] per row).
extension SQLiteStatement: StoreColumns {
    var columnCount: Int { Int(sqlite3_column_count(stmt)) }
    func int(_ i: Int) -> Int64? { isNull(Int32(i)) ? nil : int64(Int32(i)) }
    func string(_ i: Int) -> String? { isNull(Int32(i)) ? nil : text(Int32(i)) }
    func bytes(_ i: Int) -> [UInt8]? { isNull(Int32(i)) ? nil : blob(Int32(i)) }
}
