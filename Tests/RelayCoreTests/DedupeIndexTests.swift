import CSQLiteFault
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import RelayCore

/// Schema v6's dedupe index: keys in response_keys up to merged_through, the younger ones in
/// the ingesting store's memory (the tail). The answers (200 to the same credential with the
/// stored id and state, 409 to another, 202 once the row is gone) must be today's across merges,
/// restarts, kill -9 (files copied mid-merge and after one), failed merges, retention, hash
/// collisions and the upgrade from v5.
@Suite struct DedupeIndexTests {
    let tmp = TempDir()
    var dir: String { StorageFaultTests.canonical(tmp) }
    var path: String { dir + "/relay.db" }

    func open(mergeRows: Int = 4, hash: DedupeHashFunction? = nil, clock: any RelayClock = TestClock()) throws -> SQLiteOutboxStore {
        var o = SQLiteStoreOptions()
        o.dedupeMergeRows = mergeRows
        o.dedupeHash = hash
        return try SQLiteOutboxStore(path: path, options: o, clock: clock)
    }

    static func response(_ i: Int, token: Int = 0) -> NewResponse {
        sample(token: String(format: "%064x", token), index: UInt32(i))
    }

    /// Every key answers as a duplicate of its own row, and to another credential as a conflict.
    static func expectDuplicates(_ s: SQLiteOutboxStore, _ ids: [Int: String], secret: String, other: String? = nil, tokens: Int = 1,
                                 _ comment: Comment, sourceLocation: SourceLocation = #_sourceLocation) throws {
        for (i, id) in ids {
            let again = try s.ingestNow(response(i, token: i % tokens), secret: secret)
            guard case .duplicate(let got, _) = again, got == id else {
                Issue.record("\(comment): key \(i) answered \(again), expected its row \(id)", sourceLocation: sourceLocation)
                continue
            }
            if let other {
                #expect(try s.ingestNow(response(i, token: i % tokens), secret: other) == .conflict, comment, sourceLocation: sourceLocation)
            }
        }
    }

    static func ingest(_ s: SQLiteOutboxStore, _ keys: Range<Int>, secret: String, tokens: Int = 1, into ids: inout [Int: String]) throws {
        for i in keys {
            guard case .accepted(let id) = try s.ingestNow(response(i, token: i % tokens), secret: secret) else {
                Issue.record("key \(i) not accepted")
                continue
            }
            ids[i] = id
        }
    }

    static func integrity(_ path: String) throws -> String? {
        try SQLiteDatabase(path: path).scalar("PRAGMA integrity_check").string
    }

    @Test func keyedHashIsSipHash24() throws {
        // The reference vector of the SipHash paper: key 00..0f, message 00..0e.
        let h = try #require(KeyedHash(key: (0..<16).map { UInt8($0) }))
        #expect(h.hash((0..<15).map { UInt8($0) }) == 0xa129_ca61_49be_45e5)
        #expect(KeyedHash(key: [1, 2, 3]) == nil)
        #expect(throws: StoreError.self) { try DedupeHasher(key: [1, 2, 3], override: nil) }
        // Per database: two keys hash the same fields apart; the token's half is shared by its keys.
        let a = try DedupeHasher(key: (0..<16).map { UInt8($0) }, override: nil), b = try DedupeHasher(key: (1..<17).map { UInt8($0) }, override: nil)
        let r = sample(index: 7), app = "com.example.app"
        #expect(a.hash(app: app, r) != b.hash(app: app, r))
        #expect(a.tokenRange(r.pushToken).contains(a.hash(app: app, r)) && a.tokenRange(r.pushToken).contains(a.hash(app: app, sample(index: 8))))
        #expect(a.hash(app: app, r) != a.hash(app: app, sample(index: 8)))
        // The app is part of the key (schema v7), and the token's half is still the token alone.
        #expect(a.hash(app: app, r) != a.hash(app: "com.example.other", r))
        #expect(a.tokenRange(r.pushToken).contains(a.hash(app: "com.example.other", r)))
        // The stored format, computed independently (entries in response_keys outlive the
        // process): the token's half, then the whole key, each field length-prefixed, the index
        // big-endian, the app last.
        func field(_ b: [UInt8]) -> [UInt8] { withUnsafeBytes(of: UInt32(b.count).bigEndian, Array.init) + b }
        let token = field(Array(r.pushToken.utf8))
        let all = token + field(Array(r.sessionIdentifier.utf8)) + field(r.keyID) + withUnsafeBytes(of: r.messageIndex.bigEndian, Array.init)
            + field(Array(app.utf8))
        #expect(a.hash(app: app, r) == Int64(bitPattern: h.hash(token) & 0xffff_ffff_0000_0000 | h.hash(all) >> 32))
    }

    @Test func mergesMoveTheTailToTheIndexAndDedupeHoldsAcrossThem() throws {
        let s = try open(mergeRows: 4)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"]), o = try s.createCredential(name: "o", apps: ["com.example.app"])
        var ids: [Int: String] = [:]
        try Self.ingest(s, 0..<10, secret: c.secret, tokens: 3, into: &ids)
        let (merges, tail, merged) = try s.write { _ in (s.writerState.dedupe.merges, s.writerState.dedupe.tail.count, s.writerState.dedupe.mergedThrough) }
        #expect(merges >= 2 && tail < 4, "merges \(merges), tail \(tail)")
        let db = try SQLiteDatabase(path: path, readOnly: true)
        #expect(try db.scalar("SELECT merged_through FROM outbox_stats").int == merged)
        #expect(try db.scalar("SELECT count(*) FROM response_keys").int == Int64(10 - tail))
        // No UNIQUE index on the table any more: the claim and done indexes only.
        let indexes = try db.query("SELECT name FROM pragma_index_list('responses') ORDER BY name").compactMap { $0[0].string }
        #expect(indexes == ["responses_claim", "responses_done"])
        try Self.expectDuplicates(s, ids, secret: c.secret, other: o.secret, tokens: 3, "merged and tail keys")
        #expect(try s.counts().pending == 10)
    }

    @Test func aRestartAndAKill9RebuildTheTail() throws {
        var ids: [Int: String] = [:]
        let secret: String
        let crashed: String
        do {
            let s = try open(mergeRows: 1000)
            secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
            try Self.ingest(s, 0..<12, secret: secret, tokens: 2, into: &ids)
            #expect(try SQLiteDatabase(path: path, readOnly: true).scalar("SELECT count(*) FROM response_keys").int == 0, "nothing merged yet")
            crashed = try StorageFaultTests.crashCopy(dir)   // kill -9 now: the tail only in memory
            s.close()   // a clean stop merges it
        }
        #expect(try SQLiteDatabase(path: path, readOnly: true).scalar("SELECT count(*) FROM response_keys").int == 12)
        do {
            let s = try SQLiteOutboxStore(path: crashed)
            defer { s.close() }
            try s.prepareIngest()   // as relay-server starts: the rebuild is queued, not awaited
            #expect(try Self.integrity(crashed) == "ok")
            try Self.expectDuplicates(s, ids, secret: secret, tokens: 2, "after kill -9, tail rebuilt from the table")
            #expect(try s.write { _ in s.writerState.dedupe.tail.count } == 12, "rebuilt from rows above merged_through")
        }
        let s = try open(mergeRows: 1000)
        defer { s.close() }
        try Self.expectDuplicates(s, ids, secret: secret, tokens: 2, "after a clean restart, from the index")
    }

    /// Every key hashes alike: each lookup must still find its own row among all of them.
    @Test func forcedHashCollisionsAreResolvedByTheRows() throws {
        let constant: DedupeHashFunction = { _, _, _, _, _ in 42 }
        var ids: [Int: String] = [:]
        let c: CreatedCredential
        do {
            let s = try open(mergeRows: 5, hash: constant)
            c = try s.createCredential(name: "c", apps: ["com.example.app"])
            try Self.ingest(s, 0..<13, secret: c.secret, tokens: 4, into: &ids)
            try Self.expectDuplicates(s, ids, secret: c.secret, tokens: 4, "colliding keys, merged and in the tail")
            s.close()
        }
        let db = try SQLiteDatabase(path: path, readOnly: true)
        #expect(try db.scalar("SELECT count(DISTINCT h) FROM response_keys").int == 1)
        #expect(try db.scalar("SELECT count(*) FROM response_keys").int == 13)
        let s = try open(mergeRows: 5, hash: constant)
        defer { s.close() }
        try Self.expectDuplicates(s, ids, secret: c.secret, tokens: 4, "colliding keys after a restart")
        try Self.ingest(s, 13..<15, secret: c.secret, tokens: 4, into: &ids)
        #expect(ids.count == 15)
    }

    /// Retention deletes a row: its key is free again (202 with a new id, as with the UNIQUE
    /// index), whether the key was merged or still in the tail, and its entry goes with it.
    @Test(arguments: [true, false])
    func aPurgedRowFreesItsKey(merged: Bool) throws {
        let clock = TestClock()
        let s = try open(mergeRows: merged ? 1 : 1000, clock: clock)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        var ids: [Int: String] = [:]
        try Self.ingest(s, 0..<3, secret: c.secret, into: &ids)
        let claimed = try s.claimDue(limit: 10)
        try s.apply(claimed.filter { $0.id == ids[1] }.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        try s.apply(claimed.filter { $0.id != ids[1] }.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .requeue, attempt: nil) })
        clock.advance(10_000)
        #expect(try s.purge(state: .delivered, olderThan: clock.nowMillis(), dryRun: false) == 1)
        let db = try SQLiteDatabase(path: path, readOnly: true)
        let purged = try #require(ids[1])
        let high = try #require(UUIDText.high64(purged))
        #expect(try db.scalar("SELECT count(*) FROM response_keys WHERE id_high = ?", [.integer(high)]).int == 0)
        guard case .accepted(let again) = try s.ingestNow(Self.response(1), secret: c.secret) else { Issue.record("not accepted again"); return }
        #expect(again != ids[1])
        ids[1] = again
        try Self.expectDuplicates(s, ids, secret: c.secret, "after the purge")
        s.close()
        // The merge at close left the purged row out.
        #expect(try db.scalar("SELECT count(*) FROM response_keys").int == 3)
        #expect(try db.scalar("SELECT count(*) FROM response_keys k LEFT JOIN responses r ON r.id_high = k.id_high WHERE r.id_high IS NULL").int == 0)
    }

    /// A merge whose COMMIT fails (the disk fills, EIO) or that is killed before it commits
    /// changes nothing visible: the tail stays, dedupe answers as before, the next merge
    /// succeeds, and the files copied at that moment open intact with the same answers.
    @Test(arguments: [WriteFault.enospcAfterPartialWrite, .eio])
    func aFailedMergeKeepsTheTailAndTheNextOneSucceeds(_ fault: WriteFault) throws {
        let s = try open(mergeRows: 1000)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        var ids: [Int: String] = [:]
        try Self.ingest(s, 0..<40, secret: c.secret, tokens: 7, into: &ids)
        let crashCopies = Mutex<[String]>([])
        let dir = self.dir
        let failed = try s.write { _ in
            s.writerState.dedupe.beforeMergeCommit = {
                crashCopies.withLock { $0.append(try! StorageFaultTests.crashCopy(dir)) }   // kill -9 mid-merge
            }
            return s.writerState.dedupe.mergeFailures
        }
        do {
            let rule = try FaultRule(path + "-wal", fault.rule)
            _ = try s.write { _ in s.writerState.dedupe.mergeRequested = true }   // the merge runs after this batch
            _ = try s.write { _ in }
            #expect(rule.counts.failed >= 1, "the fault was hit")
        }
        let (failures, tail, merged) = try s.write { _ in (s.writerState.dedupe.mergeFailures, s.writerState.dedupe.tail.count, s.writerState.dedupe.mergedThrough) }
        #expect(failures == failed + 1 && tail == 40 && merged == 0)
        #expect(try SQLiteDatabase(path: path, readOnly: true).scalar("SELECT merged_through FROM outbox_stats").int == 0)
        try Self.expectDuplicates(s, ids, secret: c.secret, tokens: 7, "after the failed merge")
        try Self.ingest(s, 40..<45, secret: c.secret, tokens: 7, into: &ids)
        // The next merge goes through; a copy taken right after it is intact too.
        _ = try s.write { _ in s.writerState.dedupe.mergeRequested = true; s.writerState.dedupe.beforeMergeCommit = nil }
        _ = try s.write { _ in }
        #expect(try s.write { _ in s.writerState.dedupe.tail.count } == 0)
        #expect(try SQLiteDatabase(path: path, readOnly: true).scalar("SELECT count(*) FROM response_keys").int == 45)
        let afterMerge = try StorageFaultTests.crashCopy(dir)
        try Self.expectDuplicates(s, ids, secret: c.secret, tokens: 7, "after the next merge")
        for copy in crashCopies.withLock({ $0 }) + [afterMerge] {
            #expect(try Self.integrity(copy) == "ok")
            let db = try SQLiteDatabase(path: copy)
            let rows = try db.scalar("SELECT count(*) FROM responses").int ?? 0
            let cs = try SQLiteOutboxStore(path: copy)
            defer { cs.close() }
            try Self.expectDuplicates(cs, ids.filter { $0.key < Int(rows) }, secret: c.secret, tokens: 7, "copy \(copy)")
        }
    }

    /// A merge in chunks (each its own transaction): killed between two chunks, the copy holds
    /// some keys in the index and all in the rebuilt tail; it answers alike and its own merge
    /// completes the index without duplicating an entry.
    @Test func aMergeKilledBetweenChunksIsCompletedByTheNextStart() throws {
        let s = try open(mergeRows: 1000)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        var ids: [Int: String] = [:]
        try Self.ingest(s, 0..<10, secret: c.secret, tokens: 3, into: &ids)
        let copies = Mutex<[String]>([])
        let steps = Mutex(0)
        let dir = self.dir
        try s.write { _ in
            s.writerState.dedupe.mergeChunk = 3
            s.writerState.dedupe.beforeMergeCommit = {
                if steps.withLock({ $0 += 1; return $0 }) == 3 { copies.withLock { $0.append(try! StorageFaultTests.crashCopy(dir)) } }
            }
            s.writerState.dedupe.mergeRequested = true
        }
        _ = try s.write { _ in }
        #expect(steps.withLock { $0 } == 4, "10 keys in chunks of 3")
        #expect(try s.write { _ in s.writerState.dedupe.tail.count } == 0)
        let copy = try #require(copies.withLock { $0.first })
        let db = try SQLiteDatabase(path: copy)
        #expect(try db.scalar("SELECT count(*) FROM response_keys").int == 6, "two chunks committed before the kill")
        #expect(try db.scalar("SELECT merged_through FROM outbox_stats").int == 0)
        do {
            let cs = try SQLiteOutboxStore(path: copy)
            defer { cs.close() }
            try Self.expectDuplicates(cs, ids, secret: c.secret, tokens: 3, "killed between chunks")
            #expect(try cs.write { _ in cs.writerState.dedupe.tail.count } == 10)
        }
        #expect(try db.scalar("SELECT count(*) FROM response_keys").int == 10)
        #expect(try db.scalar("PRAGMA integrity_check").string == "ok")
        try Self.expectDuplicates(s, ids, secret: c.secret, tokens: 3, "the live store")
    }

    /// A batch that rolls back takes its keys out of the tail again: the key is free (202), and
    /// the tail holds exactly the committed rows.
    @Test func aRolledBackBatchLeavesNoKeyInTheTail() throws {
        let s = try open(mergeRows: 1000)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        var ids: [Int: String] = [:]
        try Self.ingest(s, 0..<3, secret: c.secret, into: &ids)
        let gate = try holdWriter(s)
        let writer = try #require(s.writer)
        let result = ResultBox<Result<IngestOutcome, StoreError>>()
        let done = DispatchSemaphore(value: 0)
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        s.submit(IngestRequest(response: Self.response(7), credentialHash: Credentials.hash(secret: c.secret))) {
            result.value = $0
            done.signal()
        }
        writer.enqueue({ db in try db.execute("INSERT INTO no_such_table VALUES (1)") }, completion: { _ in })
        gate.signal()
        done.wait()
        guard case .failure = result.value! else { Issue.record("committed in a failed batch"); return }
        #expect(try s.write { _ in s.writerState.dedupe.tail.count } == 3)
        try Self.ingest(s, 7..<8, secret: c.secret, into: &ids)
        try Self.expectDuplicates(s, ids, secret: c.secret, "after the rollback")
    }

    @Test("a symbolic link at the ingest lock's name or at the database's is refused; nothing is created through it")
    func symbolicLinksAreRefused() throws {
        let victim = dir + "-victim"
        defer { unlink(victim) }
        try FileManager.default.createSymbolicLink(atPath: path + "-ingest", withDestinationPath: victim)
        let s = try open()
        defer { s.close() }
        #expect(throws: StoreError.invalid("the ingest lock \(path)-ingest is a symbolic link; refusing to open it (remove the link)")) {
            try s.prepareIngest()
        }
        #expect(!FileManager.default.fileExists(atPath: victim))
        let linked = dir + "/linked.db"
        try FileManager.default.createSymbolicLink(atPath: linked, withDestinationPath: victim)
        do {
            _ = try SQLiteOutboxStore(path: linked, options: SQLiteStoreOptions(), clock: TestClock())
            Issue.record("a database path that is a symbolic link was opened")
        } catch {
            #expect("\(error)".contains("the database \(linked) is a symbolic link; refusing to open it for writing"), "\(error)")
        }
        #expect(!FileManager.default.fileExists(atPath: victim))
    }

    @Test func aSecondIngestingStoreIsRefusedAndRelayctlStillWrites() throws {
        let a = try open()
        try a.prepareIngest()
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let b = try open()
        defer { b.close() }
        do {
            try b.prepareIngest()
            Issue.record("a second ingesting store was accepted")
        } catch {
            #expect("\(error)".contains("another relay-server ingests into") && "\(error)".contains("relay.db-ingest"), "\(error)")
        }
        // Its submit is refused the same way (503), never answered from a stale tail.
        #expect(throws: StoreError.self) { try b.ingestNow(Self.response(1), secret: c.secret) }
        // relayctl's writes (a store that does not ingest) go on.
        _ = try b.createCredential(name: "ops", apps: ["com.example.app"])
        guard case .accepted(let id) = try a.ingestNow(Self.response(1), secret: c.secret) else { Issue.record("not accepted"); return }
        a.close()
        // Once the first is gone, the second takes over with the first's keys.
        try b.prepareIngest()
        #expect(try b.ingestNow(Self.response(1), secret: c.secret) == .duplicate(id: id, state: .queued))
    }

    /// Ids minted after a restart with the clock stepped back stay above minted_through, so
    /// their keys are in the tail (and merged later), never below the watermark unseen.
    @Test func idsAfterAClockStepBackStayAboveTheWatermark() throws {
        let clock = TestClock()
        var ids: [Int: String] = [:]
        let secret: String
        do {
            let s = try open(mergeRows: 3, clock: clock)
            defer { s.close() }
            secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
            clock.advance(60_000)
            try Self.ingest(s, 0..<7, secret: secret, into: &ids)
        }
        let newest = ids.values.compactMap(UUIDText.high64).max() ?? 0
        let s = try open(mergeRows: 3, clock: TestClock())   // a minute back
        defer { s.close() }
        try Self.ingest(s, 7..<11, secret: secret, into: &ids)
        for i in 7..<11 { #expect((UUIDText.high64(ids[i] ?? "") ?? 0) > newest) }
        let crashed = try StorageFaultTests.crashCopy(dir)
        try Self.expectDuplicates(s, ids, secret: secret, "after the step back")
        let cs = try SQLiteOutboxStore(path: crashed, clock: TestClock())
        defer { cs.close() }
        try Self.expectDuplicates(cs, ids, secret: secret, "after the step back and a kill -9")
    }

    /// A marked token is refused whatever rows newer than its cutoff the index or the tail
    /// hold: ingest reads the mark alone (it used to read every row of the token, and a row
    /// newer than the cutoff opened the token, issue 31).
    @Test(arguments: [1, 1000])
    func aMarkRefusesWhateverRowsTheIndexAndTailHold(mergeRows: Int) throws {
        let clock = TestClock()
        let token = String(format: "%064x", 5)
        let secret: String
        do {
            let s = try open(mergeRows: mergeRows, clock: clock)
            defer { s.close() }
            secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
            var ids: [Int: String] = [:]
            try Self.ingest(s, 0..<3, secret: secret, tokens: 1000, into: &ids)   // tokens 0, 1, 2
            clock.advance(1000)
            if case .accepted = try s.ingestNow(sample(token: token, index: 9), secret: secret) {} else { Issue.record("not accepted") }
            #expect(try s.list(OutboxFilter(tokenPrefix: token)).count == 1)
            try s.write { db in
                try db.run("INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at) VALUES (?, ?, ?)",
                           [.text(token), .integer(clock.nowMillis() - 500), .integer(clock.nowMillis())])
                s.writerState.watchedTokens.insert(token)
                if mergeRows > 1 { #expect(s.writerState.dedupe.tail.count == 4) }
            }
            #expect(try s.ingestNow(sample(token: token, index: 10), secret: secret) == .unregistered)
        }
    }

    /// A populated v5 file (as relay-server v5 left it) upgrades with every row keyed: each
    /// stored key answers as a duplicate, new keys are accepted, watermarks at the newest v7 id.
    @Test func aV5DatabaseUpgradesWithItsKeys() throws {
        let clock = TestClock()
        let secret = Credentials.generateSecret()
        var gen = TimeOrderedIDs()
        var ids: [Int: String] = [:]
        let db = try SQLiteDatabase(path: path)
        try db.execute("PRAGMA journal_mode=WAL")
        try db.defineFunction("relay_id_rowid") { _ in 0 }   // v5's copy of an empty table
        try db.transaction {
            for v in 0..<5 { try db.execute(SQLiteOutboxStore.migrations[v]) }
            try db.execute("PRAGMA user_version = 5")
        }
        try db.run("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ('cred_v5', 'v5', ?, 'com.example.app', 0)",
                   [.blob(Credentials.hash(secret: secret))])
        var newest: Int64 = 0
        for i in 0..<30 {
            // Every tenth a v4 id (minted before schema v3): in the index, but no watermark.
            let id = i % 10 == 9 ? RelayCrypto.uuidV4() : gen.mint(nowMillis: clock.nowMillis() - 10_000).id
            let key = try #require(UUIDText.high64(id))
            if i % 10 != 9 { newest = max(newest, key) }
            let r = Self.response(i, token: i % 4)
            try db.run("""
                INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                    state, attempts, next_attempt_at, created_at, expires_at, updated_at)
                VALUES (?, ?, 'com.example.app', ?, ?, ?, ?, X'00', 'cred_v5', ?, 0, 0, ?, ?, ?)
                """, [.integer(key), .text(id), .text(r.pushToken), .text(r.sessionIdentifier), .blob(r.keyID), .integer(Int64(i)),
                      .text(i % 3 == 0 ? "delivered" : "queued"), .integer(clock.nowMillis() - 10_000), .integer(clock.nowMillis() + 86_400_000),
                      .integer(clock.nowMillis() - 10_000)])
            ids[i] = id
        }
        let s = try SQLiteOutboxStore(path: path, clock: clock)
        defer { s.close() }
        let check = try SQLiteDatabase(path: path, readOnly: true)
        #expect(try check.scalar("PRAGMA user_version").int == Int64(SQLiteOutboxStore.schemaVersion))
        #expect(try check.scalar("SELECT count(*) FROM response_keys").int == 30)
        #expect(try check.scalar("SELECT minted_through FROM outbox_stats").int == newest)
        #expect(try check.scalar("SELECT merged_through FROM outbox_stats").int == newest)
        #expect(try check.scalar("SELECT length(dedupe_key) FROM outbox_stats").int == 16)
        #expect(try check.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'responses_v5'").int == 0)
        #expect(try Self.integrity(path) == "ok")
        for (i, id) in ids {
            let state: ResponseState = i % 3 == 0 ? .delivered : .queued
            var retry = Self.response(i, token: i % 4)
            retry.encryptedData = [0]   // the box each row was stored with
            #expect(try s.ingestNow(retry, secret: secret) == .duplicate(id: id, state: state), "key \(i)")
        }
        var more: [Int: String] = [:]
        try Self.ingest(s, 30..<33, secret: secret, tokens: 4, into: &more)
        for id in more.values { #expect((UUIDText.high64(id) ?? 0) > newest) }
    }

    /// v6's entry for a response: its key without the app, as a v6 relay hashed it.
    static func v6Hash(_ mac: KeyedHash, _ r: NewResponse) -> Int64 {
        func field(_ b: [UInt8]) -> [UInt8] { withUnsafeBytes(of: UInt32(b.count).bigEndian, Array.init) + b }
        let token = field(Array(r.pushToken.utf8))
        let all = token + field(Array(r.sessionIdentifier.utf8)) + field(r.keyID) + withUnsafeBytes(of: r.messageIndex.bigEndian, Array.init)
        return Int64(bitPattern: mac.hash(token) & 0xffff_ffff_0000_0000 | mac.hash(all) >> 32)
    }

    /// A populated v6 file as a v6 relay killed mid-run left it: rows of two apps and three
    /// credentials in several states, the older ones in response_keys under v6's hash (no app),
    /// the newest above merged_through (their keys were only in the dead process's memory).
    /// v7 writes every row's key with its app: each stored key answers its owner as before
    /// (200), another credential of its app 409, and another app's credential is no conflict.
    @Test func aV6DatabaseUpgradesToAppScopedKeys() throws {
        let clock = TestClock()
        let apps: Set<String> = ["com.example.app", "com.example.other"]
        let owners = [(id: "cred_a", app: "com.example.app", secret: Credentials.generateSecret()),
                      (id: "cred_b", app: "com.example.other", secret: Credentials.generateSecret()),
                      (id: "cred_a2", app: "com.example.app", secret: Credentials.generateSecret())]
        let key = RelayCrypto.randomBytes(16)
        let mac = try #require(KeyedHash(key: key))
        var gen = TimeOrderedIDs()
        var rows: [(i: Int, id: String, high: Int64, owner: Int, state: ResponseState)] = []
        do {
            let db = try SQLiteDatabase(path: path)
            try db.execute("PRAGMA journal_mode=WAL")
            try db.defineFunction("relay_id_rowid") { _ in 0 }   // v5's copy of an empty table
            try db.transaction {
                for v in 0..<6 { try db.execute(SQLiteOutboxStore.migrations[v]) }
                try db.execute("PRAGMA user_version = 6")
            }
            for o in owners {
                try db.run("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES (?, ?, ?, ?, 0)",
                           [.text(o.id), .text(o.id), .blob(Credentials.hash(secret: o.secret)), .text(o.app)])
            }
            for i in 0..<24 {
                let (id, high) = gen.mint(nowMillis: clock.nowMillis() - 10_000 + Int64(i))
                let r = Self.response(i, token: i % 4), owner = i % 3, state: ResponseState = i % 4 == 0 ? .delivered : .queued
                try db.run("""
                    INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                        state, attempts, next_attempt_at, created_at, expires_at, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?, ?)
                    """, [.integer(high), .text(id), .text(owners[owner].app), .text(r.pushToken), .text(r.sessionIdentifier), .blob(r.keyID),
                          .integer(Int64(i)), .blob(r.encryptedData), .text(owners[owner].id), .text(state.rawValue),
                          .integer(clock.nowMillis() - 10_000), .integer(clock.nowMillis() + 86_400_000), .integer(clock.nowMillis() - 10_000)])
                if i < 16 { try db.run("INSERT INTO response_keys (h, id_high) VALUES (?, ?)", [.integer(Self.v6Hash(mac, r)), .integer(high)]) }
                rows.append((i, id, high, owner, state))
            }
            try db.run("UPDATE outbox_stats SET pending = ?, dedupe_key = ?, merged_through = ?, minted_through = ? WHERE id = 1",
                       [.integer(Int64(rows.filter { $0.state == .queued }.count)), .blob(key), .integer(rows[15].high), .integer(rows[23].high)])
        }
        let s = try SQLiteOutboxStore(path: path, clock: clock)
        let check = try SQLiteDatabase(path: path, readOnly: true)
        #expect(try check.scalar("PRAGMA user_version").int == Int64(SQLiteOutboxStore.schemaVersion))
        #expect(try Self.integrity(path) == "ok")
        // Every row's entry under the v7 hash (same SipHash key), none under v6's; no tail left.
        let hasher = try DedupeHasher(key: key, override: nil)
        let want = Set(rows.map { r in "\(hasher.hash(app: owners[r.owner].app, Self.response(r.i, token: r.i % 4))) \(r.high)" })
        let have = Set(try check.query("SELECT h, id_high FROM response_keys").map { "\($0[0].int ?? 0) \($0[1].int ?? 0)" })
        #expect(have == want)
        for r in rows { #expect(!have.contains("\(Self.v6Hash(mac, Self.response(r.i, token: r.i % 4))) \(r.high)")) }
        #expect(try check.scalar("SELECT merged_through FROM outbox_stats").int == rows[23].high)
        #expect(try check.scalar("SELECT minted_through FROM outbox_stats").int == rows[23].high)
        #expect(try check.scalar("SELECT count(*) FROM responses").int == 24)
        func expectAnswers(_ store: SQLiteOutboxStore, _ comment: Comment) throws {
            for r in rows {
                let request = Self.response(r.i, token: r.i % 4)
                #expect(try store.ingestNow(request, secret: owners[r.owner].secret, apps: apps) == .duplicate(id: r.id, state: r.state), comment)
                if owners[r.owner].app == "com.example.app" {
                    // The app's other credential (a rotation): the key is still held.
                    #expect(try store.ingestNow(request, secret: owners[r.owner == 0 ? 2 : 0].secret, apps: apps) == .conflict, comment)
                }
            }
        }
        try expectAnswers(s, "right after the migration")
        // The other app's credential: a key of its own app, stored beside the first.
        for r in rows.filter({ owners[$0.owner].app == "com.example.app" }) {
            guard case .accepted(let id) = try s.ingestNow(Self.response(r.i, token: r.i % 4), secret: owners[1].secret, apps: apps) else {
                Issue.record("row \(r.i): the other app's key was not accepted"); continue
            }
            #expect(try s.response(id: id)?.app == "com.example.other" && id != r.id)
        }
        s.close()
        let again = try SQLiteOutboxStore(path: path, clock: clock)
        defer { again.close() }
        try expectAnswers(again, "after a restart")
        #expect(try Self.integrity(path) == "ok")
    }
}
