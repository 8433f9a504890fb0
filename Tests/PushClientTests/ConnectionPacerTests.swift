// ConnectionPacer without I/O: times are an origin plus hand-fed offsets, jitter a given number.
import Testing
@testable import PushClient

@Suite struct ConnectionPacerTests {
    let t0 = ContinuousClock.now
    func at(_ ms: Int) -> ContinuousClock.Instant { t0 + .milliseconds(ms) }

    @Test func backoffDoublesFromOneSecondToTheCap() {
        let p = ConnectionPacer(ConnectionPacing())
        #expect((1...8).map { p.ceiling(failures: $0) } == [1, 2, 4, 8, 16, 32, 60, 60].map { Duration.seconds($0) })
        #expect(p.ceiling(failures: 10_000) == .seconds(60))
        // Jitter stays within [ceiling/2, ceiling].
        #expect(p.delay(failures: 3, random: 0) == .seconds(2))
        #expect(p.delay(failures: 3, random: 1) == .seconds(4))
        #expect(p.delay(failures: 3, random: 0.5) == .seconds(3))
    }

    @Test func healthyClientOpensAtOnce() {
        var p = ConnectionPacer(ConnectionPacing())
        #expect(p.tryOpen(now: at(0), random: 0.5) == nil)
        #expect(p.tryOpen(now: at(0), random: 0.5) == nil)   // a second slot, same instant
        #expect(p.notBefore == nil)
    }

    @Test func failuresSpaceAttemptsAndASuccessResets() {
        var p = ConnectionPacer(ConnectionPacing())
        #expect(p.tryOpen(now: at(0), random: 0) == nil)
        p.failed(now: at(100), random: 0)                       // 1 s ceiling, floor 0.5 s
        #expect(p.tryOpen(now: at(200), random: 0) == at(600))
        #expect(p.tryOpen(now: at(600), random: 0) == nil)
        // The attempt in progress holds the others back by one more back-off.
        #expect(p.tryOpen(now: at(601), random: 0) == at(1100))
        p.failed(now: at(700), random: 1)                       // 2nd failure: 2 s
        #expect(p.tryOpen(now: at(1100), random: 0) == at(2700))
        p.succeeded()
        #expect(p.failures == 0)
        #expect(p.tryOpen(now: at(1200), random: 0) == nil)
    }

    @Test func retirementAfterSuccessWaitsOneBaseStep() {
        var p = ConnectionPacer(ConnectionPacing())
        #expect(p.tryOpen(now: at(0), random: 0) == nil)
        p.succeeded()
        p.failed(now: at(5_000), random: 1)                     // GOAWAY, dead PING, 503 Shutdown...
        #expect(p.tryOpen(now: at(5_000), random: 0) == at(6_000))
    }

    @Test func atMostMaxNewConnectionsPerWindow() {
        var p = ConnectionPacer(ConnectionPacing(maxNewConnections: 10))
        for i in 0..<10 { #expect(p.tryOpen(now: at(i * 1000), random: 0) == nil) }
        // The 11th waits until the first leaves the minute.
        #expect(p.tryOpen(now: at(10_000), random: 0) == at(60_000))
        #expect(p.tryOpen(now: at(60_000), random: 0) == nil)
        #expect(p.tryOpen(now: at(60_001), random: 0) == at(61_000))
    }

    /// Invariant over generated schedules: whatever happens (failures, successes, slots asking
    /// at random times), no window holds more than maxNewConnections openings, and while every
    /// attempt fails, consecutive openings are at least half the current ceiling apart.
    @Test func generatedSchedulesRespectTheCapAndTheBackoff() {
        var rng = SplitMix(seed: 31)
        for _ in 0..<200 {
            let pacing = ConnectionPacing(backoffBase: .milliseconds(100), backoffCap: .milliseconds(3_000),
                                          maxNewConnections: 5, window: .seconds(10))
            var p = ConnectionPacer(pacing)
            var now = 0
            var opens: [Int] = []
            var failuresBefore: [Int] = []
            for _ in 0..<300 {
                now += Int(rng.next() % 400)
                if p.tryOpen(now: at(now), random: rng.unit()) == nil {
                    opens.append(now)
                    failuresBefore.append(p.failures)
                    if rng.next() % 4 == 0 { p.succeeded() } else { p.failed(now: at(now + Int(rng.next() % 50)), random: rng.unit()) }
                }
            }
            for (i, t) in opens.enumerated() {
                #expect(opens[i...].prefix { $0 - t < 10_000 }.count <= 5)
                if i > 0, failuresBefore[i] > 0 {
                    let floor = Int(p.ceiling(failures: failuresBefore[i]).components.seconds * 1000
                                    + p.ceiling(failures: failuresBefore[i]).components.attoseconds / 1_000_000_000_000_000) / 2
                    #expect(t - opens[i - 1] >= floor, "opening \(i) at \(t) after \(opens[i - 1]) with \(failuresBefore[i]) failures")
                }
            }
        }
    }
}

/// A small deterministic generator for schedules (the seed makes a failure reproducible).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }
}
