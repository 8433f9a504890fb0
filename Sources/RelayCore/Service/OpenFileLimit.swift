// The open-file limit against the connections relay-server is configured to accept. Every
// connection is a descriptor, and so are the admin listener's, the APNs connections and the
// database's files: once the limit is reached accept() fails on every listener alike. Ingest
// at the limit took the admin listener (health checks, metrics) down with it, and nothing was
// logged. So ingest is capped below the limit, keeping a reserve for the rest.
import Glibc

enum OpenFileLimit {
    /// The admin listener's connection cap (Prometheus, a blackbox probe, an operator's curl).
    static let adminConnections = 64

    /// Raises the soft RLIMIT_NOFILE to the hard one (as Go's runtime does: a login shell's soft
    /// 1024 is far below the default 10,000 connections; the systemd unit sets both to 65536)
    /// and returns the soft limit in force, nil when unknown or unlimited.
    static func raiseToHard() -> Int? {
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0 else { return nil }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(resource, &raised) == 0 { limit = raised }
        }
        // RLIM_INFINITY is (rlim_t) -1, which Swift does not import.
        return limit.rlim_cur == rlim_t.max ? nil : Int(clamping: limit.rlim_cur)
    }

    /// Descriptors kept for everything but ingest connections: the admin listener's connections,
    /// APNs connections (and one reconnecting beside each), the database and its WAL files,
    /// the event loops' own (epoll, wake-ups), stdio and what libraries open.
    static func reserved(loopThreads: Int, apnsConnections: Int) -> Int {
        adminConnections + 64 + 4 * loopThreads + 2 * apnsConnections
    }

    /// `configured` (ingest.maxConnections), lowered to what `limit` leaves after `reserved`.
    static func ingestConnections(configured: Int, limit: Int?, reserved: Int) -> Int {
        guard let limit else { return configured }
        return min(configured, max(1, limit - reserved))
    }
}
