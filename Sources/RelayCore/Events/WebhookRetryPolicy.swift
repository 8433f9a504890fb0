// What a webhook attempt that was not answered 2xx leads to: the next attempt (exponential
// back-off with full jitter) or, once `retryFor` has passed since the first attempt, dead. And
// how long a failing receiver is left alone before the next probe, so that a receiver down for
// hours costs a handful of attempts a minute whatever the backlog. Pure: clock and randomness
// are arguments (WebhookRetryPolicyTests has the table).

public struct WebhookRetryPolicy: Sendable, Equatable {
    /// The first retry's ceiling; each later one doubles, up to `capMillis`.
    public var baseMillis: Int64 = 1000
    public var capMillis: Int64 = 600_000
    /// From the first attempt; an attempt failing after this is the last (dead).
    public var retryForMillis: Int64 = 86_400_000
    /// The most a failing receiver is left alone between probes (see `receiverPause`).
    public var pauseCapMillis: Int64 = 30_000

    public init(baseMillis: Int64 = 1000, capMillis: Int64 = 600_000, retryForMillis: Int64 = 86_400_000, pauseCapMillis: Int64 = 30_000) {
        self.baseMillis = baseMillis
        self.capMillis = capMillis
        self.retryForMillis = retryForMillis
        self.pauseCapMillis = pauseCapMillis
    }

    /// base * 2^(attempts-1), at most `cap`: the upper end of the delay after `attempts` failed
    /// attempts (1, 2, ...).
    public func ceiling(afterAttempts attempts: Int) -> Int64 {
        Backoff.ceiling(base: baseMillis, doublings: attempts - 1, cap: capMillis)
    }

    /// The result of a failed attempt made at `now`. `attemptsBefore` and `firstAttemptAt` are
    /// the delivery's as claimed; `random` is uniform in [0, 1) (full jitter: the delay is
    /// uniform in [0, ceiling]). The last retry is scheduled no later than the end of the window,
    /// so an event is never given up on before `retryFor` nor long after.
    public func afterFailure(attemptsBefore: Int, firstAttemptAt: Int64?, now: Int64, error: String, random: Double) -> WebhookAttemptResult {
        let first = firstAttemptAt ?? now
        let deadline = first + retryForMillis
        guard now < deadline else { return .dead(attemptedAt: now, error: error) }
        let ceiling = self.ceiling(afterAttempts: attemptsBefore + 1)
        let delay = Int64((Double(ceiling) * min(max(random, 0), 1)).rounded(.down))
        return .retry(attemptedAt: now, at: min(now + delay, deadline), error: error)
    }

    /// How long to wait before the next claim for a receiver whose last `failures` attempts in a
    /// row failed (0: none, no pause): base doubling up to `pauseCap`. While failing the sender
    /// also claims one delivery at a time (a probe), so the attempt rate is bounded by this pause,
    /// not by the backlog.
    public func receiverPause(failures: Int) -> Int64 {
        failures <= 0 ? 0 : Backoff.ceiling(base: baseMillis, doublings: failures - 1, cap: pauseCapMillis)
    }
}
