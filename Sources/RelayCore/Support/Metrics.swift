// Process-wide counters rendered in the Prometheus text exposition format (version 0.0.4).
import FoundationEssentials
import Synchronization

public final class RelayMetrics: Sendable {
    /// Upper bounds (seconds) of the push latency histogram (ingest commit -> APNs answer uses
    /// the same buckets).
    public static let latencyBuckets: [Double] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

    /// Upper bounds (seconds) of the ingest duration histogram: a durable 202 waits for a group
    /// commit and its fsync, typically a few hundred microseconds.
    public static let ingestBuckets: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1]

    struct Histogram {
        let bounds: [Double]
        var counts: [Int]
        var sum: Double = 0
        var total = 0
        init(bounds: [Double] = RelayMetrics.latencyBuckets) {
            self.bounds = bounds
            counts = [Int](repeating: 0, count: bounds.count)
        }
        mutating func observe(_ seconds: Double) {
            for (i, b) in bounds.enumerated() where seconds <= b { counts[i] += 1 }
            sum += seconds
            total += 1
        }
    }

    struct State {
        var ingestByStatus: [Int: Int] = [:]
        var pushesByStatusReason: [String: Int] = [:]
        var retries = 0
        var pushLatency = Histogram()
        var ingestToAnswer = Histogram()
        var ingestDuration = Histogram(bounds: RelayMetrics.ingestBuckets)
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
    /// An ingest the store refused for a reason worth alerting on ("conflict", "storage_full").
    public func storeRefusal(_ code: String) { state.withLock { $0.storeRefusals[code, default: 0] += 1 } }

    public func push(status: Int?, reason: String?, latencySeconds: Double, sinceIngestSeconds: Double?) {
        let key = "\(status.map(String.init) ?? "transport")|\(status == nil ? "transport" : (reason ?? ""))"
        state.withLock {
            $0.pushesByStatusReason[key, default: 0] += 1
            $0.pushLatency.observe(latencySeconds)
            if let s = sinceIngestSeconds { $0.ingestToAnswer.observe(s) }
        }
    }

    /// Counters as Prometheus text; `gauges` adds lines computed at scrape time (outbox depth,
    /// HTTP server counters) already formatted.
    public func render(extra: String) -> String {
        let s = state.withLock { $0 }
        var out = ""
        out += "# HELP relay_ingest_requests_total Ingest requests by HTTP status.\n# TYPE relay_ingest_requests_total counter\n"
        for (status, n) in s.ingestByStatus.sorted(by: { $0.key < $1.key }) {
            out += "relay_ingest_requests_total{status=\"\(status)\"} \(n)\n"
        }
        out += "# HELP relay_rate_limited_total Requests refused with 429, by limit.\n# TYPE relay_rate_limited_total counter\n"
        for (scope, n) in s.rateLimited.sorted(by: { $0.key < $1.key }) {
            out += "relay_rate_limited_total{scope=\"\(scope)\"} \(n)\n"
        }
        out += "# HELP relay_ingest_refused_total Ingests the store refused: conflict (the key belongs to another credential), storage_full (store.minFreeBytes).\n# TYPE relay_ingest_refused_total counter\n"
        for code in ["conflict", "storage_full"] {
            out += "relay_ingest_refused_total{code=\"\(code)\"} \(s.storeRefusals[code] ?? 0)\n"
        }
        out += "# HELP relay_pushes_total APNs answers by status and reason (status=\"transport\" when none arrived).\n# TYPE relay_pushes_total counter\n"
        for (key, n) in s.pushesByStatusReason.sorted(by: { $0.key < $1.key }) {
            let parts = key.split(separator: "|", maxSplits: 1, omittingEmptySubsequences: false)
            out += "relay_pushes_total{status=\"\(parts[0])\",reason=\"\(promEscape(String(parts.count > 1 ? parts[1] : "")))\"} \(n)\n"
        }
        out += "# HELP relay_push_retries_total Responses scheduled for another attempt.\n# TYPE relay_push_retries_total counter\n"
        out += "relay_push_retries_total \(s.retries)\n"
        out += histogram("relay_push_duration_seconds", "Time from sending to APNs to its answer.", s.pushLatency)
        out += histogram("relay_ingest_to_answer_seconds", "Time from ingest commit to the APNs answer (first attempt).", s.ingestToAnswer)
        out += histogram("relay_ingest_duration_seconds", "POST /v1/responses: time from the request reaching the ingest API to its answer (a 202 after the group commit and its fsync).", s.ingestDuration)
        return out + extra
    }

    private func histogram(_ name: String, _ help: String, _ h: Histogram) -> String {
        var out = "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (i, b) in h.bounds.enumerated() {
            out += "\(name)_bucket{le=\"\(b)\"} \(h.counts[i])\n"
        }
        out += "\(name)_bucket{le=\"+Inf\"} \(h.total)\n\(name)_sum \(h.sum)\n\(name)_count \(h.total)\n"
        return out
    }
}

func promEscape(_ s: String) -> String {
    s.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"").replacing("\n", with: "\\n")
}
