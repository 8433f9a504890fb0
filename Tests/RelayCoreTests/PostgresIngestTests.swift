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

    /// The INSERT's re-check probes keys (credentials, the token marks) in a plan made on empty
    /// tables: unregistered_tokens is never
    /// pruned, and a scan of it per batch would grow with every 410 ever recorded.
    @Test func theInsertsReCheckProbesKeysEvenPlannedOnAnEmptyTable() throws {
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        let plan = try genericPlan(PostgresOutboxStore.insertSQL,
                                   types: "text[], text[], text[], text[], bytea[], bigint[], bytea[], text[], bigint[], bigint[], bigint[], bigint[], bigint",
                                   args: Array(repeating: "NULL", count: 13).joined(separator: ", "))
        #expect(plan.contains("Index Scan using unregistered_tokens_pkey") || plan.contains("Index Only Scan using unregistered_tokens_pkey"), "\(plan)")
        #expect(plan.contains("Index Scan using credentials_pkey"), "\(plan)")
        #expect(!plan.contains("Seq Scan on"), "\(plan)")
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

/// One write transaction (issue 30 item 3, issue 29 item 6): the batch's read is its own
/// round trip, but the INSERT checks the credential and the token's 410 record again under
/// locks that a revocation and a 410's record take exclusive, so neither slips in between
/// the check and the commit: a revocation or a 410 committed after the read refuses the
/// batch (401, 410), and one that starts during the write waits for its commit.
extension PostgresIngestBatchTests {
    /// A credential, one response of `token` stored and claimed (the push on its way); nil
    /// (recorded) when the store refused it.
    func oneRowClaimed(_ s: PostgresOutboxStore, token: String) throws -> (credential: CreatedCredential, sent: [OutboxRow])? {
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted = try s.ingestNow(sample(token: token, index: 1), secret: c.secret, apps: apps) else {
            Issue.record("not accepted")
            return nil
        }
        return (c, try s.claimDue(limit: 1))
    }

    /// Runs `body` once, on the ingest thread, between the next batch's read and its write.
    func betweenReadAndWrite(_ s: PostgresOutboxStore, _ body: @escaping @Sendable () throws -> Void) {
        let once = Mutex(true)
        s.ingestWillWrite.withLock {
            $0 = {
                guard once.withLock({ let first = $0; $0 = false; return first }) else { return }
                do { try body() } catch { Issue.record("between read and write: \(error)") }
            }
        }
    }

    /// Waits until one of the store's connections waits for an advisory lock (ingest's locks).
    func waitForAdvisoryWait() throws {
        for _ in 0..<1000 {
            if try f.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND application_name = '\(f.schema)'") != [["0"]] { return }
            usleep(10_000)
        }
        throw StoreError.invalid("nothing waited for an advisory lock")
    }

    @Test func aRevocationCommittedBetweenTheReadAndTheInsertIsRefused() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        betweenReadAndWrite(s) {
            let revoked = try s.revokeCredential(id: c.record.id)   // committed and returned
            #expect(revoked)
        }
        s.ingestSettings = settings()
        #expect(try s.ingestNow(sample(index: 1), secret: c.secret, apps: apps) == .unauthorized)
        #expect(try f.sql("SELECT count(*) FROM responses") == [["0"]])
        #expect(try f.sql("SELECT last_used_at FROM credentials WHERE id = '\(c.record.id)'") == [[nil]])
        #expect(try s.ingestNow(sample(index: 2), secret: c.secret, apps: apps) == .unauthorized)
        // The place taken under the outbox bound was given back.
        let d = try s.createCredential(name: "d", apps: ["com.example.app"])
        guard case .accepted = try s.ingestNow(sample(index: 3), secret: d.secret, apps: apps, maxPending: 1) else { Issue.record("bound not given back"); return }
    }

    /// A token mark recorded between the read and the insert (a 410, or the marks' other kind,
    /// BadDeviceToken: 400) refuses the batch's row, and the token stays refused.
    @Test(arguments: [("Unregistered", IngestOutcome.unregistered), ("BadDeviceToken", .badDeviceToken)])
    func aMarkRecordedBetweenTheReadAndTheInsertIsRefusedAndTheTokenStaysRefused(reason: String, refusal: IngestOutcome) throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let token = String(repeating: "de", count: 32)
        guard let claimed = try oneRowClaimed(s, token: token) else { return }
        let (c, sent) = claimed
        #expect(sent.count == 1)
        f.clock.advance(5)
        let answeredAt = f.clock.nowMillis()
        f.clock.advance(5)
        betweenReadAndWrite(s) {
            try s.apply([DeliveryUpdate(id: sent[0].id, pushToken: token,
                                        outcome: .unregistered(reason: reason, apnsTimestamp: answeredAt), attempt: nil)])
        }
        #expect(try s.ingestNow(sample(token: token, index: 2), secret: c.secret, apps: apps) == refusal)
        f.clock.advance(5)
        #expect(try s.ingestNow(sample(token: token, index: 3), secret: c.secret, apps: apps) == refusal)
        #expect(try f.sql("SELECT count(*) FROM responses WHERE push_token = '\(token)'") == [["1"]])
    }

    /// A probe let through on another node (its hold re-armed) between this batch's read, which
    /// saw the hold over, and its insert: the batch is refused, as one probe per hold allows.
    @Test func aProbeTakenByAnotherNodeBetweenTheReadAndTheInsertIsRefused() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let token = String(repeating: "dc", count: 32)
        guard let claimed = try oneRowClaimed(s, token: token) else { return }
        let (c, sent) = claimed
        try s.apply([DeliveryUpdate(id: sent[0].id, pushToken: token,
                                    outcome: .unregistered(reason: "Unregistered", apnsTimestamp: f.clock.nowMillis()), attempt: nil)])
        f.clock.advance(3_600_001)   // the quarantine is over: the next response is the probe
        betweenReadAndWrite(s) {
            _ = try f.sql("UPDATE unregistered_tokens SET recorded_at = \(f.clock.nowMillis()) WHERE token = '\(token)'")
        }
        #expect(try s.ingestNow(sample(token: token, index: 2), secret: c.secret, apps: apps) == .unregistered)
        #expect(try f.sql("SELECT count(*) FROM responses WHERE push_token = '\(token)'") == [["1"]])
    }

    /// The other order: the write holds its locks (here stalled by another transaction holding
    /// the key it inserts) when the revocation starts. The revocation waits on the credentials
    /// lock, before touching the row, so the write's last_used_at UPDATE of the same row does
    /// not deadlock with it; the batch commits (202: admitted before the revocation), then the
    /// revocation, and the next request is 401.
    @Test func aRevocationDuringTheWriteWaitsForItsCommit() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let blocker = try PostgresConnection(url: blockerURL, applicationName: "blocker")
        try blocker.execute("""
            BEGIN; INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                state, next_attempt_at, created_at, expires_at, updated_at)
            VALUES ('blocker', 'com.example.app', '\(String(repeating: "ab", count: 32))', '6F9619FF-8B86-D011-B42D-00C04FC964FF',
                    '\\x01020304', 1, '\\x00', 'x', 'queued', 0, 0, 0, 0)
            """)
        let (first, firstDone) = submitWithoutWaiting(s, request(sample(index: 1), c.secret))
        try waitForLockWait(f)   // the INSERT waits for the blocker's key, holding the ingest locks
        let revoked = ResultBox<Result<Bool, Error>>()
        let revokeDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            revoked.value = Result { try s.revokeCredential(id: c.record.id) }
            revokeDone.signal()
        }
        try waitForAdvisoryWait()
        #expect(revoked.value == nil)
        try blocker.execute("ROLLBACK")
        #expect(firstDone.wait(timeout: .now() + 60) == .success)
        #expect(revokeDone.wait(timeout: .now() + 60) == .success)
        guard case .success(.accepted)? = first.value else { Issue.record("\(String(describing: first.value))"); return }
        #expect(try revoked.value?.get() == true)
        #expect(try s.ingestNow(sample(index: 2), secret: c.secret, apps: apps) == .unauthorized)
    }

    /// A 410 recorded while a write holds the token's lock waits for its commit; that row then
    /// counts in the cutoff: the token stays refused, and the row fails without a push.
    @Test func a410DuringTheWriteWaitsForItsCommitAndTheTokenStaysRefused() throws {
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let token = String(repeating: "de", count: 32)
        guard let claimed = try oneRowClaimed(s, token: token) else { return }
        let (c, sent) = claimed
        #expect(sent.count == 1)
        f.clock.advance(5)
        let answeredAt = f.clock.nowMillis()
        f.clock.advance(5)
        let blocker = try PostgresConnection(url: blockerURL, applicationName: "blocker")
        try blocker.execute("""
            BEGIN; INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                state, next_attempt_at, created_at, expires_at, updated_at)
            VALUES ('blocker', 'com.example.app', '\(token)', '6F9619FF-8B86-D011-B42D-00C04FC964FF',
                    '\\x01020304', 2, '\\x00', 'x', 'queued', 0, 0, 0, 0)
            """)
        let (racing, racingDone) = submitWithoutWaiting(s, request(sample(token: token, index: 2), c.secret))
        try waitForLockWait(f)
        let applied = ResultBox<StoreError?>()
        let appliedDone = DispatchSemaphore(value: 0)
        s.apply([DeliveryUpdate(id: sent[0].id, pushToken: token, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: answeredAt),
                                attempt: nil)]) { error in
            applied.value = .some(error)
            appliedDone.signal()
        }
        try waitForAdvisoryWait()
        #expect(applied.value == nil)
        try blocker.execute("ROLLBACK")
        #expect(racingDone.wait(timeout: .now() + 60) == .success)
        #expect(appliedDone.wait(timeout: .now() + 60) == .success)
        guard case .success(.accepted(let racingID))? = racing.value else { Issue.record("\(String(describing: racing.value))"); return }
        #expect(applied.value == .some(nil))
        f.clock.advance(5)
        #expect(try s.ingestNow(sample(token: token, index: 3), secret: c.secret, apps: apps) == .unregistered)
        // The racing row is failed at its claim, not pushed.
        #expect(try s.claimDue(limit: 10).isEmpty)
        #expect(try f.sql("SELECT state, last_reason FROM responses WHERE id = '\(racingID)'") == [["failed", StoreRules.unregisteredReason]])
    }

    /// claimDue is one statement: a claim that fails (here a trigger refuses the due row's
    /// UPDATE) leaves every row as it was, the expired lease it would have taken over too.
    /// Before, the reclaim of expired leases committed on its own first: those rows stayed
    /// leased to this node and unsent until the lease ran out again.
    @Test func aClaimThatFailsChangesNoRow() throws {
        let dead = try f.openPostgres(nodeID: "dead", leaseMillis: 1_000)
        let c = try dead.createCredential(name: "c", apps: ["com.example.app"])
        _ = try dead.ingestNow(sample(index: 1), secret: c.secret, apps: apps)
        #expect(try dead.claimDue(limit: 1).count == 1)
        dead.close()
        f.clock.advance(2_000)   // its lease expired
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        _ = try s.ingestNow(sample(index: 2), secret: c.secret, apps: apps)
        let admin = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
        try admin.execute("""
            CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF OLD.state = 'queued' THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$;
            CREATE TRIGGER refuse_claim BEFORE UPDATE ON responses FOR EACH ROW EXECUTE FUNCTION refuse_claim();
            """)
        #expect(throws: StoreError.self) { try s.claimDue(limit: 10) }
        #expect(try f.sql("SELECT message_index, state, lease_owner FROM responses ORDER BY message_index") == [["1", "inflight", "dead"], ["2", "queued", nil]])
        try admin.execute("DROP TRIGGER refuse_claim ON responses")
        #expect(try s.claimDue(limit: 10).map(\.messageIndex).sorted() == [1, 2])
    }
}
