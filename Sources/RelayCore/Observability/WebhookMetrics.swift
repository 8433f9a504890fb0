// The webhook sender's counters, gauges and its latency histogram, for /metrics
// (docs/operations.md, the Webhook* alerts in deploy/prometheus/).
import Synchronization

public final class WebhookMetrics: Sendable {
    /// Upper bounds (seconds) of event created -> 2xx: seconds when the receiver is up, hours
    /// when it was down.
    public static let latencyBuckets: [Double] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21_600, 86_400]

    struct PerWebhook {
        var sent = 0
        var failedAttempts = 0
        var dead = 0
        var backlog: Int?
        var failing = 0
        var staleResults = 0
        var localFailures = 0
    }
    struct State {
        var webhooks: [String: PerWebhook] = [:]
        var latency = PrometheusHistogram(bounds: WebhookMetrics.latencyBuckets)
    }
    private let state = Mutex(State())

    public init(webhooks: [String] = []) {
        state.withLock { s in for name in webhooks { s.webhooks[name] = PerWebhook() } }
    }

    func sent(_ webhook: String, latencySeconds: Double) {
        state.withLock {
            $0.webhooks[webhook, default: PerWebhook()].sent += 1
            $0.latency.observe(latencySeconds)
        }
    }
    func failedAttempt(_ webhook: String) { state.withLock { $0.webhooks[webhook, default: PerWebhook()].failedAttempts += 1 } }
    func staleResults(_ webhook: String, _ n: Int) { state.withLock { $0.webhooks[webhook, default: PerWebhook()].staleResults += n } }
    func localFailure(_ webhook: String) { state.withLock { $0.webhooks[webhook, default: PerWebhook()].localFailures += 1 } }
    func dead(_ webhook: String) { state.withLock { $0.webhooks[webhook, default: PerWebhook()].dead += 1 } }
    func backlog(_ webhook: String, _ count: Int?) { state.withLock { $0.webhooks[webhook, default: PerWebhook()].backlog = count } }
    func failing(_ webhook: String, consecutiveFailures: Int) { state.withLock { $0.webhooks[webhook, default: PerWebhook()].failing = consecutiveFailures } }

    /// Results dropped because their delivery was claimed again or replayed meanwhile.
    public func staleResults(_ webhook: String) -> Int { state.withLock { $0.webhooks[webhook]?.staleResults ?? 0 } }

    /// Requests not sent because of a failure here (libcurl out of memory, an option refused).
    public func localFailures(_ webhook: String) -> Int { state.withLock { $0.webhooks[webhook]?.localFailures ?? 0 } }

    /// Counts as tests read them.
    public func counts(_ webhook: String) -> (sent: Int, failedAttempts: Int, dead: Int) {
        state.withLock { s in s.webhooks[webhook].map { ($0.sent, $0.failedAttempts, $0.dead) } ?? (0, 0, 0) }
    }

    /// Every family is declared even without webhooks (no samples then), so the alert rules'
    /// names are on every relay's page (RelayctlLiveRelayTests checks them).
    public func collect(into r: inout PrometheusRegistry) {
        let s = state.withLock { $0 }
        let sorted = s.webhooks.sorted { $0.key < $1.key }
        r.declare("relay_webhook_events_sent_total", .counter, help: "Events a webhook answered 2xx.")
        for (name, w) in sorted { r.sample("relay_webhook_events_sent_total", ["webhook": name], w.sent) }
        r.declare("relay_webhook_failed_attempts_total", .counter, help: "Webhook attempts not answered 2xx (status, timeout, connection); each is retried or, after retryForSeconds, dead.")
        for (name, w) in sorted { r.sample("relay_webhook_failed_attempts_total", ["webhook": name], w.failedAttempts) }
        r.declare("relay_webhook_events_dead_total", .counter, help: "Events given up on after retryForSeconds (kept; relayctl events replay).")
        for (name, w) in sorted { r.sample("relay_webhook_events_dead_total", ["webhook": name], w.dead) }
        r.declare("relay_webhook_stale_results_total", .counter, help: "Webhook results not recorded: their delivery was claimed again (lease ended) or replayed meanwhile.")
        for (name, w) in sorted { r.sample("relay_webhook_stale_results_total", ["webhook": name], w.staleResults) }
        r.declare("relay_webhook_local_failures_total", .counter, help: "Webhook requests not sent because of a failure in this process (libcurl out of memory, an option refused): not attempts, tried again after 1 s.")
        for (name, w) in sorted { r.sample("relay_webhook_local_failures_total", ["webhook": name], w.localFailures) }
        r.declare("relay_webhook_consecutive_failures", .gauge, help: "Attempts in a row a webhook has not answered 2xx (0 while it accepts).")
        for (name, w) in sorted { r.sample("relay_webhook_consecutive_failures", ["webhook": name], w.failing) }
        r.declare("relay_webhook_backlog", .gauge, help: "Events pending for a webhook (not yet delivered or dead), as the store counts them.")
        for (name, w) in sorted { if let n = w.backlog { r.sample("relay_webhook_backlog", ["webhook": name], n) } }
        r.histogram("relay_webhook_delivery_seconds", help: "Time from an event's creation to its webhook's 2xx answer.", s.latency)
    }
}
