// The admin listener's endpoints: /healthz, /readyz and /metrics (docs/operations.md).
import Basics
import FoundationEssentials

/// /healthz, /readyz, /metrics for the admin listener. What they ask the database is reused for
/// up to `maxAgeMillis`, so a scraper or probe polling in a loop costs it at most one outbox
/// count and one write transaction a second; `workers` should be the admin's own (RelayService
/// gives it one thread), so neither waits behind ingest reads nor holds them up.
public final class AdminService: Sendable {
    private let store: any OutboxStore
    private let metrics: RelayMetrics
    private let workers: WorkerPool
    private let clock: any RelayClock
    private let readiness: @Sendable () -> [String: Bool]
    private let paused: @Sendable () -> [String: String]
    private let extraMetrics: @Sendable (inout PrometheusRegistry) -> Void
    let maxAgeMillis: Int64 = 1000
    /// The counts, nil when the store could not be read; times by `clock`, in ms.
    private let counts: TimedValue<OutboxCounts?>
    private let writable: TimedValue<Bool>

    /// `readiness` returns named checks besides the database (e.g. "apns_credentials",
    /// "dispatcher"); `paused` the paused apps and why (each fails /readyz, named in its body);
    /// `extraMetrics` adds the rest of /metrics (HTTP server counters).
    public init(store: any OutboxStore, metrics: RelayMetrics, workers: WorkerPool, clock: any RelayClock = SystemRelayClock(),
                readiness: @escaping @Sendable () -> [String: Bool], paused: @escaping @Sendable () -> [String: String] = { [:] },
                extraMetrics: @escaping @Sendable (inout PrometheusRegistry) -> Void) {
        self.paused = paused
        self.store = store
        self.metrics = metrics
        self.workers = workers
        self.clock = clock
        counts = TimedValue(maxAge: maxAgeMillis)
        writable = TimedValue(maxAge: maxAgeMillis)
        self.readiness = readiness
        self.extraMetrics = extraMetrics
    }

    public func handle(_ request: APIRequest, respond: @escaping @Sendable (APIReply) -> Void) {
        guard request.method == "GET" || request.method == "HEAD" else {
            return respond(APIReply(status: 405, headers: [("allow", "GET, HEAD"), ("content-type", "application/json")],
                                       body: ClientError(status: 405, code: "method_not_allowed", field: nil, message: "use GET").jsonBody))
        }
        switch request.path {
        case "/healthz":
            respond(APIReply(status: 200, headers: [("content-type", "application/json")], body: "{\"status\":\"ok\"}"))
        case "/readyz":
            workers.submit { [self] in
                var checks = readiness()
                checks["database_writable"] = writable.value(now: clock.nowMillis()) { store.checkWritable() }
                if let g = store.freeSpaceGuard { checks["storage_free_space"] = !g.isBelowFloor }
                let pausedApps = paused()
                checks["apps_not_paused"] = pausedApps.isEmpty
                let ok = checks.values.allSatisfy { $0 }
                var body = "{\"ready\":\(ok),\"checks\":{" + checks.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ",") + "}"
                if !pausedApps.isEmpty {
                    body += ",\"paused\":{" + pausedApps.sorted { $0.key < $1.key }.map { JSONString.quote($0.key) + ":" + JSONString.quote($0.value) }.joined(separator: ",") + "}"
                }
                body += "}"
                respond(APIReply(status: ok ? 200 : 503, headers: [("content-type", "application/json")], body: body))
            }
        case "/metrics":
            workers.submit { [self] in
                var r = PrometheusRegistry()
                metrics.collect(into: &r)
                if let c = counts.value(now: clock.nowMillis(), read: { try? store.counts() }) {
                    r.declare("relay_outbox_responses", .gauge, help: "Responses in the outbox by state.")
                    for s in ResponseState.allCases { r.sample("relay_outbox_responses", ["state": s.rawValue], c.byState[s] ?? 0) }
                    let age = c.oldestPendingCreatedAt.map { Double(max(0, clock.nowMillis() - $0)) / 1000 } ?? 0
                    r.gauge("relay_outbox_oldest_pending_age_seconds", help: "Age of the oldest queued or retry response.", age)
                    r.gauge("relay_store_up", help: "1 when the outbox could be read.", 1)
                } else {
                    r.gauge("relay_store_up", help: "1 when the outbox could be read.", 0)
                }
                extraMetrics(&r)
                respond(APIReply(status: 200, headers: [("content-type", "text/plain; version=0.0.4")], body: r.render()))
            }
        default:
            respond(APIReply(status: 404, headers: [("content-type", "application/json")],
                                body: ClientError(status: 404, code: "not_found", field: nil, message: "no such endpoint").jsonBody))
        }
    }
}
