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
        let json = { (r: APIResponse) in (try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any]) ?? [:] }
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
}
