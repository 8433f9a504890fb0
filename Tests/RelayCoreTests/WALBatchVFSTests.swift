import Foundation
import Testing
@testable import RelayCore

/// The relay-walbatch VFS (Sources/CSQLiteWAL/walbatch.c): the writer connection's WAL frames
/// reach the file with one write per COMMIT, and nothing about what other connections see, what
/// survives a reopen, or how a failed write surfaces may change.
@Suite struct WALBatchVFSTests {
    /// A writer connection through the VFS, set up as the store sets up its own.
    static func openWriter(_ path: String) throws -> SQLiteDatabase {
        let db = try SQLiteDatabase(path: path, vfs: SQLiteDatabase.walBatchVFS())
        try db.execute("PRAGMA synchronous=FULL")
        try db.execute("PRAGMA journal_mode=WAL")
        return db
    }

    /// The bytes of row `k`, so every row's content can be checked, not only the count.
    static func payload(_ k: Int, size: Int = 300) -> [UInt8] {
        var bytes = withUnsafeBytes(of: UInt64(k).littleEndian) { Array($0) }
        bytes += [UInt8](repeating: UInt8(truncatingIfNeeded: k &* 31 &+ 7), count: size - 8)
        return bytes
    }

    /// Every row 0..<count is present exactly once with its own bytes.
    static func expectRows(_ db: SQLiteDatabase, count: Int, size: Int = 300, _ comment: Comment) throws {
        let rows = try db.query("SELECT k, v FROM t ORDER BY k")
        #expect(rows.count == count, comment)
        var good = 0
        for (i, row) in rows.enumerated() where row[0].int == Int64(i) && row[1].bytes == payload(i, size: size) { good += 1 }
        #expect(good == count, comment)
    }

    static func insertRows(_ db: SQLiteDatabase, _ range: Range<Int>, size: Int = 300) throws {
        for k in range { try db.run("INSERT INTO t (k, v) VALUES (?, ?)", [.integer(Int64(k)), .blob(payload(k, size: size))]) }
    }

    @Test func eachCommitIsOneWriteWhereSQLiteMadeTwoPerFrame() throws {
        let dir = TempDir()
        let db = try Self.openWriter(dir.db)
        // Two B-trees (table + unique index), so every transaction dirties at least two pages.
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER UNIQUE, v BLOB)")
        let before = try #require(db.walBatchStats)
        let transactions = 40, rowsEach = 8
        for i in 0..<transactions {
            try db.transaction { try Self.insertRows(db, i * rowsEach ..< (i + 1) * rowsEach) }
        }
        let after = try #require(db.walBatchStats)
        let received = after.writesReceived - before.writesReceived
        let forwarded = after.writesForwarded - before.writesForwarded
        let restarts = after.headerWrites - before.headerWrites
        // What SQLite asked for: two writes per frame, at least two frames per transaction.
        #expect(received >= 4 * transactions)
        // What reached the file: one write per COMMIT, plus one per WAL header (re)write.
        #expect(forwarded == transactions + restarts)
        #expect(after.flushes - before.flushes == forwarded)
        #expect(after.flushFailures == 0)
        try Self.expectRows(db, count: transactions * rowsEach, "writer's own view")
    }

    @Test func aDefaultVFSConnectionSeesEveryCommitAtOnce() throws {
        let dir = TempDir()
        let db = try Self.openWriter(dir.db)
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER UNIQUE, v BLOB)")
        let reader = try SQLiteDatabase(path: dir.db)
        #expect(reader.walBatchStats == nil)
        #expect(reader.vfsName != db.vfsName)
        for i in 0..<30 {
            try db.transaction { try Self.insertRows(db, i * 5 ..< (i + 1) * 5) }
            try Self.expectRows(reader, count: (i + 1) * 5, "reader after commit \(i)")
        }
    }

    /// The second line of defence: were the writer's synchronous ever lowered to NORMAL (no WAL
    /// sync at commit), the main file's xShmBarrier still flushes the frames before the
    /// wal-index header naming them becomes valid.
    @Test func atNORMALTheBarrierStillFlushesBeforeFramesArePublished() throws {
        let dir = TempDir()
        let db = try Self.openWriter(dir.db)
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER UNIQUE, v BLOB)")
        try db.execute("PRAGMA synchronous=NORMAL")
        let reader = try SQLiteDatabase(path: dir.db)
        let before = try #require(db.walBatchStats)
        for i in 0..<20 {
            try db.transaction { try Self.insertRows(db, i * 5 ..< (i + 1) * 5) }
            try Self.expectRows(reader, count: (i + 1) * 5, "reader after commit \(i)")
        }
        let after = try #require(db.walBatchStats)
        #expect(after.writesForwarded - before.writesForwarded == 20 + after.headerWrites - before.headerWrites)
    }

    /// `ownDescriptor` false: the VFS's fallback, flushing through the default VFS in pieces.
    @Test(arguments: [true, false])
    func manyCommitsAcrossCheckpointsAndWALRestartsStayIntactAndSurviveReopening(ownDescriptor: Bool) throws {
        let dir = TempDir()
        let size = 2500   // about one row per 4 KiB page
        var total = 0
        do {
            let db = try Self.openWriter(dir.db)
            try db.execute("PRAGMA wal_autocheckpoint=16")   // checkpoint (and restart the WAL) often
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER UNIQUE, v BLOB)")
            if !ownDescriptor { #expect(db.flushWALThroughDefaultVFS()) }   // the WAL is open now
            let reader = try SQLiteDatabase(path: dir.db)
            let before = try #require(db.walBatchStats)
            for i in 0..<300 {
                try db.transaction { try Self.insertRows(db, total ..< total + 3, size: size) }
                total += 3
                if i % 50 == 49 { try Self.expectRows(reader, count: total, size: size, "reader after commit \(i)") }
                // Now and then a transaction bigger than the VFS's 4 MiB buffer and than the page
                // cache: SQLite spills frames mid-transaction, rewrites them in place and reads
                // them back for the checksums, all through the buffer.
                if i % 100 == 0 {
                    try db.transaction {
                        try Self.insertRows(db, total ..< total + 1200, size: size)
                        #expect(try #require(db.walBatchStats).bufferCapacity > 1 << 20, "spilled frames are buffered")
                    }
                    total += 1200
                    // The buffer that transaction grew is not kept after its commit.
                    #expect(try #require(db.walBatchStats).bufferCapacity <= 1 << 20)
                }
            }
            let after = try #require(db.walBatchStats)
            #expect(after.headerWrites - before.headerWrites >= 3, "the WAL restarted")
            // The big transactions' flushes were 4 MiB: one pwrite each on our own descriptor,
            // 64 KiB pieces through the default VFS.
            let perFlush = Double(after.writesForwarded - before.writesForwarded) / Double(after.flushes - before.flushes)
            #expect(ownDescriptor ? perFlush < 1.01 : perFlush > 1.5, "\(perFlush) writes per flush")
            #expect(after.flushFailures == 0)
            #expect(try db.scalar("PRAGMA integrity_check").string == "ok")
            #expect(try reader.scalar("PRAGMA integrity_check").string == "ok")
            try Self.expectRows(reader, count: total, size: size, "reader at the end")
        }
        // Both connections closed: a new one on the default VFS, then one on ours.
        let plain = try SQLiteDatabase(path: dir.db)
        #expect(try plain.scalar("PRAGMA integrity_check").string == "ok")
        try Self.expectRows(plain, count: total, size: size, "reopened, default VFS")
        let again = try Self.openWriter(dir.db)
        try Self.expectRows(again, count: total, size: size, "reopened, relay-walbatch")
    }

    @Test(arguments: [WALFlushFailure.ioError, .diskFull])
    func aFailedFlushFailsTheCommitRollsBackAndTheNextTransactionWorks(_ failure: WALFlushFailure) throws {
        let dir = TempDir()
        let db = try Self.openWriter(dir.db)
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER UNIQUE, v BLOB)")
        let reader = try SQLiteDatabase(path: dir.db)
        for i in 0..<10 { try db.transaction { try Self.insertRows(db, i * 5 ..< (i + 1) * 5) } }
        #expect(db.failNextWALFlush(failure))
        #expect(throws: StoreError.self) {
            try db.transaction { try Self.insertRows(db, 50..<55) }
        }
        #expect(db.isAutocommit, "the failed transaction is over")
        #expect(try #require(db.walBatchStats).flushFailures == 1)
        try Self.expectRows(reader, count: 50, "reader after the failed commit")
        try Self.expectRows(db, count: 50, "writer after the failed commit")
        // The next transactions commit (the same rows again: nothing of the failed one stuck).
        for i in 10..<20 { try db.transaction { try Self.insertRows(db, i * 5 ..< (i + 1) * 5) } }
        try Self.expectRows(reader, count: 100, "reader after recovery")
        #expect(try db.scalar("PRAGMA integrity_check").string == "ok")
        let plain = try SQLiteDatabase(path: dir.db)
        try Self.expectRows(plain, count: 100, "reopened")
    }

    @Test func aFailedFlushFailsTheStoreBatchNeverAcceptsIt() throws {
        let dir = TempDir()
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let writer = try #require(s.writer)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted(let first) = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("first ingest"); return }
        #expect(try writer.perform { db in db.failNextWALFlush(.ioError) })
        #expect(throws: StoreError.self) { try s.ingestNow(sample(index: 2), secret: c.secret) }
        guard case .accepted(let third) = try s.ingestNow(sample(index: 2), secret: c.secret) else { Issue.record("retry"); return }
        #expect(try s.response(id: first) != nil)
        #expect(try s.response(id: third) != nil)
        #expect(try s.counts().pending == 2)
        #expect(try writer.perform { db in db.walBatchStats?.flushFailures } == 1)
    }

    @Test func onlyTheWriterAtFULLUsesTheVFS() throws {
        let dir = TempDir()
        let defaultVFS = try SQLiteDatabase(path: dir.path + "/probe.db").vfsName
        #expect(!defaultVFS.isEmpty)
        let walBatch = try SQLiteDatabase.walBatchVFS()
        let cases: [(SQLiteStoreOptions, String)] = [
            (SQLiteStoreOptions(synchronous: .full), walBatch),
            (SQLiteStoreOptions(synchronous: .normal), defaultVFS),
            ({ var o = SQLiteStoreOptions(synchronous: .full); o.coalesceWALWrites = false; return o }(), defaultVFS),
        ]
        for (options, expected) in cases {
            let s = try SQLiteOutboxStore(path: dir.db, options: options)
            defer { s.close() }
            let c = try s.createCredential(name: "c\(options.synchronous)", apps: ["com.example.app"])
            _ = try s.ingestNow(sample(index: UInt32.random(in: 0...UInt32.max)), secret: c.secret)
            let names = try s.connectionVFSNames()
            #expect(names.writer == expected, "\(options.synchronous), coalesce \(options.coalesceWALWrites)")
            #expect(names.reader == defaultVFS)
            let stats = try #require(s.writer).perform { db in db.walBatchStats }
            #expect((stats != nil) == (expected == walBatch))
            #expect(try s.writer?.perform { db in try db.scalar("PRAGMA synchronous").int } == (options.synchronous == .full ? 2 : 1))
        }
    }
}
