import CSQLiteFault
import Foundation
import Testing
import TestSupport
@testable import RelayCore

/// The background checkpointer (SQLiteCheckpointer) under the same faults as the storage
/// integrity tests (Tests/CSQLiteFault): the database file's writes hang, fail (ENOSPC, EIO,
/// EDQUOT) or stop half way, the process dies in the middle, a reader pins the WAL. The WAL
/// holds every committed row until a checkpoint has copied and synced it, so every accepted
/// response must survive each of these, the writer must go on committing, and a failed
/// checkpoint must be tried again.
@Suite struct CheckpointerTests {
    /// Small thresholds so a few hundred rows cross every one of them.
    static let policy = SQLiteCheckpointPolicy(passivePages: 32, restartPages: 128, restartResiduePages: 16,
                                               hardLimitPages: 100_000, idleMillis: 20)

    static func open(_ path: String, _ policy: SQLiteCheckpointPolicy = policy) throws -> SQLiteOutboxStore {
        var options = SQLiteStoreOptions()
        options.checkpoint = policy
        return try SQLiteOutboxStore(path: path, options: options)
    }

    /// A response for a random push token (so each lands on its own index leaf), 300 bytes.
    static func response(_ rng: inout SeededGenerator, _ i: Int) -> NewResponse {
        let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &rng)) }.joined()
        return NewResponse(app: nil, pushToken: token, sessionIdentifier: "6F9619FF-8B86-D011-B42D-00C04FC964FF",
                           keyID: [1, 2, 3, 4], messageIndex: UInt32(i), encryptedData: [UInt8](repeating: UInt8(i & 0xff), count: 300))
    }

    /// Submits and waits for the answer, at most `seconds` (nil: none came: the writer hangs).
    static func ingest(_ s: SQLiteOutboxStore, _ r: NewResponse, secret: String, within seconds: Double = 60) -> Result<IngestOutcome, StoreError>? {
        let slot = ResultBox<Result<IngestOutcome, StoreError>>()
        let done = DispatchSemaphore(value: 0)
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 86_400_000, maxPending: 1_000_000)
        s.submit(IngestRequest(response: r, credentialHash: Credentials.hash(secret: secret))) {
            slot.value = $0
            done.signal()
        }
        guard done.wait(timeout: .now() + seconds) == .success else { return nil }
        return slot.value
    }

    /// Ingests `count` responses one commit each; returns the accepted ids, or records an issue
    /// (and stops) at the first one not accepted within the deadline.
    static func ingestAll(_ s: SQLiteOutboxStore, _ count: Int, from: Int, secret: String, _ rng: inout SeededGenerator,
                          sourceLocation: SourceLocation = #_sourceLocation) -> [String] {
        var ids: [String] = []
        for i in from ..< from + count {
            switch ingest(s, response(&rng, i), secret: secret) {
            case .success(.accepted(let id)): ids.append(id)
            case let other:
                Issue.record("response \(i) not accepted: \(String(describing: other))", sourceLocation: sourceLocation)
                return ids
            }
        }
        return ids
    }

    /// Polls `condition` until it holds or a generous deadline passes (no timing assertion).
    static func eventually(_ seconds: Double = 60, _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try condition() { return true }
            usleep(5_000)
        }
        return try condition()
    }

    /// Exactly the accepted rows, intact: in the files a kill -9 leaves (`dir`'s database and
    /// WAL as they are now) or in one database file.
    static func expectRows(_ path: String, _ accepted: [String], _ comment: Comment, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let db = try SQLiteDatabase(path: path)
        #expect(try db.scalar("PRAGMA integrity_check").string == "ok", comment, sourceLocation: sourceLocation)
        let ids = Set(try db.query("SELECT id FROM responses").compactMap { $0[0].string })
        let missing = accepted.filter { !ids.contains($0) }
        #expect(missing.isEmpty, "\(comment): accepted rows missing: \(missing.count) of \(accepted.count)", sourceLocation: sourceLocation)
        #expect(ids.count == accepted.count, "\(comment): \(ids.count) rows, \(accepted.count) accepted", sourceLocation: sourceLocation)
    }

    static func walSize(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path + "-wal"))?[.size] as? Int) ?? 0
    }

    /// The old writer checkpointed inside its COMMIT (wal_autocheckpoint): a database file whose
    /// writes hang stopped every commit, and every client with it. Now only the checkpointer
    /// waits on them; the WAL takes the commits.
    /// relayctl's writable open: no checkpointer thread, and SQLite's own autocheckpoint keeps
    /// the WAL bounded.
    @Test func withoutBackgroundCheckpointsSQLitesAutocheckpointBoundsTheWAL() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let path = tmp.path + "/relay.db"
        var rng = SeededGenerator(seed: 5)
        var options = SQLiteStoreOptions()
        options.backgroundCheckpoints = false
        let s = try SQLiteOutboxStore(path: path, options: options)
        #expect(s.checkpointer == nil)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let ids = Self.ingestAll(s, 1500, from: 0, secret: c.secret, &rng)
        #expect(ids.count == 1500)
        // One commit per row: 1,500 rows wrote well over 1,000 frames (4 KiB each); the
        // autocheckpoint (every 1,000) restarted the WAL, so the file never held them all.
        let wal = Self.walSize(path)
        #expect(wal > 0 && wal < 1_400 * 4_120, "WAL of \(wal) bytes")
        s.close()
        try Self.expectRows(path, ids, "every row after the close")
    }

    /// A relayctl-mode store closing next to a running server leaves the WAL to the server: no
    /// TRUNCATE checkpoint of its own (which takes the write lock while it copies and would hold
    /// the server's next COMMIT).
    @Test func aStoreWithoutBackgroundCheckpointsLeavesTheServersWALAloneAtClose() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let path = tmp.path + "/relay.db"
        var rng = SeededGenerator(seed: 6)
        var serverPolicy = Self.policy
        serverPolicy.idleMillis = 60_000
        let server = try Self.open(path, serverPolicy)
        defer { server.close() }
        let c = try server.createCredential(name: "c", apps: ["com.example.app"])
        var options = SQLiteStoreOptions()
        options.backgroundCheckpoints = false
        let tool = try SQLiteOutboxStore(path: path, options: options)
        _ = try tool.list(OutboxFilter(limit: 1))
        _ = Self.ingestAll(server, 20, from: 0, secret: c.secret, &rng)
        let before = Self.walSize(path)
        #expect(before > 0)
        tool.close()
        #expect(Self.walSize(path) == before, "the tool's close truncated the server's WAL")
    }

    /// With everything copied the thread sleeps until a commit instead of ticking every
    /// idleMillis; the next commit wakes it and its idle pass copies that commit too. (Counts
    /// turns of the loop over a sleep: a loaded machine only makes fewer.)
    @Test func anIdleCheckpointerSleepsUntilTheNextCommit() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        var rng = SeededGenerator(seed: 4)
        let s = try Self.open(tmp.path + "/relay.db")   // idleMillis 20: 25 ticks in 0.5 s
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = Self.ingestAll(s, 10, from: 0, secret: c.secret, &rng)
        let ckpt = try #require(s.checkpointer)
        // Settled: an idle pass copied the commits and the loop stopped turning.
        var before = ckpt.stats.steps
        #expect(Self.eventually {
            usleep(100_000)
            defer { before = ckpt.stats.steps }
            return ckpt.stats.steps == before
        }, "the checkpointer kept turning with nothing to copy")
        let passes = ckpt.stats.passes
        usleep(500_000)
        #expect(ckpt.stats.steps - before <= 1, "turns while idle: \(ckpt.stats.steps - before)")
        #expect(ckpt.stats.passes == passes)
        _ = Self.ingestAll(s, 1, from: 10, secret: c.secret, &rng)
        #expect(Self.eventually { ckpt.stats.passes > passes }, "a commit after the idle sleep was not copied")
    }

    @Test func commitsGoOnWhileTheDatabaseFilesWritesHang() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let path = StorageFaultTests.canonical(tmp) + "/relay.db"
        var rng = SeededGenerator(seed: 1)
        var accepted: [String] = []
        do {
            let s = try Self.open(path)
            defer { s.close() }
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            let disk = try FaultRule(path, FaultRule.rule(exact: true, blockAfter: 0))
            // ~5 frames per commit: far past the passive threshold and SQLite's old 1,000-page one.
            accepted += Self.ingestAll(s, 400, from: 0, secret: c.secret, &rng)
            #expect(accepted.count == 400)
            #expect(disk.counts.blocked >= 1, "the checkpointer is waiting on the database file")
            try Self.expectRows(try StorageFaultTests.crashCopy((path as NSString).deletingLastPathComponent), accepted, "crash while the checkpoint hangs")
            disk.update(FaultRule.rule(exact: true))
            #expect(Self.eventually { s.checkpointer!.stats.passes >= 1 }, "the hung checkpoint finished")
            accepted += Self.ingestAll(s, 200, from: 400, secret: c.secret, &rng)
            #expect(Self.eventually { s.checkpointer!.stats.restarts >= 1 }, "the WAL was started over")
        }
        try Self.expectRows(path, accepted, "after a clean close")
    }

    enum CheckpointFault: String, CaseIterable, CustomTestStringConvertible {
        case enospcAfterPartialWrite, enospc, eio, edquot
        var testDescription: String { rawValue }
        /// Only the database file (the WAL is written as usual), until disarmed.
        var rule: csqlitefault_rule {
            switch self {
            case .enospcAfterPartialWrite: FaultRule.rule(budget: 6000, exact: true)
            case .enospc: FaultRule.rule(errno: ENOSPC, times: -1, exact: true)
            case .eio: FaultRule.rule(errno: EIO, times: -1, exact: true)
            case .edquot: FaultRule.rule(errno: EDQUOT, times: -1, exact: true)
            }
        }
    }

    @Test(arguments: CheckpointFault.allCases)
    func aFailingCheckpointLosesNothingTheWriterGoesOnAndTheCheckpointIsRetried(_ fault: CheckpointFault) throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = StorageFaultTests.canonical(tmp)
        let path = dir + "/relay.db"
        var rng = SeededGenerator(seed: 2)
        var accepted: [String] = []
        do {
            let s = try Self.open(path)
            defer { s.close() }
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            accepted += Self.ingestAll(s, 100, from: 0, secret: c.secret, &rng)
            #expect(Self.eventually { s.checkpointer!.stats.passes >= 1 })
            let disk = try FaultRule(path, fault.rule)
            let failuresBefore = s.checkpointer!.stats.failures
            accepted += Self.ingestAll(s, 300, from: 100, secret: c.secret, &rng)
            #expect(accepted.count == 400, "the writer kept committing")
            #expect(Self.eventually { s.checkpointer!.stats.failures >= failuresBefore + 2 }, "the failed checkpoint was tried again")
            #expect(disk.counts.failed >= 2)
            try Self.expectRows(try StorageFaultTests.crashCopy(dir), accepted, "crash during the failures")
            #expect(try s.counts().pending == accepted.count, "the writer's own view")
            disk.disarm()
            let passes = s.checkpointer!.stats.passes
            #expect(Self.eventually { s.checkpointer!.stats.passes > passes }, "a later try succeeded")
            accepted += Self.ingestAll(s, 200, from: 400, secret: c.secret, &rng)
            #expect(Self.eventually { s.checkpointer!.stats.restarts >= 1 }, "the WAL was started over")
            try Self.expectRows(try StorageFaultTests.crashCopy(dir), accepted, "crash after recovery")
        }
        try Self.expectRows(path, accepted, "after a clean close")
    }

    /// kill -9 while the checkpointer is half way through copying pages into the database file
    /// (some written, no sync yet), and again after it finished and the WAL was started over.
    @Test func aCrashDuringAndAfterABackgroundCheckpointLosesNothing() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = StorageFaultTests.canonical(tmp)
        let path = dir + "/relay.db"
        var rng = SeededGenerator(seed: 3)
        var accepted: [String] = []
        let s = try Self.open(path)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        accepted += Self.ingestAll(s, 50, from: 0, secret: c.secret, &rng)
        let disk = try FaultRule(path, FaultRule.rule(exact: true, blockAfter: 5))
        var i = 50
        while disk.counts.blocked == 0 && i < 2000 {
            accepted += Self.ingestAll(s, 10, from: i, secret: c.secret, &rng)
            i += 10
        }
        #expect(disk.counts.blocked == 1, "caught after 5 page writes of a checkpoint")
        try Self.expectRows(try StorageFaultTests.crashCopy(dir), accepted, "crash in the middle of a checkpoint")
        disk.disarm()
        accepted += Self.ingestAll(s, 300, from: i, secret: c.secret, &rng)
        #expect(Self.eventually { s.checkpointer!.stats.restarts >= 1 })
        try Self.expectRows(try StorageFaultTests.crashCopy(dir), accepted, "crash after checkpoints and a restart")
    }

    /// A reader holding one snapshot (relayctl's long read, a backup) keeps every frame after it
    /// in the WAL: no checkpoint can copy them and the WAL cannot start over. The writer goes on
    /// committing past the hard limit (and checkpoints itself there); once the reader is gone
    /// the WAL starts over and its file is cut back to journal_size_limit.
    @Test func theWALHardLimitWithAReaderPinningItLosesNothingAndRecovers() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = StorageFaultTests.canonical(tmp)
        let path = dir + "/relay.db"
        var rng = SeededGenerator(seed: 4)
        var policy = Self.policy
        policy.hardLimitPages = 256
        var accepted: [String] = []
        let s = try Self.open(path, policy)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        accepted += Self.ingestAll(s, 20, from: 0, secret: c.secret, &rng)
        let restarts = s.checkpointer!.stats.restarts
        let reader = try SQLiteDatabase(path: path)
        try reader.execute("BEGIN")
        let pinned = try reader.scalar("SELECT count(*) FROM responses").int
        var i = 20
        while s.checkpointer!.stats.walFrames < 3 * policy.hardLimitPages && i < 5000 {
            accepted += Self.ingestAll(s, 20, from: i, secret: c.secret, &rng)
            i += 20
        }
        #expect(s.checkpointer!.stats.walFrames >= 3 * policy.hardLimitPages, "commits went on past the hard limit")
        #expect(s.checkpointer!.stats.writerCheckpoints >= 1, "the writer checkpointed at the hard limit")
        #expect(s.checkpointer!.stats.restarts == restarts, "no restart while the reader pins the WAL")
        #expect(try reader.scalar("SELECT count(*) FROM responses").int == pinned, "the reader kept its snapshot")
        try Self.expectRows(try StorageFaultTests.crashCopy(dir), accepted, "crash with the WAL past its hard limit")
        try reader.execute("COMMIT")
        #expect(Self.eventually {
            accepted += Self.ingestAll(s, 5, from: i, secret: c.secret, &rng)
            i += 5
            return s.checkpointer!.stats.restarts > restarts
        }, "the WAL was started over once the reader was gone")
        accepted += Self.ingestAll(s, 5, from: i, secret: c.secret, &rng)
        #expect(Self.walSize(path) <= 2 * policy.restartPages * (4096 + 24), "the WAL file was cut back (\(Self.walSize(path)) bytes)")
        try Self.expectRows(try StorageFaultTests.crashCopy(dir), accepted, "crash after the WAL started over")
    }

    /// Under continuous load the checkpointer catches up and the writer starts the WAL over (it
    /// never waits for an idle moment), and a clean close leaves everything in the database file.
    @Test func theWALStartsOverUnderContinuousLoadAndCloseCheckpointsEverything() throws {
        let tmp = TempDir()
        defer { withExtendedLifetime(tmp) {} }
        let dir = StorageFaultTests.canonical(tmp)
        let path = dir + "/relay.db"
        var rng = SeededGenerator(seed: 5)
        var policy = Self.policy
        policy.idleMillis = 60_000   // no idle pass: only the restart path can start the WAL over
        let s = try Self.open(path, policy)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let accepted = Self.ingestAll(s, 1500, from: 0, secret: c.secret, &rng)
        #expect(s.checkpointer!.stats.restarts >= 2, "\(s.checkpointer!.stats)")
        s.close()
        #expect(Self.walSize(path) == 0, "close checkpointed and truncated the WAL")
        // The database file alone (no WAL) holds every row.
        let alone = dir + "/alone"
        try FileManager.default.createDirectory(atPath: alone, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: path, toPath: alone + "/relay.db")
        try Self.expectRows(alone + "/relay.db", accepted, "the database file alone")
    }
}
