// The dispatcher over a real PushClient and mock-apns while APNs refuses the app's credentials:
// the "0 rows failed by 30 s of InvalidProviderToken, all delivered after", scaled to
// 2 s with probes 50 ms doubling to 400 ms. Counts asserted, no timed assertions.
import Foundation
import MockAPNs
import PushClient
import Testing
@testable import RelayCore

@Suite(.serialized) struct DispatcherPauseTests {
    let dir = TempDir()

    @Test(arguments: [("InvalidProviderToken", 403), ("TopicDisallowed", 400), ("TooManyProviderTokenUpdates", 429)])
    func aCredentialFaultFailsNoRowAndEverythingIsDeliveredAfter(reason: String, status: Int) throws {
        let rig = try TransportRig(faults: [MockAPNs.FaultRule(status: status, reason: reason)]) { c in
            c.connections = 2
            c.connectionPacing = ConnectionPacing(backoffBase: .milliseconds(20), backoffCap: .milliseconds(100), maxNewConnections: 1000)
        }
        let s = try SQLiteOutboxStore(path: dir.db, clock: SystemRelayClock())
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        var ids: [String] = []
        for i in 0..<40 {
            if case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: secret) { ids.append(id) }
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": rig.transport],
                           options: DispatcherOptions(idlePollMillis: 20, policy: DeliveryPolicy(backoffBaseMillis: 50, backoffCapMillis: 400),
                                                      pause: PauseSchedule(baseMillis: 50, capMillis: 400, holdMillis: 50)))
        try d.start()
        defer { d.stop() }
        Thread.sleep(forTimeInterval: 2)
        let pausedDuringFault = d.paused
        let countsDuringFault = try s.counts()
        rig.mock.setFaults(MockAPNs.FaultPlan())
        let end = Date() + 30
        while Date() < end, try s.counts().pending > 0 { usleep(20_000) }
        let counts = try s.counts()
        #expect(pausedDuringFault == ["com.example.app": reason])
        #expect(countsDuringFault.byState[.failed] == nil || countsDuringFault.byState[.failed] == 0, "\(countsDuringFault.byState)")
        #expect(counts.byState[.delivered] == ids.count, "\(counts.byState)")
        #expect(d.paused.isEmpty)
        // Only the delivering attempt counts: the refused sends were released, not attempted.
        let attempts = try ids.map { try #require(try s.response(id: $0)).attempts }
        #expect(attempts.allSatisfy { $0 == 1 }, "\(attempts)")
        // Refused answers: the pushes in flight when the fault began (up to the 40 rows), then
        // one probe per step (waits 25-50, 50-100, 100-200, then 200-400 ms: at most ~12 in 2 s).
        let refused = rig.mock.stats.byStatusReason["\(status) \(reason)"] ?? 0
        print("dispatcher, \(reason) for 2 s: \(refused) refused answers, \(counts.byState[.delivered] ?? 0) of \(ids.count) rows delivered, \(counts.byState[.failed] ?? 0) failed")
        #expect(refused >= 1 && refused <= ids.count + 16)
    }

    /// A host clock APNs disagrees with: every token is ExpiredProviderToken for 2 s. PushClient
    /// re-mints once and retries, then keeps the token (one early re-mint per 20 minutes); the
    /// app pauses instead of failing or hammering. JWTs counted: 2 (the first and the one
    /// re-mint), where the old client minted again once a minute and the dispatcher retried at once.
    @Test func anExpiredProviderTokenFloodPausesAndMintsOnce() throws {
        let rig = try TransportRig(faults: [MockAPNs.FaultRule(expireTokensIssuedBefore: Int64.max / 2)], checkTokens: true) { c in
            c.connections = 2
            c.connectionPacing = ConnectionPacing(backoffBase: .milliseconds(20), backoffCap: .milliseconds(100), maxNewConnections: 1000)
        }
        let s = try SQLiteOutboxStore(path: dir.db, clock: SystemRelayClock())
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        var ids: [String] = []
        for i in 0..<20 {
            if case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: secret) { ids.append(id) }
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": rig.transport],
                           options: DispatcherOptions(idlePollMillis: 20, pause: PauseSchedule(baseMillis: 50, capMillis: 400, holdMillis: 50)))
        try d.start()
        defer { d.stop() }
        Thread.sleep(forTimeInterval: 2)
        let pausedDuringFault = d.paused
        let failedDuringFault = try s.counts().byState[.failed] ?? 0
        rig.mock.setFaults(MockAPNs.FaultPlan())
        let end = Date() + 30
        while Date() < end, try s.counts().pending > 0 { usleep(20_000) }
        let counts = try s.counts()
        let minted = rig.client.tokenProvider?.minted ?? 0
        let refused = rig.mock.stats.byStatusReason["403 ExpiredProviderToken"] ?? 0
        print("dispatcher, ExpiredProviderToken for 2 s: \(minted) JWTs, \(refused) refused answers, \(counts.byState[.delivered] ?? 0) of \(ids.count) delivered, \(counts.byState[.failed] ?? 0) failed")
        #expect(pausedDuringFault == ["com.example.app": "ExpiredProviderToken"])
        #expect(failedDuringFault == 0)
        #expect(counts.byState[.delivered] == ids.count, "\(counts.byState)")
        #expect(minted == 2)
    }
}
