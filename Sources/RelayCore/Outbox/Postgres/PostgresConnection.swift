// With PostgresConnInfo.swift, the only file in RelayCore that sees libpq's C API. `PostgresConnection` owns one `PGconn*`
// (PQfinish in deinit), `PostgresResult` owns one `PGresult*` (PQclear in deinit); every call's
// status is checked and turned into `StoreError.postgres` carrying libpq's own message and the
// server's SQLSTATE. Parameters and results travel in binary format, arrays (for set-based
// batch statements) included, so integers, bytea and array elements need no text parsing,
// quoting or hex on either side.
import FoundationEssentials
import Glibc
internal import CPQ

/// One libpq connection. Not thread-safe: exactly one store-owned thread uses it (see
/// PostgresWorker); it is never touched from an event loop or Swift's cooperative pool.
final class PostgresConnection {
    private let conn: OpaquePointer
    /// Prepared statement names by SQL text and parameter types, so each hot statement is
    /// parsed and planned once per connection.
    private var prepared: [String: String] = [:]

    /// `url` is a libpq URI or key=value string. Defaults below come first so the URL's own
    /// parameters override them (PQconnectStartParams with expand_dbname). Connecting gives up
    /// at `deadline` (monotonic ms) or after PostgresTimeouts.connectMillis, whichever comes
    /// first; the session settings (`timeouts.sessionSQL`) are set before it returns.
    init(url: String, applicationName: String, timeouts: PostgresTimeouts = PostgresTimeouts(), deadline: Int64? = nil) throws {
        let keys = ["connect_timeout", "application_name", "keepalives_idle", "keepalives_interval", "keepalives_count",
                    "tcp_user_timeout", "dbname"]
        let values = ["5", applicationName, "10", "5", "3", String(timeouts.tcpUserMillis), url]
        let conn: OpaquePointer? = withCStrings(keys) { k in
            withCStrings(values) { v in PQconnectStartParams(k, v, 1) }
        }
        guard let conn else { throw StoreError.unavailable("libpq could not allocate a connection") }
        let connectBy = min(deadline ?? .max, monotonicMillis() + PostgresTimeouts.connectMillis)
        if let problem = Self.connect(conn, until: connectBy) {
            // In case libpq ever quotes the password in its message.
            let message = PostgresConnInfo(url)?.scrub(problem) ?? problem
            PQfinish(conn)
            throw StoreError.unavailable("cannot connect to PostgreSQL: \(message)")
        }
        self.conn = conn
        cpq_silence_notices(conn)
        // Nothing blocks from here on: every wait is a poll() bounded by `deadline`.
        PQsetnonblocking(conn, 1)
        self.deadline = connectBy
        try execute(timeouts.sessionSQL)
        statementsSent = 0
        self.deadline = deadline
    }

    /// Drives PQconnectPoll until the connection is made (nil) or fails (libpq's message).
    private static func connect(_ conn: OpaquePointer, until: Int64) -> String? {
        guard PQstatus(conn) != CONNECTION_BAD else { return clean(PQerrorMessage(conn)) }
        var state = PGRES_POLLING_WRITING
        while true {
            switch state {
            case PGRES_POLLING_OK: return nil
            case PGRES_POLLING_FAILED: return clean(PQerrorMessage(conn))
            default:
                let events = Int16(state == PGRES_POLLING_READING ? POLLIN : POLLOUT)
                guard waitSocket(PQsocket(conn), events: events, until: until) != nil else {
                    return "no answer within \(PostgresTimeouts.connectMillis) ms or the call's deadline"
                }
            }
            state = PQconnectPoll(conn)
        }
    }

    /// poll() for `events` on `fd` until `until` (monotonic ms): the returned events, nil when
    /// the time ran out. A bad socket returns at once (libpq then reports the failure).
    private static func waitSocket(_ fd: Int32, events: Int16, until: Int64) -> Int16? {
        guard fd >= 0 else { return Int16(POLLERR) }
        while true {
            let left = until == .max ? -1 : until - monotonicMillis()
            guard until == .max || left > 0 else { return nil }
            var pfd = pollfd(fd: fd, events: events, revents: 0)
            let n = poll(&pfd, 1, Int32(clamping: left))
            if n > 0 { return pfd.revents }
            if n == 0 { continue }  // timed out: the loop's guard decides
            if errno != EINTR { return Int16(POLLERR) }
        }
    }

    deinit { PQfinish(conn) }

    /// Monotonic ms after which every wait of this connection gives up: the call fails with
    /// `StoreError.unavailable` and the connection is marked broken, so its owner closes it and
    /// reconnects instead of reusing a connection whose last statement is in an unknown state
    /// (it may yet commit: ingest answers 503 and the client's retry is answered by dedupe).
    /// nil: no deadline (migrations). Set by the owner before each job.
    var deadline: Int64?

    /// True when the last failure was a deadline.
    private(set) var timedOut = false

    /// Round trips (statements, or pipelines) since the owner last reset it (see
    /// PostgresLink.withConnection).
    var statementsSent = 0
    /// Run after the current transaction's COMMIT, dropped at its ROLLBACK
    /// (PostgresLink.transaction): for what a process may believe only once the
    /// transaction's writes are durable (e.g. "this webhook's cursor row exists").
    var afterCommit: [() -> Void] = []

    /// Set when a pipeline's answers stopped making sense: the connection's state is unknown.
    private var broken = false

    /// False once libpq noticed the server is gone (or a pipeline broke); the owner then drops
    /// this connection.
    var isOK: Bool { !broken && PQstatus(conn) == CONNECTION_OK }

    /// Not inside a transaction block (or the connection is unusable).
    var isIdle: Bool { PQtransactionStatus(conn) == PQTRANS_IDLE }

    var serverVersion: Int { Int(PQserverVersion(conn)) }

    /// False when the server closed this idle connection meanwhile (a restart,
    /// pg_terminate_backend, a failover, a pooler): its socket is readable with nothing asked.
    /// Reading lets libpq see it, so nothing is sent on a connection already seen closed (one
    /// that dies in the instant after this check fails its first statement instead).
    func stillAlive() -> Bool {
        guard isOK, isIdle else { return isOK }
        for _ in 0..<2 {
            var pfd = pollfd(fd: PQsocket(conn), events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 0) > 0 else { return isOK }
            if PQconsumeInput(conn) != 1 {
                broken = true
                return false
            }
            // A notification or parameter status (harmless), or an error before the close.
            while PQisBusy(conn) == 0, let r = PQgetResult(conn) { PQclear(r) }
        }
        return isOK
    }

    /// Waits for the socket until the deadline; past it the connection is abandoned.
    private func waitFor(_ events: Int16, _ context: @autoclosure () -> String) throws -> Int16 {
        guard let revents = Self.waitSocket(PQsocket(conn), events: events, until: deadline ?? .max) else {
            broken = true
            timedOut = true
            throw StoreError.unavailable("PostgreSQL did not answer in time (\(context())); connection abandoned")
        }
        return revents
    }

    /// Sends what libpq has buffered (nonblocking mode), within the deadline.
    private func flush(_ context: @autoclosure () -> String) throws {
        while true {
            let r = PQflush(conn)
            if r == 0 { return }
            guard r > 0 else {
                broken = true
                throw failure(nil, context())
            }
            // libpq: when read-ready, consume input first (the server may wait for us to read).
            let revents = try waitFor(Int16(POLLIN | POLLOUT), context())
            if revents & Int16(POLLIN) != 0, PQconsumeInput(conn) != 1 {
                broken = true
                throw failure(nil, context())
            }
        }
    }

    /// The next result of what was sent (nil: none left), reading within the deadline.
    private func nextResult(_ context: @autoclosure () -> String) throws -> OpaquePointer? {
        while PQisBusy(conn) == 1 {
            _ = try waitFor(Int16(POLLIN), context())
            guard PQconsumeInput(conn) == 1 else {
                broken = true
                throw StoreError.unavailable("PostgreSQL connection lost: \(Self.clean(PQerrorMessage(conn)))")
            }
        }
        return PQgetResult(conn)
    }

    /// Sends nothing more and reads every result of one command: the first failure is thrown
    /// (after reading on to the end, so the connection stays in step), else the last result.
    private func finish(_ context: @autoclosure () -> String) throws -> PostgresResult {
        var last: PostgresResult?
        var firstError: StoreError?
        while let handle = try nextResult(context()) {
            let result = PostgresResult(handle)
            switch PQresultStatus(handle) {
            case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY: break
            default: if firstError == nil { firstError = failure(handle, context()) }
            }
            last = result
        }
        if let firstError { throw firstError }
        guard let last else { throw failure(nil, context()) }
        return last
    }

    static func clean(_ p: UnsafePointer<CChar>?) -> String {
        guard let p else { return "unknown libpq error" }
        return ASCII.trimLines(String(cString: p))
    }

    private func failure(_ result: OpaquePointer?, _ context: String) -> StoreError {
        if let result {
            let state = PQresultErrorField(result, cpq_diag_sqlstate()).map { String(cString: $0) } ?? ""
            let message = Self.clean(PQresultErrorMessage(result))
            if !state.isEmpty { return .postgres(sqlState: state, message: message, context: context) }
            if !isOK { return .unavailable("PostgreSQL connection lost: \(message.isEmpty ? Self.clean(PQerrorMessage(conn)) : message)") }
            return .postgres(sqlState: "", message: message.isEmpty ? Self.clean(PQerrorMessage(conn)) : message, context: context)
        }
        let message = Self.clean(PQerrorMessage(conn))
        if !isOK { return .unavailable("PostgreSQL connection lost: \(message)") }
        return .postgres(sqlState: "", message: message, context: context)
    }

    /// Runs one or more statements without parameters (simple query protocol): DDL, BEGIN/COMMIT.
    func execute(_ sql: String) throws {
        statementsSent += 1
        timedOut = false
        guard PQsendQuery(conn, sql) == 1 else { throw failure(nil, Self.context(sql)) }
        try flush(Self.context(sql))
        _ = try finish(Self.context(sql))
    }

    /// Runs one statement with parameters through a cached prepared statement; returns its rows.
    @discardableResult
    func query(_ sql: String, _ params: [PGValue] = []) throws -> [PGRow] {
        try run(sql, params).rows
    }

    /// Like `query`, also returning the affected-row count (UPDATE/DELETE/INSERT).
    func run(_ sql: String, _ params: [PGValue] = []) throws -> (rows: [PGRow], affected: Int) {
        statementsSent += 1
        timedOut = false
        let encoded = params.map(Self.encode)
        let (key, types) = Self.preparedKey(sql, encoded)
        let name: String
        if let n = prepared[key] {
            name = n
        } else {
            let n = "relay_\(prepared.count)"
            guard types.withUnsafeBufferPointer({ PQsendPrepare(conn, n, sql, Int32(types.count), $0.baseAddress) }) == 1 else {
                throw failure(nil, "prepare " + Self.context(sql))
            }
            try flush("prepare " + Self.context(sql))
            _ = try finish("prepare " + Self.context(sql))
            prepared[key] = n
            name = n
        }
        let sent = withParameters(encoded) { values, lengths, formats in
            PQsendQueryPrepared(conn, name, Int32(encoded.count), values, lengths, formats, 1)
        }
        guard sent == 1 else { throw failure(nil, Self.context(sql)) }
        try flush(Self.context(sql))
        let result = try finish(Self.context(sql))
        return (try result.rows(context: Self.context(sql)), result.affected)
    }

    private static func preparedKey(_ sql: String, _ encoded: [Encoded]) -> (key: String, types: [Oid]) {
        let types = encoded.map(\.type)
        return (sql + "\u{0}" + types.map(String.init).joined(separator: ","), types)
    }

    /// Sends every statement and then one Sync in a single write (libpq pipeline mode) and reads
    /// every answer: one round trip however many statements. Outside BEGIN ... COMMIT the
    /// statements form one implicit transaction that commits at the Sync, durably with
    /// synchronous_commit on; if one fails, the rest are skipped and nothing of them stays. So a
    /// returned value means committed; a throw means nothing committed, or, with the connection
    /// lost before the Sync's answer, that the outcome is unknown (`StoreError.unavailable`).
    func pipeline(_ statements: [(sql: String, params: [PGValue])]) throws -> [(rows: [PGRow], affected: Int)] {
        statementsSent += 1  // one round trip: a dead idle connection fails it before anything ran
        timedOut = false
        guard PQenterPipelineMode(conn) == 1 else { throw failure(nil, "enter pipeline mode") }
        defer {
            // Fails only with answers still unread: the connection is then unusable.
            if PQexitPipelineMode(conn) != 1 { broken = true }
        }
        enum Answer { case prepare(key: String, name: String), statement(index: Int) }
        var answers: [Answer] = []
        var preparing: [String: String] = [:]
        for (i, st) in statements.enumerated() {
            let encoded = st.params.map(Self.encode)
            let (key, types) = Self.preparedKey(st.sql, encoded)
            var name = prepared[key] ?? preparing[key]
            if name == nil {
                let n = "relay_\(prepared.count + preparing.count)"
                guard types.withUnsafeBufferPointer({ PQsendPrepare(conn, n, st.sql, Int32(types.count), $0.baseAddress) }) == 1 else {
                    broken = true
                    throw failure(nil, "prepare " + Self.context(st.sql))
                }
                preparing[key] = n
                answers.append(.prepare(key: key, name: n))
                name = n
            }
            let sent = withParameters(encoded) { values, lengths, formats in
                PQsendQueryPrepared(conn, name, Int32(encoded.count), values, lengths, formats, 1)
            }
            guard sent == 1 else {
                broken = true
                throw failure(nil, Self.context(st.sql))
            }
            answers.append(.statement(index: i))
        }
        guard PQpipelineSync(conn) == 1 else {
            broken = true
            throw failure(nil, "pipeline sync")
        }
        try flush("pipeline")
        var out = [(rows: [PGRow], affected: Int)](repeating: ([], 0), count: statements.count)
        var firstError: StoreError?
        for answer in answers {
            let context: () -> String = {
                switch answer {
                case .prepare(let key, _): return "prepare " + Self.context(String(key.prefix { $0 != "\u{0}" }))
                case .statement(let i): return Self.context(statements[i].sql)
                }
            }
            guard let handle = try nextResult(context()) else { throw lostInPipeline(firstError) }
            let result = PostgresResult(handle)
            switch PQresultStatus(handle) {
            case PGRES_COMMAND_OK, PGRES_TUPLES_OK:
                switch answer {
                case .prepare(let key, let name): prepared[key] = name
                case .statement(let i): if firstError == nil { out[i] = (try result.rows(context: context()), result.affected) }
                }
            case PGRES_PIPELINE_ABORTED:
                if firstError == nil { firstError = .postgres(sqlState: "", message: "pipeline aborted", context: context()) }
            default:
                if firstError == nil { firstError = failure(handle, context()) }
            }
            // Each statement's answers end with a NULL.
            if let extra = try nextResult(context()) {
                PQclear(extra)
                // libpq adds one when the server ended the connection (e.g. terminated it).
                if PQstatus(conn) != CONNECTION_OK { throw lostInPipeline(nil) }
                broken = true
                throw StoreError.unavailable("PostgreSQL pipeline out of step after \(context())")
            }
        }
        guard let sync = try nextResult("pipeline sync") else { throw lostInPipeline(firstError) }
        let syncStatus = PQresultStatus(sync)
        guard syncStatus == PGRES_PIPELINE_SYNC else {
            // An error raised by the implicit COMMIT itself: not committed. The connection's
            // place in the protocol is then unclear, so it is replaced.
            let error = syncStatus == PGRES_FATAL_ERROR ? failure(sync, "commit") : nil
            PQclear(sync)
            broken = true
            throw error ?? StoreError.unavailable("PostgreSQL pipeline out of step at its Sync")
        }
        PQclear(sync)
        if let firstError { throw firstError }
        return out
    }

    /// The connection ended before the pipeline's Sync answered: whether it committed is unknown.
    private func lostInPipeline(_ earlier: StoreError?) -> StoreError {
        broken = true
        if let earlier, case .unavailable = earlier { return earlier }
        return .unavailable("PostgreSQL connection lost before the commit was confirmed: \(Self.clean(PQerrorMessage(conn)))")
    }

    /// The start of a statement, on one line, for error messages (built only when one is thrown).
    static func context(_ sql: String) -> String { String(ASCII.trimLines(sql).prefix(60)) }

    // MARK: parameter encoding (binary, network byte order)

    struct Encoded {
        var type: Oid
        var bytes: [UInt8]?
    }

    static func encode(_ v: PGValue) -> Encoded {
        switch v {
        case .null: return Encoded(type: 0, bytes: nil)
        case .int(let i): return Encoded(type: 20, bytes: withUnsafeBytes(of: i.bigEndian) { Array($0) })
        case .text(let s): return Encoded(type: 25, bytes: Array(s.utf8))
        case .bytes(let b): return Encoded(type: 17, bytes: b)
        case .bool(let b): return Encoded(type: 16, bytes: [b ? 1 : 0])
        case .textArray(let a):
            return Encoded(type: 1009, bytes: binaryArray(a, elementType: 25, size: { $0?.utf8.count }) { s, out in out.append(contentsOf: s!.utf8) })
        case .intArray(let a):
            return Encoded(type: 1016, bytes: binaryArray(a, elementType: 20, size: { $0 == nil ? nil : 8 }) { i, out in append(i!, to: &out) })
        case .bytesArray(let a):
            return Encoded(type: 1001, bytes: binaryArray(a, elementType: 17, size: { $0.count }) { b, out in out.append(contentsOf: b) })
        }
    }

    /// A one-dimensional array in array_recv's binary form: ndim, has-null flag, element type,
    /// (length, lower bound 1), then each element as its byte length (-1: NULL) and its binary
    /// form. An empty array has ndim 0 and no dimension.
    static func binaryArray<E>(_ elements: [E], elementType: Oid, size: (E) -> Int?, write: (E, inout [UInt8]) -> Void) -> [UInt8] {
        var out: [UInt8] = []
        var total = 20
        var hasNull = false
        for e in elements {
            if let n = size(e) { total += 4 + n } else { total += 4; hasNull = true }
        }
        out.reserveCapacity(total)
        append(Int32(elements.isEmpty ? 0 : 1), to: &out)
        append(Int32(hasNull ? 1 : 0), to: &out)
        append(Int32(bitPattern: elementType), to: &out)
        guard !elements.isEmpty else { return out }
        append(Int32(elements.count), to: &out)
        append(Int32(1), to: &out)
        for e in elements {
            guard let n = size(e) else { append(Int32(-1), to: &out); continue }
            append(Int32(n), to: &out)
            write(e, &out)
        }
        return out
    }

    private static func append<I: FixedWidthInteger>(_ v: I, to out: inout [UInt8]) {
        withUnsafeBytes(of: v.bigEndian) { out.append(contentsOf: $0) }
    }

    /// Hands libpq C arrays of value pointers, lengths and formats that stay valid for the call.
    private func withParameters<R>(_ params: [Encoded], _ body: (UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) -> R) -> R {
        // Every value is binary (read by length); the NUL terminator costs nothing and keeps a
        // zero-length value's pointer non-NULL (NULL means SQL NULL).
        let buffers: [UnsafeMutablePointer<CChar>?] = params.map { p in
            guard let bytes = p.bytes else { return nil }
            let buf = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
            bytes.withUnsafeBufferPointer { src in
                src.withMemoryRebound(to: CChar.self) { s in
                    if let base = s.baseAddress { buf.initialize(from: base, count: bytes.count) }
                }
            }
            buf[bytes.count] = 0
            return buf
        }
        defer { for b in buffers { b?.deallocate() } }
        let values: [UnsafePointer<CChar>?] = buffers.map { $0.map { UnsafePointer($0) } }
        let lengths: [Int32] = params.map { Int32($0.bytes?.count ?? 0) }
        let formats = [Int32](repeating: 1, count: params.count)
        return values.withUnsafeBufferPointer { v in
            lengths.withUnsafeBufferPointer { l in
                formats.withUnsafeBufferPointer { f in body(v.baseAddress, l.baseAddress, f.baseAddress) }
            }
        }
    }
}

/// Owns one PGresult.
private final class PostgresResult {
    let handle: OpaquePointer?
    init(_ handle: OpaquePointer?) { self.handle = handle }
    deinit { if let handle { PQclear(handle) } }

    var affected: Int {
        guard let handle, let p = PQcmdTuples(handle) else { return 0 }
        return Int(String(cString: p)) ?? 0
    }

    /// Decodes binary-format columns by their type OID.
    func rows(context: @autoclosure () -> String) throws -> [PGRow] {
        guard let handle, PQresultStatus(handle) == PGRES_TUPLES_OK else { return [] }
        let n = PQntuples(handle), m = PQnfields(handle)
        var out: [PGRow] = []
        out.reserveCapacity(Int(n))
        for r in 0..<n {
            var row: PGRow = []
            row.reserveCapacity(Int(m))
            for c in 0..<m {
                if PQgetisnull(handle, r, c) == 1 {
                    row.append(.null)
                    continue
                }
                let len = Int(PQgetlength(handle, r, c))
                guard let raw = PQgetvalue(handle, r, c) else { row.append(.null); continue }
                let bytes = UnsafeRawBufferPointer(start: raw, count: len)
                switch PQftype(handle, c) {
                case 20, 23, 21:  // int8, int4, int2 (big-endian)
                    var v: Int64 = 0
                    for b in bytes { v = (v << 8) | Int64(b) }
                    if len < 8, len > 0, bytes[0] & 0x80 != 0 { v -= Int64(1) << (len * 8) }  // sign-extend
                    row.append(.int(v))
                case 16: row.append(.bool(len == 1 && bytes[0] != 0))
                case 17: row.append(.bytes(Array(bytes)))
                case 25, 1043, 19, 705: row.append(.text(String(decoding: bytes, as: UTF8.self)))
                case 2278: row.append(.null)  // void (e.g. SELECT pg_advisory_lock(...))
                default:
                    throw StoreError.postgres(sqlState: "", message: "column \(c) has unsupported type oid \(PQftype(handle, c))", context: context())
                }
            }
            out.append(row)
        }
        return out
    }
}

/// Turns Swift strings into a NULL-free array of C strings valid for the duration of `body`.
private func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
    let dup: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    defer { for p in dup { free(p) } }
    var ptrs: [UnsafePointer<CChar>?] = dup.map { $0.map { UnsafePointer($0) } }
    ptrs.append(nil)
    return ptrs.withUnsafeBufferPointer { body($0.baseAddress!) }
}
