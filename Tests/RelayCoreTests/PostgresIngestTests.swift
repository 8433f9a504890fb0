// The PostgreSQL ingest path below the contract: binary array parameters, the plans of the
// batch statements, and how a batch fails. The contract shared with SQLite is in StoreTests.swift.
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import RelayCore

@Suite(.enabled(if: PGTest.url != nil, Comment(rawValue: PGTest.skipMessage)))
struct PostgresIngestTests {
    let f: StoreFixture
    init() throws { f = try StoreFixture(.postgres) }

    @Test func binaryArrayParametersRoundTripEveryElement() throws {
        let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
        let texts: [String?] = ["plain", "", nil, "quote \" backslash \\ comma , braces {} NULL", "ünïcødé ✓", String(repeating: "x", count: 5000)]
        let got = try c.query("SELECT x FROM unnest($1::text[]) WITH ORDINALITY AS u(x, n) ORDER BY n", [.textArray(texts)]).map { $0[0] }
        #expect(got == texts.map { $0.map(PGValue.text) ?? .null })
        let blobs: [[UInt8]] = [[], [0], [0, 0x5c, 0x22, 0xff], Array(0...255)]
        #expect(try c.query("SELECT x FROM unnest($1::bytea[]) WITH ORDINALITY AS u(x, n) ORDER BY n", [.bytesArray(blobs)]).map { $0[0] }
                == blobs.map(PGValue.bytes))
        let ints: [Int64?] = [0, -1, nil, .min, .max, 1_800_000_000_000]
        #expect(try c.query("SELECT x FROM unnest($1::bigint[]) WITH ORDINALITY AS u(x, n) ORDER BY n", [.intArray(ints)]).map { $0[0] }
                == ints.map { $0.map(PGValue.int) ?? .null })
        // Empty arrays are zero-dimensional, as PostgreSQL itself sends them.
        let empty = try c.query("SELECT cardinality($1::text[]), cardinality($2::bytea[]), cardinality($3::bigint[])",
                                [.textArray([]), .bytesArray([]), .intArray([])])
        #expect(empty == [[.int(0), .int(0), .int(0)]])
    }

    /// The plan PostgreSQL caches for a prepared statement once it stops planning per call.
    func genericPlan(_ sql: String, types: String, args: String) throws -> String {
        let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
        try c.execute("SET plan_cache_mode = force_generic_plan")
        try c.execute("PREPARE p(\(types)) AS \(sql)")
        return try c.query("EXPLAIN EXECUTE p(\(args))").compactMap { $0.first?.string }.joined(separator: "\n")
    }

    @Test func theDedupeLookupProbesTheUniqueKeyEvenPlannedOnAnEmptyTable() throws {
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        // A join planned on the empty table of a fresh database hashed the batch's keys and read
        // every row of responses on each batch from then on.
        let plan = try genericPlan(PostgresOutboxStore.existingSQL, types: "text[], text[], bytea[], bigint[]", args: "NULL, NULL, NULL, NULL")
        #expect(plan.contains("Index Scan using responses_dedupe_key"), "\(plan)")
        #expect(!plan.contains("Seq Scan on responses"), "\(plan)")
    }
}

/// Batches made on purpose: a first request waits for a lock on credentials on the one ingest
/// connection while the requests under test queue behind it, so they form the next batch.
@Suite(.enabled(if: PGTest.url != nil, Comment(rawValue: PGTest.skipMessage)))
struct PostgresIngestBatchTests {
    let f: StoreFixture
    let apps: Set<String> = ["com.example.app", "com.example.other"]
    init() throws { f = try StoreFixture(.postgres) }

    /// The fixture's schema under another application_name, so the store's own connections can
    /// be told apart (waitForLockWait, terminateStoreConnections).
    var blockerURL: String { (PGTest.url ?? "") + ((PGTest.url ?? "").contains("?") ? "&" : "?") + "options=-csearch_path%3D\(f.schema)&application_name=blocker" }

    func request(_ r: NewResponse, _ secret: String) -> IngestRequest {
        IngestRequest(response: r, credentialHash: Credentials.hash(secret: secret))
    }

    func settings(maxPending: Int = 1000) -> IngestStoreSettings {
        IngestStoreSettings(configuredApps: apps, ttlMillis: 60_000, maxPending: maxPending)
    }

    /// Submits `r`; its result is in the box once the semaphore is signalled.
    func submitWithoutWaiting(_ s: PostgresOutboxStore, _ r: IngestRequest) -> (ResultBox<Result<IngestOutcome, StoreError>>, DispatchSemaphore) {
        s.ingestSettings = settings()
        let result = ResultBox<Result<IngestOutcome, StoreError>>()
        let done = DispatchSemaphore(value: 0)
        s.submit(r) { answer in
            result.value = answer
            done.signal()
        }
        return (result, done)
    }

    /// Every result of `requests`, queued behind a gate request so they form one batch, and how
    /// many batches committed meanwhile (2 when the gate and they both committed).
    func oneBatch(_ s: PostgresOutboxStore, _ gateSecret: String, _ requests: [IngestRequest], maxPending: Int = 1000) throws
        -> (results: [Result<IngestOutcome, StoreError>], committed: Int) {
        s.ingestSettings = settings(maxPending: maxPending)
        let blocker = try PostgresConnection(url: blockerURL, applicationName: "blocker")
        try blocker.execute("BEGIN; LOCK TABLE credentials IN ACCESS EXCLUSIVE MODE")
        let results = Mutex<[Int: Result<IngestOutcome, StoreError>]>([:])
        let done = DispatchGroup()
        let before = s.writerStats.batches
        done.enter()
        s.submit(request(sample(token: String(repeating: "0f", count: 32), index: 999), gateSecret)) { _ in done.leave() }
        try waitForLockWait(f)
        for (i, r) in requests.enumerated() {
            done.enter()
            s.submit(r) { result in
                results.withLock { $0[i] = result }
                done.leave()
            }
        }
        try blocker.execute("COMMIT")
        done.wait()
        return (results.withLock { r in (0..<requests.count).map { r[$0]! } }, s.writerStats.batches - before)
    }

    @Test func duplicatesInsideOneBatchShareTheFirstOnesRowAndOtherCredentialsConflict() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"]), b = try s.createCredential(name: "b", apps: ["com.example.app"])
        guard case .accepted(let stored) = try s.ingestNow(sample(index: 0), secret: a.secret) else { Issue.record("not accepted"); return }
        let batch = try oneBatch(s, a.secret, [
            request(sample(index: 1), a.secret), request(sample(index: 1), a.secret), request(sample(index: 1), b.secret),
            request(sample(index: 0), a.secret), request(sample(index: 0), b.secret), request(sample(index: 2), a.secret),
        ])
        #expect(batch.committed == 2)
        let got = try batch.results.map { try $0.get() }
        guard case .accepted(let first) = got[0], case .accepted(let last) = got[5] else { Issue.record("\(got)"); return }
        #expect(got[1] == .duplicate(id: first, state: .queued))
        #expect(got[2] == .conflict)
        #expect(got[3] == .duplicate(id: stored, state: .queued))
        #expect(got[4] == .conflict)
        #expect(Set([stored, first, last]).count == 3)
        #expect(try f.sql("SELECT count(*) FROM responses") == [["4"]])  // the gate's row too
    }

    /// A marked token past its hold lets ONE response of a batch through as the probe (the
    /// hold restarts in the batch's commit); the others of that batch are refused.
    @Test func oneProbePerHoldInsideOneBatch() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 0), secret: a.secret)
        let row = try s.claimDue(limit: 1)[0]
        try StoreContractTests.mark(s, row, at: f.clock.nowMillis())
        f.clock.advance(3_600_000)
        let batch = try oneBatch(s, a.secret, (1...3).map { request(sample(index: UInt32($0)), a.secret) })
        let got = try batch.results.map { try $0.get() }
        guard case .accepted = got[0] else { Issue.record("\(got)"); return }
        #expect(Array(got[1...]) == [.unregistered, .unregistered])
        #expect(try s.unregisteredTokens().first?.recordedAt == f.clock.nowMillis())
    }

    /// The same four fields under two apps in one batch are two keys: both rows are stored, and
    /// each app's repeat in the batch shares its own app's row.
    @Test func oneBatchStoresTheSameFieldsUnderTwoApps() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"]), b = try s.createCredential(name: "b", apps: ["com.example.other"])
        let batch = try oneBatch(s, a.secret, [request(sample(index: 1), a.secret), request(sample(index: 1), b.secret),
                                               request(sample(index: 1), b.secret), request(sample(index: 1), a.secret)])
        #expect(batch.committed == 2)
        let got = try batch.results.map { try $0.get() }
        guard case .accepted(let idA) = got[0], case .accepted(let idB) = got[1] else { Issue.record("\(got)"); return }
        #expect(idA != idB)
        #expect(got[2] == .duplicate(id: idB, state: .queued))
        #expect(got[3] == .duplicate(id: idA, state: .queued))
        #expect(try f.sql("SELECT app FROM responses WHERE message_index = 1 ORDER BY app") == [["com.example.app"], ["com.example.other"]])
    }

    /// A credential's second sealed box for a key within one batch (and after it): refused with
    /// the id of the row the batch stored; the same box shares the id; another credential's is a
    /// conflict.
    @Test func anotherSealedBoxInOneBatchIsRefusedWithTheStoredID() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"]), b = try s.createCredential(name: "b", apps: ["com.example.app"])
        func boxed(_ box: UInt8) -> NewResponse { var r = sample(index: 1); r.encryptedData = [UInt8](repeating: box, count: 40); return r }
        let batch = try oneBatch(s, a.secret, [request(boxed(5), a.secret), request(boxed(6), a.secret), request(boxed(5), a.secret),
                                               request(boxed(6), b.secret)])
        #expect(batch.committed == 2)
        let got = try batch.results.map { try $0.get() }
        guard case .accepted(let id) = got[0] else { Issue.record("\(got)"); return }
        #expect(got[1] == .indexReused(id: id))
        #expect(got[2] == .duplicate(id: id, state: .queued))
        #expect(got[3] == .conflict)
        #expect(try s.ingestNow(boxed(6), secret: a.secret) == .indexReused(id: id))
        #expect(try f.sql("SELECT count(*) FROM responses WHERE message_index = 1") == [["1"]])
    }

    /// The ingest queue is bounded like SQLite's writer queue (StoreRules.maxWaitingIngests):
    /// with the ingest thread held by a lock, requests past the bound are refused at once with
    /// `.unavailable` (503 storage_unavailable) instead of growing the relay's memory, and the
    /// queued ones all commit once the lock goes.
    @Test func ingestsPastTheQueueBoundAreRefusedAndTheRestCommit() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        s.ingestSettings = settings(maxPending: 100_000)
        let bound = s.ingestWorker.maxQueuedItems
        #expect(bound == StoreRules.maxWaitingIngests)
        let blocker = try PostgresConnection(url: blockerURL, applicationName: "blocker")
        try blocker.execute("BEGIN; LOCK TABLE credentials IN ACCESS EXCLUSIVE MODE")
        let done = DispatchGroup()
        done.enter()
        s.submit(request(sample(token: String(repeating: "0f", count: 32), index: 0), c.secret)) { _ in done.leave() }
        try waitForLockWait(f)   // the one ingest thread holds the gate's batch
        let accepted = Mutex(0), refused = Mutex(0), other = Mutex<[String]>([])
        for i in 0..<(bound + 5) {
            done.enter()
            s.submit(request(sample(index: UInt32(i)), c.secret)) { r in
                switch r {
                case .success(.accepted): accepted.withLock { $0 += 1 }
                case .failure(.unavailable(let why)) where why.contains("queue is full"): refused.withLock { $0 += 1 }
                default: other.withLock { $0.append("\(r)") }
                }
                done.leave()
            }
        }
        #expect(refused.withLock { $0 } == 5)   // answered at once, while the lock still holds
        try blocker.execute("COMMIT")
        done.wait()
        #expect(accepted.withLock { $0 } == bound)
        #expect(other.withLock { $0 }.isEmpty)
        #expect(try f.sql("SELECT count(*) FROM responses") == [["\(bound + 1)"]])
    }

    @Test func oneBatchMixingCredentialsAndRefusalsDecidesEachRequestAlone() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let good = try s.createCredential(name: "good", apps: ["com.example.app"])
        let two = try s.createCredential(name: "two", apps: ["com.example.app", "com.example.other"])
        let gone = try s.createCredential(name: "gone", apps: ["com.example.app"])
        #expect(try s.revokeCredential(id: gone.record.id))
        // A token APNs called unregistered.
        let dead = String(repeating: "de", count: 32)
        _ = try s.ingestNow(sample(token: dead, index: 1), secret: good.secret)
        let rows = try s.claimDue(limit: 1)
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: dead, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: f.clock.nowMillis() + 1),
                                    attempt: nil)])
        f.clock.advance(5)
        // The gate's row makes 1 pending; the bound of 3 leaves room for two more.
        let batch = try oneBatch(s, good.secret, [
            request(sample(index: 1), "rk_unknown"),
            request(sample(index: 1), gone.secret),
            request(sample(index: 1), two.secret),
            request(sample(index: 1, app: "com.example.other"), good.secret),
            request(sample(index: 1), good.secret),
            request(sample(token: dead, index: 2), good.secret),
            request(sample(index: 2), good.secret),
            request(sample(index: 3), good.secret),
            request(sample(index: 3), good.secret),
        ], maxPending: 3)
        #expect(batch.committed == 2)
        let got = try batch.results.map { try $0.get() }
        #expect(Array(got[0..<4]) == [.unauthorized, .unauthorized, .appRequired, .forbidden(app: "com.example.other")])
        guard case .accepted(let one) = got[4], case .accepted(let twoID) = got[6] else { Issue.record("\(got)"); return }
        #expect(got[5] == .unregistered)
        #expect(got[7] == .overCapacity && got[8] == .overCapacity)
        let stored = Set(try f.sql("SELECT id FROM responses WHERE state = 'queued'").compactMap { $0[0] })
        #expect(stored.isSuperset(of: [one, twoID]) && stored.count == 3)
    }

    /// A trigger that makes the INSERT fail when a row carries `token`.
    func refuseInsert(of token: String) throws {
        let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
        try c.execute("""
            CREATE FUNCTION refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.push_token = '\(token)' THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$;
            CREATE TRIGGER refuse_row BEFORE INSERT ON responses FOR EACH ROW EXECUTE FUNCTION refuse_row();
            """)
    }

    @Test func aFailedInsertFailsEveryRequestOfTheBatchAndStoresNothing() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let gate = try s.createCredential(name: "gate", apps: ["com.example.app"])
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let poison = String(repeating: "ee", count: 32)
        try refuseInsert(of: poison)
        let batch = try oneBatch(s, gate.secret, [
            request(sample(index: 1), c.secret), request(sample(token: poison, index: 1), c.secret),
            request(sample(index: 2), c.secret), request(sample(index: 2), c.secret),
        ], maxPending: 3)
        #expect(batch.committed == 1)  // the gate's
        for r in batch.results {
            guard case .failure(.postgres(_, let message, _)) = r else { Issue.record("not failed by the INSERT: \(r)"); continue }
            #expect(message.contains("refused by the test"))
        }
        // Nothing half-stored: no row, and the credential's last_used_at (same transaction) unchanged.
        #expect(try f.sql("SELECT count(*) FROM responses WHERE credential_id = '\(c.record.id)'") == [["0"]])
        #expect(try f.sql("SELECT last_used_at FROM credentials WHERE id = '\(c.record.id)'") == [[nil]])
        // The places the batch took under the outbox bound were given back (1 pending: the gate's row).
        guard case .accepted = try s.ingestNow(sample(index: 1), secret: c.secret, maxPending: 2) else { Issue.record("bound not given back"); return }
    }

    @Test func aConnectionLostAfterTheInsertAnsweredButBeforeTheCommitGivesNo202() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        // The write pipeline is INSERT ... RETURNING, then last_used_at (first use): holding the
        // credential's row lock stops it after the INSERT's rows came back, before the commit.
        let blocker = try PostgresConnection(url: blockerURL, applicationName: "blocker")
        try blocker.execute("BEGIN; SELECT 1 FROM credentials WHERE id = '\(c.record.id)' FOR UPDATE")
        let (result, done) = submitWithoutWaiting(s, request(sample(index: 1), c.secret))
        try waitForLockWait(f)
        #expect(try terminateStoreConnections(f) >= 1)
        #expect(done.wait(timeout: .now() + 60) == .success)
        try blocker.execute("ROLLBACK")
        guard case .failure(.unavailable)? = result.value else { Issue.record("answered \(String(describing: result.value))"); return }
        #expect(try f.sql("SELECT count(*) FROM responses") == [["0"]])
        // The store reconnects by itself; the client's retry is stored.
        guard case .accepted = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("not accepted after the loss"); return }
    }

    @Test func aBatchWaitingForARowLockDoesNotHoldUpTheNextOne() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 2)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 0), secret: c.secret)  // last_used_at written: no touch below
        // Another transaction holds the key of index 1 (inserted, not committed): the batch
        // storing it waits for that transaction on one connection...
        let blocker = try PostgresConnection(url: blockerURL, applicationName: "blocker")
        try blocker.execute("""
            BEGIN; INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                state, next_attempt_at, created_at, expires_at, updated_at)
            SELECT 'blocker', app, push_token, session_id, key_id, 1, encrypted_data, credential_id, 'queued', 0, 0, 0, 0 FROM responses
            """)
        let (first, firstDone) = submitWithoutWaiting(s, request(sample(index: 1), c.secret))
        try waitForLockWait(f)
        // ...while the next batch commits on the other.
        let (second, secondDone) = submitWithoutWaiting(s, request(sample(index: 2), c.secret))
        let overtook = secondDone.wait(timeout: .now() + 30) == .success
        try blocker.execute("ROLLBACK")
        #expect(overtook)
        #expect(firstDone.wait(timeout: .now() + 60) == .success)
        guard case .success(.accepted)? = second.value, case .success(.accepted)? = first.value else {
            Issue.record("\(String(describing: first.value)) \(String(describing: second.value))"); return
        }
        #expect(try f.sql("SELECT count(*) FROM responses") == [["3"]])
    }
}
