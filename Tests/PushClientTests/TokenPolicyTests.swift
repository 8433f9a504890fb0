// TokenPolicy with hand-fed times: no clock, no I/O.
import Foundation
import Testing
@testable import PushClient

@Suite struct TokenPolicyTests {
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)
    func at(_ minutes: Double) -> Date { t0 + minutes * 60 }

    @Test func firstRequestMintsThenReusesUntil50Minutes() {
        var p = TokenPolicy()
        let a = p.tokenForRequest(connection: 0, now: at(0))
        #expect(a.mint && a.token.generation == 1 && !a.freshConnection && a.token.issuedAt == at(0))
        let b = p.tokenForRequest(connection: 1, now: at(10))
        #expect(!b.mint && b.token == a.token && !b.freshConnection)   // shared by all connections
        let c = p.tokenForRequest(connection: 0, now: at(49.99))
        #expect(!c.mint && c.token.generation == 1)
        let d = p.tokenForRequest(connection: 0, now: at(50))
        #expect(d.mint && d.token.generation == 2 && d.token.issuedAt == at(50))
        #expect(!d.freshConnection)   // slot 0 used generation 1 since minute 0: 50 >= 20
        let e = p.tokenForRequest(connection: 1, now: at(51))
        #expect(!e.mint && e.token.generation == 2 && !e.freshConnection)   // first use 10 -> 41 min ago
    }

    @Test func lateConnectionGetsAFreshConnectionInsteadOfAnEarlySwap() {
        var p = TokenPolicy()
        _ = p.tokenForRequest(connection: 0, now: at(0))
        let late = p.tokenForRequest(connection: 1, now: at(35))
        #expect(late.token.generation == 1 && !late.freshConnection)
        #expect(p.firstUse(connection: 1) == at(35))
        let swap = p.tokenForRequest(connection: 1, now: at(50))   // only 15 min on this connection
        #expect(swap.mint && swap.token.generation == 2 && swap.freshConnection)
        #expect(p.firstUse(connection: 1) == at(50))
        let next = p.tokenForRequest(connection: 1, now: at(51))
        #expect(!next.freshConnection && !next.mint)
    }

    @Test func twentyMinuteBoundaryIsInclusive() {
        var p = TokenPolicy()
        _ = p.tokenForRequest(connection: 0, now: at(0))
        _ = p.tokenForRequest(connection: 1, now: at(30))
        let u = p.tokenForRequest(connection: 1, now: at(50))
        #expect(u.token.generation == 2 && !u.freshConnection)
        var q = TokenPolicy()
        _ = q.tokenForRequest(connection: 0, now: at(0))
        _ = q.tokenForRequest(connection: 1, now: at(30.01))
        #expect(q.tokenForRequest(connection: 1, now: at(50)).freshConnection)
    }

    @Test func expiredForcesMintAndFreshConnectionsOnce() {
        var p = TokenPolicy()
        _ = p.tokenForRequest(connection: 0, now: at(0))
        _ = p.tokenForRequest(connection: 1, now: at(1))
        p.expired(generation: 1, now: at(5))
        let a = p.tokenForRequest(connection: 0, now: at(5))
        #expect(a.mint && a.token.generation == 2 && a.freshConnection)
        // Many in-flight requests report the same dead token: no further mints.
        p.expired(generation: 1, now: at(5))
        let b = p.tokenForRequest(connection: 1, now: at(5))
        #expect(!b.mint && b.token.generation == 2 && b.freshConnection)
        let c = p.tokenForRequest(connection: 1, now: at(5.1))
        #expect(!c.mint && !c.freshConnection)
        // The new token also reported expired (bad clock?): no mint storm. The early re-mint
        // at minute 5 was the one allowed; the next comes when generation 2 is 20 minutes old.
        let kept = p.expired(generation: 2, now: at(5.5))
        #expect(!kept)
        #expect(!p.tokenForRequest(connection: 0, now: at(5.5)).mint)
        let stillKept = p.expired(generation: 2, now: at(24.9))
        #expect(!stillKept)
        #expect(!p.tokenForRequest(connection: 0, now: at(24.9)).mint)
        let renewed = p.expired(generation: 2, now: at(25))
        #expect(renewed)
        #expect(p.tokenForRequest(connection: 0, now: at(25)).mint)
    }

    /// A host clock an hour off: every answer is ExpiredProviderToken, reported by 4
    /// connections every 30 s for two hours. Apple allows one new token per 20 minutes: at
    /// most 1 (first) + 1 (the one early re-mint) + 6 (one per 20 minutes) = 8. The old
    /// once-a-minute guard minted ~120 here.
    @Test func expiredFloodMintsAboutOncePer20Minutes() {
        var p = TokenPolicy()
        var mints = 0
        var minute = 0.0
        while minute <= 120 {
            for c in 0..<4 {
                let u = p.tokenForRequest(connection: c, now: at(minute))
                if u.mint { mints += 1 }
                p.expired(generation: u.token.generation, now: at(minute))
            }
            minute += 0.5
        }
        #expect(mints <= 8, "\(mints) tokens minted in 120 minutes")
        #expect(mints >= 6)   // still refreshed: a fixed clock must be picked up within 20 minutes
    }

    @Test func requestRefreshIsLimitedToEvery20Minutes() {
        var p = TokenPolicy()
        let first = p.requestRefresh(now: at(0))
        #expect(first)   // nothing minted yet
        _ = p.tokenForRequest(connection: 0, now: at(0))
        let early = p.requestRefresh(now: at(19.9))
        #expect(!early)
        #expect(!p.tokenForRequest(connection: 0, now: at(19.9)).mint)
        let onTime = p.requestRefresh(now: at(20))
        #expect(onTime)
        let u = p.tokenForRequest(connection: 0, now: at(20))
        #expect(u.mint && u.token.generation == 2 && !u.freshConnection)   // 20 min on slot 0
    }

    @Test func connectionResetMakesNextUseAFirstUse() {
        var p = TokenPolicy()
        _ = p.tokenForRequest(connection: 0, now: at(0))
        _ = p.tokenForRequest(connection: 1, now: at(45))
        p.connectionReset(connection: 1)
        #expect(p.firstUse(connection: 1) == nil)
        let u = p.tokenForRequest(connection: 1, now: at(50))
        #expect(u.token.generation == 2 && !u.freshConnection)
    }

    @Test func connectionOpenedLaterRestartsTheSlotsClock() {
        var p = TokenPolicy()
        _ = p.tokenForRequest(connection: 0, now: at(0))
        p.connectionOpened(connection: 0, generation: 1, now: at(35))   // the slot's new connection first carried it at 35
        #expect(p.firstUse(connection: 0) == at(35))
        p.connectionOpened(connection: 0, generation: 1, now: at(30))   // never moves backwards
        #expect(p.firstUse(connection: 0) == at(35))
        p.connectionOpened(connection: 0, generation: 7, now: at(40))   // other generation: ignored
        #expect(p.firstUse(connection: 0) == at(35))
        let u = p.tokenForRequest(connection: 0, now: at(50))
        #expect(u.mint && u.freshConnection)   // 15 min on the new connection: do not swap in place
    }

    @Test func clockJumpingBackwardsMints() {
        var p = TokenPolicy()
        _ = p.tokenForRequest(connection: 0, now: at(10))
        #expect(!p.tokenForRequest(connection: 0, now: at(9.5)).mint)   // 30 s skew tolerated
        #expect(p.tokenForRequest(connection: 0, now: at(8)).mint)
    }

    /// Sweeps many request schedules (deterministic LCG) over 6 hours and 4 slots, checking
    /// APNs' rules on every single request.
    @Test(arguments: 0..<40)
    func invariantsHoldForAnySchedule(seed: Int) {
        var rng = UInt64(seed) &* 6364136223846793005 &+ 1442695040888963407
        func next(_ n: UInt64) -> UInt64 {
            rng = rng &* 6364136223846793005 &+ 1442695040888963407
            return (rng >> 33) % n
        }
        var p = TokenPolicy()
        var now = 0.0
        var lastMint: Double? = nil
        var slotSince: [Int: (gen: Int, since: Double)] = [:]
        var mints = 0
        while now < 360 {
            now += Double(next(300)) / 10   // 0 ... 30 min between requests
            let slot = Int(next(4))
            let u = p.tokenForRequest(connection: slot, now: at(now))
            let age = now - u.token.issuedAt.timeIntervalSince(t0) / 60
            #expect(age > -1e-9 && age < 50, "token used at age \(age) min")
            if u.mint {
                mints += 1
                if let last = lastMint { #expect(now - last >= 50, "minted \(now - last) min after the previous one") }
                lastMint = now
            }
            if let s = slotSince[slot], s.gen != u.token.generation {
                #expect(u.freshConnection || now - s.since >= 20, "swap after \(now - s.since) min on slot \(slot)")
            }
            if slotSince[slot]?.gen != u.token.generation || u.freshConnection {
                slotSince[slot] = (u.token.generation, now)
            }
        }
        #expect(mints >= 6)   // 6 h of traffic needs at least one token per 60 min
    }
}
