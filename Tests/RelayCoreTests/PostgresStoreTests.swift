// PostgreSQL-only behaviour: several nodes on one database (SKIP LOCKED claims, leases and
// their expiry, shared pacing and unregistered tokens, concurrent migrations), group commit,
// and losing the connection. The contract shared with SQLite is in StoreTests.swift.
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import RelayCore

@Suite struct PostgresSetupTests {
    @Test(.enabled(if: PGTest.url != nil, Comment(rawValue: PGTest.skipMessage)))
    func postgresTestsAreConfigured() throws {
        let c = try PGTest.admin()
        #expect(c.serverVersion >= 150_000)
    }

    @Test func unreachableDatabaseIsAClearError() throws {
        // A loopback port nothing listens on (bound then closed).
        let port = try freeLoopbackPort()
        do {
            _ = try PostgresOutboxStore(options: PostgresStoreOptions(url: "postgresql://relay@127.0.0.1:\(port)/relay?connect_timeout=2"))
            Issue.record("opened a store on a closed port")
        } catch let e as StoreError {
            guard case .unavailable(let why) = e else { Issue.record("unexpected error \(e)"); return }
            #expect(why.contains("127.0.0.1") || why.contains("connect"))
        }
    }
}

@Suite(.enabled(if: PGTest.url != nil, Comment(rawValue: PGTest.skipMessage)))
struct PostgresStoreTests {
    let f: StoreFixture
    init() throws { f = try StoreFixture(.postgres) }

    func ingestMany(_ s: some OutboxStore, secret: String, count: Int, token: String = String(repeating: "ab", count: 32)) throws -> [String] {
        try (0..<count).map { i in
            guard case .accepted(let id) = try s.ingestNow(sample(token: token, index: UInt32(i)), secret: secret) else {
                throw StoreError.invalid("not accepted")
            }
            return id
        }
    }

    @Test func nodesStartingTogetherMigrateOnce() throws {
        let opened = Mutex<[PostgresOutboxStore]>([])
        let errors = Mutex<[String]>([])
        let group = DispatchGroup()
        for n in 0..<4 {
            group.enter()
            Thread.detachNewThread { [f] in
                do {
                    let s = try f.openPostgres(nodeID: "node-\(n)")
                    opened.withLock { $0.append(s) }
                } catch { errors.withLock { $0.append("\(error)") } }
                group.leave()
            }
        }
        group.wait()
        #expect(errors.withLock { $0 } == [])
        #expect(try f.sql("SELECT count(*) FROM relay_schema_version") == [["1"]])
        #expect(try f.schemaVersion == PostgresOutboxStore.schemaVersion)
        for s in opened.withLock({ $0 }) { s.close() }
    }

    /// A version-1 database (dedupe key without the app) holding rows of two apps: version 2
    /// replaces the UNIQUE key with one that holds the app and keeps every row as it was; each
    /// stored key answers as before (200 to its owner, 409 to its app's other credential), and
    /// another app's credential stores the same four fields beside it.
    @Test func aVersion1DatabaseUpgradesToAppScopedKeys() throws {
        let apps: Set<String> = ["com.example.app", "com.example.other"]
        let owners = [(id: "cred_a", app: "com.example.app", secret: Credentials.generateSecret()),
                      (id: "cred_b", app: "com.example.other", secret: Credentials.generateSecret()),
                      (id: "cred_a2", app: "com.example.app", secret: Credentials.generateSecret())]
        var gen = TimeOrderedIDs()
        var rows: [(i: Int, id: String, owner: Int, state: ResponseState)] = []
        do {
            let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
            try c.execute("CREATE TABLE relay_schema_version (version bigint NOT NULL); INSERT INTO relay_schema_version VALUES (1)")
            try c.execute(PostgresOutboxStore.migrations[0])
            for o in owners {
                try c.query("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ($1, $1, $2, $3, 0)",
                            [.text(o.id), .bytes(Credentials.hash(secret: o.secret)), .text(o.app)])
            }
            let now = f.clock.nowMillis()
            for i in 0..<12 {
                let id = gen.mint(nowMillis: now - 10_000 + Int64(i)).id
                let r = sample(token: String(format: "%064x", i % 4), index: UInt32(i)), owner = i % 3
                let state: ResponseState = i % 4 == 0 ? .delivered : .queued
                try c.query("""
                    INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                        state, attempts, next_attempt_at, created_at, expires_at, updated_at)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $10, $11, $10)
                    """, [.text(id), .text(owners[owner].app), .text(r.pushToken), .text(r.sessionIdentifier), .bytes(r.keyID), .int(Int64(i)),
                          .bytes(r.encryptedData), .text(owners[owner].id), .text(state.rawValue), .int(now - 10_000), .int(now + 86_400_000)])
                rows.append((i, id, owner, state))
            }
        }
        let columns = "id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state, created_at"
        let before = try f.sql("SELECT \(columns) FROM responses ORDER BY id")
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        #expect(try f.schemaVersion == PostgresOutboxStore.schemaVersion)
        #expect(try f.sql("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'responses'::regclass AND contype = 'u'")
                == [["UNIQUE (push_token, session_id, key_id, message_index, app)"]])
        #expect(try f.sql("SELECT \(columns) FROM responses ORDER BY id") == before)
        for r in rows {
            let request = sample(token: String(format: "%064x", r.i % 4), index: UInt32(r.i))
            #expect(try s.ingestNow(request, secret: owners[r.owner].secret, apps: apps) == .duplicate(id: r.id, state: r.state), "row \(r.i)")
            guard owners[r.owner].app == "com.example.app" else { continue }
            #expect(try s.ingestNow(request, secret: owners[r.owner == 0 ? 2 : 0].secret, apps: apps) == .conflict, "row \(r.i)")
            guard case .accepted(let id) = try s.ingestNow(request, secret: owners[1].secret, apps: apps) else {
                Issue.record("row \(r.i): the other app's key was not accepted"); continue
            }
            #expect(try s.response(id: id)?.app == "com.example.other")
        }
        #expect(try f.sql("SELECT count(*) FROM responses") == [["20"]])
    }

    @Test func twoNodesClaimDisjointRows() throws {
        let a = try f.openPostgres(nodeID: "a"), b = try f.openPostgres(nodeID: "b")
        defer { a.close(); b.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        var ids = Set<String>()
        for t in 0..<4 {
            ids.formUnion(try ingestMany(t % 2 == 0 ? a : b, secret: c.secret, count: 30, token: String(repeating: "a\(t)", count: 32)))
        }
        #expect(ids.count == 120)
        let claimedBy = Mutex<[String: [String]]>([:])
        let group = DispatchGroup()
        for (name, s) in [("a", a), ("b", b)] {
            group.enter()
            Thread.detachNewThread {
                while let rows = try? s.claimDue(limit: 7), !rows.isEmpty {
                    claimedBy.withLock { $0[name, default: []] += rows.map(\.id) }
                }
                group.leave()
            }
        }
        group.wait()
        let byNode = claimedBy.withLock { $0 }
        let all = byNode.values.flatMap { $0 }
        #expect(all.count == 120)
        #expect(Set(all) == ids)
        #expect(Set(byNode["a"] ?? []).isDisjoint(with: Set(byNode["b"] ?? [])))
        let owners = try f.sql("SELECT lease_owner, count(*) FROM responses GROUP BY lease_owner ORDER BY lease_owner")
        let leased: Int = owners.compactMap { Int($0[1] ?? "") }.reduce(0, +)
        #expect(leased == 120)
        #expect(Set(owners.compactMap { $0[0] }).isSubset(of: ["a", "b"]))
    }

    @Test func anExpiredLeaseMovesToAnotherNodeAndTheOldOwnersAnswerIsIgnored() throws {
        let a = try f.openPostgres(nodeID: "a", leaseMillis: 30_000), b = try f.openPostgres(nodeID: "b", leaseMillis: 30_000)
        defer { a.close(); b.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let ids = try ingestMany(a, secret: c.secret, count: 3)
        #expect(try a.claimDue(limit: 10).count == 3)
        // A live lease is neither claimable nor recoverable by another node.
        #expect(try b.claimDue(limit: 10).isEmpty)
        #expect(try b.recoverInflight() == 0)
        #expect(try b.nextDueAt() == f.clock.nowMillis() + 30_000)
        f.clock.advance(30_000)
        let taken = try b.claimDue(limit: 10)
        #expect(Set(taken.map(\.id)) == Set(ids))
        let t = f.clock.nowMillis()
        // Node a answers late: its attempt is recorded, its state change is not applied.
        try a.apply([DeliveryUpdate(id: ids[0], pushToken: taken[0].pushToken, outcome: .failed(reason: "BadDeviceToken"),
                                    attempt: AttemptRecord(responseID: ids[0], attemptedAt: t, status: 400, reason: "BadDeviceToken"))])
        #expect(try a.response(id: ids[0])?.state == .inflight)
        try b.apply([DeliveryUpdate(id: ids[0], pushToken: taken[0].pushToken, outcome: .delivered,
                                    attempt: AttemptRecord(responseID: ids[0], attemptedAt: t, status: 200, reason: nil))])
        let row = try #require(try a.response(id: ids[0]))
        #expect(row.state == .delivered && row.attempts == 1)
        #expect(try a.attemptNodes(responseID: ids[0]) == ["a", "b"])
        #expect(try f.sql("SELECT count(*) FROM responses WHERE lease_owner IS NOT NULL") == [["2"]])
    }

    /// Issue 30 item 6: a node's push outlived its lease, the same node claimed the row again;
    /// the first push's late answer (a timeout: retry) must not land on the new lease, and the
    /// second push's 200 must. Without the epoch the owner alone matched: the row went to retry
    /// and the 200 was dropped (checked).
    @Test func aLateAnswerNeverLandsOnANewerLeaseOfTheSameNode() throws {
        let a = try f.openPostgres(nodeID: "a", leaseMillis: 30_000)
        defer { a.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let id = try #require(try ingestMany(a, secret: c.secret, count: 1).first)
        let first = try #require(try a.claimDue(limit: 10).first)
        f.clock.advance(30_000)
        let second = try #require(try a.claimDue(limit: 10).first)
        #expect(first.id == id && second.id == id)
        #expect(second.leaseEpoch == first.leaseEpoch + 1)
        let t = f.clock.nowMillis()
        try a.apply([DeliveryUpdate(id: id, pushToken: first.pushToken, outcome: .retry(at: t + 5_000, paceTokenUntil: nil),
                                    attempt: AttemptRecord(responseID: id, attemptedAt: t, status: nil, reason: "timeout"),
                                    leaseEpoch: first.leaseEpoch)])
        #expect(try a.response(id: id)?.state == .inflight)
        try a.apply([DeliveryUpdate(id: id, pushToken: second.pushToken, outcome: .delivered,
                                    attempt: AttemptRecord(responseID: id, attemptedAt: t, status: 200, reason: nil),
                                    leaseEpoch: second.leaseEpoch)])
        let row = try #require(try a.response(id: id))
        #expect(row.state == .delivered && row.attempts == 1 && row.lastStatus == 200)
        #expect(try a.attemptNodes(responseID: id) == ["a", "a"])
    }

    @Test func aRestartedNodeTakesBackOnlyItsOwnLeases() throws {
        let a = try f.openPostgres(nodeID: "a"), b = try f.openPostgres(nodeID: "b")
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        _ = try ingestMany(a, secret: c.secret, count: 4)
        let mine = try a.claimDue(limit: 2), theirs = try b.claimDue(limit: 2)
        #expect(mine.count == 2 && theirs.count == 2)
        a.close()
        let again = try f.openPostgres(nodeID: "a")
        defer { again.close(); b.close() }
        #expect(try again.recoverInflight() == 2)
        #expect(Set(try again.claimDue(limit: 10).map(\.id)) == Set(mine.map(\.id)))
        #expect(try again.list(OutboxFilter(state: .inflight)).count == 4)
    }

    @Test func pacingAndUnregisteredTokensAreSharedBetweenNodes() throws {
        let a = try f.openPostgres(nodeID: "a"), b = try f.openPostgres(nodeID: "b")
        defer { a.close(); b.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let paced = String(repeating: "11", count: 32), dead = String(repeating: "22", count: 32)
        _ = try a.ingestNow(sample(token: paced, index: 1), secret: c.secret)
        _ = try a.ingestNow(sample(token: dead, index: 1), secret: c.secret)
        let rows = try a.claimDue(limit: 2)
        #expect(rows.count == 2)
        let now = f.clock.nowMillis()
        try a.apply(rows.map { r in
            r.pushToken == paced
                ? DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .retry(at: now + 60_000, paceTokenUntil: now + 60_000), attempt: nil)
                : DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: now + 1), attempt: nil)
        })
        f.clock.advance(5)
        // Node b sees node a's findings.
        #expect(try b.ingestNow(sample(token: dead, index: 2), secret: c.secret) == .unregistered)
        guard case .accepted(let id) = try b.ingestNow(sample(token: paced, index: 2), secret: c.secret) else { Issue.record("refused"); return }
        #expect(try b.response(id: id)?.nextAttemptAt == now + 60_000)
        #expect(try b.claimDue(limit: 10).isEmpty)
        #expect(try b.unregisteredTokens().map(\.token) == [dead])
    }

    @Test func theSameResponseOnTwoNodesAtOnceIsStoredOnce() throws {
        let a = try f.openPostgres(nodeID: "a"), b = try f.openPostgres(nodeID: "b")
        defer { a.close(); b.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        for s in [a, b] { s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000) }
        let outcomes = Mutex<[IngestOutcome]>([])
        let group = DispatchGroup()
        for i in 0..<40 {
            for s in [a, b] {
                group.enter()
                s.submit(IngestRequest(response: sample(index: UInt32(i)), credentialHash: Credentials.hash(secret: c.secret))) { r in
                    if case .success(let o) = r { outcomes.withLock { $0.append(o) } }
                    group.leave()
                }
            }
        }
        group.wait()
        let all = outcomes.withLock { $0 }
        #expect(all.count == 80)
        #expect(all.filter { if case .accepted = $0 { true } else { false } }.count == 40)
        #expect(all.filter { if case .duplicate = $0 { true } else { false } }.count == 40)
        #expect(try f.sql("SELECT count(*) FROM responses") == [["40"]])
    }

    /// The dispatcher hears of committed rows through its channel (rows are inserted queued,
    /// nothing is handed off, whatever room it offers); a batch that inserted nothing says nothing.
    @Test func aCommitThatInsertedRowsWakesTheDispatcherChannel() throws {
        let ch = DispatchChannel()
        ch.open(capacity: 4)
        let s = try f.openPostgres(nodeID: "a", observer: ch)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        #expect(ch.take(waitingMillis: 0).isEmpty)
        guard case .accepted = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("refused"); return }
        let inbox = ch.take(waitingMillis: 0)
        #expect(inbox.mayHaveDue && inbox.rows.isEmpty)
        guard case .duplicate = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("not a duplicate"); return }
        #expect(ch.take(waitingMillis: 0).isEmpty)
    }

    @Test func queuedIngestsCommitInOneTransaction() throws {
        // One ingest connection: with more, the next free one takes part of the queue.
        let s = try f.openPostgres(nodeID: "a", ingestConnections: 1)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let before = s.writerStats.batches
        // checkWritable runs on the ingest thread; a backend holding an exclusive lock on the
        // credentials table makes the first batch wait, so the next 100 queue up behind it.
        let blocker = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-blocker")
        try blocker.execute("BEGIN; LOCK TABLE credentials IN ACCESS EXCLUSIVE MODE")
        let done = DispatchGroup()
        let results = Mutex<[IngestOutcome]>([])
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        for i in 0..<101 {
            done.enter()
            s.submit(IngestRequest(response: sample(index: UInt32(i)), credentialHash: Credentials.hash(secret: c.secret))) { r in
                if case .success(let o) = r { results.withLock { $0.append(o) } }
                done.leave()
            }
            if i == 0 { try waitForLockWait(f) }
        }
        try blocker.execute("COMMIT")
        done.wait()
        #expect(results.withLock { $0.count } == 101)
        #expect(results.withLock { $0.allSatisfy { if case .accepted = $0 { true } else { false } } })
        // The first submission alone, then the 100 that queued behind it.
        #expect(s.writerStats.batches - before == 2)
    }

    /// The dispatcher's apply is queued on the dispatch connection's thread: a write that waits
    /// for a row lock held elsewhere does not hold up the caller (the dispatcher thread, which
    /// meanwhile sends handed-off rows); it completes once the lock is gone.
    @Test func theDispatchersApplyDoesNotWaitForTheDatabase() throws {
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let id = try ingestMany(s, secret: c.secret, count: 1)[0]
        let row = try #require(try s.claimDue(limit: 1).first)
        let blocker = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-blocker")
        try blocker.execute("BEGIN")
        _ = try blocker.query("SELECT id FROM responses WHERE id = $1 FOR UPDATE", [.text(id)])
        let returned = DispatchSemaphore(value: 0), completed = DispatchSemaphore(value: 0)
        let error = ResultBox<StoreError?>()
        DispatchQueue.global().async {
            s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)]) {
                error.value = $0
                completed.signal()
            }
            returned.signal()
        }
        #expect(returned.wait(timeout: .now() + 30) == .success, "apply waited for the locked row")
        try waitForLockWait(f)   // the UPDATE is queued in PostgreSQL behind the lock
        #expect(completed.wait(timeout: .now()) == .timedOut, "completed while the row was still locked")
        try blocker.execute("ROLLBACK")
        #expect(completed.wait(timeout: .now() + 30) == .success)
        #expect((error.value ?? nil) == nil)
        #expect(try s.response(id: id)?.state == .delivered)
    }

    @Test func aKilledIdleConnectionIsReplacedWithoutFailingAnything() throws {
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("not accepted"); return }
        #expect(try terminateStoreConnections(f) >= 2)
        // Each worker finds its connection dead on the first statement, reconnects, runs again.
        guard case .accepted = try s.ingestNow(sample(index: 2), secret: c.secret) else { Issue.record("no reconnect"); return }
        #expect(try s.counts().byState[.queued] == 2)
        #expect(try s.claimDue(limit: 5).count == 2)
    }

    @Test func anOutageFailsIngestFastThenRecoversOnItsOwn() throws {
        guard let base = PGTest.url, let target = URLComponents(string: base)?.port else { Issue.record("no port in RELAY_TEST_PG_URL"); return }
        let proxy = try OutageProxy(targetPort: target)
        defer { proxy.stop() }
        let url = proxy.url(for: f.pgURL, targetPort: target)
        let s = try PostgresOutboxStore(options: PostgresStoreOptions(url: url, nodeID: "a"), clock: f.clock, databaseClock: f.clock)
        defer { s.close() }
        let c = try settled { try s.createCredential(name: "c", apps: ["com.example.app"]) }
        guard case .accepted = try settled({ try s.ingestNow(sample(index: 1), secret: c.secret) }) else { Issue.record("not accepted"); return }
        proxy.cut()
        // Down: every ingest fails (503 upstream, never 202) and nothing is stored.
        for i in 2...4 {
            #expect(throws: StoreError.self) { try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) }
        }
        #expect(!s.checkWritable())
        #expect(throws: StoreError.self) { try s.claimDue(limit: 10) }
        #expect(try f.sql("SELECT count(*) FROM responses") == [["1"]])
        proxy.restore()
        // Back: within the back-off cap (2 s) the store reconnects by itself.
        var accepted = false
        for _ in 0..<100 where !accepted {
            if case .accepted? = try? s.ingestNow(sample(index: 5), secret: c.secret) { accepted = true } else { usleep(50_000) }
        }
        #expect(accepted)
        #expect(s.checkWritable())
        #expect(try s.counts().byState[.queued] == 2)
        #expect(try s.claimDue(limit: 10).count == 2)
    }

    /// Issue 30 item 1: APNs answered 200, the outcome write failed (the database away), and the
    /// row stayed inflight under this node: once its lease expired it was claimed and pushed
    /// again. Now the outcome is kept and written before the next claim, so after the outage
    /// the row is delivered and nothing is claimed twice. Without the kept write the claim
    /// after the lease returned the row (checked).
    @Test func anOutcomeWriteLostToAnOutageIsWrittenBeforeTheNextClaim() throws {
        guard let base = PGTest.url, let target = URLComponents(string: base)?.port else { Issue.record("no port in RELAY_TEST_PG_URL"); return }
        let proxy = try OutageProxy(targetPort: target)
        defer { proxy.stop() }
        let s = try PostgresOutboxStore(options: PostgresStoreOptions(url: proxy.url(for: f.pgURL, targetPort: target), nodeID: "a",
                                                                      leaseMillis: 30_000), clock: f.clock, databaseClock: f.clock)
        defer { s.close() }
        let c = try settled { try s.createCredential(name: "c", apps: ["com.example.app"]) }
        let id = try #require(try settled { try ingestMany(s, secret: c.secret, count: 1) }.first)
        let row = try #require(try settled { try s.claimDue(limit: 10) }.first)
        proxy.cut()
        let done = DispatchSemaphore(value: 0)
        let error = ResultBox<StoreError?>()
        let t = f.clock.nowMillis()
        s.apply([DeliveryUpdate(id: id, pushToken: row.pushToken, outcome: .delivered,
                                attempt: AttemptRecord(responseID: id, attemptedAt: t, status: 200, reason: nil), leaseEpoch: row.leaseEpoch)]) {
            error.value = $0
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 60) == .success)
        #expect((error.value ?? nil) != nil, "the write went through the cut proxy")
        #expect(s.retainedOutcomesDueAt().map { $0 <= f.clock.nowMillis() + 2_000 } == true, "the kept outcome is due within the back-off cap")
        proxy.restore()
        f.clock.advance(30_000)   // the lease is over: without the kept write, the claim takes the row back
        #expect(try settled { try s.claimDue(limit: 10) }.isEmpty)
        let after = try #require(try s.response(id: id))
        #expect(after.state == .delivered && after.attempts == 1 && after.lastStatus == 200)
        #expect(try s.attemptNodes(responseID: id) == ["a"])
        #expect(s.retainedOutcomes.withLock { $0.isEmpty })
    }

    /// The issue's probe, through the dispatcher on the real clocks: one node, lease 1.5 s, the
    /// database cut between APNs' 200 and its outcome write. After the database is back the row
    /// is delivered without a second push, also once its lease would have ended and the next
    /// ingest wakes the dispatcher. Before, it stayed inflight and went out again (checked:
    /// pushed twice with the kept writes disabled).
    @Test func aDispatchersOutcomeLostToAnOutageCostsNoSecondPush() throws {
        guard let base = PGTest.url, let target = URLComponents(string: base)?.port else { Issue.record("no port in RELAY_TEST_PG_URL"); return }
        let proxy = try OutageProxy(targetPort: target)
        defer { proxy.stop() }
        let s = try PostgresOutboxStore(options: PostgresStoreOptions(url: proxy.url(for: f.pgURL, targetPort: target), nodeID: "a",
                                                                      leaseMillis: 1_500))
        defer { s.close() }
        let c = try settled { try s.createCredential(name: "c", apps: ["com.example.app"]) }
        guard case .accepted(let first) = try settled({ try s.ingestNow(sample(index: 1), secret: c.secret) }) else { Issue.record("not accepted"); return }
        let t = FakeTransport { _, n in
            if n == 1 { proxy.cut() }   // APNs answers 200; the outcome write finds the database gone
            return PushAnswer(status: 200, reason: nil, classification: .done)
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], options: DispatcherOptions(idlePollMillis: 200))
        try d.start()
        defer { d.stop() }
        try waitLong("the push went out") { t.sent.withLock { $0.count } == 1 }
        Thread.sleep(forTimeInterval: 0.5)
        proxy.restore()
        try waitLong("the kept outcome was written") { (try? s.response(id: first))?.state == .delivered }
        Thread.sleep(forTimeInterval: 2)   // past the lease the row would have had
        guard case .accepted(let second) = try settled({ try s.ingestNow(sample(index: 2), secret: c.secret) }) else { Issue.record("not accepted"); return }
        try waitLong("the next row delivered") { (try? s.response(id: second))?.state == .delivered }
        #expect(t.sent.withLock { $0.map(\.id) } == [first, second])
        #expect(try s.response(id: first)?.attempts == 1)
    }

    /// One response stored and claimed by `s`, and the update recording its delivery (APNs 200).
    func claimedWithItsDelivery(_ s: PostgresOutboxStore) throws -> (id: String, update: DeliveryUpdate) {
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let id = try ingestMany(s, secret: c.secret, count: 1)[0]
        let row = try #require(try s.claimDue(limit: 1).first)
        return (id, DeliveryUpdate(id: id, pushToken: row.pushToken, outcome: .delivered,
                                   attempt: AttemptRecord(responseID: id, attemptedAt: f.clock.nowMillis(), status: 200, reason: nil),
                                   leaseEpoch: row.leaseEpoch))
    }

    /// A node stopped while it still keeps an outcome (its write failed, the database came back,
    /// no claim or outcome write came since) records it at close: its row is not left inflight
    /// under the node, which the restart's recoverInflight would requeue and push again.
    @Test func aKeptOutcomeIsRecordedAtClose() throws {
        let s = try f.openPostgres(nodeID: "a")
        let (id, update) = try claimedWithItsDelivery(s)
        _ = s.retainedOutcomes.withLock { $0.keep([update], nowMonotonicMillis: 0) }
        s.close()
        let again = try f.openPostgres(nodeID: "a")
        defer { again.close() }
        #expect(try again.recoverInflight() == 0)
        #expect(try again.response(id: id)?.state == .delivered)
        #expect(try again.claimDue(limit: 1).isEmpty)
    }

    /// A kept outcome whose first write committed unseen (its answer lost with the connection)
    /// is written again without effect: the lease guard skips the row, the attempt is not
    /// recorded twice, no second event.
    @Test func writingAKeptOutcomeAgainChangesNothing() throws {
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        let (id, update) = try claimedWithItsDelivery(s)
        try s.apply([update])
        let events = try f.sql("SELECT count(*) FROM events")
        _ = s.retainedOutcomes.withLock { $0.keep([update], nowMonotonicMillis: 0) }
        #expect(try s.claimDue(limit: 1).isEmpty)
        #expect(s.retainedOutcomes.withLock { $0.isEmpty })
        #expect(try s.attemptNodes(responseID: id) == ["a"])
        #expect(try f.sql("SELECT count(*) FROM events") == events)
        #expect(try s.response(id: id)?.attempts == 1)
    }

    /// A row whose outcome this node lost (not kept: the bound, or a restart of the dispatcher
    /// without one) is still this node's lease: nextDueAt names its expiry, so the node takes it
    /// back without waiting for an ingest to wake it. Before, own leases were left out and the
    /// row waited for the next ingest (checked).
    @Test func nextDueAtIncludesThisNodesOwnLeases() throws {
        let s = try f.openPostgres(nodeID: "a", leaseMillis: 30_000)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try ingestMany(s, secret: c.secret, count: 1)
        #expect(try s.claimDue(limit: 1).count == 1)
        #expect(try s.nextDueAt() == f.clock.nowMillis() + 30_000)
    }

    /// Issue 30 item 2: a node whose clock is 60 s fast takes over nothing live. Its offset is
    /// measured at connect (exported), past the bound it claims nothing, and its recovery at
    /// start leaves other nodes' live leases alone. Without the database clock it reclaimed
    /// a's live leases (its now was past their expiry) and requeued them at start (checked).
    @Test func aNodeWhoseClockIs60SecondsFastTakesOverNothingLive() throws {
        let a = try f.openPostgres(nodeID: "a", leaseMillis: 30_000)
        defer { a.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let ids = try ingestMany(a, secret: c.secret, count: 3)
        #expect(try a.claimDue(limit: 10).count == 3)
        let fast = try f.openPostgres(nodeID: "fast", leaseMillis: 30_000, skewMillis: 60_000)
        defer { fast.close() }
        #expect(fast.clockOffsetSeconds == -60)
        #expect(try fast.recoverInflight() == 0)
        do {
            _ = try fast.claimDue(limit: 10)
            Issue.record("a node 60 s off the database's clock claimed")
        } catch let e as StoreError {
            // Said as such, and not as a lost connection (which would drop and reopen it).
            guard case .invalid(let why) = e else { Issue.record("unexpected error \(e)"); return }
            #expect(why.contains("maxClockOffsetSeconds"))
        }
        #expect(try fast.nextDueAt() == nil, "out of bound: the idle poll, not a loop of refused claims")
        #expect(try f.sql("SELECT lease_owner, count(*) FROM responses GROUP BY lease_owner") == [["a", "3"]])
        // a's answers land: nothing was taken over.
        let t = f.clock.nowMillis()
        let rows = try a.list(OutboxFilter(state: .inflight))
        try a.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered,
                                              attempt: AttemptRecord(responseID: $0.id, attemptedAt: t, status: 200, reason: nil)) })
        #expect(try Set(ids.compactMap { try a.response(id: $0)?.state }) == [.delivered])
    }

    /// A node whose clock comes back in bound (NTP fixed it) claims again: the idle poll's
    /// nextDueAt measures the offset anew while it is out of bound.
    @Test func aNodeClaimsAgainOnceItsClockIsBackInBound() throws {
        let nodeClock = TestClock(f.clock.nowMillis() + 60_000)
        let s = try PostgresOutboxStore(options: PostgresStoreOptions(url: f.pgURL, nodeID: "late"), clock: nodeClock, databaseClock: f.clock)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try ingestMany(s, secret: c.secret, count: 1)
        #expect(throws: StoreError.self) { try s.claimDue(limit: 1) }
        #expect(try s.nextDueAt() == nil)
        nodeClock.advance(-60_000)   // the clock is set right
        #expect(try s.nextDueAt() != nil)
        #expect(s.clockOffsetSeconds == 0)
        #expect(try s.claimDue(limit: 1).count == 1)
    }

    /// Within the bound the offset is corrected: a node 8 s fast (bound 10 s) neither takes a
    /// lease 5 s before it ends on the database's clock, nor a row paced by a 429 before its
    /// pacing ends, and what it stores (ingest times, the outcome's retry time) is in the
    /// database's time. Without the correction it took both early (checked).
    @Test func aNodeWithinTheClockBoundIsCorrectedToTheDatabasesTime() throws {
        let a = try f.openPostgres(nodeID: "a", leaseMillis: 10_000)
        let b = try f.openPostgres(nodeID: "b", leaseMillis: 10_000, skewMillis: 8_000)
        defer { a.close(); b.close() }
        #expect(b.clockOffsetSeconds == -8)
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let paced = String(repeating: "11", count: 32)
        let leased = try ingestMany(a, secret: c.secret, count: 1)[0]
        let t0 = f.clock.nowMillis()
        #expect(try a.claimDue(limit: 10).map(\.id) == [leased])
        // b stores a row: its times are the database's, not b's 8 s ahead.
        guard case .accepted(let other) = try b.ingestNow(sample(token: paced, index: 1), secret: c.secret) else { Issue.record("not accepted"); return }
        let stored = try #require(try a.response(id: other))
        #expect(stored.createdAt == t0 && stored.nextAttemptAt == t0)
        // a's 429 paces the token 20 s (a's clock is the database's).
        let row = try #require(try a.claimDue(limit: 10).first)
        try a.apply([DeliveryUpdate(id: other, pushToken: paced, outcome: .retry(at: t0 + 20_000, paceTokenUntil: t0 + 20_000),
                                    attempt: AttemptRecord(responseID: other, attemptedAt: t0, status: 429, reason: "TooManyRequests"),
                                    leaseEpoch: row.leaseEpoch)])
        f.clock.advance(15_000)   // the lease ended 5 s ago on the database; pacing has 5 s to go (b reads 23 s: past both)
        // b's retention sweep (its clock: 3 s past the pacing's end) leaves the pacing alone.
        #expect(try b.pruneEndedPacing(before: f.clock.nowMillis() + 8_000, limit: 10) == 0)
        let taken = try b.claimDue(limit: 10)
        #expect(taken.map(\.id) == [leased], "only the ended lease")
        // Back in b's clock at its edge: the dispatcher compares with its own.
        #expect(taken.first?.createdAt == t0 + 8_000)
        // b's answer (decided on its clock) is stored in the database's time.
        let bt = f.clock.nowMillis() + 8_000
        try b.apply([DeliveryUpdate(id: leased, pushToken: taken[0].pushToken, outcome: .retry(at: bt + 1_000, paceTokenUntil: nil),
                                    attempt: AttemptRecord(responseID: leased, attemptedAt: bt, status: 503, reason: "ServiceUnavailable"),
                                    leaseEpoch: taken[0].leaseEpoch)])
        #expect(try a.response(id: leased)?.nextAttemptAt == f.clock.nowMillis() + 1_000)
        #expect(try b.nextDueAt() == bt + 1_000, "the next due time in b's clock")
    }

    /// A node 8 s fast (within the bound) prunes a token mark only once it is stale in the
    /// database's time, not 8 s early by its own clock (marks' times are the database's).
    @Test func aFastNodePrunesNoMarkEarly() throws {
        let a = try f.openPostgres(nodeID: "a")
        defer { a.close() }
        let c = try a.createCredential(name: "c", apps: ["com.example.app"])
        let token = String(repeating: "f5", count: 32)
        _ = try a.ingestNow(sample(token: token, index: 1), secret: c.secret)
        let r = try a.claimDue(limit: 1)[0]
        try a.apply([DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: f.clock.nowMillis()),
                                    attempt: nil, leaseEpoch: r.leaseEpoch)])
        let hold: Int64 = 3_600_000, ttl: Int64 = 86_400_000
        let b = try f.openPostgres(nodeID: "b", skewMillis: 8_000)
        defer { b.close() }
        _ = try b.ingestNow(sample(token: "aa", index: 9), secret: c.secret, ttl: ttl, quarantine: hold)   // b's settings
        f.clock.advance(hold + StoreRules.staleMarkMillis - 3_000)   // stale in 3 s; by b's clock 5 s ago
        #expect(try b.pruneStaleMarks(now: f.clock.nowMillis() + 8_000, limit: 10) == 0)
        f.clock.advance(4_000)
        #expect(try b.pruneStaleMarks(now: f.clock.nowMillis() + 8_000, limit: 10) == 1)
    }

    /// Against the real clock_timestamp() on the same host the measured offset is about zero.
    @Test func theOffsetToTheRealDatabaseClockIsMeasuredAtConnect() throws {
        let s = try PostgresOutboxStore(options: PostgresStoreOptions(url: f.pgURL, nodeID: "real"))
        defer { s.close() }
        #expect(abs(s.clockOffsetSeconds) < 1)
        #expect(try s.claimDue(limit: 1).isEmpty)
    }
}

/// Set-up through an OutageProxy, a thread of this busy test process: a connection it was slow
/// to carry puts a worker in its reconnect back-off (make test once failed here, before the
/// outage), so the set-up waits that out; the outage is what is under test. Also waits out
/// the back-off after a restore.
func settled<T>(_ body: () throws -> T) throws -> T {
    let deadline = ContinuousClock.now + .seconds(20)
    while true {
        do { return try body() } catch where ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.1) }
    }
}

/// Bounded polling (30 s) for what another thread reaches through a reconnect back-off.
func waitLong(_ what: String, _ cond: () throws -> Bool) throws {
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline {
        if try cond() { return }
        usleep(20_000)
    }
    Issue.record("condition never became true: \(what)")
}

/// Waits (bounded) until some backend of this fixture waits for a lock.
func waitForLockWait(_ f: StoreFixture) throws {
    for _ in 0..<500 {
        if try f.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = '\(f.schema)'") != [["0"]] { return }
        usleep(10_000)
    }
    throw StoreError.invalid("ingest never waited for the lock")
}

/// Kills every connection of this fixture (they carry its schema as application_name) and
/// waits until they are gone. Returns how many there were.
@discardableResult
func terminateStoreConnections(_ f: StoreFixture) throws -> Int {
    let admin = try PGTest.admin()
    let n = try admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", [.text(f.schema)]).count
    for _ in 0..<500 {
        if try admin.query("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", [.text(f.schema)]).first?.first?.int == 0 { return n }
        usleep(10_000)
    }
    throw StoreError.invalid("store connections did not go away")
}

/// Which clock-offset samples a PostgreSQL store takes (no database needed): a slow round trip
/// (a stalled database) says too little about the offset to replace the one measured before.
@Suite struct DatabaseClockSampleTests {
    @Test func aSlowRoundTripKeepsThePreviousOffset() {
        #expect(DatabaseClock.takesSample(roundTripMillis: 3, boundMillis: 10_000, measured: true))
        #expect(DatabaseClock.takesSample(roundTripMillis: 250, boundMillis: 10_000, measured: true))
        #expect(!DatabaseClock.takesSample(roundTripMillis: 251, boundMillis: 10_000, measured: true))
        #expect(!DatabaseClock.takesSample(roundTripMillis: 30_000, boundMillis: 10_000, measured: true))
        // A tight bound tightens it: at most a quarter of the bound.
        #expect(!DatabaseClock.takesSample(roundTripMillis: 101, boundMillis: 400, measured: true))
        // The first sample is always taken: there is no other offset yet.
        #expect(DatabaseClock.takesSample(roundTripMillis: 30_000, boundMillis: 10_000, measured: false))
    }
}
