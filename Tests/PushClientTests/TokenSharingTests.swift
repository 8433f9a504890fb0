// One provider token per (team, key) in the process: clients sharing a TokenRegistry sign
// with one JWT, a client rebuilt from the same key file (a reload) keeps it, and an
// ExpiredProviderToken flood mints about once per 20 minutes (counted by the registry).
import Foundation
import MockAPNs
import Testing
@testable import PushClient

@Suite(.serialized) struct TokenSharingTests {
    let team = "DEF123GHIJ"

    @Test func twoClientsOfOneTeamShareOneToken() async throws {
        let rig = try MockRig()
        let registry = TokenRegistry()
        let a = try rig.client(registry: registry)
        let b = try rig.client(connections: 2, registry: registry)
        defer { a.shutdown(); b.shutdown() }
        #expect(isDelivered(await a.send(push())))
        #expect(isDelivered(await b.send(push())))
        #expect(isDelivered(await b.send(push())))
        #expect(registry.mintedByTeam() == [team: 1])
        #expect(Set(rig.mock.deliveries.compactMap { $0.push.claims?.issuedAt }).count == 1)
        #expect(a.tokenProvider === b.tokenProvider)
        // Control: without a shared registry (the behaviour before) each client mints its own.
        let c = try rig.client(), d = try rig.client()
        defer { c.shutdown(); d.shutdown() }
        rig.clock.advance(minutes: 1)
        #expect(isDelivered(await c.send(push())))
        #expect(isDelivered(await d.send(push())))
        #expect(c.tokenProvider !== d.tokenProvider)
        #expect((c.tokenProvider?.minted ?? 0) + (d.tokenProvider?.minted ?? 0) == 2)
    }

    /// A SIGHUP rebuilds the client (e.g. for a new caFile) from the same .p8: same token.
    /// A different key (another file content) gets its own.
    @Test func reloadWithTheSameKeyKeepsTheToken() async throws {
        let rig = try MockRig()
        let registry = TokenRegistry()
        do {
            let first = try rig.client(registry: registry)
            #expect(isDelivered(await first.send(push())))
            first.shutdown()
        }
        rig.clock.advance(minutes: 5)
        let reread = try TokenKey(p8PEM: try String(contentsOfFile: rig.dir.file("AuthKey.p8"), encoding: .utf8),
                                  keyID: "ABC123DEFG", teamID: team)
        let second = try rig.client(key: reread, registry: registry)
        defer { second.shutdown() }
        #expect(isDelivered(await second.send(push())))
        #expect(registry.mintedByTeam() == [team: 1])
        #expect(Set(rig.mock.deliveries.compactMap { $0.push.claims?.issuedAt }).count == 1)
        let otherDir = try TempDir()
        let (otherPath, _) = try makeP8(in: otherDir)
        let other = try TokenKey(p8Path: otherPath, keyID: "ABC123DEFG", teamID: team)
        #expect(registry.provider(for: other) !== second.tokenProvider)
    }

    /// Every token refused as expired (a host clock far off) for two simulated hours, one
    /// push a minute over 2 connections: the registry counts the JWTs. Apple: at most one new
    /// token per 20 minutes; 1 + 1 early re-mint + 6 = 8 at most (once a minute before: ~120).
    @Test func expiredFloodMintsOneTokenPer20Minutes() async throws {
        let rig = try MockRig(faults: [FaultRule(expireTokensIssuedBefore: Int64.max / 2)])
        let registry = TokenRegistry()
        let client = try rig.client(connections: 2, registry: registry)
        defer { client.shutdown() }
        for _ in 0...120 {
            let r = await client.send(push())
            #expect(r == .rejected(status: 403, reason: .expiredProviderToken, timestamp: nil))
            rig.clock.advance(minutes: 1)
        }
        let minted = registry.mintedByTeam()[team] ?? 0
        #expect(minted <= 8 && minted >= 6, "\(minted) JWTs in 120 minutes")
        #expect(rig.mock.stats.byStatusReason["429 TooManyProviderTokenUpdates"] == nil)
    }
}
