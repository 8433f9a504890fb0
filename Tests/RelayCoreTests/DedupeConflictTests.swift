import Foundation
import Testing
@testable import RelayCore

/// Dedupe scoped to the credential, as a client sees it (StoreContractTests check both stores).
@Suite struct DedupeConflictTests {
    let dir = TempDir()
    let clock = TestClock()

    @Test func anotherCredentialsKeyAnswers409NamingMessageIndexAndRevealingNothing() throws {
        let metrics = RelayMetrics()
        let h = try IngestServiceTests.Harness(dir: dir, clock: clock, metrics: metrics)
        let body = IngestServiceTests.body(index: 41, app: "com.example.app")
        let first = h.call(secret: h.otherSecret, body: body)
        #expect(first.status == 202)
        let json = { (r: APIReply) in (try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any]) ?? [:] }
        let idB = try #require(json(first)["id"] as? String)
        let before = try #require(try h.store.response(id: idB))
        let conflict = h.call(secret: h.secret, body: body)
        #expect(conflict.status == 409)
        let error = json(conflict)
        #expect(error["error"] as? String == "conflict")
        #expect(error["field"] as? String == "messageIndex")
        #expect(!conflict.body.contains(idB) && !conflict.body.contains("queued"))
        // The owner's retry still gets its id; its row is untouched.
        let retry = h.call(secret: h.otherSecret, body: body)
        #expect(retry.status == 200 && json(retry)["id"] as? String == idB)
        #expect(try h.store.response(id: idB) == before)
        #expect(metrics.render().contains("relay_ingest_refused_total{code=\"conflict\"} 1"))
    }

    /// Issue 29 item 4: the same credential, key and another encryptedData used to get 200 with
    /// the first row's id, and the new sealed box was never pushed. It is 409 `index_reused`
    /// naming messageIndex, with the stored response's id (the credential's own: nothing
    /// leaks), counted in relay_ingest_refused_total{code="index_reused"}; the identical bytes
    /// are still the idempotent retry (200), and another credential learns nothing (conflict).
    @Test(arguments: StoreBackend.available)
    func anotherSealedBoxAtAUsedIndexIs409IndexReusedWithTheID(_ backend: StoreBackend) throws {
        let h = try TenantIsolationTests.Harness(backend)
        let box1 = Data(repeating: 1, count: 40), box2 = Data(repeating: 2, count: 40)
        let first = h.post(h.a, index: 5, sealed: box1)
        #expect(first.status == 202, "\(first.body)")
        let id = try #require(first.json["id"] as? String)
        let reused = h.post(h.a, index: 5, sealed: box2)
        #expect(reused.status == 409, "\(reused.body)")
        #expect(reused.json["error"] as? String == "index_reused" && reused.json["field"] as? String == "messageIndex")
        #expect(reused.json["id"] as? String == id && reused.json["message"] is String)
        #expect(h.metrics.render().contains("relay_ingest_refused_total{code=\"index_reused\"} 1"))
        let retry = h.post(h.a, index: 5, sealed: box1)
        #expect(retry.status == 200 && retry.json["id"] as? String == id, "\(retry.body)")
        let other = h.post(h.a2, index: 5, sealed: box2)
        #expect(other.status == 409 && other.json["error"] as? String == "conflict" && !other.body.contains(id), "\(other.body)")
        #expect(try h.store.response(id: id)?.encryptedData == Array(box1))
        #expect(try h.store.list(OutboxFilter()).count == 1)
    }
}
