import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// Bounded disk (issue 15): retention in small batches on both backends, the free-space guard,
/// and the config keys that drive them.
@Suite struct RetentionContractTests {
    /// 6 delivered rows with an attempt each, 3 failed, 1 queued, 1 inflight; returns ids by state.
    func seed(_ s: any OutboxStore, _ clock: TestClock) throws -> [ResponseState: [String]] {
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        for i in 0..<11 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: c.secret) }
        let rows = try s.claimDue(limit: 10)
        var updates: [DeliveryUpdate] = []
        for (n, r) in rows.enumerated() where n < 9 {
            let a = AttemptRecord(responseID: r.id, attemptedAt: clock.nowMillis(), status: n < 6 ? 200 : 400, reason: n < 6 ? nil : "BadDeviceToken")
            updates.append(DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: n < 6 ? .delivered : .failed(reason: "BadDeviceToken"), attempt: a))
        }
        try s.apply(updates)
        var ids: [ResponseState: [String]] = [:]
        for st in ResponseState.allCases { ids[st] = try s.list(OutboxFilter(state: st)).map(\.id) }
        return ids
    }

    @Test(arguments: StoreBackend.available)
    func purgeBatchDeletesAtMostItsLimitWithTheAttemptsAndNeverUnfinishedRows(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let ids = try seed(s, f.clock)
        #expect(ids[.delivered]?.count == 6 && ids[.failed]?.count == 3 && ids[.queued]?.count == 1 && ids[.inflight]?.count == 1)
        f.clock.advance(1000)
        let cutoff = f.clock.nowMillis()
        #expect(try s.purgeBatch(state: .delivered, olderThan: cutoff, limit: 4) == 4)
        #expect(try s.counts().byState[.delivered] == 2)
        // Attempts go with their rows.
        let gone = try ids[.delivered]!.filter { try s.response(id: $0) == nil }
        #expect(gone.count == 4)
        for id in gone { #expect(try s.attempts(responseID: id).isEmpty) }
        // The rest in batches of 1: purge() loops until a batch comes back short.
        #expect(try PurgeBatches.run(s, state: .delivered, olderThan: cutoff, batch: 1) == 2)
        #expect(try s.purgeBatch(state: .delivered, olderThan: cutoff, limit: 4) == 0)
        // Rows updated at or after the cutoff stay; unfinished states are refused outright.
        #expect(try s.purge(state: .failed, olderThan: cutoff - 1000, dryRun: false) == 0)
        #expect(try s.purge(state: .failed, olderThan: cutoff, dryRun: false) == 3)
        #expect(throws: StoreError.self) { try s.purgeBatch(state: .queued, olderThan: cutoff, limit: 10) }
        #expect(throws: StoreError.self) { try s.purgeBatch(state: .inflight, olderThan: cutoff, limit: 10) }
        let left = try s.counts()
        #expect(left.byState[.queued] == 1 && left.byState[.inflight] == 1 && left.byState[.delivered] == 0 && left.byState[.failed] == 0)
        #expect(try s.attempts(responseID: ids[.inflight]![0]).isEmpty)
    }

    @Test(arguments: StoreBackend.available)
    func retentionSweepRemovesOnlyWhatThePolicyLetsGo(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let ids = try seed(s, f.clock)
        // Delivered rows kept 10 s, failed rows forever (0).
        let sweeper = RetentionSweeper(store: s, policy: RetentionPolicy(deliveredSeconds: 10, failedSeconds: 0), clock: f.clock, pauseMillis: 0, batch: 4)
        f.clock.advance(9_000)
        #expect(sweeper.sweepOnce().isEmpty || sweeper.sweepOnce()[.delivered] == 0)
        #expect(try s.counts().byState[.delivered] == 6)
        f.clock.advance(1_001)
        #expect(sweeper.sweepOnce() == [.delivered: 6])
        let c = try s.counts()
        #expect(c.byState[.delivered] == 0 && c.byState[.failed] == 3 && c.byState[.queued] == 1 && c.byState[.inflight] == 1)
        for id in ids[.delivered]! { #expect(try s.attempts(responseID: id).isEmpty) }
        #expect(try ids[.failed]!.allSatisfy { try !s.attempts(responseID: $0).isEmpty })
        var r = PrometheusRegistry()
        sweeper.collectMetrics(into: &r)
        let text = r.render()
        #expect(text.contains("relay_retention_removed_total{state=\"delivered\"} 6"))
        #expect(text.contains("relay_retention_removed_total{state=\"failed\"} 0"))
        #expect(text.contains("relay_retention_seconds{state=\"failed\"} 0"))
    }

    @Test func theSweeperThreadRunsAndStops() throws {
        let f = try StoreFixture(.sqlite)
        let s = try f.open()
        defer { s.close() }
        _ = try seed(s, f.clock)
        f.clock.advance(20_000)
        let sweeper = RetentionSweeper(store: s, policy: RetentionPolicy(deliveredSeconds: 10, failedSeconds: 10), clock: f.clock, intervalMillis: 10)
        sweeper.start()
        // Bounded wait with a generous deadline (no timing assertion).
        let deadline = Date().addingTimeInterval(30)
        while try s.counts().byState[.failed] != 0, Date() < deadline { usleep(10_000) }
        sweeper.stop()
        #expect(try s.counts().byState[.delivered] == 0 && s.counts().byState[.failed] == 0)
        // Nothing to do with a keep-everything policy: start() starts no thread, stop() returns.
        let idle = RetentionSweeper(store: s, policy: RetentionPolicy(deliveredSeconds: 0, failedSeconds: 0), clock: f.clock)
        idle.start()
        idle.stop()
        #expect(RetentionPolicy(deliveredSeconds: 0, failedSeconds: 0).cutoffs(now: 1000).isEmpty)
    }
}

@Suite struct FreeSpaceGuardTests {
    /// A probe whose answer the test sets, counting its calls.
    final class FakeDisk: Sendable {
        let state = Mutex((free: Int64(10 << 30), calls: 0, now: Int64(0)))
        var probe: FreeSpaceGuard.Probe { { [self] _ in state.withLock { $0.calls += 1; return $0.free } } }
        var now: @Sendable () -> Int64 { { [self] in state.withLock { $0.now } } }
        func set(free: Int64) { state.withLock { $0.free = free } }
        func advance(micros: Int64) { state.withLock { $0.now += micros } }
        var calls: Int { state.withLock { $0.calls } }
    }

    @Test func theProbeRunsAtMostOncePerCachePeriod() {
        let disk = FakeDisk()
        let g = FreeSpaceGuard(path: "/x", minFreeBytes: 1 << 30, cacheMicros: 1_000_000, probe: disk.probe, now: disk.now)
        for _ in 0..<1000 { #expect(!g.isBelowFloor) }
        #expect(disk.calls == 1)
        disk.set(free: 1 << 20)
        #expect(!g.isBelowFloor)   // cached for the period
        disk.advance(micros: 1_000_000)
        #expect(g.isBelowFloor)
        #expect(disk.calls == 2)
        // Off at 0; a failed probe never refuses.
        #expect(!FreeSpaceGuard(path: "/x", minFreeBytes: 0, probe: disk.probe, now: disk.now).isBelowFloor)
        #expect(!FreeSpaceGuard(path: "/x", minFreeBytes: 1 << 30, probe: { _ in nil }).isBelowFloor)
    }

    @Test func statvfsReportsTheFilesystemOfTheDatabase() throws {
        let dir = TempDir()
        let s = try SQLiteOutboxStore(path: dir.db)
        s.close()
        let free = try #require(FreeSpaceGuard.statvfsAvailable(dir.db))
        #expect(free > 0)
        #expect(FreeSpaceGuard.statvfsAvailable(dir.db + ".missing/x") == nil)
    }

    @Test func belowTheFloorIngestIsRefusedButPurgeAndDeliveryStillWork() throws {
        let dir = TempDir()
        let clock = TestClock()
        let disk = FakeDisk()
        var options = SQLiteStoreOptions()
        options.minFreeBytes = 1 << 30
        options.freeSpaceProbe = disk.probe
        let s = try SQLiteOutboxStore(path: dir.db, options: options, clock: clock)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("not accepted"); return }
        guard case .accepted = try s.ingestNow(sample(index: 2), secret: c.secret) else { Issue.record("not accepted"); return }
        let row = try s.claimDue(limit: 1)[0]
        // The guard's own clock is monotonic time: wait out its 1 s cache (bounded, generous).
        disk.set(free: (1 << 30) - 1)
        let deadline = Date().addingTimeInterval(30)
        var index: UInt32 = 3
        var outcome = try s.ingestNow(sample(index: index), secret: c.secret)
        var acceptedWhileCached = 0
        while outcome != .storageFull, Date() < deadline {
            if case .accepted = outcome { acceptedWhileCached += 1 }
            usleep(100_000)
            index += 1
            outcome = try s.ingestNow(sample(index: index), secret: c.secret)
        }
        #expect(outcome == .storageFull)
        // Refused means not stored.
        #expect(try s.list(OutboxFilter()).count == 2 + acceptedWhileCached)
        #expect(try s.response(id: row.id)?.state == .inflight)
        #expect(s.freeSpaceGuard?.isBelowFloor == true)
        // The dispatcher, retention and relayctl still write: finishing and deleting rows is how
        // space comes back.
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)])
        clock.advance(1000)
        #expect(try s.purge(state: .delivered, olderThan: clock.nowMillis(), dryRun: false) == 1)
        #expect(try s.list(OutboxFilter()).count == 1 + acceptedWhileCached)
        // A read-only store (relayctl status) has no guard.
        let r = try SQLiteOutboxStore(path: dir.db, options: SQLiteStoreOptions(readOnly: true))
        defer { r.close() }
        #expect(r.freeSpaceGuard == nil)
    }

    @Test func storageFullIs503WithRetryAfterAndReadyzSaysWhy() throws {
        let dir = TempDir()
        let disk = FakeDisk()
        disk.set(free: 100)
        var options = SQLiteStoreOptions()
        options.minFreeBytes = 1 << 30
        options.freeSpaceProbe = disk.probe
        let store = try SQLiteOutboxStore(path: dir.db, options: options)
        defer { store.close() }
        let secret = try store.createCredential(name: "a", apps: ["com.example.app"]).secret
        let workers = WorkerPool(name: "test", threads: 1)
        defer { workers.close() }
        let metrics = RelayMetrics()
        let settings = IngestSettings()
        store.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"])
        let service = IngestService(store: store, settings: settings, metrics: metrics, logger: RelayLogger(capture: true), workers: workers)
        func call(_ svc: @escaping (APIRequest, @escaping @Sendable (APIReply) -> Void) -> Void, _ method: String, _ path: String, body: String = "") -> APIReply {
            let slot = ResultBox<APIReply>()
            let done = DispatchSemaphore(value: 0)
            svc(APIRequest(method: method, path: path, headers: ["authorization": "Bearer \(secret)", "content-type": "application/json"],
                           body: Array(body.utf8), requestID: "r1", remoteAddress: "192.0.2.1:40000")) {
                slot.value = $0
                done.signal()
            }
            done.wait()
            return slot.value!
        }
        let r = call({ request, respond in service.handle(request) { respond($0.reply) } }, "POST", "/v1/responses", body: IngestServiceTests.body())
        #expect(r.status == 503)
        #expect(r.body.contains("\"error\":\"storage_full\""))
        #expect(r.header("retry-after") != nil)
        #expect(try store.list(OutboxFilter()).isEmpty)
        #expect(metrics.render().contains("relay_ingest_refused_total{code=\"storage_full\"} 1"))
        let admin = AdminService(store: store, metrics: metrics, workers: workers, readiness: { [:] }, extraMetrics: { _ in })
        let ready = call(admin.handle, "GET", "/readyz")
        #expect(ready.status == 503)
        #expect(ready.body.contains("\"storage_free_space\":false") && ready.body.contains("\"database_writable\":true"), "\(ready.body)")
        var page = PrometheusRegistry()
        OutboxStores.collectDiskMetrics(store, retention: nil, into: &page)
        #expect(page.render().contains("relay_store_free_bytes 100\n"))
    }
}

@Suite struct StoreDiskConfigTests {
    static let app = #""apps": [{"bundleID": "com.example.app", "environment": "sandbox", "token": {"p8Path": "k.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]"#

    @Test func defaultsAndValues() throws {
        let d = try RelayConfig.parse(Array("{\(Self.app)}".utf8))
        #expect(d.store.retention == RetentionPolicy(deliveredSeconds: 86_400, failedSeconds: 604_800))
        #expect(d.store.minFreeBytes == 1 << 30)
        let c = try RelayConfig.parse(Array(#"{"store": {"retention": {"deliveredSeconds": 0, "failedSeconds": 60}, "minFreeBytes": 0}, \#(Self.app)}"#.utf8))
        #expect(c.store.retention == RetentionPolicy(deliveredSeconds: 0, failedSeconds: 60))
        #expect(c.store.minFreeBytes == 0)
        let pg = try RelayConfig.parse(Array(#"{"store": {"kind": "postgres", "url": "postgresql://relay@db/relay", "retention": {"failedSeconds": 5}}, \#(Self.app)}"#.utf8))
        #expect(pg.store.retention.failedSeconds == 5 && pg.store.minFreeBytes == 0)
    }

    @Test func mistakesNameTheKey() {
        let cases: [(String, String)] = [
            (#"{"retention": {"deliveredSeconds": -1}}"#, "store.retention.deliveredSeconds: must be a non-negative integer"),
            (#"{"retention": {"failedSeconds": 1.5}}"#, "store.retention.failedSeconds: must be a non-negative integer"),
            (#"{"retention": {"failedSeconds": "7d"}}"#, "store.retention.failedSeconds: must be a non-negative integer"),
            (#"{"retention": {"keepSeconds": 1}}"#, "store.retention.keepSeconds: unknown key (allowed: deliveredSeconds, failedSeconds)"),
            (#"{"retention": 86400}"#, "store.retention: must be an object"),
            (#"{"minFreeBytes": -5}"#, "store.minFreeBytes: must be a non-negative integer"),
            (#"{"kind": "postgres", "url": "postgresql://x/y", "minFreeBytes": 1}"#, "store.minFreeBytes: only allowed with store.kind \"sqlite\""),
        ]
        for (store, message) in cases {
            do {
                _ = try RelayConfig.parse(Array(#"{"store": \#(store), \#(Self.app)}"#.utf8))
                Issue.record("accepted: \(store)")
            } catch let e as ConfigError {
                #expect(e.description == message)
            } catch { Issue.record("wrong error \(error)") }
        }
    }
}
