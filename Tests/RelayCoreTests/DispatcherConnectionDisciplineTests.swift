// The dispatcher over a real PushClient and mock-apns while APNs refuses connections or answers
// too slowly: no row fails because the client waits out its connection back-off, connections
// stay bounded, and nothing is pushed twice because of the back-off. Scaled timings (pacing
// 100 ms doubling to 800 ms, row back-off 50-400 ms); counts asserted.
import Foundation
import MockAPNs
import PushClient
import Testing
@testable import RelayCore

@Suite(.serialized) struct DispatcherConnectionDisciplineTests {
    let dir = TempDir()

    static func configure(requestTimeout: Duration, answerWaitCap: Duration = .seconds(20),
                          queueWaitCap: Duration = .seconds(30)) -> (inout PushClientConfiguration) -> Void {
        { c in
            c.connections = 2
            c.requestTimeout = requestTimeout
            c.answerWaitCap = answerWaitCap
            c.queueWaitCap = queueWaitCap
            c.connectTimeout = .milliseconds(300)
            c.connectionPacing = ConnectionPacing(backoffBase: .milliseconds(100), backoffCap: .milliseconds(800), maxNewConnections: 1000)
        }
    }

    /// Ingests `count` rows, dispatches them with the fault on for `faultSeconds`, clears it and
    /// waits (bounded) until no row is pending. Returns the store's counts.
    func run(_ rig: TransportRig, count: Int, faultSeconds: Double) throws -> (ids: [String], counts: OutboxCounts, store: SQLiteOutboxStore) {
        let s = try SQLiteOutboxStore(path: dir.db, clock: SystemRelayClock())
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        var ids: [String] = []
        for i in 0..<count {
            if case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: secret) { ids.append(id) }
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": rig.transport],
                           options: DispatcherOptions(idlePollMillis: 20, policy: DeliveryPolicy(backoffBaseMillis: 50, backoffCapMillis: 400)))
        try d.start()
        Thread.sleep(forTimeInterval: faultSeconds)
        rig.mock.setFaults(MockAPNs.FaultPlan())
        let end = Date() + 30
        while Date() < end, try s.counts().pending > 0 { usleep(20_000) }
        d.stop()
        return (ids, try s.counts(), s)
    }

    @Test func refusedConnectionsFailNoRowAndPushNothingTwice() throws {
        let rig = try TransportRig(faults: [MockAPNs.FaultRule(refuseConnections: true)], configure: Self.configure(requestTimeout: .seconds(2)))
        let (ids, counts, store) = try run(rig, count: 40, faultSeconds: 1.5)
        defer { store.close() }
        #expect(counts.byState[.delivered] == ids.count, "\(counts.byState)")
        let delivered = rig.mock.deliveries.map(\.apnsID)
        #expect(delivered.count == ids.count)
        #expect(Set(delivered) == Set(ids.map { $0.lowercased() }))
        // 1.5 s of refusals: the first attempt per slot, then one per back-off step (floors
        // 50, 100, 200, 400, 400 ms): at most 7; the old client made one per failure at once.
        let refused = rig.mock.stats.connectionsRefused
        print("dispatcher, refused connections: \(refused) attempts refused, \(ids.count) rows delivered once each")
        #expect(refused >= 2 && refused <= 9)
    }

    /// Answers take 1.5 s for 2 s, the request timeout is 300 ms: every push written meanwhile
    /// outlives its timeout, but the mock answers PING, so the client waits for the answers
    /// (answerWaitCap 20 s) instead of failing pushes APNs already has. Pushes queued behind
    /// the one-stream connections fail as not sent after 500 ms and the dispatcher retries
    /// them with its back-off. Both connections stay, every row is delivered, and the mock
    /// sees each push once. (With answerWaitCap = requestTimeout and no queue bound, the old
    /// behaviour, this run saw 14 repeats: every push written while the server was slow timed
    /// out, and its retry was a second copy; 52 with a mock granting 1000 streams at once.)
    @Test func slowServerKeepsTwoConnectionsAndRepeatsNothing() throws {
        // checkTokens: the mock then allows 1 stream per connection until a push succeeds, as
        // APNs does, so the other 38 rows queue in the client behind the 2 slow ones.
        let rig = try TransportRig(faults: [MockAPNs.FaultRule(latencyMs: 1500)], checkTokens: true,
                                   configure: Self.configure(requestTimeout: .milliseconds(300), queueWaitCap: .milliseconds(500)))
        let before = AnswerWaitCounts.process
        let (ids, counts, store) = try run(rig, count: 40, faultSeconds: 2)
        defer { store.close() }
        #expect(counts.byState[.delivered] == ids.count, "\(counts.byState)")
        let delivered = rig.mock.deliveries.map(\.apnsID)
        #expect(Set(delivered) == Set(ids.map { $0.lowercased() }))
        let repeats = delivered.count - Set(delivered).count
        print("dispatcher, slow server: \(rig.mock.connectionsAccepted) connections, \(repeats) repeats for \(ids.count) rows")
        #expect(rig.mock.connectionsAccepted == 2)
        #expect(repeats == 0)
        // The process-wide counters the relay exports moved (other suites may add to them too).
        let after = AnswerWaitCounts.process
        #expect(after.answeredLate - before.answeredLate >= 2 && after.notSent - before.notSent >= 1, "\(before) -> \(after)")
        var r = PrometheusRegistry()
        PushClientTransport.collectAnswerWaitMetrics(into: &r, counts: AnswerWaitCounts(awaitedPastTimeout: 5, answeredLate: 4, capped: 1, notSent: 7))
        let page = r.render()
        #expect(page.contains("relay_apns_slow_answers_total{outcome=\"answered\"} 4\n") && page.contains("relay_apns_pushes_not_sent_total 7\n"), "\(page)")
        #expect(expositionProblems(page).isEmpty)
    }
}
