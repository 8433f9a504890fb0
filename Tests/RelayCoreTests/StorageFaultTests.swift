import CSQLiteFault
import Foundation
import Testing
import TestSupport
@testable import RelayCore

/// Writes to chosen files fail, come up short or are interrupted, the way a full or failing disk
/// makes them (Tests/CSQLiteFault: the unix VFS's pwrite64/write are wrapped). Armed while the
/// value lives; disarmed on `disarm()` or deinit.
final class FaultRule {
    let handle: Int32
    private var armed = true
    /// `prefix`: files whose absolute path starts with it (a database path covers its -wal too).
    init(_ prefix: String, _ rule: csqlitefault_rule) throws {
        #expect(csqlitefault_install() == 0, "fault hooks installed in the unix VFS")
        handle = csqlitefault_arm(prefix, rule)
        guard handle >= 0 else {
            armed = false
            throw StoreError.invalid("no free fault slot")
        }
    }
    func update(_ rule: csqlitefault_rule) { csqlitefault_update(handle, rule) }
    var counts: csqlitefault_counts {
        var c = csqlitefault_counts()
        csqlitefault_counts_get(handle, &c)
        return c
    }
    /// Once only: a disarmed slot may already serve another test running in parallel.
    func disarm() {
        guard armed else { return }
        armed = false
        csqlitefault_disarm(handle)
    }
    deinit { disarm() }

    static func rule(budget: Int64 = -1, failAfter: Int64 = 0, errno: Int32 = 0, times: Int32 = 0,
                     shortMax: Int32 = 0, eintrEvery: Int32 = 0, exact: Bool = false, blockAfter: Int64 = -1) -> csqlitefault_rule {
        csqlitefault_rule(budget: budget, fail_after: failAfter, fail_errno: errno, fail_times: times,
                          short_max: shortMax, eintr_every: eintrEvery, exact: exact ? 1 : 0, block_after: blockAfter)
    }
}

/// How a write fails in a test.
enum WriteFault: String, CaseIterable, CustomTestStringConvertible {
    /// The disk fills during the COMMIT: the first frames are written, one only partly, then ENOSPC.
    case enospcAfterPartialWrite
    /// One write comes up short, the next one fails EIO.
    case eioAfterPartialWrite
    case eio, edquot, efbig

    var testDescription: String { rawValue }

    var rule: csqlitefault_rule {
        switch self {
        case .enospcAfterPartialWrite: FaultRule.rule(budget: 6000)
        case .eioAfterPartialWrite: FaultRule.rule(failAfter: 1, errno: EIO, times: 1, shortMax: 3000)
        case .eio: FaultRule.rule(errno: EIO, times: 1)
        case .edquot: FaultRule.rule(errno: EDQUOT, times: 1)
        case .efbig: FaultRule.rule(errno: EFBIG, times: 1)
        }
    }
}

/// The failure path of the SQLite store as strict as SQLite's own fault tests: a COMMIT that
/// failed is never visible later (not after a crash, not to the next transaction), another
/// connection's commits are never overwritten, a disk-full episode with a second writer ends
/// with an intact database holding every acknowledged row and nothing else, and short writes
/// and EINTR change nothing. "Another connection" stands for another process (relayctl,
/// sqlite3): SQLite's WAL locking treats both alike.
@Suite struct StorageFaultTests {
    /// The temp dir under its kernel name (what /proc/self/fd shows, which the rules match).
    static func canonical(_ dir: TempDir) -> String {
        URL(fileURLWithPath: dir.path).resolvingSymlinksInPath().path
    }

    /// A writer connection set up as the store's writer sets up its own.
    static func openWriter(_ path: String) throws -> SQLiteDatabase {
        let db = try SQLiteDatabase(path: path)
        try db.execute("PRAGMA synchronous=FULL")
        try db.execute("PRAGMA journal_mode=WAL")
        return db
    }

    static func payload(_ k: Int, tag: UInt8 = 0, size: Int = 300) -> [UInt8] {
        var bytes = withUnsafeBytes(of: UInt64(k).littleEndian) { Array($0) }
        bytes += [UInt8](repeating: UInt8(truncatingIfNeeded: k &* 31 &+ 7) ^ tag, count: size - 8)
        return bytes
    }

    static func insert(_ db: SQLiteDatabase, _ keys: some Sequence<Int>, tag: UInt8 = 0) throws {
        for k in keys { try db.run("INSERT INTO t (k, v) VALUES (?, ?)", [.integer(Int64(k)), .blob(payload(k, tag: tag))]) }
    }

    /// The table holds exactly `expected` (key -> tag), each row with its own bytes.
    static func expectContent(_ db: SQLiteDatabase, _ expected: [Int: UInt8], _ comment: Comment,
                              sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(try db.scalar("PRAGMA integrity_check").string == "ok", comment, sourceLocation: sourceLocation)
        var seen: [Int: [UInt8]] = [:]
        for row in try db.query("SELECT k, v FROM t") { seen[Int(row[0].int ?? -1)] = row[1].bytes ?? [] }
        let missing = expected.keys.filter { seen[$0] == nil }.sorted()
        let extra = seen.keys.filter { expected[$0] == nil }.sorted()
        let wrong = expected.filter { k, tag in seen[k].map { $0 != payload(k, tag: tag) } ?? false }.keys.sorted()
        #expect(missing.isEmpty, "\(comment): acknowledged rows missing \(missing.prefix(10))", sourceLocation: sourceLocation)
        #expect(extra.isEmpty, "\(comment): rows of failed transactions present \(extra.prefix(10))", sourceLocation: sourceLocation)
        #expect(wrong.isEmpty, "\(comment): rows with other bytes than committed \(wrong.prefix(10))", sourceLocation: sourceLocation)
    }

    /// What a kill -9 leaves at this moment: the database and WAL files as written so far (no
    /// close, no checkpoint; the page cache survives a process kill), copied aside and opened
    /// by a fresh connection, which recovers the WAL as after a crash.
    static func crashCopy(_ dir: String, _ name: String = "relay.db") throws -> String {
        let to = dir + "/crash-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: to, withIntermediateDirectories: true)
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: dir + "/" + name + suffix) {
            try FileManager.default.copyItem(atPath: dir + "/" + name + suffix, toPath: to + "/" + name + suffix)
        }
        return to + "/" + name
    }

    /// A base of committed rows 0..<40 (several transactions).
    static func base(_ db: SQLiteDatabase, into expected: inout [Int: UInt8]) throws {
        try db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        for i in 0..<4 { try db.transaction { try insert(db, i * 10 ..< (i + 1) * 10) } }
        for k in 0..<40 { expected[k] = 0 }
    }

    @Test(arguments: WriteFault.allCases)
    func aFailedCommitIsAbsentAfterACrashAndReopen(_ fault: WriteFault) throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = Self.canonical(tmp)
        let db = try Self.openWriter(dir + "/relay.db")
        var expected: [Int: UInt8] = [:]
        try Self.base(db, into: &expected)
        let rule = try FaultRule(dir + "/relay.db-wal", fault.rule)
        // 40 rows of 300 bytes: several WAL frames, so the fault lands inside the transaction.
        #expect(throws: StoreError.self) { try db.transaction { try Self.insert(db, 100..<140) } }
        #expect(rule.counts.failed >= 1, "the fault was hit")
        #expect(db.isAutocommit)
        rule.disarm()
        // The relay goes on: its next batch begins (and takes the write lock), then it is killed.
        try db.execute("BEGIN IMMEDIATE")
        try Self.insert(db, [200])
        let crashed = try SQLiteDatabase(path: try Self.crashCopy(dir))
        try Self.expectContent(crashed, expected, "after the crash")
        try db.execute("ROLLBACK")
        // And had it lived: the next COMMIT holds only its own rows.
        try db.transaction { try Self.insert(db, [300]) }
        expected[300] = 0
        try Self.expectContent(db, expected, "writer, next commit")
        let crashedLater = try SQLiteDatabase(path: try Self.crashCopy(dir))
        try Self.expectContent(crashedLater, expected, "after a crash following the next commit")
    }

    enum Interruption: String, CaseIterable, CustomTestStringConvertible {
        case failedCommitENOSPC, failedCommitEIO, rolledBackSpilledTransaction
        var testDescription: String { rawValue }
    }

    @Test(arguments: Interruption.allCases)
    func anotherWritersCommitSurvivesTheWritersFailedOrRolledBackTransaction(_ how: Interruption) throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = Self.canonical(tmp)
        let path = dir + "/relay.db"
        let db = try Self.openWriter(path)
        var expected: [Int: UInt8] = [:]
        try Self.base(db, into: &expected)
        switch how {
        case .failedCommitENOSPC, .failedCommitEIO:
            let rule = try FaultRule(path + "-wal", how == .failedCommitEIO ? WriteFault.eio.rule : WriteFault.enospcAfterPartialWrite.rule)
            #expect(throws: StoreError.self) { try db.transaction { try Self.insert(db, 100..<140, tag: 1) } }
            #expect(rule.counts.failed >= 1)
        case .rolledBackSpilledTransaction:
            // A page cache of 8 pages: the transaction's frames spill into the WAL before COMMIT.
            try db.execute("PRAGMA cache_size=8")
            try db.execute("BEGIN IMMEDIATE")
            try Self.insert(db, 100..<400, tag: 1)
            try db.execute("UPDATE t SET v = zeroblob(300) WHERE k < 40")
            try db.execute("ROLLBACK")
        }
        // Another process commits in between: other keys, and rewrites of the base rows' pages.
        let other = try SQLiteDatabase(path: path)
        try other.transaction {
            try Self.insert(other, 1000..<1600, tag: 2)
            try other.run("UPDATE t SET v = ? WHERE k = 5", [.blob(Self.payload(5, tag: 3))])
        }
        for k in 1000..<1600 { expected[k] = 2 }
        expected[5] = 3
        try Self.expectContent(other, expected, "other connection, right after its commit")
        // The writer's next transaction.
        try db.transaction { try Self.insert(db, [2000]) }
        expected[2000] = 0
        try Self.expectContent(other, expected, "other connection, after the writer's next commit")
        try Self.expectContent(db, expected, "writer")
        try Self.expectContent(try SQLiteDatabase(path: try Self.crashCopy(dir)), expected, "after a crash")
    }

    /// The disk fills under steady commits; during the episode another connection (relayctl)
    /// writes too; then space comes back. Checkpoints run often, so the database file's writes
    /// meet the full disk as well. Every acknowledged commit must be there with its bytes, no
    /// failed one, and integrity_check must say ok, also after a crash at the end.
    @Test(arguments: [UInt64(1), 2, 3, 4, 5, 6])
    func aDiskFullEpisodeWithASecondWriterLosesNothingAcknowledgedAndCorruptsNothing(seed: UInt64) throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = Self.canonical(tmp)
        let path = dir + "/relay.db"
        var rng = SeededGenerator(seed: seed)
        let db = try Self.openWriter(path)
        try db.execute("PRAGMA wal_autocheckpoint=20")
        var expected: [Int: UInt8] = [:]
        try Self.base(db, into: &expected)
        let other = try SQLiteDatabase(path: path, busyTimeoutMillis: 100)
        // A reader on an old snapshot during the episode keeps the WAL from restarting, so it
        // must grow into the full disk (without it, the writer would reuse the WAL's blocks).
        let reader = try SQLiteDatabase(path: path)
        let disk = try FaultRule(path, FaultRule.rule())
        var key = 100, failedCommits = 0, otherAcked = 0, otherFailed = 0
        for step in 0..<120 {
            if step == 30 {
                try reader.execute("BEGIN")
                _ = try reader.scalar("SELECT count(*) FROM t")
                disk.update(FaultRule.rule(budget: Int64.random(in: 0...30_000, using: &rng)))
            }
            if step == 90 {   // space freed, the reader done
                disk.update(FaultRule.rule())
                try reader.execute("COMMIT")
            }
            let n = Int.random(in: 1...12, using: &rng)
            let keys = key ..< key + n
            key += n
            do {
                try db.transaction { try Self.insert(db, keys) }
                for k in keys { expected[k] = 0 }
            } catch {
                failedCommits += 1
            }
            if step >= 30 && step < 90 && step % 7 == 0 {
                // relayctl's write during the episode: one small transaction on its own connection.
                let k = 100_000 + step
                do {
                    try other.transaction { try Self.insert(other, [k], tag: 4) }
                    expected[k] = 4
                    otherAcked += 1
                } catch {
                    otherFailed += 1
                }
            }
        }
        #expect(failedCommits > 0, "the disk was full for a while")
        #expect(otherFailed + otherAcked > 0)
        #expect(disk.counts.failed > 0)
        disk.disarm()
        try Self.expectContent(db, expected, "writer, seed \(seed)")
        try Self.expectContent(other, expected, "other connection, seed \(seed)")
        try Self.expectContent(try SQLiteDatabase(path: try Self.crashCopy(dir)), expected, "after a crash, seed \(seed)")
    }

    /// Short writes and EINTR on every file of the database: SQLite continues and retries, and
    /// nothing changes.
    @Test func shortWritesAndEINTRChangeNothing() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = Self.canonical(tmp)
        let path = dir + "/relay.db"
        let rule = try FaultRule(path, FaultRule.rule(shortMax: 700, eintrEvery: 3))
        var expected: [Int: UInt8] = [:]
        do {
            let db = try Self.openWriter(path)
            try db.execute("PRAGMA wal_autocheckpoint=16")
            try Self.base(db, into: &expected)
            for i in 0..<60 {
                try db.transaction { try Self.insert(db, 100 + i * 9 ..< 100 + (i + 1) * 9) }
                for k in 100 + i * 9 ..< 100 + (i + 1) * 9 { expected[k] = 0 }
            }
            try Self.expectContent(db, expected, "writer")
            try Self.expectContent(try SQLiteDatabase(path: try Self.crashCopy(dir)), expected, "after a crash")
        }
        let c = rule.counts
        #expect(c.short_writes > 100 && c.interrupted > 100, "\(c)")
        #expect(c.failed == 0)
        rule.disarm()
        try Self.expectContent(try SQLiteDatabase(path: path), expected, "reopened")
    }

    /// The store as the relay runs it: ingest during a disk-full episode, a relayctl write
    /// (its own store, as relayctl opens one) in the middle of it. Every 202 (accepted) is
    /// there afterwards, every 503 (thrown) is not, and the database is intact, also after a
    /// crash.
    @Test(arguments: [UInt64(11), 12, 13])
    func theStoreUnderADiskFullEpisodeKeepsEveryAcceptedResponseAndNoRefusedOne(seed: UInt64) throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = Self.canonical(tmp)
        let path = dir + "/relay.db"
        var rng = SeededGenerator(seed: seed)
        var accepted: [String] = []
        var refused = 0
        var opsCredential: String?
        do {
            let s = try SQLiteOutboxStore(path: path)
            defer { s.close() }
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            let disk = try FaultRule(path, FaultRule.rule())
            for i in 0..<150 {
                if i == 40 { disk.update(FaultRule.rule(budget: Int64.random(in: 0...40_000, using: &rng))) }
                if i == 70 {
                    var options = SQLiteStoreOptions()
                    options.busyTimeoutMillis = 200
                    if let ops = try? SQLiteOutboxStore(path: path, options: options) {
                        opsCredential = try? ops.createCredential(name: "ops", apps: ["com.example.app"]).record.id
                        ops.close()
                    }
                }
                if i == 110 { disk.update(FaultRule.rule()) }
                let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
                do {
                    if case .accepted(let id) = try s.ingestNow(sample(token: token, index: UInt32(i)), secret: c.secret) { accepted.append(id) }
                } catch {
                    refused += 1
                }
            }
            #expect(refused > 0, "the disk was full for a while")
            disk.disarm()
            let crashed = try SQLiteDatabase(path: try Self.crashCopy(dir))
            #expect(try crashed.scalar("PRAGMA integrity_check").string == "ok")
            #expect(try crashed.scalar("SELECT count(*) FROM responses").int == Int64(accepted.count), "after a crash: exactly the accepted rows")
        }
        do {
            let s = try SQLiteOutboxStore(path: path)
            defer { s.close() }
            for id in accepted { #expect(try s.response(id: id) != nil, "accepted \(id)") }
        }
        let check = try SQLiteDatabase(path: path)
        #expect(try check.scalar("PRAGMA integrity_check").string == "ok")
        #expect(try check.scalar("SELECT count(*) FROM responses").int == Int64(accepted.count))
        if let opsCredential {
            #expect(try check.scalar("SELECT count(*) FROM credentials WHERE id = ?", [.text(opsCredential)]).int == 1)
        }
    }
}
