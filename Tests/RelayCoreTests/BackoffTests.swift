import Testing
@testable import RelayCore

/// The one back-off ceiling the dispatcher, paused-app probes and webhook retries share.
struct BackoffTests {
    @Test(arguments: [
        (base: Int64(1_000), doublings: 0, cap: Int64(300_000), ceiling: Int64(1_000)),
        (1_000, 1, 300_000, 2_000),
        (1_000, 8, 300_000, 256_000),
        (1_000, 9, 300_000, 300_000),          // capped
        (1_000, -3, 300_000, 1_000),           // negative counts as none
        (1_000, 62, 300_000, 300_000),         // would overflow: the cap
        (1_000, 1_000, 300_000, 300_000),      // far past 62: the cap
        (5_000, 0, 1_000, 1_000),              // base above the cap: the cap
        (1, 62, Int64.max, Int64(1) << 62),    // the largest exact step
    ])
    func ceiling(base: Int64, doublings: Int, cap: Int64, ceiling: Int64) {
        #expect(Backoff.ceiling(base: base, doublings: doublings, cap: cap) == ceiling)
    }

    /// Each user reads the same ceiling.
    @Test func everyPolicyUsesIt() {
        let d = DeliveryPolicy(backoffBaseMillis: 1_000, backoffCapMillis: 300_000)
        let w = WebhookRetryPolicy(baseMillis: 1_000, capMillis: 600_000, pauseCapMillis: 30_000)
        for n in 0..<30 {
            #expect(d.backoffCeiling(priorAttempts: n) == Backoff.ceiling(base: 1_000, doublings: n, cap: 300_000))
            #expect(w.ceiling(afterAttempts: n + 1) == Backoff.ceiling(base: 1_000, doublings: n, cap: 600_000))
            #expect(w.receiverPause(failures: n + 1) == Backoff.ceiling(base: 1_000, doublings: n, cap: 30_000))
        }
    }
}
