// Process-wide counters and histograms of the ingest API and the dispatcher, for /metrics.
import BuildInfo
import FoundationEssentials
import Synchronization

public final class RelayMetrics: Sendable {
    /// Upper bounds (seconds) of the push latency histogram (ingest commit -> APNs answer uses
    /// the same buckets).
    public static let latencyBuckets: [Double] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

    /// Upper bounds (seconds) of the ingest duration histogram: a durable 202 waits for a group
    /// commit and its fsync, typically a few hundred microseconds.
    public static let ingestBuckets: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1]

    struct State {
        var ingestByStatus: [Int: Int] = [:]
        var pushesByStatusReason: [String: Int] = [:]
        var retries = 0
        var pushLatency = PrometheusHistogram(bounds: RelayMetrics.latencyBuckets)
        var ingestToAnswer = PrometheusHistogram(bounds: RelayMetrics.latencyBuckets)
        var ingestDuration = PrometheusHistogram(bounds: RelayMetrics.ingestBuckets)
        var rateLimited: [String: Int] = [:]
        var storeRefusals: [String: Int] = [:]
    }

    private let state = Mutex(State())

    public init() {}

    /// One answered ingest request; `seconds` (POST /v1/responses only) from the request reaching
    /// the ingest API to its answer going to the HTTP server.
    public func ingest(status: Int, seconds: Double? = nil) {
        state.withLock {
            $0.ingestByStatus[status, default: 0] += 1
            if let seconds { $0.ingestDuration.observe(seconds) }
        }
    }
    public func rateLimited(scope: String) { state.withLock { $0.rateLimited[scope, default: 0] += 1 } }
    public func retry() { state.withLock { $0.retries += 1 } }
    /// An ingest the store refused for a reason worth alerting on ("conflict", "index_reused", "storage_full").
    public func storeRefusal(_ code: String) { state.withLock { $0.storeRefusals[code, default: 0] += 1 } }

    public func push(status: Int?, reason: String?, latencySeconds: Double, sinceIngestSeconds: Double?) {
        let key = "\(status.map(String.init) ?? "transport")|\(status == nil ? "transport" : (reason ?? ""))"
        state.withLock {
            $0.pushesByStatusReason[key, default: 0] += 1
            $0.pushLatency.observe(latencySeconds)
            if let s = sinceIngestSeconds { $0.ingestToAnswer.observe(s) }
        }
    }

    /// Adds the process-wide counters and histograms to a /metrics page.
    public func collect(into r: inout PrometheusRegistry) {
        let s = state.withLock { $0 }
        // The usual Prometheus idiom: a constant 1 whose labels say what is running, for joins
        // (`* on(instance) group_left(version) relay_build_info`) and upgrade dashboards.
        r.declare("relay_build_info", .gauge, help: "Always 1; the labels are the relay's version and the git commit it was built from.")
        r.sample("relay_build_info", ["version": BuildInfo.version, "commit": BuildInfo.commit], 1)
        r.declare("relay_ingest_requests_total", .counter, help: "Ingest requests by HTTP status.")
        for (status, n) in s.ingestByStatus.sorted(by: { $0.key < $1.key }) {
            r.sample("relay_ingest_requests_total", ["status": "\(status)"], n)
        }
        r.declare("relay_rate_limited_total", .counter, help: "Requests refused with 429, by limit.")
        for (scope, n) in s.rateLimited.sorted(by: { $0.key < $1.key }) {
            r.sample("relay_rate_limited_total", ["scope": scope], n)
        }
        r.declare("relay_ingest_refused_total", .counter,
                  help: "Ingests the store refused: conflict (the key belongs to another credential), index_reused (the credential's own key with another encryptedData), storage_full (store.minFreeBytes).")
        for code in ["conflict", "index_reused", "storage_full"] {
            r.sample("relay_ingest_refused_total", ["code": code], s.storeRefusals[code] ?? 0)
        }
        r.declare("relay_pushes_total", .counter, help: "APNs answers by status and reason (status=\"transport\" when none arrived).")
        for (key, n) in s.pushesByStatusReason.sorted(by: { $0.key < $1.key }) {
            let parts = key.split(separator: "|", maxSplits: 1, omittingEmptySubsequences: false)
            r.sample("relay_pushes_total", ["status": String(parts[0]), "reason": String(parts.count > 1 ? parts[1] : "")], n)
        }
        r.counter("relay_push_retries_total", help: "Responses scheduled for another attempt.", s.retries)
        r.histogram("relay_push_duration_seconds", help: "Time from sending to APNs to its answer.", s.pushLatency)
        r.histogram("relay_ingest_to_answer_seconds", help: "Time from ingest commit to the APNs answer (first attempt).", s.ingestToAnswer)
        r.histogram("relay_ingest_duration_seconds",
                    help: "POST /v1/responses: time from the request reaching the ingest API to its answer (a 202 after the group commit and its fsync).",
                    s.ingestDuration)
    }

    /// These metrics alone as Prometheus text.
    public func render() -> String {
        var r = PrometheusRegistry()
        collect(into: &r)
        return r.render()
    }
}
