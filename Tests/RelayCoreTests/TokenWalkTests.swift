import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// A 410 or TooManyRequests for a token with thousands of waiting rows: the rows end as the
/// token's answer says, in bounded steps with other tokens' ingests committing in between, and
/// across a restart (docs/storage.md "Token-wide outcomes").
extension StoreContractTests {
    static let busyToken = String(repeating: "ab", count: 32)
    static let otherToken = String(repeating: "cd", count: 32)

    /// `count` rows for `token`, submitted together (committed in a few group commits).
    static func fill(_ s: any OutboxStore, token: String, count: Int, secret: String, from first: UInt32 = 0) throws {
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 86_400_000, maxPending: 1_000_000)
        let failures = Counter()
        let done = DispatchGroup()
        for i in 0..<count {
            done.enter()
            s.submit(IngestRequest(response: sample(token: token, index: first + UInt32(i)), credentialHash: Credentials.hash(secret: secret))) { r in
                if case .success(.accepted) = r {} else { failures.add() }
                done.leave()
            }
        }
        done.wait()
        #expect(failures.value == 0)
    }

    static func failedUnregistered(_ s: any OutboxStore) throws -> Int {
        try s.recentOutcomes(since: 0).filter { $0.state == .failed && $0.reason == StoreRules.unregisteredReason }.reduce(0) { $0 + $1.count }
    }

    @Test(arguments: StoreBackend.available)
    func a410FailsEveryWaitingRowOfItsTokenInClaimSizedSteps(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        try Self.fill(s, token: Self.busyToken, count: 5000, secret: c.secret)
        let answered = try s.claimDue(limit: 1)[0]
        f.clock.advance(5)
        let ts = f.clock.nowMillis()
        try s.apply([DeliveryUpdate(id: answered.id, pushToken: answered.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts),
                                    attempt: AttemptRecord(responseID: answered.id, attemptedAt: ts, status: 410, reason: "Unregistered", apnsTimestamp: ts))])
        #expect(try s.unregisteredTokens().map(\.token) == [Self.busyToken])
        #expect(try s.ingestNow(sample(token: Self.busyToken, index: 99_999), secret: c.secret) == .unregistered)
        // Claims fail the token's rows, at most a claim's limit per transaction, and another
        // token's ingest commits between them and is sent.
        var steps = 0
        var sentOther = 0
        while try s.counts().byState[.queued] ?? 0 > 0 {
            steps += 1
            guard case .accepted = try s.ingestNow(sample(token: Self.otherToken, index: UInt32(steps)), secret: c.secret, maxPending: 1_000_000) else {
                Issue.record("other token refused"); return
            }
            let claimed = try s.claimDue(limit: 1000)
            #expect(claimed.allSatisfy { $0.pushToken == Self.otherToken })
            sentOther += claimed.count
            #expect(steps < 20)
            if steps >= 20 { break }
        }
        #expect(steps >= 5)
        #expect(sentOther == steps)
        #expect(try Self.failedUnregistered(s) == 5000)
        let first = try #require(try s.response(id: answered.id))
        #expect(first.state == .failed && first.attempts == 1 && first.lastStatus == 410)
    }

    @Test(arguments: StoreBackend.available)
    func aRestartInTheMiddleOfA410sStepsFinishesThem(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        do {
            let s = try f.open()
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            try Self.fill(s, token: Self.busyToken, count: 3000, secret: c.secret)
            let answered = try s.claimDue(limit: 1)[0]
            let ts = f.clock.nowMillis()
            try s.apply([DeliveryUpdate(id: answered.id, pushToken: answered.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts), attempt: nil)])
            _ = try s.claimDue(limit: 1000)
            #expect(try Self.failedUnregistered(s) == 1001)
            s.close()
        }
        // The cutoff is durable: the next process's claims finish the token's rows.
        let s = try f.open()
        defer { s.close() }
        _ = try s.recoverInflight()
        var steps = 0
        while try s.counts().byState[.queued] ?? 0 > 0, steps < 10 {
            #expect(try s.claimDue(limit: 1000).isEmpty)
            steps += 1
        }
        #expect(try Self.failedUnregistered(s) == 3000)
    }

    @Test(arguments: StoreBackend.available)
    func tooManyRequestsPacesEveryWaitingRowOfItsToken(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        try Self.fill(s, token: Self.busyToken, count: 2500, secret: c.secret)
        let answered = try s.claimDue(limit: 1)[0]
        let until = f.clock.nowMillis() + 60_000
        try s.apply([DeliveryUpdate(id: answered.id, pushToken: answered.pushToken, outcome: .retry(at: until, paceTokenUntil: until), attempt: nil)])
        try Self.fill(s, token: Self.otherToken, count: 3, secret: c.secret)
        // Not one of the token's rows is sent before the pacing ends; the other token's are.
        var sent: [OutboxRow] = []
        for _ in 0..<10 { sent += try s.claimDue(limit: 1000) }
        #expect(sent.map(\.pushToken) == [String](repeating: Self.otherToken, count: 3))
        #expect(try s.nextDueAt() == until)
        f.clock.advance(60_000)
        var later = 0
        for _ in 0..<5 { later += try s.claimDue(limit: 1000).count }
        #expect(later == 2500)
    }
}

/// SQLite's cutoff scan (SQLiteOutboxStore+TokenScan.swift): bounded steps, ingest between
/// them, and a restart in the middle.
@Suite struct SQLiteTokenScanTests {
    @Test func theCutoffIsReadInStepsWithIngestCommittingBetweenThem() throws {
        let f = try StoreFixture(.sqlite)
        let s = try f.open() as! SQLiteOutboxStore
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        try StoreContractTests.fill(s, token: StoreContractTests.busyToken, count: 5000, secret: c.secret)
        let answered = try s.claimDue(limit: 1)[0]
        // An ingest of another token submitted while the scan runs commits before it ends.
        let stepsWhenOtherCommitted = Mutex<Int?>(nil)
        let otherDone = DispatchSemaphore(value: 0)
        let ts = f.clock.nowMillis()
        let applied = DispatchSemaphore(value: 0)
        s.apply([DeliveryUpdate(id: answered.id, pushToken: answered.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts), attempt: nil)]) { _ in
            applied.signal()
        }
        s.submit(IngestRequest(response: sample(token: StoreContractTests.otherToken, index: 1), credentialHash: Credentials.hash(secret: c.secret))) { _ in
            stepsWhenOtherCommitted.withLock { $0 = s.tokenScanSteps }
            otherDone.signal()
        }
        otherDone.wait()
        applied.wait()
        let total = s.tokenScanSteps
        #expect(total >= 5)   // 5,000 rows, 1,000 a step
        #expect((stepsWhenOtherCommitted.withLock { $0 } ?? .max) < total)
        #expect(try s.unregisteredTokens().first?.apnsTimestamp == StoreRules.markCutoff(apnsTimestamp: ts, newestPendingCreatedAt: f.clock.nowMillis(), now: f.clock.nowMillis()))
    }

    @Test func aRestartDuringTheScanLeavesTheAnsweredRowToBeSentAgain() throws {
        let f = try StoreFixture(.sqlite)
        var id = ""
        do {
            let s = try f.open() as! SQLiteOutboxStore
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            try StoreContractTests.fill(s, token: StoreContractTests.busyToken, count: 3000, secret: c.secret)
            let state = s.writerState
            try s.write { _ in state.scans.walkChunk = 10 }   // hundreds of steps: the close lands among them
            let answered = try s.claimDue(limit: 1)[0]
            id = answered.id
            let ts = f.clock.nowMillis()
            let told = Mutex<StoreError?>(nil)
            let done = DispatchSemaphore(value: 0)
            s.apply([DeliveryUpdate(id: answered.id, pushToken: answered.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts), attempt: nil)]) { e in
                told.withLock { $0 = e }
                done.signal()
            }
            s.close()   // the scan has not finished: nothing of it is written
            done.wait()
            #expect(told.withLock { $0 } != nil)
        }
        let s = try f.open()
        defer { s.close() }
        #expect(try s.unregisteredTokens().isEmpty)
        #expect(try s.response(id: id)?.state == .inflight)
        #expect(try s.recoverInflight() == 1)
        // Sent again, answered 410 again: this time the scan ends and the claims fail the rest.
        let again = try s.claimDue(limit: 1)[0]
        let ts = f.clock.nowMillis()
        try s.apply([DeliveryUpdate(id: again.id, pushToken: again.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts), attempt: nil)])
        for _ in 0..<5 { _ = try s.claimDue(limit: 1000) }
        #expect(try StoreContractTests.failedUnregistered(s) == 3000)
    }
}

/// PostgreSQL's v3 index (the token's waiting rows by created_at, read by a 410's cutoff),
/// migrated from a v2 database holding rows.
@Suite(.enabled(if: PGTest.url != nil, Comment(rawValue: PGTest.skipMessage)))
struct PostgresTokenIndexTests {
    @Test func aV2DatabaseGetsTheTokenIndexAndTheCutoffUsesIt() throws {
        let f = try StoreFixture(.postgres)
        do {
            let s = try f.open()
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            try StoreContractTests.fill(s, token: StoreContractTests.busyToken, count: 50, secret: c.secret)
            s.close()
        }
        // Back to v2 (the app-scoped dedupe key) as it was shipped: no token index, and a 410
        // mark without a reason (v4 adds it: the old marks are 410s).
        _ = try f.sql("DROP INDEX responses_token_pending")
        _ = try f.sql("ALTER TABLE unregistered_tokens DROP COLUMN reason")
        _ = try f.sql("INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at) VALUES ('\(StoreContractTests.otherToken)', 1, 1)")
        _ = try f.sql("DROP TABLE webhook_deliveries, events")   // v5 (delivery events)
        try f.setSchemaVersion(2)
        let s = try f.open()
        defer { s.close() }
        #expect(try f.schemaVersion == PostgresOutboxStore.schemaVersion)
        #expect(try s.unregisteredTokens().map(\.reason) == ["Unregistered"])
        #expect(try s.forgetToken(StoreContractTests.otherToken))
        #expect(try f.sql("SELECT indexdef FROM pg_indexes WHERE schemaname = '\(f.schema)' AND indexname = 'responses_token_pending'").first?.first??
            .contains("(push_token, created_at)") == true)
        let answered = try s.claimDue(limit: 1)[0]
        let ts = f.clock.nowMillis() - 10
        try s.apply([DeliveryUpdate(id: answered.id, pushToken: answered.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts), attempt: nil)])
        // The cutoff was raised to the newest waiting row's created_at, read through the index.
        #expect(try s.unregisteredTokens().first?.apnsTimestamp == f.clock.nowMillis())
        #expect(try s.claimDue(limit: 100).isEmpty)
        #expect(try StoreContractTests.failedUnregistered(s) == 50)
    }
}
