// Runs the store contract tests against both backends. PostgreSQL comes from RELAY_TEST_PG_URL
// (`make test` starts a throwaway cluster with scripts/pg-test.sh and sets it); without it the
// PostgreSQL cases are skipped and `postgresTestsAreConfigured` says why.
import Foundation
import Ratchet
import Testing
import TestSupport
@testable import RelayCore

enum PGTest {
    static let url: String? = {
        let v = ProcessInfo.processInfo.environment["RELAY_TEST_PG_URL"] ?? ""
        return v.isEmpty ? nil : v
    }()
    static let skipMessage = "RELAY_TEST_PG_URL is not set: PostgreSQL store tests skipped (make test starts a cluster with scripts/pg-test.sh; or run: scripts/pg-test.sh run -- swift test)"

    /// `url` with every connection's search_path set to `schema`, and the schema as
    /// application_name so a test can find (and kill) exactly its own connections.
    static func url(schema: String) -> String {
        let base = url ?? ""
        return base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)&application_name=\(schema)"
    }

    /// An admin connection for fixtures (tests may block their own thread).
    static func admin() throws -> PostgresConnection {
        try PostgresConnection(url: url ?? "", applicationName: "relay-test-admin")
    }
}

enum StoreBackend: String, Sendable, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
    /// SQLite always; PostgreSQL when a test server is configured.
    static var available: [StoreBackend] { PGTest.url == nil ? [.sqlite] : [.sqlite, .postgres] }
}

/// One isolated database for one test: a temp SQLite file, or a fresh PostgreSQL schema that
/// is dropped when the fixture dies. Every store it opens shares the fixture's clock.
final class StoreFixture: @unchecked Sendable {
    // @unchecked Sendable: every stored property is a `let` set in init; the clock is itself
    // Sendable and the temp dir is only read (its path) until deinit.
    let backend: StoreBackend
    let clock = TestClock()
    let dir = TempDir()
    let schema: String
    /// The lease owner used by `open()`: reopening is "the same node restarting".
    let nodeID = "node-a"

    init(_ backend: StoreBackend) throws {
        self.backend = backend
        schema = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        if backend == .postgres {
            try PGTest.admin().execute("CREATE SCHEMA \(schema)")
        }
    }

    deinit {
        if backend == .postgres { try? PGTest.admin().execute("DROP SCHEMA IF EXISTS \(schema) CASCADE") }
    }

    var pgURL: String { PGTest.url(schema: schema) }

    /// The contract tests move the clock by up to a minute; a one-hour lease keeps PostgreSQL's
    /// lease expiry (which SQLite does not have) out of them. PostgresStoreTests test expiry.
    func open(readOnly: Bool = false, nodeID: String? = nil, leaseMillis: Int64 = 3_600_000) throws -> any OutboxStore {
        switch backend {
        case .sqlite:
            return try SQLiteOutboxStore(path: dir.db, options: SQLiteStoreOptions(readOnly: readOnly), clock: clock)
        case .postgres:
            return try PostgresOutboxStore(
                options: PostgresStoreOptions(url: pgURL, nodeID: nodeID ?? self.nodeID, leaseMillis: leaseMillis, readOnly: readOnly),
                clock: clock, databaseClock: clock)
        }
    }

    /// The fixture's clock is the database's (tests move it); `skewMillis` sets this node's
    /// clock that far ahead of it.
    func openPostgres(nodeID: String, leaseMillis: Int64 = 60_000, ingestConnections: Int = 2, observer: (any OutboxCommitObserver)? = nil,
                      skewMillis: Int64 = 0, maxClockOffsetMillis: Int64 = 10_000) throws -> PostgresOutboxStore {
        let s = try PostgresOutboxStore(options: PostgresStoreOptions(url: pgURL, nodeID: nodeID, leaseMillis: leaseMillis, ingestConnections: ingestConnections,
                                                                      maxClockOffsetMillis: maxClockOffsetMillis),
                                        clock: skewMillis == 0 ? clock : SkewedClock(base: clock, skewMillis: skewMillis), databaseClock: clock)
        if let observer { s.addCommitObserver(observer) }
        return s
    }

    /// Runs SQL directly against this fixture's database (checks that bypass the store).
    func sql(_ query: String) throws -> [[String?]] {
        switch backend {
        case .sqlite:
            let db = try SQLiteDatabase(path: dir.db)
            return try db.query(query).map { $0.map { v in v.string ?? v.int.map(String.init) ?? v.bytes.map { $0.hexString } } }
        case .postgres:
            let c = try PostgresConnection(url: pgURL, applicationName: "relay-test-admin")
            return try c.query(query).map {
                $0.map { v in v.string ?? v.int.map(String.init) ?? v.bytes.map { $0.hexString } ?? v.bool.map { $0 ? "t" : "f" } }
            }
        }
    }

    var schemaVersion: Int {
        get throws {
            switch backend {
            case .sqlite: return Int(try SQLiteDatabase(path: dir.db, readOnly: true).scalar("PRAGMA user_version").int ?? -1)
            case .postgres: return Int((try sql("SELECT max(version) FROM relay_schema_version").first?.first ?? nil) ?? "") ?? -1
            }
        }
    }

    func setSchemaVersion(_ v: Int) throws {
        switch backend {
        case .sqlite: try SQLiteDatabase(path: dir.db).execute("PRAGMA user_version = \(v)")
        case .postgres: _ = try sql("UPDATE relay_schema_version SET version = \(v)")
        }
    }

    /// Column names of one table.
    func columns(_ table: String) throws -> Set<String> {
        switch backend {
        case .sqlite: return Set(try sql("SELECT name FROM pragma_table_info('\(table)')").compactMap { $0[0] })
        case .postgres:
            return Set(try sql("SELECT column_name::text FROM information_schema.columns WHERE table_schema = '\(schema)' AND table_name = '\(table)'").compactMap { $0[0] })
        }
    }

    var tables: [String] {
        get throws {
            switch backend {
            case .sqlite: return try sql("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").compactMap { $0[0] }
            case .postgres:
                return try sql("SELECT tablename::text FROM pg_tables WHERE schemaname = '\(schema)' ORDER BY tablename").compactMap { $0[0] }
            }
        }
    }
}

/// A node clock `skewMillis` ahead of `base` (behind when negative).
struct SkewedClock: RelayClock {
    let base: any RelayClock
    let skewMillis: Int64
    func nowMillis() -> Int64 { base.nowMillis() + skewMillis }
}

/// A loopback TCP proxy in front of the test PostgreSQL that a test can cut (every connection
/// closed, new ones closed on accept) and restore: a database outage that touches no other test.
final class OutageProxy: @unchecked Sendable {
    // @unchecked Sendable: `sockets`, `halfDone`, `down`, `stalled`, `held` and `stopped` are
    // only touched under `lock`; the listener closes itself once its accept thread is gone.
    private let listener: LoopbackListener
    private let targetPort: UInt16
    private let lock = NSLock()
    private var sockets: Set<Int32> = []
    private var down = false
    private var stopped = false
    var port: Int { listener.port }

    init(targetPort: Int) throws {
        self.targetPort = UInt16(targetPort)
        do { listener = try LoopbackListener(backlog: 64) } catch { throw StoreError.invalid("proxy listen failed: \(error)") }
        listener.acceptInBackground { [self] client in self.accepted(client) }
    }

    static func loopback(_ port: UInt16) -> sockaddr_in {
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        a.sin_port = port.bigEndian
        return a
    }

    /// The test URL's port replaced by the proxy's.
    func url(for url: String, targetPort: Int) -> String {
        url.replacingOccurrences(of: ":\(targetPort)/", with: ":\(port)/")
    }

    func cut() {
        lock.lock()
        down = true
        for s in sockets { shutdown(s, Int32(SHUT_RDWR)) }
        lock.unlock()
    }

    func restore() {
        lock.lock()
        down = false
        lock.unlock()
    }

    private var stalled = false
    private var held: [Int32] = []

    /// A blackhole: connections stay open and new ones are accepted, but no byte goes through
    /// either way until `unstall()` (a frozen server, a failover with no answer).
    func stall() {
        lock.lock()
        stalled = true
        lock.unlock()
    }

    func unstall() {
        lock.lock()
        stalled = false
        for c in held { close(c) }
        held = []
        lock.unlock()
    }

    private var isStalled: Bool {
        lock.lock()
        defer { lock.unlock() }
        return stalled
    }

    /// Cuts every connection and stops accepting (the accept thread is gone when it returns).
    func stop() {
        lock.lock()
        stopped = true
        lock.unlock()
        cut()
        listener.close()
        lock.lock()
        for c in held { close(c) }
        held = []
        lock.unlock()
    }

    private func accepted(_ client: Int32) {
        lock.lock()
        let refuse = down || stopped
        let hold = stalled && !stopped
        if hold { held.append(client) }
        lock.unlock()
        if hold { return }
        if refuse { close(client); return }
        let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = Self.loopback(targetPort)
        let connected = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else { close(client); close(server); return }
        lock.lock()
        sockets.insert(client)
        sockets.insert(server)
        lock.unlock()
        Thread.detachNewThread { [self] in self.pump(from: client, to: server, pair: client) }
        Thread.detachNewThread { [self] in self.pump(from: server, to: client, pair: client) }
    }

    private var halfDone: Set<Int32> = []

    private func pump(from: Int32, to: Int32, pair: Int32) {
        var buf = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = buf.withUnsafeMutableBytes { read(from, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            while isStalled { usleep(10_000) }
            var off = 0
            while off < n {
                // MSG_NOSIGNAL: a peer that went away must not SIGPIPE the test process.
                let w = buf.withUnsafeBytes { send(to, $0.baseAddress! + off, n - off, Int32(MSG_NOSIGNAL)) }
                if w <= 0 { break }
                off += w
            }
            if off < n { break }
        }
        shutdown(from, Int32(SHUT_RDWR))
        shutdown(to, Int32(SHUT_RDWR))
        lock.lock()
        // The first pump of a pair to finish forgets the sockets; the second closes them.
        if halfDone.remove(pair) != nil {
            close(from)
            close(to)
        } else {
            halfDone.insert(pair)
            sockets.remove(from)
            sockets.remove(to)
        }
        lock.unlock()
    }
}
