import Foundation
import Testing
@testable import RelayCore

/// Two tenants on one relay, through IngestService on every store backend: app A
/// (`com.example.app`, credentials `a` and `a2`) and app B (`com.example.other`, credential `b`),
/// plus `both` (may send for either) for the refusals that name no app. What one tenant sends
/// naming the other's push token or dedupe key must not change the other's answers.
@Suite struct TenantIsolationTests {
    static let appA = "com.example.app", appB = "com.example.other"
    static let token = String(repeating: "ab", count: 32)

    final class Harness {
        let fixture: StoreFixture
        let store: any OutboxStore
        let metrics = RelayMetrics()
        let workers = WorkerPool(name: "tenant-test", threads: 1)
        let service: IngestService
        let a, a2, b, both: String

        init(_ backend: StoreBackend, settings: (inout IngestSettings) -> Void = { _ in }) throws {
            fixture = try StoreFixture(backend)
            store = try fixture.open()
            store.ingestSettings = IngestStoreSettings(configuredApps: [appA, appB])
            a = try store.createCredential(name: "a", apps: [appA]).secret
            a2 = try store.createCredential(name: "a2", apps: [appA]).secret
            b = try store.createCredential(name: "b", apps: [appB]).secret
            both = try store.createCredential(name: "both", apps: [appA, appB]).secret
            var s = IngestSettings()
            settings(&s)
            service = IngestService(store: store, settings: s, metrics: metrics, logger: RelayLogger(capture: true), workers: workers)
        }

        deinit {
            workers.close()
            store.close()
        }

        func post(_ secret: String, index: Int, app: String? = nil, sealed: Data = Data(count: 40)) -> (status: Int, json: [String: Any], body: String) {
            let slot = ResultBox<APIReply>()
            let done = DispatchSemaphore(value: 0)
            let body = IngestServiceTests.body(index: index, token: TenantIsolationTests.token, app: app, sealed: sealed)
            service.handle(APIRequest(method: "POST", path: "/v1/responses",
                                      headers: ["authorization": "Bearer \(secret)", "content-type": "application/json"],
                                      body: Array(body.utf8), requestID: "t", remoteAddress: "192.0.2.1:40000")) {
                slot.value = $0.reply
                done.signal()
            }
            done.wait()
            let r = slot.value!
            let json = (try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any]) ?? [:]
            return (r.status, json, r.body)
        }
    }

    /// Issue 29 item 2 as reported: B's 120 requests naming A's push token (60 under B's own app,
    /// 60 naming A's app and refused 403) used to leave A's next request 429. The bucket is per
    /// (app, token) and only admitted requests pay: A still has its whole burst, and the
    /// refusals that name no usable app (app_required, unknown_app) pay nothing either.
    @Test(arguments: StoreBackend.available)
    func anotherTenantNamingATokenDoesNotSpendItsBucket(_ backend: StoreBackend) throws {
        // Refill slowed so that only the charges decide (the default is 10/s, burst 20).
        let h = try Harness(backend) { $0.perPushToken = RateLimit(perSecond: 0.001, burst: 20) }
        var statuses: [Int: Int] = [:]
        for i in 0..<60 { statuses[h.post(h.b, index: i).status, default: 0] += 1 }
        #expect(statuses == [202: 20, 429: 40], "B's own bucket for the token: \(statuses)")
        for i in 0..<60 {
            let r = h.post(h.b, index: 100 + i, app: Self.appA)
            #expect(r.status == 403 && r.json["error"] as? String == "forbidden", "\(r.body)")
        }
        for i in 0..<10 {
            #expect(h.post(h.both, index: 200 + i).json["error"] as? String == "app_required")
            #expect(h.post(h.both, index: 300 + i, app: "com.example.unknown").json["error"] as? String == "unknown_app")
        }
        // A's bucket is whole: its burst, then 429 (the bucket still limits A).
        statuses = [:]
        for i in 0..<21 { statuses[h.post(h.a, index: 1000 + i).status, default: 0] += 1 }
        #expect(statuses == [202: 20, 429: 1], "A's bucket for the token: \(statuses)")
        // A's other credential shares A's bucket for the token (same app).
        let shared = h.post(h.a2, index: 2000)
        #expect(shared.status == 429 && shared.json["field"] as? String == "pushToken", "\(shared.body)")
    }

    /// Issue 29 item 3 as reported: B (another app) posting A's key first gave A's real response
    /// 409 `conflict` for good. The key holds the app: A gets 202 and its own row, each
    /// tenant's retry finds its own row, and another credential of A's app still gets 409.
    @Test(arguments: StoreBackend.available)
    func anotherAppPostingAKeyFirstDoesNotConflict(_ backend: StoreBackend) throws {
        let h = try Harness(backend)
        let first = h.post(h.b, index: 41)
        #expect(first.status == 202, "\(first.body)")
        let idB = try #require(first.json["id"] as? String)
        let mine = h.post(h.a, index: 41)
        #expect(mine.status == 202, "\(mine.body)")
        let idA = try #require(mine.json["id"] as? String)
        #expect(idA != idB)
        #expect(try h.store.response(id: idA)?.app == Self.appA)
        let retryA = h.post(h.a, index: 41), retryB = h.post(h.b, index: 41)
        #expect(retryA.status == 200 && retryA.json["id"] as? String == idA)
        #expect(retryB.status == 200 && retryB.json["id"] as? String == idB)
        // Within one app the key still belongs to the credential that stored it (rotation).
        let rotated = h.post(h.a2, index: 41)
        #expect(rotated.status == 409 && rotated.json["error"] as? String == "conflict" && rotated.json["field"] as? String == "messageIndex")
        #expect(!rotated.body.contains(idA) && !rotated.body.contains(idB))
        #expect(h.metrics.render().contains("relay_ingest_refused_total{code=\"conflict\"} 1"))
    }
}
