import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// Schema v5: `responses` is keyed by the id's first 64 bits (`id_high`, the rowid) and has no
/// index on `id`. A v4 file holding random v4 ids (minted before schema v3) and time-ordered v7
/// ids must come through with every row, id, state and attempt, and every lookup by id, the
/// dedupe and the outcome writes must work on the migrated rows.
@Suite struct MigrationToV5Tests {
    let dir = TempDir()
    let clock = TestClock()
    /// Every column but the key, in a stable order (by id) for before/after comparison.
    static let columns = "id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state, attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at"

    struct Seed { var id: String; var state: String; var attempts: Int }

    /// A v4 file as relay-server v4 left it: one credential, v4 and v7 ids in several states
    /// (inserted in an order unrelated to their ids), an attempts row per attempt.
    func makeV4(secret: String, ids: [(String, String)]) throws -> [Seed] {
        let db = try SQLiteDatabase(path: dir.db)
        try db.execute("PRAGMA journal_mode=WAL")
        try db.transaction {
            for v in 0..<4 { try db.execute(SQLiteOutboxStore.migrations[v]) }
            try db.execute("PRAGMA user_version = 4")
        }
        let now = clock.nowMillis()
        try db.run("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ('cred_v4', 'v4', ?, 'com.example.app', 0)",
                   [.blob(Credentials.hash(secret: secret))])
        var seeds: [Seed] = []
        for (i, (id, state)) in ids.enumerated() {
            let attempts = state == "queued" ? 0 : 1 + i % 3
            try db.run("""
                INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                    state, attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at)
                VALUES (?, 'com.example.app', ?, '6F9619FF-8B86-D011-B42D-00C04FC964FF', X'01020304', ?, ?, 'cred_v4',
                        ?, ?, ?, ?, ?, ?, ?, ?)
                """, [.text(id), .text(String(repeating: "ab", count: 32)), .integer(Int64(i)), .blob([UInt8](repeating: UInt8(i), count: 40)),
                      .text(state), .integer(Int64(attempts)), .integer(now - 1000), .integer(now - 5000 + Int64(i)), .integer(now + 86_400_000),
                      state == "queued" ? .null : .integer(state == "failed" ? 400 : 200),
                      state == "failed" ? .text("BadDeviceToken") : .null, .integer(now - 4000 + Int64(i))])
            for a in 0..<attempts {
                try db.run("INSERT INTO attempts (response_id, attempted_at, status, reason) VALUES (?, ?, 200, NULL)",
                           [.text(id), .integer(now - 4000 + Int64(a))])
            }
            seeds.append(Seed(id: id, state: state, attempts: attempts))
        }
        let pending = seeds.filter { ["queued", "inflight", "retry"].contains($0.state) }.count
        try db.run("UPDATE outbox_stats SET pending = ?", [.integer(Int64(pending))])
        return seeds
    }

    /// v7 ids minted as a v4 relay would have (earlier milliseconds), v4 ids as before v3.
    func mixedIDs() -> [(String, String)] {
        var gen = TimeOrderedIDs()
        let v7 = (0..<4).map { gen.mint(nowMillis: clock.nowMillis() - 60_000 + Int64($0) / 2).id }
        let v4 = (0..<4).map { _ in RelayCrypto.uuidV4() }
        // Interleaved so the old rowid order is neither id order nor "all v4 first".
        return [(v7[2], "queued"), (v4[0], "queued"), (v4[1], "inflight"), (v7[0], "retry"),
                (v4[2], "delivered"), (v7[1], "inflight"), (v4[3], "failed"), (v7[3], "delivered")]
    }

    @Test func v4AndV7RowsKeepEverythingAndAreFoundByID() throws {
        let secret = Credentials.generateSecret()
        let seeds = try makeV4(secret: secret, ids: mixedIDs())
        let before = try SQLiteDatabase(path: dir.db, readOnly: true).query("SELECT \(Self.columns) FROM responses ORDER BY id")
        let attemptsBefore = try SQLiteDatabase(path: dir.db, readOnly: true).query("SELECT response_id, attempted_at, status FROM attempts ORDER BY id")
        let store = try SQLiteOutboxStore(path: dir.db, clock: clock)
        defer { store.close() }

        let db = try SQLiteDatabase(path: dir.db, readOnly: true)
        #expect(try db.scalar("PRAGMA user_version").int == Int64(SQLiteOutboxStore.schemaVersion))
        #expect(try db.query("SELECT \(Self.columns) FROM responses ORDER BY id") == before)
        #expect(try db.query("SELECT response_id, attempted_at, status FROM attempts ORDER BY id") == attemptsBefore)
        #expect(try db.scalar("SELECT pending FROM outbox_stats").int == 5)
        #expect(try db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'responses_v4'").int == 0)
        // The key is the id's first 64 bits, read big-endian (v4 ids give negative keys too).
        for row in try db.query("SELECT rowid, id_high, id FROM responses") {
            let id = try #require(row[2].string)
            let expected = try #require(UUIDText.high64(id))
            #expect(row[0].int == expected && row[1].int == expected, "\(id)")
            let bytes = try #require(UUIDText.parse(id))
            #expect(UInt64(bitPattern: expected) == bytes[0..<8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) })
        }
        #expect(Set(try db.query("SELECT id_high FROM responses").compactMap { $0[0].int }).count == seeds.count)
        // responses_claim and responses_done (since v6 the dedupe key is in response_keys); none on id.
        let indexes = try db.query("SELECT name FROM pragma_index_list('responses') ORDER BY name").compactMap { $0[0].string }
        #expect(indexes == ["responses_claim", "responses_done"], "\(indexes)")
        for name in indexes {
            let cols = try db.query("SELECT name FROM pragma_index_info(?)", [.text(name)]).compactMap { $0[0].string }
            #expect(!cols.contains("id"), "\(name): \(cols)")
        }
        let plan = try db.query("EXPLAIN QUERY PLAN SELECT state FROM responses WHERE id_high = 5 AND id = 'x'").compactMap { $0.last?.string }.joined()
        #expect(plan.contains("INTEGER PRIMARY KEY"), "\(plan)")

        // GET by id (any case), with state and attempts; the attempts list by id.
        for seed in seeds {
            let row = try #require(try store.response(id: seed.id.uppercased()), "\(seed.id)")
            #expect(row.id == seed.id && row.state.rawValue == seed.state && row.attempts == seed.attempts)
            #expect(try store.attempts(responseID: seed.id).count == seed.attempts)
        }
        #expect(try store.response(id: "not-a-uuid") == nil)
        // Dedupe: the same key and sealed box as each migrated row answers with its id and state.
        for (i, seed) in seeds.enumerated() {
            var retry = sample(index: UInt32(i))
            retry.encryptedData = [UInt8](repeating: UInt8(i), count: 40)
            #expect(try store.ingestNow(retry, secret: secret) == .duplicate(id: seed.id, state: ResponseState(rawValue: seed.state)!))
        }
        // Outcome writes find migrated rows by id: recover, claim, deliver every pending row.
        #expect(try store.recoverInflight() == 2)
        let claimed = try store.claimDue(limit: 10)
        #expect(Set(claimed.map(\.id)) == Set(seeds.filter { ["queued", "inflight", "retry"].contains($0.state) }.map(\.id)))
        try store.apply(claimed.map {
            DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered,
                           attempt: AttemptRecord(responseID: $0.id, attemptedAt: clock.nowMillis(), status: 200, reason: nil))
        })
        for row in claimed {
            let seed = try #require(seeds.first { $0.id == row.id })
            let after = try #require(try store.response(id: row.id))
            #expect(after.state == .delivered && after.attempts == seed.attempts + 1, "\(row.id)")
        }
        #expect(try db.scalar("SELECT pending FROM outbox_stats").int == 0)
        // Operator requeue by id (relayctl retry) finds a migrated failed row.
        let failed = try #require(seeds.first { $0.state == "failed" })
        #expect(try store.requeue(ids: [failed.id.uppercased(), "nope"]) == 1)
        #expect(try store.response(id: failed.id)?.state == .queued)
    }

    /// Two v4 ids with the same first 64 bits (~2^-60 per pair, so built by hand) cannot both
    /// become keys: the migration fails naming them, and the file stays a usable v4 file.
    @Test func clashingV4IDsFailTheMigrationNamingThem() throws {
        let a = "0123abcd-ef01-4234-8aaa-000000000001"
        let b = "0123abcd-ef01-4234-9bbb-000000000002"
        _ = try makeV4(secret: Credentials.generateSecret(), ids: [(a, "queued"), (RelayCrypto.uuidV4(), "queued"), (b, "delivered")])
        do {
            _ = try SQLiteOutboxStore(path: dir.db, clock: clock)
            Issue.record("migration with clashing ids succeeded")
        } catch let error as StoreError {
            guard case .invalid(let message) = error else { Issue.record("unexpected \(error)"); return }
            #expect(message.contains(a) && message.contains(b) && message.contains("first 64 bits"), "\(message)")
        }
        let db = try SQLiteDatabase(path: dir.db, readOnly: true)
        #expect(try db.scalar("PRAGMA user_version").int == 4)
        #expect(try db.scalar("SELECT count(*) FROM responses").int == 3)
        #expect(try db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'responses_v4'").int == 0)
    }

    /// A relay never minted an id that is not a UUID; such a row has no key, so the migration
    /// refuses it by name instead of keeping a row nothing can find.
    @Test func anIDThatIsNotAUUIDFailsTheMigrationNamingIt() throws {
        _ = try makeV4(secret: Credentials.generateSecret(), ids: [(RelayCrypto.uuidV4(), "queued"), ("hand-made-7", "failed")])
        do {
            _ = try SQLiteOutboxStore(path: dir.db, clock: clock)
            Issue.record("migration with a non-UUID id succeeded")
        } catch {
            #expect("\(error)".contains("'hand-made-7' is not a UUID"), "\(error)")
        }
        let db = try SQLiteDatabase(path: dir.db, readOnly: true)
        #expect(try db.scalar("PRAGMA user_version").int == 4)
        #expect(try db.scalar("SELECT count(*) FROM responses").int == 2)
    }
}

/// A key clash at ingest: a row inserted by other means (a script's fixture) holds the high word
/// the store mints next. The INSERT fails for that row only; the store mints past it and the
/// batch commits with every request accepted. Duplicates are still duplicates. A restart with
/// the clock stepped back mints above every id minted before (outbox_stats.minted_through).
@Suite struct IngestKeyClashTests {
    let dir = TempDir()

    @Test func aClockSteppedBackAcrossARestartMintsPastTheTakenKeys() throws {
        let clock = TestClock()
        let start = clock.nowMillis()
        let secret: String
        var first: [String] = []
        do {
            let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
            defer { s.close() }
            secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
            // Three ids in one millisecond (counters 0, 1, 2), then one a second later.
            for i in 0..<3 {
                guard case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: secret) else { Issue.record("not accepted"); return }
                first.append(id)
            }
            clock.advance(1000)
            guard case .accepted(let id) = try s.ingestNow(sample(index: 3), secret: secret) else { Issue.record("not accepted"); return }
            first.append(id)
        }
        // A fixture row holds the word just past the newest id (what a restart mints next, the
        // clock being back at the first millisecond).
        let newest = try #require(UUIDText.high64(first[3]))
        let fixture = UUIDText.format(high: UInt64(bitPattern: newest + 1), low: 0x8000_0000_0000_0000)
        try SQLiteDatabase(path: dir.db).run("""
            INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                state, attempts, next_attempt_at, created_at, expires_at, updated_at)
            VALUES (?, ?, 'com.example.app', 'ff', 'S', X'01', 0, X'00', 'cred', 'delivered', 0, 0, 0, 0, 0)
            """, [.integer(newest + 1), .text(fixture)])
        let back = TestClock(start)
        let s = try SQLiteOutboxStore(path: dir.db, clock: back)
        defer { s.close() }
        let gate = try holdWriter(s)   // everything below lands in one batch
        let outcomes = Mutex<[UInt32: Result<IngestOutcome, StoreError>]>([:])
        let done = DispatchGroup()
        // Five new responses and a duplicate of a first-run row, in one batch.
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        for index in [UInt32(10), 11, 12, 1, 13, 14] {
            done.enter()
            s.submit(IngestRequest(response: sample(index: index), credentialHash: Credentials.hash(secret: secret))) { r in
                outcomes.withLock { $0[index] = r }
                done.leave()
            }
        }
        let batchesBefore = s.writerStats.batches
        gate.signal()
        done.wait()
        #expect(s.writerStats.batches - batchesBefore == 2)   // the held job's batch, then all six
        let got = outcomes.withLock { $0 }
        #expect(try got[1]?.get() == .duplicate(id: first[1], state: .queued))
        var newIDs: [String] = []
        for index in [UInt32(10), 11, 12, 13, 14] {
            guard case .accepted(let id) = try #require(try got[index]?.get()) else { Issue.record("\(index): \(String(describing: got[index]))"); continue }
            newIDs.append(id)
        }
        #expect(newIDs.count == 5 && Set(newIDs + first).count == 9)
        // Above every earlier id despite the clock, and past the fixture's word.
        let highs = newIDs.compactMap(UUIDText.high64)
        #expect(highs.count == 5 && highs.allSatisfy { $0 > newest + 1 } && highs == highs.sorted())
        #expect(highs.first == newest + 2)
        for id in newIDs + first { #expect(try s.response(id: id)?.id == id) }
        #expect(try s.counts().byState[.queued] == 9)
    }
}

@Suite struct IDHighWordTests {
    @Test func mintedHighWordIsTheIDsFirst64Bits() throws {
        var gen = TimeOrderedIDs()
        for i in 0..<5000 {
            let (id, high) = gen.mint(nowMillis: 1_800_000_000_000 + Int64(i / 3000), random: [0xff, 1, 2, 3, 4, 5, 6, UInt8(i & 0xff)])
            #expect(UUIDText.high64(id) == high)
            #expect(UUIDText.high64(id.uppercased()) == high)
        }
        #expect(UUIDText.high64("ffffffff-ffff-4fff-8fff-ffffffffffff") == Int64(bitPattern: 0xffff_ffff_ffff_4fff))
        #expect(UUIDText.high64("00000000-0000-4001-8fff-ffffffffffff") == 0x4001)
        for bad in ["", "0123abcd-ef01-4234-8aaa-00000000000", "0123abcd-ef01-4234-8aaa-00000000000g", "0123abcdef01-4234-8aaa-0000000000001", "id0"] {
            #expect(UUIDText.high64(bad) == nil, "\(bad)")
        }
    }

    @Test func advancePastATakenHighWordMovesOnlyForward() throws {
        var gen = TimeOrderedIDs()
        let ms: Int64 = 1_800_000_000_000
        let first = gen.mint(nowMillis: ms, random: [0, 0, 0, 0, 0, 0, 0, 0]).high
        // A taken key further on in the same millisecond: the next id is just past it.
        gen.advance(pastHigh: first + 7)
        #expect(gen.mint(nowMillis: ms, random: [0, 0, 0, 0, 0, 0, 0, 0]).high == first + 8)
        // Older keys and v4 high words change nothing.
        gen.advance(pastHigh: first)
        gen.advance(pastHigh: Int64(bitPattern: 0x7fff_ffff_ffff_4fff))
        #expect(gen.mint(nowMillis: ms, random: [0, 0, 0, 0, 0, 0, 0, 0]).high == first + 9)
        // The last counter of a millisecond: the next id borrows the following millisecond.
        gen.advance(pastHigh: (first & ~0xfff) | 0xfff)
        #expect(gen.mint(nowMillis: ms, random: [0, 0, 0, 0, 0, 0, 0, 0]).high == ((ms + 1) << 16 | 0x7000))
    }
}
