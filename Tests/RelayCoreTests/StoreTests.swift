import Foundation
import POSIXThreads
import Ratchet
import Synchronization
import Testing
@testable import RelayCore

/// The OutboxStore contract, run against every backend (SQLite always, PostgreSQL when
/// RELAY_TEST_PG_URL is set; see PostgresTestSupport.swift). Backend-specific behaviour lives in
/// SQLiteStoreTests below and in PostgresStoreTests.swift.
@Suite struct StoreContractTests {
    @Test(arguments: StoreBackend.available)
    func migrationsAreIdempotent(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        try f.open().close()
        let s = try f.open()
        defer { s.close() }
        // Each backend numbers its own migrations; outbox_stats is SQLite's pending-row counter
        // (PostgreSQL counts with its own statistics), response_keys its dedupe index (PostgreSQL
        // keeps a UNIQUE constraint).
        #expect(try f.schemaVersion == (backend == .sqlite ? SQLiteOutboxStore.schemaVersion : PostgresOutboxStore.schemaVersion))
        let tables = try f.tables.filter { $0 != "relay_schema_version" && $0 != "outbox_stats" && $0 != "response_keys" }
        #expect(tables == ["attempts", "credential_generation", "credentials", "events", "feed_cursor_key", "responses", "token_pacing", "unregistered_tokens", "webhook_cursors", "webhook_deliveries"])
    }

    @Test(arguments: StoreBackend.available)
    func newerSchemaIsRefused(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        try f.open().close()
        try f.setSchemaVersion(99)
        #expect(throws: StoreError.self) { try f.open() }
    }

    /// The configured apps, TTL and outbox bound are the store's (given once at start), not the
    /// request's: a store never given them knows no app, and what it was given applies to
    /// every later request.
    @Test(arguments: StoreBackend.available)
    func ingestIsCheckedAgainstTheStoresSettings(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let cred = try s.createCredential(name: "fleet", apps: ["com.example.app"])
        #expect(s.ingestSettings == IngestStoreSettings())
        func submit(_ index: UInt32) throws -> IngestOutcome {
            let slot = ResultBox<Result<IngestOutcome, StoreError>>()
            let done = DispatchSemaphore(value: 0)
            s.submit(IngestRequest(response: sample(index: index), credentialHash: Credentials.hash(secret: cred.secret))) {
                slot.value = $0
                done.signal()
            }
            done.wait()
            return try slot.value!.get()
        }
        #expect(try submit(1) == .unknownApp("com.example.app"))
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 5_000, maxPending: 2)
        guard case .accepted(let id) = try submit(2) else { Issue.record("not accepted"); return }
        #expect(try s.response(id: id)?.expiresAt == f.clock.nowMillis() + 5_000)
        _ = try submit(3)
        #expect(try submit(4) == .overCapacity)
    }

    @Test(arguments: StoreBackend.available)
    func acceptedThenDuplicateReturnsSameIdAndState(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let cred = try s.createCredential(name: "fleet", apps: ["com.example.app"])
        #expect(cred.secret.hasPrefix("rk_"))
        guard case .accepted(let id) = try s.ingestNow(sample(), secret: cred.secret) else { Issue.record("not accepted"); return }
        #expect(UUID(uuidString: id) != nil && id == id.lowercased())
        #expect(try s.ingestNow(sample(), secret: cred.secret) == .duplicate(id: id, state: .queued))
        let row = try #require(try s.response(id: id))
        #expect(row.app == "com.example.app")
        #expect(row.state == .queued)
        #expect(row.credentialID == cred.record.id)
        #expect(row.expiresAt == f.clock.nowMillis() + 86_400_000)
        #expect(row.encryptedData == sample().encryptedData && row.keyID == [1, 2, 3, 4] && row.messageIndex == 1)
        #expect(try s.counts().byState[.queued] == 1)
    }

    @Test(arguments: StoreBackend.available)
    func concurrentIngestsAreAllStoredAndDuplicatesInOneBatchShareAnId(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let results = Mutex<[UInt32: [IngestOutcome]]>([:])
        let done = DispatchGroup()
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        // 50 distinct responses, each submitted twice without waiting: most land in shared batches.
        for i in 0..<100 {
            done.enter()
            let index = UInt32(i % 50)
            s.submit(IngestRequest(response: sample(index: index), credentialHash: Credentials.hash(secret: c.secret))) { r in
                if case .success(let o) = r { results.withLock { $0[index, default: []].append(o) } }
                done.leave()
            }
        }
        done.wait()
        let byIndex = results.withLock { $0 }
        #expect(byIndex.count == 50)
        for (_, outcomes) in byIndex {
            let ids = outcomes.compactMap { o -> String? in
                switch o {
                case .accepted(let id), .duplicate(let id, _): return id
                default: return nil
                }
            }
            #expect(ids.count == 2 && Set(ids).count == 1)
            #expect(outcomes.filter { if case .accepted = $0 { true } else { false } }.count == 1)
        }
        #expect(try s.counts().byState[.queued] == 50)
    }

    @Test(arguments: StoreBackend.available)
    func authScopeAndAppResolution(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let one = try s.createCredential(name: "one", apps: ["com.example.app"])
        let two = try s.createCredential(name: "two", apps: ["com.example.app", "com.example.other"])
        let apps: Set<String> = ["com.example.app", "com.example.other", "com.example.third"]
        #expect(try s.ingestNow(sample(), secret: "rk_nope", apps: apps) == .unauthorized)
        #expect(try s.ingestNow(sample(index: 1), secret: two.secret, apps: apps) == .appRequired)
        #expect(try s.ingestNow(sample(index: 1, app: "com.example.third"), secret: two.secret, apps: apps) == .forbidden(app: "com.example.third"))
        #expect(try s.ingestNow(sample(index: 1, app: "com.unknown"), secret: two.secret, apps: apps) == .unknownApp("com.unknown"))
        guard case .accepted(let id) = try s.ingestNow(sample(index: 2, app: "com.example.other"), secret: two.secret, apps: apps) else {
            Issue.record("not accepted"); return
        }
        #expect(try s.response(id: id)?.app == "com.example.other")
        guard case .accepted = try s.ingestNow(sample(index: 3), secret: one.secret, apps: apps) else { Issue.record("not accepted"); return }
        // Revocation takes effect for the very next request.
        #expect(try s.revokeCredential(id: one.record.id))
        #expect(try s.ingestNow(sample(index: 4), secret: one.secret, apps: apps) == .unauthorized)
        #expect(try s.authenticate(secret: one.secret) == nil)
        #expect(try s.authenticate(secret: two.secret)?.id == two.record.id)
        let listed = try s.credentials()
        #expect(listed.count == 2)
        #expect(listed.first { $0.id == one.record.id }?.revokedAt != nil)
        #expect(listed.first { $0.id == two.record.id }?.lastUsedAt == f.clock.nowMillis())
        // Only the hash is stored.
        let stored = try f.sql("SELECT hash FROM credentials").compactMap { $0[0] }
        #expect(stored.contains(Credentials.hash(secret: one.secret).hexString))
        #expect(!stored.contains(Array(one.secret.utf8).hexString))
    }

    @Test(arguments: StoreBackend.available)
    func outboxBound(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        for i in 0..<3 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret, maxPending: 3) }
        #expect(try s.ingestNow(sample(index: 9), secret: c.secret, maxPending: 3) == .overCapacity)
        // A delivered row frees a slot.
        let claimed = try s.claimDue(limit: 1)
        try s.apply([DeliveryUpdate(id: claimed[0].id, pushToken: claimed[0].pushToken, outcome: .delivered, attempt: nil)])
        guard case .accepted = try s.ingestNow(sample(index: 9), secret: c.secret, maxPending: 3) else { Issue.record("bound not freed"); return }
    }

    /// The dispatcher's apply: queued on the store's own thread, completed once per call in
    /// the order given, the rows written by then; after close it fails instead of never answering
    /// (the dispatcher's stop waits for every completion).
    @Test(arguments: StoreBackend.available)
    func queuedApplyCompletesInOrderAfterItsWriteAndFailsOnceClosed(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        for i in 0..<6 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) }
        let claimed = try s.claimDue(limit: 10)
        #expect(claimed.count == 6)
        let order = Mutex<[Int]>([])
        let done = DispatchGroup()
        for (n, row) in claimed.enumerated() {
            done.enter()
            s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)]) { error in
                #expect(error == nil)
                // Written before the completion runs: a read now sees it.
                #expect((try? s.response(id: row.id))??.state == .delivered)
                order.withLock { $0.append(n) }
                done.leave()
            }
        }
        #expect(done.wait(timeout: .now() + 60) == .success)
        #expect(order.withLock { $0 } == Array(0..<6))
        s.close()
        let failed = ResultBox<StoreError?>()
        let closedDone = DispatchSemaphore(value: 0)
        s.apply([DeliveryUpdate(id: claimed[0].id, pushToken: claimed[0].pushToken, outcome: .delivered, attempt: nil)]) { error in
            failed.value = error
            closedDone.signal()
        }
        #expect(closedDone.wait(timeout: .now() + 60) == .success, "no completion after close")
        #expect((failed.value ?? nil) != nil)
    }

    @Test(arguments: StoreBackend.available)
    func claimStatesAndAttempts(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let clock = f.clock
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        var ids: [String] = []
        for i in 0..<4 {
            if case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) { ids.append(id) }
        }
        #expect(ids.count == 4)
        let claimed = try s.claimDue(limit: 10)
        #expect(Set(claimed.map(\.id)) == Set(ids))
        #expect(claimed.allSatisfy { $0.state == .inflight })
        #expect(try s.claimDue(limit: 10).isEmpty)
        let t = clock.nowMillis()
        try s.apply([
            DeliveryUpdate(id: ids[0], pushToken: claimed[0].pushToken, outcome: .delivered,
                           attempt: AttemptRecord(responseID: ids[0], attemptedAt: t, status: 200, reason: nil, latencyMicros: 900)),
            DeliveryUpdate(id: ids[1], pushToken: claimed[0].pushToken, outcome: .failed(reason: "BadDeviceToken"),
                           attempt: AttemptRecord(responseID: ids[1], attemptedAt: t, status: 400, reason: "BadDeviceToken")),
            DeliveryUpdate(id: ids[2], pushToken: claimed[0].pushToken, outcome: .retry(at: t + 5000, paceTokenUntil: nil),
                           attempt: AttemptRecord(responseID: ids[2], attemptedAt: t, status: 503, reason: "ServiceUnavailable")),
            DeliveryUpdate(id: ids[3], pushToken: claimed[0].pushToken, outcome: .requeue, attempt: nil),
        ])
        #expect(try s.response(id: ids[0])?.state == .delivered)
        #expect(try s.response(id: ids[0])?.attempts == 1)
        #expect(try s.attempts(responseID: ids[0]).first?.latencyMicros == 900)
        #expect(try s.response(id: ids[1])?.state == .failed)
        #expect(try s.response(id: ids[1])?.lastReason == "BadDeviceToken")
        let r2 = try #require(try s.response(id: ids[2]))
        #expect(r2.state == .retry && r2.nextAttemptAt == t + 5000 && r2.lastStatus == 503)
        #expect(try s.response(id: ids[3])?.state == .queued)
        #expect(try s.response(id: ids[3])?.attempts == 0)
        #expect(try s.attempts(responseID: ids[1]).map(\.status) == [400])
        // Only the requeued row is due now; the retry row becomes due after its time.
        #expect(try s.claimDue(limit: 10).map(\.id) == [ids[3]])
        #expect(try s.nextDueAt() == t + 5000)
        clock.advance(5000)
        #expect(try s.claimDue(limit: 10).map(\.id) == [ids[2]])
        let counts = try s.counts()
        #expect(counts.byState[.delivered] == 1 && counts.byState[.failed] == 1 && counts.byState[.inflight] == 2)
        // Nothing waits but the inflight rows; PostgreSQL names their lease's end (a row whose
        // outcome was lost is taken back then), SQLite has no leases.
        let next = try s.nextDueAt()
        #expect(backend == .sqlite ? next == nil : next == t + 3_600_000)
        let outcomes = try s.recentOutcomes(since: t)
        #expect(outcomes.map(\.state) == [.delivered, .failed])
        #expect(outcomes.map(\.reason) == [nil, "BadDeviceToken"])
    }

    /// One claim order on both backends (StoreRules.claimsBefore): due rows by due time, queued
    /// and retry alike, a tie by id (accept order). A retry due before newer queued rows is
    /// claimed first; one due later waits behind them.
    @Test(arguments: StoreBackend.available)
    func dueRowsAreClaimedByDueTimeWhateverTheirState(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        func ingest(_ i: UInt32) throws -> String {
            guard case .accepted(let id) = try s.ingestNow(sample(index: i), secret: c.secret) else { throw StoreError.invalid("not accepted") }
            return id
        }
        let t = f.clock.nowMillis()
        // Three rows sent once and answered 503: retry rows due at t+15, t+5 and t+30.
        let x = try (0..<3).map { try ingest(UInt32($0)) }
        let sent = try s.claimDue(limit: 10)
        #expect(Set(sent.map(\.id)) == Set(x))
        try s.apply(zip(x, [15, 5, 30]).map { id, due in
            DeliveryUpdate(id: id, pushToken: sent[0].pushToken, outcome: .retry(at: t + Int64(due), paceTokenUntil: nil),
                           attempt: AttemptRecord(responseID: id, attemptedAt: t, status: 503, reason: "ServiceUnavailable"))
        })
        // Queued rows accepted (so due) at t+10, t+20, t+30 (the same time as x[2]), t+40.
        var q: [String] = []
        for i in 0..<4 {
            f.clock.advance(t + Int64(10 * (i + 1)) - f.clock.nowMillis())
            q.append(try ingest(UInt32(10 + i)))
        }
        f.clock.advance(10)
        // The tie at t+30: x[2] was accepted first (its id sorts first).
        #expect(x[2] < q[2])
        #expect(try s.claimDue(limit: 4).map(\.id) == [x[1], q[0], x[0], q[1]])
        #expect(try s.claimDue(limit: 10).map(\.id) == [x[2], q[2], q[3]])
    }

    /// The claim order's rule itself: due time first, then the tie.
    @Test func claimOrderRule() {
        #expect(StoreRules.claimsBefore(dueAt: 1, tie: "b", dueAt: 2, tie: "a"))
        #expect(StoreRules.claimsBefore(dueAt: 2, tie: "a", dueAt: 2, tie: "b"))
        #expect(!StoreRules.claimsBefore(dueAt: 2, tie: "b", dueAt: 2, tie: "a"))
        #expect(!StoreRules.claimsBefore(dueAt: 2, tie: "a", dueAt: 2, tie: "a"))
        #expect(StoreRules.claimOrderSQL(tie: "id") == "next_attempt_at, id")
    }

    /// A paused app's row goes back as if never sent: queued, due at the next probe, attempts,
    /// attempt history and last status/reason as they were (docs/pushclient.md "Paused apps").
    @Test(arguments: StoreBackend.available)
    func releaseReturnsARowWithoutCountingAnAttempt(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted(let id) = try s.ingestNow(sample(), secret: c.secret) else { Issue.record("not accepted"); return }
        var row = try #require(try s.claimDue(limit: 10).first)
        let t = f.clock.nowMillis()
        try s.apply([DeliveryUpdate(id: id, pushToken: row.pushToken, outcome: .retry(at: t, paceTokenUntil: nil),
                                    attempt: AttemptRecord(responseID: id, attemptedAt: t, status: 503, reason: "ServiceUnavailable"))])
        row = try #require(try s.claimDue(limit: 10).first)
        try s.apply([DeliveryUpdate(id: id, pushToken: row.pushToken, outcome: .release(at: t + 4000), attempt: nil)])
        let released = try #require(try s.response(id: id))
        #expect(released.state == .queued && released.nextAttemptAt == t + 4000)
        #expect(released.attempts == 1 && released.lastStatus == 503 && released.lastReason == "ServiceUnavailable")
        #expect(try s.attempts(responseID: id).count == 1)
        #expect(try s.counts().byState[.queued] == 1)
        #expect(try s.claimDue(limit: 10).isEmpty)
        #expect(try s.nextDueAt() == t + 4000)
        f.clock.advance(4000)
        #expect(try s.claimDue(limit: 10).map(\.id) == [id])
    }

    /// A reload ends a pause: the app's released rows become due now; retry rows (their own
    /// back-off) and other apps' rows keep their times.
    @Test(arguments: StoreBackend.available)
    func hastenQueuedMakesOnlyTheAppsReleasedRowsDue(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app", "com.example.other"])
        var ids: [String] = []
        for (i, app) in ["com.example.app", "com.example.app", "com.example.other"].enumerated() {
            let outcome = try s.ingestNow(sample(token: String(repeating: "c\(i)", count: 32), index: UInt32(i), app: app), secret: c.secret,
                                       apps: ["com.example.app", "com.example.other"])
            if case .accepted(let id) = outcome { ids.append(id) } else { Issue.record("\(app): \(outcome)") }
        }
        let rows = try s.claimDue(limit: 10)
        #expect(rows.count == 3)
        let t = f.clock.nowMillis()
        try s.apply(rows.map { row in
            row.id == ids[1]
                ? DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .retry(at: t + 60_000, paceTokenUntil: nil),
                                 attempt: AttemptRecord(responseID: row.id, attemptedAt: t, status: 503, reason: "ServiceUnavailable"))
                : DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .release(at: t + 60_000), attempt: nil)
        })
        #expect(try s.hastenQueued(app: "com.example.app") == 1)
        #expect(try s.claimDue(limit: 10).map(\.id) == [ids[0]])
        #expect(try s.response(id: ids[2])?.nextAttemptAt == t + 60_000)
    }

    @Test(arguments: StoreBackend.available)
    func expiredRowsFailAtClaim(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted(let id) = try s.ingestNow(sample(), secret: c.secret, ttl: 1000) else { Issue.record("no"); return }
        f.clock.advance(1000)
        #expect(try s.claimDue(limit: 10).isEmpty)
        let row = try #require(try s.response(id: id))
        #expect(row.state == .failed && row.lastReason == "expired")
    }

    @Test(arguments: StoreBackend.available)
    func pacingDelaysEveryRowOfTheTokenAndNewIngests(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let clock = f.clock
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let other = String(repeating: "cd", count: 32)
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        let claimed = try s.claimDue(limit: 1)
        _ = try s.ingestNow(sample(index: 2), secret: c.secret)
        _ = try s.ingestNow(sample(token: other, index: 1), secret: c.secret)
        let until = clock.nowMillis() + 60_000
        try s.apply([DeliveryUpdate(id: claimed[0].id, pushToken: claimed[0].pushToken, outcome: .retry(at: until, paceTokenUntil: until),
                                    attempt: AttemptRecord(responseID: claimed[0].id, attemptedAt: clock.nowMillis(), status: 429, reason: "TooManyRequests"))])
        _ = try s.ingestNow(sample(index: 3), secret: c.secret)
        let due = try s.claimDue(limit: 10)
        #expect(due.map(\.pushToken) == [other])
        clock.advance(60_000)
        #expect(try s.claimDue(limit: 10).count == 3)
    }

    @Test(arguments: StoreBackend.available)
    func unregisteredTokenRefusesNewIngestUntilForgotten(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let clock = f.clock
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        let row = try s.claimDue(limit: 1)[0]
        clock.advance(10)
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: clock.nowMillis()),
                                    attempt: AttemptRecord(responseID: row.id, attemptedAt: clock.nowMillis(), status: 410, reason: "Unregistered", apnsTimestamp: clock.nowMillis()))])
        #expect(try s.unregisteredTokens().map(\.token) == [row.pushToken])
        #expect(try s.attempts(responseID: row.id).first?.apnsTimestamp == clock.nowMillis())
        #expect(try s.ingestNow(sample(index: 2), secret: c.secret) == .unregistered)
        // The duplicate of the failed row still answers with its id and state.
        #expect(try s.ingestNow(sample(index: 1), secret: c.secret) == .duplicate(id: row.id, state: .failed))
        #expect(try s.forgetToken(row.pushToken))
        #expect(try !s.forgetToken(row.pushToken))
        guard case .accepted = try s.ingestNow(sample(index: 2), secret: c.secret) else { Issue.record("not accepted after forget"); return }
    }

    @Test(arguments: StoreBackend.available)
    func noIngestIsAcceptedAfterThe410Committed(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let clock = f.clock
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        let row = try s.claimDue(limit: 1)[0]
        clock.advance(5)
        let apnsTimestamp = clock.nowMillis()
        // Accepted between APNs' 410 and its commit: the relay did not know yet.
        clock.advance(1)
        guard case .accepted(let early) = try s.ingestNow(sample(index: 2), secret: c.secret) else { Issue.record("not accepted"); return }
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: apnsTimestamp),
                                    attempt: AttemptRecord(responseID: row.id, attemptedAt: apnsTimestamp, status: 410, reason: "Unregistered", apnsTimestamp: apnsTimestamp))])
        // Once the failure committed, every new response for the token is refused (the early
        // row does not pass for the token coming back), in the same millisecond and after.
        #expect(try s.ingestNow(sample(index: 3), secret: c.secret) == .unregistered)
        clock.advance(1)
        #expect(try s.ingestNow(sample(index: 4), secret: c.secret) == .unregistered)
        #expect(try s.ingestNow(sample(index: 2), secret: c.secret) == .duplicate(id: early, state: .queued))
    }

    /// A 410 and the token's rows in other states: the old row fails, and the mark is kept
    /// whatever APNs' timestamp says against the rows (the push that drew it went out after them).
    static func mark(_ s: any OutboxStore, _ row: OutboxRow, reason: String = "Unregistered", status: Int = 410, at ts: Int64) throws {
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .unregistered(reason: reason, apnsTimestamp: ts),
                                    attempt: AttemptRecord(responseID: row.id, attemptedAt: ts, status: status, reason: reason, apnsTimestamp: ts))])
    }

    /// Issue 31: a row delivered after APNs' timestamp (accepted and delivered before the 410
    /// was known) used to open the token again: ingest compared the cutoff, which only moved
    /// with pending rows, with the newest row in any state.
    @Test(arguments: StoreBackend.available)
    func aNewerDeliveredRowDoesNotReopenAMarkedToken(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        let old = try s.claimDue(limit: 1)[0]
        let apnsTimestamp = f.clock.nowMillis()
        f.clock.advance(5)
        _ = try s.ingestNow(sample(index: 2), secret: c.secret)
        let newer = try s.claimDue(limit: 1)[0]
        try s.apply([DeliveryUpdate(id: newer.id, pushToken: newer.pushToken, outcome: .delivered, attempt: nil)])
        f.clock.advance(5)
        try Self.mark(s, old, at: apnsTimestamp)
        #expect(try s.ingestNow(sample(index: 3), secret: c.secret) == .unregistered)
        // The same when APNs' timestamp is older than every row of the token.
        #expect(try s.forgetToken(old.pushToken))
        _ = try s.ingestNow(sample(index: 4), secret: c.secret)
        let row = try s.claimDue(limit: 1)[0]
        try Self.mark(s, row, at: row.createdAt - 1)
        #expect(try s.ingestNow(sample(index: 5), secret: c.secret) == .unregistered)
    }

    /// After the quarantine one response goes through and is pushed (the hold starts again
    /// with it); its 200 removes the mark, a covered row's 200 does not.
    @Test(arguments: StoreBackend.available)
    func aProbeAfterTheQuarantineIsPushedAndItsDeliveryClearsTheMark(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        for i in 1...2 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret, quarantine: 1000) }
        let both = try s.claimDue(limit: 2)
        try Self.mark(s, both[0], at: f.clock.nowMillis())
        // Pushed beside the one that drew the 410: its 200 says nothing about after the mark.
        try s.apply([DeliveryUpdate(id: both[1].id, pushToken: both[1].pushToken, outcome: .delivered, attempt: nil)])
        #expect(try s.unregisteredTokens().count == 1)
        f.clock.advance(999)
        #expect(try s.ingestNow(sample(index: 3), secret: c.secret, quarantine: 1000) == .unregistered)
        f.clock.advance(1)
        guard case .accepted(let probe) = try s.ingestNow(sample(index: 3), secret: c.secret, quarantine: 1000) else { Issue.record("no probe"); return }
        #expect(try s.ingestNow(sample(index: 4), secret: c.secret, quarantine: 1000) == .unregistered)   // one per hold
        #expect(try s.claimDue(limit: 5).map(\.id) == [probe])
        try s.apply([DeliveryUpdate(id: probe, pushToken: both[0].pushToken, outcome: .delivered, attempt: nil)])
        #expect(try s.unregisteredTokens().isEmpty)
        guard case .accepted = try s.ingestNow(sample(index: 4), secret: c.secret, quarantine: 1000) else { Issue.record("still refused"); return }
    }

    /// A probe answered 410 again renews the mark (its hold from the answer); quarantine 0
    /// refuses until forgotten, however long.
    @Test(arguments: StoreBackend.available)
    func aProbeAnsweredGoneRenewsTheMarkAndZeroRefusesUntilForgotten(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        try Self.mark(s, try s.claimDue(limit: 1)[0], at: f.clock.nowMillis())
        f.clock.advance(86_400_000 * 30)
        #expect(try s.ingestNow(sample(index: 2), secret: c.secret, quarantine: 0) == .unregistered)
        guard case .accepted(let probe) = try s.ingestNow(sample(index: 2), secret: c.secret, quarantine: 1000) else { Issue.record("no probe"); return }
        let row = try #require(try s.claimDue(limit: 5).first)
        #expect(row.id == probe)
        f.clock.advance(200)
        try Self.mark(s, row, at: f.clock.nowMillis())
        let marks = try s.unregisteredTokens()
        #expect(marks.count == 1 && marks[0].recordedAt == f.clock.nowMillis() && marks[0].apnsTimestamp >= row.createdAt)
        f.clock.advance(999)
        #expect(try s.ingestNow(sample(index: 3), secret: c.secret, quarantine: 1000) == .unregistered)
    }

    /// Issue 31: BadDeviceToken marks the token for dispatch.badDeviceTokenHoldSeconds: ingest
    /// answers bad_device_token, the token's queued rows fail with that reason without a push,
    /// then one probe; with a hold of 0 the mark holds nothing.
    @Test(arguments: StoreBackend.available)
    func badDeviceTokenMarksTheTokenForItsHold(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        let answered = try s.claimDue(limit: 1)[0]
        guard case .accepted(let queued) = try s.ingestNow(sample(index: 2), secret: c.secret) else { Issue.record("not accepted"); return }
        _ = try s.ingestNow(sample(token: StoreContractTests.otherToken, index: 1), secret: c.secret)
        try Self.mark(s, answered, reason: "BadDeviceToken", status: 400, at: f.clock.nowMillis())
        #expect(try s.unregisteredTokens().map(\.reason) == ["BadDeviceToken"])
        #expect(try s.ingestNow(sample(index: 3), secret: c.secret, badDeviceTokenHold: 500) == .badDeviceToken)
        #expect(try s.claimDue(limit: 5).map(\.pushToken) == [StoreContractTests.otherToken])
        let failed = try #require(try s.response(id: queued))
        #expect(failed.state == .failed && failed.lastReason == "BadDeviceToken" && failed.attempts == 0)
        #expect(try s.response(id: answered.id)?.lastReason == "BadDeviceToken")
        #expect(try s.ingestNow(sample(index: 3), secret: c.secret, badDeviceTokenHold: 0) != .badDeviceToken)
        f.clock.advance(500)
        guard case .accepted = try s.ingestNow(sample(index: 4), secret: c.secret, badDeviceTokenHold: 500) else { Issue.record("no probe"); return }
        #expect(try s.ingestNow(sample(index: 5), secret: c.secret, badDeviceTokenHold: 500) == .badDeviceToken)
    }

    /// The migration that gave marks a reason (SQLite v8, PostgreSQL v4): marks recorded
    /// before it are 410s, and hold as such.
    @Test(arguments: StoreBackend.available)
    func marksFromBeforeTheReasonColumnAre410Marks(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        try f.open().close()
        _ = try f.sql("ALTER TABLE unregistered_tokens DROP COLUMN reason")
        _ = try f.sql("INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at) VALUES ('\(StoreContractTests.otherToken)', 1, \(f.clock.nowMillis()))")
        _ = try f.sql("DROP TABLE webhook_deliveries")   // the next migration's (delivery events)
        _ = try f.sql("DROP TABLE events")
        try f.setSchemaVersion(backend == .sqlite ? 7 : 3)
        let s = try f.open()
        defer { s.close() }
        #expect(try f.schemaVersion == (backend == .sqlite ? SQLiteOutboxStore.schemaVersion : PostgresOutboxStore.schemaVersion))
        #expect(try s.unregisteredTokens().map(\.reason) == ["Unregistered"])
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        #expect(try s.ingestNow(sample(token: StoreContractTests.otherToken, index: 1), secret: c.secret) == .unregistered)
    }

    @Test(arguments: StoreBackend.available)
    func recoveryRequeuesInflightWithSameId(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        var id = ""
        do {
            let s = try f.open()
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            _ = try s.ingestNow(sample(), secret: c.secret)
            id = try s.claimDue(limit: 1)[0].id
            s.close()
        }
        let s = try f.open()
        defer { s.close() }
        #expect(try s.response(id: id)?.state == .inflight)
        #expect(try s.recoverInflight() == 1)
        #expect(try s.claimDue(limit: 5).map(\.id) == [id])
    }

    @Test(arguments: StoreBackend.available)
    func operatorRequeueAndPurgeNeverTouchInflight(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let clock = f.clock
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        for i in 0..<3 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) }
        let rows = try s.claimDue(limit: 3)
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .failed(reason: "BadTopic"), attempt: nil),
                     DeliveryUpdate(id: rows[1].id, pushToken: rows[1].pushToken, outcome: .delivered, attempt: nil)])
        #expect(try s.requeue(ids: [rows[2].id]) == 0)  // inflight: untouched
        #expect(try s.requeueFailed(reason: "Other") == 0)
        #expect(try s.requeueFailed(reason: "BadTopic") == 1)
        #expect(try s.response(id: rows[0].id)?.state == .queued)
        clock.advance(10_000)
        #expect(try s.purge(state: .delivered, olderThan: clock.nowMillis(), dryRun: true) == 1)
        #expect(try s.purge(state: .delivered, olderThan: clock.nowMillis(), dryRun: false) == 1)
        #expect(try s.response(id: rows[1].id) == nil)
        #expect(throws: StoreError.self) { try s.purge(state: .inflight, olderThan: clock.nowMillis(), dryRun: false) }
        #expect(try s.list(OutboxFilter(state: .inflight)).map(\.id) == [rows[2].id])
        #expect(try s.list(OutboxFilter(tokenPrefix: "ABAB")).count == 2)
        #expect(try s.list(OutboxFilter(tokenPrefix: "abcd")).isEmpty)
        #expect(try s.list(OutboxFilter(app: "com.example.app", limit: 1)).count == 1)
        // A failed row requeued by id (any case) is claimable again.
        #expect(try s.claimDue(limit: 5).map(\.id) == [rows[0].id])
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .failed(reason: "BadTopic"), attempt: nil)])
        #expect(try s.requeue(ids: [rows[0].id.uppercased()]) == 1)
        #expect(try s.claimDue(limit: 5).map(\.id) == [rows[0].id])
    }

    @Test(arguments: StoreBackend.available)
    func requeueOfADeliveredIdIsRefused(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        for i in 0..<3 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) }
        let rows = try s.claimDue(limit: 2)
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered, attempt: nil),
                     DeliveryUpdate(id: rows[1].id, pushToken: rows[1].pushToken, outcome: .failed(reason: "BadTopic"), attempt: nil)])
        let queued = try #require(try s.list(OutboxFilter(state: .queued)).first)
        // A delivered row requeued would be pushed twice; a queued one is already due.
        #expect(try s.requeue(ids: [rows[0].id, rows[0].id.uppercased(), queued.id, "not-an-id"]) == 0)
        let delivered = try #require(try s.response(id: rows[0].id))
        #expect(delivered.state == .delivered && delivered.updatedAt == rows[0].updatedAt)
        #expect(try s.response(id: queued.id)?.updatedAt == queued.updatedAt)
        #expect(try s.claimDue(limit: 5).map(\.id) == [queued.id])
        // The failed one next to it is requeued, and the bound counts it as pending again.
        f.clock.advance(1000)
        #expect(try s.requeue(ids: [rows[0].id, rows[1].id]) == 1)
        #expect(try s.response(id: rows[1].id)?.state == .queued)
        #expect(try s.ingestNow(sample(index: 9), secret: c.secret, maxPending: 2) == .overCapacity)
    }

    @Test(arguments: StoreBackend.available)
    func requeueExtendsAnExpiredRowsTTLByOneHour(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted(let id) = try s.ingestNow(sample(), secret: c.secret, ttl: 1000) else { Issue.record("not accepted"); return }
        f.clock.advance(5000)
        #expect(try s.claimDue(limit: 1).isEmpty)   // expired at claim
        #expect(try s.requeue(ids: [id]) == 1)
        #expect(try s.response(id: id)?.expiresAt == f.clock.nowMillis() + 3_600_000)
        #expect(try s.claimDue(limit: 1).map(\.id) == [id])
    }

    @Test(arguments: StoreBackend.available)
    func idsAreTimeOrderedUUIDv7(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        var ids: [String] = []
        for i in 0..<5 {
            guard case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) else { Issue.record("not accepted"); return }
            ids.append(id)
            f.clock.advance(1)
        }
        #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 })
        for id in ids {
            let b = try #require(UUIDText.parse(id))
            #expect(b[6] >> 4 == 7 && b[8] >> 6 == 0b10 && id == id.lowercased())
            let row = try #require(try s.response(id: id))
            // The leading 48 bits are the acceptance millisecond.
            #expect(b[0..<6].reduce(Int64(0)) { $0 << 8 | Int64($1) } == row.createdAt)
        }
    }

    @Test(arguments: StoreBackend.available)
    func dedupeIsScopedToTheCredential(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"])
        let b = try s.createCredential(name: "b", apps: ["com.example.app"])
        guard case .accepted(let idB) = try s.ingestNow(sample(index: 7), secret: b.secret) else { Issue.record("not accepted"); return }
        let before = try #require(try s.response(id: idB))
        // The same four fields from A: a conflict that carries nothing of B's row.
        #expect(try s.ingestNow(sample(index: 7), secret: a.secret) == .conflict)
        // B's retry still gets its id; B's row is untouched.
        #expect(try s.ingestNow(sample(index: 7), secret: b.secret) == .duplicate(id: idB, state: .queued))
        #expect(try s.response(id: idB) == before)
        #expect(try s.list(OutboxFilter()).count == 1)
        // Also when the other credential's row is finished, and on the slow path (watched token).
        let row = try s.claimDue(limit: 1)[0]
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: row.createdAt + 1), attempt: nil)])
        #expect(try s.ingestNow(sample(index: 7), secret: a.secret) == .conflict)
        #expect(try s.ingestNow(sample(index: 7), secret: b.secret) == .duplicate(id: idB, state: .failed))
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        // Two credentials in one batch: one stores the row, the other gets the conflict.
        let results = Mutex<[String: IngestOutcome]>([:])
        let done = DispatchGroup()
        for (name, secret) in [("a", a.secret), ("b", b.secret)] {
            done.enter()
            s.submit(IngestRequest(response: sample(token: String(repeating: "cd", count: 32), index: 1), credentialHash: Credentials.hash(secret: secret))) { r in
                if case .success(let o) = r { results.withLock { $0[name] = o } }
                done.leave()
            }
        }
        done.wait()
        let outcomes = results.withLock { $0 }
        #expect(outcomes.count == 2)
        #expect(outcomes.values.filter { $0 == .conflict }.count == 1)
        #expect(outcomes.values.filter { if case .accepted = $0 { true } else { false } }.count == 1)
    }

    /// The dedupe key holds the app the row was stored for (SQLite schema v7, PostgreSQL v2):
    /// the same four fields stored first under another app are no conflict, each app's retry
    /// finds its own row, and within one app the credential rule stands (409 across credentials,
    /// as during a rotation).
    @Test(arguments: StoreBackend.available)
    func dedupeIsScopedToTheApp(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let apps: Set<String> = ["com.example.app", "com.example.other"]
        let a = try s.createCredential(name: "a", apps: ["com.example.app"])
        let a2 = try s.createCredential(name: "a2", apps: ["com.example.app"])
        let b = try s.createCredential(name: "b", apps: ["com.example.other"])
        let both = try s.createCredential(name: "both", apps: ["com.example.app", "com.example.other"])
        guard case .accepted(let idB) = try s.ingestNow(sample(index: 7), secret: b.secret, apps: apps),
              case .accepted(let idA) = try s.ingestNow(sample(index: 7), secret: a.secret, apps: apps)
        else { Issue.record("not accepted"); return }
        #expect(idA != idB)
        #expect(try s.response(id: idA)?.app == "com.example.app")
        #expect(try s.response(id: idB)?.app == "com.example.other")
        #expect(try s.ingestNow(sample(index: 7), secret: a.secret, apps: apps) == .duplicate(id: idA, state: .queued))
        #expect(try s.ingestNow(sample(index: 7), secret: b.secret, apps: apps) == .duplicate(id: idB, state: .queued))
        #expect(try s.ingestNow(sample(index: 7), secret: a2.secret, apps: apps) == .conflict)
        // A credential of both apps: one row per app it names, each its own duplicate; under an
        // app where another credential holds the key, a conflict.
        guard case .accepted(let x) = try s.ingestNow(sample(index: 8, app: "com.example.app"), secret: both.secret, apps: apps),
              case .accepted(let y) = try s.ingestNow(sample(index: 8, app: "com.example.other"), secret: both.secret, apps: apps)
        else { Issue.record("not accepted"); return }
        #expect(x != y)
        #expect(try s.ingestNow(sample(index: 8, app: "com.example.other"), secret: both.secret, apps: apps) == .duplicate(id: y, state: .queued))
        #expect(try s.ingestNow(sample(index: 7, app: "com.example.other"), secret: both.secret, apps: apps) == .conflict)
        // Submitted together (in one batch, mostly): both apps' rows are stored.
        let results = Mutex<[String: IngestOutcome]>([:])
        let done = DispatchGroup()
        for (name, secret) in [("a", a.secret), ("b", b.secret)] {
            done.enter()
            s.submit(IngestRequest(response: sample(token: String(repeating: "cd", count: 32), index: 1), credentialHash: Credentials.hash(secret: secret))) { r in
                if case .success(let o) = r { results.withLock { $0[name] = o } }
                done.leave()
            }
        }
        done.wait()
        let outcomes = results.withLock { $0 }
        guard case .accepted(let p)? = outcomes["a"], case .accepted(let q)? = outcomes["b"] else { Issue.record("\(outcomes)"); return }
        #expect(p != q)
        #expect(try s.list(OutboxFilter()).count == 6)
    }

    /// A credential's own key with another sealed box is refused with the stored row's id, and
    /// nothing is stored or changed; the same box is still its idempotent retry. Also once the row
    /// is finished, and when the boxes arrive together; never across credentials (a conflict,
    /// whatever the box).
    @Test(arguments: StoreBackend.available)
    func anotherSealedBoxAtAUsedIndexIsRefusedWithTheStoredID(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"])
        let a2 = try s.createCredential(name: "a2", apps: ["com.example.app"])
        func boxed(_ r: NewResponse, _ box: [UInt8]) -> NewResponse { var r = r; r.encryptedData = box; return r }
        let other = boxed(sample(index: 7), [UInt8](repeating: 6, count: 40))
        guard case .accepted(let id) = try s.ingestNow(sample(index: 7), secret: a.secret) else { Issue.record("not accepted"); return }
        let before = try #require(try s.response(id: id))
        #expect(try s.ingestNow(other, secret: a.secret) == .indexReused(id: id))
        #expect(try s.ingestNow(boxed(sample(index: 7), sample().encryptedData + [5]), secret: a.secret) == .indexReused(id: id))
        #expect(try s.ingestNow(sample(index: 7), secret: a.secret) == .duplicate(id: id, state: .queued))
        #expect(try s.ingestNow(other, secret: a2.secret) == .conflict)
        #expect(try s.response(id: id) == before)
        #expect(try s.list(OutboxFilter()).count == 1)
        // Delivered: the index stays used.
        let row = try s.claimDue(limit: 1)[0]
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)])
        #expect(try s.ingestNow(other, secret: a.secret) == .indexReused(id: id))
        #expect(try s.ingestNow(sample(index: 7), secret: a.secret) == .duplicate(id: id, state: .delivered))
        // Submitted together (in one batch, mostly; on PostgreSQL perhaps on two connections at
        // once): one box is stored, the same box shares its id, the other is refused with it.
        let boxes: [UInt8] = [5, 6, 5, 6]
        let results = Mutex<[Int: IngestOutcome]>([:])
        let done = DispatchGroup()
        for (n, b) in boxes.enumerated() {
            done.enter()
            s.submit(IngestRequest(response: boxed(sample(token: String(repeating: "cd", count: 32), index: 1), [UInt8](repeating: b, count: 40)),
                                   credentialHash: Credentials.hash(secret: a.secret))) { r in
                if case .success(let o) = r { results.withLock { $0[n] = o } }
                done.leave()
            }
        }
        done.wait()
        let outcomes = results.withLock { $0 }
        let stored = outcomes.compactMap { n, o -> (Int, String)? in if case .accepted(let id) = o { (n, id) } else { nil } }
        guard stored.count == 1, let (winner, storedID) = stored.first else { Issue.record("\(outcomes)"); return }
        for (n, o) in outcomes where n != winner {
            #expect(o == (boxes[n] == boxes[winner] ? .duplicate(id: storedID, state: .queued) : .indexReused(id: storedID)), "\(n): \(o)")
        }
        #expect(outcomes.count == 4)
        #expect(try s.response(id: storedID)?.encryptedData == [UInt8](repeating: boxes[winner], count: 40))
    }

    @Test(arguments: StoreBackend.available)
    func bothBackendsHoldTheSameColumns(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        try f.open().close()
        let shared: [String: Set<String>] = [
            "responses": ["id", "app", "push_token", "session_id", "key_id", "message_index", "encrypted_data", "credential_id", "state",
                          "attempts", "next_attempt_at", "created_at", "expires_at", "last_status", "last_reason", "updated_at"],
            "attempts": ["id", "response_id", "attempted_at", "status", "reason", "apns_timestamp", "latency_us"],
            "credentials": ["id", "name", "hash", "apps", "created_at", "last_used_at", "revoked_at"],
            "unregistered_tokens": ["token", "apns_timestamp", "recorded_at", "reason"],
            "token_pacing": ["token", "paced_until", "updated_at"],
        ]
        // What each backend adds for itself: SQLite's row key, PostgreSQL's leases.
        let own: [String: Set<String>] = backend == .sqlite ? ["responses": ["id_high"]] : ["responses": ["lease_owner", "lease_expires_at", "lease_epoch"], "attempts": ["node"]]
        for (table, columns) in shared {
            #expect(try f.columns(table) == columns.union(own[table] ?? []), "\(table)")
        }
        // Each backend numbers its own migrations; the stored version is that backend's latest.
        #expect(try f.schemaVersion == (backend == .sqlite ? SQLiteOutboxStore.migrations.count : PostgresOutboxStore.migrations.count))
    }

    @Test(arguments: StoreBackend.available)
    func readOnlyStoreReadsButRefusesWrites(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let w = try f.open()
        defer { w.close() }
        let c = try w.createCredential(name: "c", apps: ["com.example.app"])
        _ = try w.ingestNow(sample(), secret: c.secret)
        let r = try f.open(readOnly: true)
        defer { r.close() }
        #expect(try r.counts().byState[.queued] == 1)
        #expect(throws: StoreError.self) { try r.claimDue(limit: 1) }
        #expect(throws: StoreError.self) { try r.ingestNow(sample(index: 2), secret: c.secret) }
        #expect(!r.checkWritable())
        #expect(w.checkWritable())
    }

    @Test(arguments: StoreBackend.available)
    func closedStoreFailsSubmissions(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        s.close()
        #expect(throws: StoreError.self) { try s.ingestNow(sample(), secret: c.secret) }
    }
}

/// SQLite-only behaviour: WAL mode and the GroupCommitWriter's batching.
@Suite struct SQLiteStoreTests {
    @Test func journalIsWAL() throws {
        let dir = TempDir()
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        #expect(try SQLiteDatabase(path: dir.db, readOnly: true).scalar("PRAGMA journal_mode").string == "wal")
    }
}

@Suite struct GroupCommitTests {
    let dir = TempDir()

    @Test func queuedIngestsCommitInOneTransaction() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let writer = try #require(s.writer)
        let gate = DispatchSemaphore(value: 0)
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 1000, maxPending: 1000)
        let before = writer.batchesCommitted
        // Hold the writer inside a job so the next submissions queue up behind it.
        let entered = DispatchSemaphore(value: 0)
        writer.enqueue({ _ in entered.signal(); gate.wait() }, completion: { _ in })
        entered.wait()
        let done = DispatchGroup()
        let results = Mutex<[IngestOutcome]>([])
        for i in 0..<100 {
            done.enter()
            s.submit(IngestRequest(response: sample(index: UInt32(i)), credentialHash: Credentials.hash(secret: c.secret))) { r in
                if case .success(let o) = r { results.withLock { $0.append(o) } }
                done.leave()
            }
        }
        gate.signal()
        done.wait()
        #expect(results.withLock { $0.count } == 100)
        #expect(results.withLock { $0.allSatisfy { if case .accepted = $0 { true } else { false } } })
        // One batch for the gate job, one for all 100 ingests.
        #expect(writer.batchesCommitted - before == 2)
    }

    @Test func aFailingJobFailsTheWholeBatchAndNothingIsStored() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let writer = try #require(s.writer)
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        writer.enqueue({ _ in entered.signal(); gate.wait() }, completion: { _ in })
        entered.wait()
        let result = ResultBox<Result<IngestOutcome, StoreError>>()
        let done = DispatchSemaphore(value: 0)
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 1000, maxPending: 1000)
        s.submit(IngestRequest(response: sample(), credentialHash: Credentials.hash(secret: c.secret))) {
            result.value = $0
            done.signal()
        }
        writer.enqueue({ db in try db.execute("INSERT INTO no_such_table VALUES (1)") }, completion: { _ in })
        gate.signal()
        done.wait()
        guard case .failure(let e) = result.value! else { Issue.record("ingest succeeded in a failed batch"); return }
        #expect("\(e)".contains("no_such_table"))
        #expect(try s.counts().pending == 0)
        // The next batch works again and the bound counter was recomputed.
        guard case .accepted = try s.ingestNow(sample(), secret: c.secret) else { Issue.record("no recovery"); return }
    }
}

@Suite struct PendingCounterTests {
    let dir = TempDir()
    let clock = TestClock()

    @Test func boundSeesRowsWrittenByAnotherStoreOnTheSameFile() throws {
        let server = try SQLiteOutboxStore(path: dir.db, clock: clock)
        defer { server.close() }
        let secret = try server.createCredential(name: "c", apps: ["com.example.app"]).secret
        _ = try server.ingestNow(sample(index: 1), secret: secret, maxPending: 3)
        guard case .accepted(let failed) = try server.ingestNow(sample(index: 2), secret: secret, maxPending: 3) else { Issue.record("not accepted"); return }
        _ = try server.claimDue(limit: 10)
        try server.apply([DeliveryUpdate(id: failed, pushToken: sample().pushToken, outcome: .failed(reason: "BadDeviceToken"), attempt: nil)])
        _ = try server.recoverInflight()
        // A second store on the same file (relayctl retry in another process; only relay-server
        // ingests) makes the failed row pending again.
        let other = try SQLiteOutboxStore(path: dir.db, clock: clock)
        #expect(try other.requeue(ids: [failed]) == 1)
        other.close()
        _ = try server.ingestNow(sample(index: 3), secret: secret, maxPending: 3)
        #expect(try server.ingestNow(sample(index: 4), secret: secret, maxPending: 3) == .overCapacity)
        let db = try SQLiteDatabase(path: dir.db, readOnly: true)
        #expect(try db.scalar("SELECT pending FROM outbox_stats").int == 3)
        #expect(try db.scalar("SELECT count(*) FROM responses WHERE state IN ('queued','inflight','retry')").int == 3)
    }

    @Test func migrationFromV1CountsExistingRows() throws {
        do {
            // A v1 database with two pending rows and one delivered.
            let db = try SQLiteDatabase(path: dir.db)
            try db.execute(SQLiteOutboxStore.migrations[0])
            try db.execute("PRAGMA user_version = 1")
            for (i, state) in ["queued", "retry", "delivered"].enumerated() {
                try db.run("""
                    INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                        state, attempts, next_attempt_at, created_at, expires_at, updated_at)
                    VALUES (?, 'a', 'ab', 'S', X'01020304', ?, X'00', 'c', ?, 0, 0, 0, 1, 0)
                    """, [.text(RelayCrypto.uuidV4()), .integer(Int64(i)), .text(state)])
            }
        }
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        defer { s.close() }
        let db = try SQLiteDatabase(path: dir.db, readOnly: true)
        #expect(try db.scalar("PRAGMA user_version").int == Int64(SQLiteOutboxStore.schemaVersion))
        #expect(try db.scalar("SELECT pending FROM outbox_stats").int == 2)
    }
}

/// v2 -> v3 rebuilds `responses` (CHECK without an ephemeral table, partial responses_done
/// index), v3 -> v4 makes responses_claim partial, v4 -> v5 keys rows by their id. A v2 file with rows in every state must come
/// through with nothing lost or changed, and dedupe, GET, claim, recovery, counts and purge must
/// work on the migrated rows through the new indexes.
@Suite struct MigrationFromV2Tests {
    let dir = TempDir()
    let clock = TestClock()
    static let states = ["queued", "inflight", "retry", "delivered", "failed"]
    static let columns = "rowid, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state, attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at"

    /// A v2 database (as relay-server v2 left it): one credential, one row per state (the
    /// retry row already due), an attempt for each answered row, outbox_stats = 3 pending.
    func makeV2(secret: String) throws -> [[SQLValue]] {
        let db = try SQLiteDatabase(path: dir.db)
        try db.execute("PRAGMA journal_mode=WAL")
        try db.transaction {
            try db.execute(SQLiteOutboxStore.migrations[0])
            try db.execute(SQLiteOutboxStore.migrations[1])
            try db.execute("PRAGMA user_version = 2")
        }
        let now = clock.nowMillis()
        try db.run("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ('cred_v2', 'v2', ?, 'com.example.app', 0)",
                   [.blob(Credentials.hash(secret: secret))])
        for (i, state) in Self.states.enumerated() {
            let terminal = state == "delivered" || state == "failed"
            try db.run("""
                INSERT INTO responses (rowid, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                    state, attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at)
                VALUES (?, ?, 'com.example.app', ?, '6F9619FF-8B86-D011-B42D-00C04FC964FF', X'01020304', ?, ?, 'cred_v2',
                        ?, ?, ?, ?, ?, ?, ?, ?)
                """, [.integer(Int64(100 + i)), .text(RelayCrypto.uuidV4()), .text(String(repeating: "ab", count: 32)), .integer(Int64(i)),
                      .blob([UInt8](repeating: UInt8(i), count: 40)), .text(state), .integer(state == "queued" ? 0 : 1),
                      .integer(now - 1000), .integer(now - 5000), .integer(now + 86_400_000),
                      state == "queued" ? .null : .integer(terminal && state == "failed" ? 400 : 200),
                      state == "failed" ? .text("BadDeviceToken") : .null, .integer(now - 4000 + Int64(i))])
            if state != "queued" {
                try db.run("INSERT INTO attempts (response_id, attempted_at, status, reason) SELECT id, ?, 200, NULL FROM responses WHERE rowid = ?",
                           [.integer(now - 4000), .integer(Int64(100 + i))])
            }
        }
        try db.run("UPDATE outbox_stats SET pending = 3")
        return try db.query("SELECT \(Self.columns) FROM responses ORDER BY rowid")
    }

    /// The v3 rebuild copies the whole outbox; while it runs the store reports the stage
    /// (relay-server turns that into systemd EXTEND_TIMEOUT_USEC and a log line).
    @Test func aLongMigrationReportsItsStageWhileRunning() throws {
        _ = try makeV2(secret: Credentials.generateSecret())
        let db = try SQLiteDatabase(path: dir.db)
        try db.execute("""
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
            INSERT INTO responses (id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
                state, attempts, next_attempt_at, created_at, expires_at, updated_at)
            SELECT printf('%08x-0000-4000-8000-%012d', i, i), 'com.example.app', 'abcd', '6F9619FF-8B86-D011-B42D-00C04FC964FF',
                   X'01020304', i + 100, zeroblob(40), 'cred_v2', 'delivered', 1, 0, 0, 0, 0 FROM n
            """)
        let stages = Mutex<[String]>([])
        try SQLiteOutboxStore.migrate(db, onSlowStart: { stage in stages.withLock { $0.append(stage) } }, reportEveryMicros: 0)
        let seen = stages.withLock { $0 }
        #expect(seen.contains("migrating the database to schema v3"), "\(Set(seen))")
        #expect(seen.contains("migrating the database to schema v5"), "\(Set(seen))")
        #expect(try db.scalar("PRAGMA user_version").int == Int64(SQLiteOutboxStore.schemaVersion))
        #expect(try db.scalar("SELECT count(*) FROM responses").int == 3005)
    }

    @Test func v2RowsInEveryStateSurviveAndStillWork() throws {
        let secret = Credentials.generateSecret()
        let before = try makeV2(secret: secret)
        #expect(before.count == 5)
        let store = try SQLiteOutboxStore(path: dir.db, clock: clock)
        defer { store.close() }

        let db = try SQLiteDatabase(path: dir.db, readOnly: true)
        #expect(try db.scalar("PRAGMA user_version").int == Int64(SQLiteOutboxStore.schemaVersion))
        // Every column of every row unchanged (v5 re-keys rows by their id's first 64 bits, so
        // compare in id order, without the rowid); attempts and counter kept.
        func byID(_ rows: [[SQLValue]]) -> [[SQLValue]] { rows.map { Array($0.dropFirst()) }.sorted { $0[0].string! < $1[0].string! } }
        #expect(byID(try db.query("SELECT \(Self.columns) FROM responses")) == byID(before))
        #expect(try db.query("SELECT rowid, id FROM responses").allSatisfy { $0[0].int != nil && $0[0].int == UUIDText.high64($0[1].string!) })
        #expect(try db.scalar("SELECT count(*) FROM attempts").int == 4)
        #expect(try db.scalar("SELECT pending FROM outbox_stats").int == 3)
        #expect(try db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'responses_v2'").int == 0)
        let indexes = try db.query("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'responses' ORDER BY name").compactMap { $0[0].string }
        #expect(indexes.contains("responses_claim") && indexes.contains("responses_done") && !indexes.contains("responses_updated"))

        // GET: every migrated row by its id (any case), with its state.
        for row in before {
            let id = try #require(row[1].string)
            let got = try #require(try store.response(id: id.uppercased()))
            #expect(got.state.rawValue == row[9].string)
            #expect(got.encryptedData == row[7].bytes)
        }
        // Dedupe: the same (token, session, keyID, index) and sealed box as each migrated row
        // answers with its id and state; another box at its index is refused with its id.
        for (i, row) in before.enumerated() {
            var retry = sample(index: UInt32(i))
            retry.encryptedData = row[7].bytes ?? []
            let outcome = try store.ingestNow(retry, secret: secret)
            #expect(outcome == .duplicate(id: row[1].string!, state: ResponseState(rawValue: row[9].string!)!))
            retry.encryptedData.append(0xff)
            #expect(try store.ingestNow(retry, secret: secret) == .indexReused(id: row[1].string!))
        }
        // A new response is accepted with a time-ordered id after the migrated ones.
        guard case .accepted(let newID) = try store.ingestNow(sample(index: 99), secret: secret) else {
            Issue.record("new ingest not accepted")
            return
        }
        #expect(newID.utf8.count == 36 && Array(newID.utf8)[14] == UInt8(ascii: "7"))

        // Crash recovery puts the migrated inflight row back; the claim finds queued, recovered and due retry rows.
        #expect(try store.recoverInflight() == 1)
        let claimed = try store.claimDue(limit: 10)
        #expect(Set(claimed.map(\.id)) == Set([before[0][1].string!, before[1][1].string!, before[2][1].string!, newID]))
        #expect(try db.scalar("SELECT pending FROM outbox_stats").int == 4)

        // Purge and "recent outcomes" use the partial index on terminal rows; claims and counts
        // of pending states the partial claim index (no full scan for either).
        func plan(_ sql: String) throws -> String {
            try db.query("EXPLAIN QUERY PLAN " + sql).compactMap { $0.last?.string }.joined(separator: " ")
        }
        #expect(try plan("SELECT count(*) FROM responses WHERE state = 'delivered' AND updated_at < 5").contains("responses_done"))
        #expect(try plan("SELECT count(*) FROM responses WHERE state = 'failed'").contains("responses_done"))
        #expect(try plan("SELECT id FROM responses WHERE state = 'retry' AND next_attempt_at <= 5 ORDER BY next_attempt_at LIMIT 3").contains("responses_claim"))
        #expect(try plan("SELECT count(*) FROM responses WHERE state = 'inflight'").contains("responses_claim"))
        #expect(try db.scalar("SELECT count(*) FROM responses INDEXED BY responses_claim WHERE state = 'queued' OR state = 'inflight' OR state = 'retry'").int == 4)
        #expect(try store.counts().byState == [.queued: 0, .inflight: 4, .retry: 0, .delivered: 1, .failed: 1])
        #expect(try store.recentOutcomes(since: 0).map { "\($0.state.rawValue)/\($0.reason ?? "")/\($0.count)" } == ["delivered//1", "failed/BadDeviceToken/1"])
        #expect(try store.purge(state: .delivered, olderThan: clock.nowMillis(), dryRun: true) == 1)
        #expect(try store.purge(state: .delivered, olderThan: clock.nowMillis(), dryRun: false) == 1)
        #expect(try store.response(id: before[3][1].string!) == nil)
        #expect(try db.scalar("SELECT count(*) FROM attempts WHERE response_id = ?", [before[3][1]]).int == 0)
    }
}

@Suite struct TimeOrderedIDTests {
    @Test func idsAreVersion7AndStrictlyIncreasingEvenWhenTheClockStallsOrStepsBack() throws {
        var gen = TimeOrderedIDs()
        let random: [UInt8] = [0xff, 1, 2, 3, 4, 5, 6, 7]
        var ids: [String] = []
        // Same millisecond 5000 times (counter overflows into the next ms), then the clock steps back.
        for _ in 0..<5000 { ids.append(gen.mint(nowMillis: 1_800_000_000_000, random: random).id) }
        ids.append(gen.mint(nowMillis: 1_700_000_000_000, random: random).id)
        ids.append(gen.mint(nowMillis: 1_900_000_000_000, random: random).id)
        #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 })
        #expect(Set(ids).count == ids.count)
        for id in ids {
            let b = try #require(UUIDText.parse(id))
            #expect(b[6] >> 4 == 7)            // version 7
            #expect(b[8] >> 6 == 0b10)         // RFC 9562 variant
            #expect(id == id.lowercased())
        }
        // The first id's leading 48 bits are the millisecond timestamp.
        let first = try #require(UUIDText.parse(ids[0]))
        #expect(first[0..<6].reduce(Int64(0)) { $0 << 8 | Int64($1) } == 1_800_000_000_000)
        #expect(Array(first[9..<16]) == Array(random[1..<8]))
    }
}

/// A submit completes once, after its batch's COMMIT (or ROLLBACK), on the writer thread, in
/// commit order: plain completions, no executor (the HTTP server moves the reply to its loop).
@Suite struct IngestCompletionTests {
    let dir = TempDir()

    /// Completions in the order they ran, with whether they ran on the submitting thread.
    final class Log: Sendable {
        let entries = Mutex<[(UInt32, Result<IngestOutcome, StoreError>, Bool)]>([])
        func withLock<T>(_ body: (inout [(UInt32, Result<IngestOutcome, StoreError>, Bool)]) -> T) -> T { entries.withLock { body(&$0) } }
    }

    func submit(_ s: SQLiteOutboxStore, _ secret: String, index: UInt32, into results: Log) {
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        let caller = UInt(pthread_self())
        s.submit(IngestRequest(response: sample(index: index), credentialHash: Credentials.hash(secret: secret))) { r in
            let here = UInt(pthread_self()) == caller
            results.withLock { $0.append((index, r, here)) }
        }
    }

    @Test func aBatchCompletesOnTheWriterThreadAfterCommitInCommitOrder() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let results = Log()
        let gate = try holdWriter(s)
        for i in 0..<10 { submit(s, c.secret, index: UInt32(i), into: results) }
        // The writer is held in an earlier batch: nothing is answered before this one committed.
        #expect(results.withLock { $0.isEmpty })
        gate.signal()
        waitUntil("every completion ran") { results.withLock { $0.count == 10 } }
        let all = results.withLock { $0 }
        #expect(all.map(\.0) == Array(0..<10))
        #expect(all.allSatisfy { !$0.2 })
        // Ids are minted in commit order (submission order within the batch).
        var ids: [String] = []
        for (i, r, _) in all {
            guard case .success(.accepted(let id)) = r else { Issue.record("request \(i): \(r)"); continue }
            ids.append(id)
        }
        #expect(ids.count == 10 && ids == ids.sorted())
        #expect(try s.counts().byState[.queued] == 10)
    }

    @Test func aRolledBackBatchFailsEveryIngestInIt() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let results = Log()
        let gate = try holdWriter(s)
        submit(s, c.secret, index: 1, into: results)
        submit(s, c.secret, index: 2, into: results)
        try #require(s.writer).enqueue({ db in try db.execute("INSERT INTO no_such_table VALUES (1)") }, completion: { _ in })
        gate.signal()
        waitUntil("both completions ran") { results.withLock { $0.count == 2 } }
        let all = results.withLock { $0 }
        #expect(all.map(\.0) == [1, 2])
        for (_, r, _) in all {
            guard case .failure(let e) = r else { Issue.record("ingest succeeded in a failed batch"); continue }
            #expect("\(e)".contains("no_such_table"))
        }
        #expect(try s.counts().pending == 0)
    }

    /// The writer keeps StoreRules.admit's last verdict per credential within a batch: a
    /// request for another app, or from another credential in between, is decided afresh.
    @Test func oneBatchDecidesEachAppAndCredentialOnItsOwn() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let both = try s.createCredential(name: "both", apps: ["com.example.a", "com.example.b"])
        let one = try s.createCredential(name: "one", apps: ["com.example.a"])
        let revoked = try s.createCredential(name: "gone", apps: ["com.example.a"])
        _ = try s.revokeCredential(id: revoked.record.id)
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.a", "com.example.b"], ttlMillis: 60_000, maxPending: 1000)
        let asked: [(secret: String, app: String?)] = [
            (both.secret, "com.example.a"), (both.secret, "com.example.a"), (both.secret, "com.example.c"), (both.secret, "com.example.b"),
            (both.secret, nil), (one.secret, nil), (one.secret, "com.example.b"), (revoked.secret, nil), (both.secret, "com.example.a"),
            (one.secret, nil),
        ]
        let results = Log()
        let gate = try holdWriter(s)
        for (i, q) in asked.enumerated() {
            s.submit(IngestRequest(response: sample(index: UInt32(i), app: q.app), credentialHash: Credentials.hash(secret: q.secret))) { r in
                results.withLock { $0.append((UInt32(i), r, false)) }
            }
        }
        gate.signal()
        waitUntil("every completion ran") { results.withLock { $0.count == asked.count } }
        let outcomes = results.withLock { $0 }.sorted { $0.0 < $1.0 }.map { entry -> String in
            switch entry.1 {
            case .success(.accepted): return "accepted"
            case .success(let o): return "\(o)"
            case .failure(let e): return "failed \(e)"
            }
        }
        #expect(outcomes == ["accepted", "accepted", "\(IngestOutcome.unknownApp("com.example.c"))", "accepted",
                             "\(IngestOutcome.appRequired)", "accepted", "\(IngestOutcome.forbidden(app: "com.example.b"))",
                             "\(IngestOutcome.unauthorized)", "accepted", "accepted"])
        let apps = try s.list(OutboxFilter()).reduce(into: [String: Int]()) { $0[$1.app, default: 0] += 1 }
        #expect(apps == ["com.example.a": 5, "com.example.b": 1])
    }

    @Test func aClosedStoreRefusesAtOnceOnTheCallersThread() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        s.close()
        let results = Log()
        submit(s, c.secret, index: 1, into: results)
        let all = results.withLock { $0 }
        #expect(all.count == 1 && all.first?.2 == true)
        if case .failure(.closed) = all.first?.1 {} else { Issue.record("expected .closed, got \(String(describing: all.first))") }
    }
}

/// token_pacing is pruned by the retention sweep once a pacing is over, so the table (and
/// SQLite's in-memory watched-token set) does not grow with every token APNs ever paced.
@Suite struct TokenPacingPruneTests {
    @Test(arguments: StoreBackend.available)
    func theSweepDropsEndedPacingAndKeepsLiveOnes(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let ended = String(repeating: "e1", count: 32), live = String(repeating: "e2", count: 32)
        for token in [ended, live] { _ = try s.ingestNow(sample(token: token, index: 1), secret: c.secret) }
        let rows = try s.claimDue(limit: 2)
        #expect(rows.count == 2)
        let now = f.clock.nowMillis()
        try s.apply(rows.map { r in
            DeliveryUpdate(id: r.id, pushToken: r.pushToken,
                           outcome: .retry(at: now + 100, paceTokenUntil: now + (r.pushToken == ended ? 1_000 : 100_000)), attempt: nil)
        })
        #expect(try f.sql("SELECT count(*) FROM token_pacing") == [["2"]])
        f.clock.advance(2_000)
        RetentionSweeper(store: s, policy: RetentionPolicy(deliveredSeconds: 0, failedSeconds: 0), clock: f.clock,
                         logger: RelayLogger(capture: true), batch: 100).sweepOnce()
        #expect(try f.sql("SELECT token FROM token_pacing") == [[live]])
        if let sqlite = s as? SQLiteOutboxStore {
            #expect(try sqlite.write { _ in sqlite.writerState.watchedTokens } == [live])
        }
        // The live pacing still holds its token's rows back.
        #expect(try s.claimDue(limit: 2).map(\.pushToken) == [ended])
    }
}

/// unregistered_tokens is pruned by the retention sweep once a mark changes nothing
/// (StoreRules.markIsStale): its hold ended staleMarkMillis ago and the rows it covers are past
/// their TTL. A mark still in reach, and a 410 mark while the quarantine is 0, stay.
/// SQLite: an ingest batch that rolls back wrote no last_used_at, so the writer must not
/// remember its credential as touched (it would skip the write for the next minute).
@Suite struct CredentialTouchRollbackTests {
    @Test func aRolledBackIngestDoesNotCountAsTouchingItsCredential() throws {
        let f = try StoreFixture(.sqlite)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let refused = String(repeating: "fe", count: 32)
        _ = try f.sql("""
            CREATE TRIGGER test_refuse BEFORE UPDATE ON outbox_stats
            WHEN EXISTS (SELECT 1 FROM responses WHERE push_token = '\(refused)')
            BEGIN SELECT RAISE(ABORT, 'refused by the test'); END
            """)
        #expect(throws: StoreError.self) { try s.ingestNow(sample(token: refused), secret: c.secret) }
        #expect(try f.sql("SELECT last_used_at IS NULL FROM credentials") == [["1"]])
        guard case .accepted = try s.ingestNow(sample(token: "ab", index: 2), secret: c.secret) else {
            Issue.record("not accepted"); return
        }
        #expect(try f.sql("SELECT last_used_at IS NOT NULL FROM credentials") == [["1"]])
    }
}

@Suite struct StaleMarkPruneTests {
    /// SQLite: a prune whose batch rolls back leaves its tokens watched. The writer's watched
    /// set mirrors the two token tables, and a token wrongly left out of it would skip its
    /// mark's check at ingest (the mark's row is back after the rollback).
    @Test func aRolledBackPruneKeepsItsTokensWatched() throws {
        let f = try StoreFixture(.sqlite)
        let s = try f.open()
        defer { s.close() }
        let sqlite = try #require(s as? SQLiteOutboxStore)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let first = String(repeating: "f3", count: 32), second = String(repeating: "f4", count: 32)
        for token in [first, second] {
            _ = try s.ingestNow(sample(token: token, index: 1), secret: c.secret)
            let r = try s.claimDue(limit: 1)[0]
            try s.apply([DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: f.clock.nowMillis()), attempt: nil)])
        }
        let hold: Int64 = 3_600_000, ttl: Int64 = 86_400_000
        f.clock.advance(hold + StoreRules.staleMarkMillis + ttl + 1_000)
        _ = try s.ingestNow(sample(token: "aa", index: 9), secret: c.secret, ttl: ttl, quarantine: hold)   // the settings
        #expect(try sqlite.write { _ in sqlite.writerState.watchedTokens } == [first, second])
        // The second token's DELETE fails after the first was deleted and unwatched: the batch rolls back.
        _ = try f.sql("""
            CREATE TRIGGER test_refuse_prune BEFORE DELETE ON unregistered_tokens WHEN OLD.token = '\(second)'
            BEGIN SELECT RAISE(ABORT, 'refused by the test'); END
            """)
        #expect(throws: StoreError.self) { try sqlite.pruneStaleMarks(now: f.clock.nowMillis(), limit: 10) }
        #expect(try f.sql("SELECT count(*) FROM unregistered_tokens") == [["2"]])
        #expect(try sqlite.write { _ in sqlite.writerState.watchedTokens } == [first, second])
        _ = try f.sql("DROP TRIGGER test_refuse_prune")
        #expect(try sqlite.pruneStaleMarks(now: f.clock.nowMillis(), limit: 10) == 2)
        #expect(try sqlite.write { _ in sqlite.writerState.watchedTokens }.isEmpty)
    }

    @Test(arguments: StoreBackend.available)
    func theSweepDropsStaleMarksAndKeepsTheOthers(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let old = String(repeating: "f1", count: 32), recent = String(repeating: "f2", count: 32)
        func mark(_ token: String) throws {
            _ = try s.ingestNow(sample(token: token, index: 1), secret: c.secret)
            let r = try s.claimDue(limit: 1)[0]
            try s.apply([DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: f.clock.nowMillis()), attempt: nil)])
        }
        try mark(old)
        let hold: Int64 = 3_600_000, ttl: Int64 = 86_400_000
        f.clock.advance(hold + StoreRules.staleMarkMillis - 10)
        try mark(recent)
        f.clock.advance(20)
        func sweep() {
            RetentionSweeper(store: s, policy: RetentionPolicy(deliveredSeconds: 0, failedSeconds: 0), clock: f.clock,
                             logger: RelayLogger(capture: true), batch: 100).sweepOnce()
        }
        // Quarantine 0: a 410 mark is refused until forgotten, never stale.
        _ = try s.ingestNow(sample(token: "aa", index: 9), secret: c.secret, ttl: ttl, quarantine: 0)
        sweep()
        #expect(Set(try s.unregisteredTokens().map(\.token)) == [old, recent])
        _ = try s.ingestNow(sample(token: "aa", index: 9), secret: c.secret, ttl: ttl, quarantine: hold)
        sweep()
        #expect(try s.unregisteredTokens().map(\.token) == [recent])
        if let sqlite = s as? SQLiteOutboxStore {
            #expect(try sqlite.write { _ in sqlite.writerState.watchedTokens } == [recent])
        }
        // Gone: the old token's responses are accepted (no probe that re-arms a hold).
        for i: UInt32 in [2, 3] {
            guard case .accepted = try s.ingestNow(sample(token: old, index: i), secret: c.secret, ttl: ttl, quarantine: hold) else {
                Issue.record("the pruned token's response \(i) was refused"); return
            }
        }
    }

    @Test func theRuleAndItsBounds() {
        let settings = IngestStoreSettings(ttlMillis: 1000, unregisteredQuarantineMillis: 100, badDeviceTokenHoldMillis: 50)
        let now = StoreRules.staleMarkMillis * 2
        let b = StoreRules.staleMarkBounds(now: now, settings: settings)
        let edge410 = now - 100 - StoreRules.staleMarkMillis, edgeBad = now - 50 - StoreRules.staleMarkMillis
        #expect(StoreRules.markIsStale(reason: "Unregistered", recordedAt: edge410 - 1, cutoff: now - 1001, bounds: b))
        #expect(!StoreRules.markIsStale(reason: "Unregistered", recordedAt: edge410, cutoff: now - 1001, bounds: b))
        #expect(!StoreRules.markIsStale(reason: "Unregistered", recordedAt: edge410 - 1, cutoff: now - 1000, bounds: b))
        #expect(StoreRules.markIsStale(reason: "BadDeviceToken", recordedAt: edgeBad - 1, cutoff: now - 1001, bounds: b))
        #expect(!StoreRules.markIsStale(reason: "BadDeviceToken", recordedAt: edgeBad, cutoff: now - 1001, bounds: b))
        var forever = settings
        forever.unregisteredQuarantineMillis = 0
        #expect(!StoreRules.markIsStale(reason: "Unregistered", recordedAt: .min + 1, cutoff: .min + 1, bounds: StoreRules.staleMarkBounds(now: now, settings: forever)))
        // No overflow with huge holds: nothing is stale.
        forever.unregisteredQuarantineMillis = .max
        #expect(!StoreRules.markIsStale(reason: "Unregistered", recordedAt: 0, cutoff: 0, bounds: StoreRules.staleMarkBounds(now: now, settings: forever)))
    }
}
