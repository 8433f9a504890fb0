// The ceiling of every exponential back-off in the relay, in one place: APNs retries
// (DeliveryPolicy), a paused app's probes (PauseSchedule) and webhook retries and receiver
// pauses (WebhookRetryPolicy). Each adds its own jitter below the ceiling.

public enum Backoff {
    /// `base` doubled `doublings` times (negative counts as 0), at most `cap`; an overflow is
    /// `cap`.
    public static func ceiling(base: Int64, doublings: Int, cap: Int64) -> Int64 {
        let shift = min(max(doublings, 0), 62)
        let (v, overflow) = base.multipliedReportingOverflow(by: Int64(1) << shift)
        return overflow ? cap : min(v, cap)
    }
}
