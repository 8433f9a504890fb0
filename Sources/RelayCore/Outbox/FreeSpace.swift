// The free-space guard (store.minFreeBytes): below the floor ingest answers 503 storage_full
// before the filesystem is actually full, so SQLite never meets ENOSPC mid-commit on the ingest
// path, while deletes (retention, relayctl purge) still have room for their WAL frames.
import Glibc

public final class FreeSpaceGuard: Sendable {
    /// Bytes available to an unprivileged writer on the filesystem holding `path`, or nil.
    public typealias Probe = @Sendable (String) -> Int64?

    public let path: String
    public let minFreeBytes: Int64
    private let probe: Probe
    private let now: @Sendable () -> Int64
    private let cached: TimedValue<Int64?>

    /// `probe` and `now` (monotonic microseconds) are injectable for tests; the probe runs at
    /// most once per `cacheMicros`, not once per request.
    public init(path: String, minFreeBytes: Int64, cacheMicros: Int64 = 1_000_000,
                probe: @escaping Probe = FreeSpaceGuard.statvfsAvailable, now: @escaping @Sendable () -> Int64 = { monotonicMicros() }) {
        self.path = path
        self.minFreeBytes = minFreeBytes
        self.probe = probe
        self.now = now
        cached = TimedValue(maxAge: cacheMicros)
    }

    /// Free bytes as last probed (probing again when the cached value is older than the cache
    /// period); nil when the probe failed.
    public var freeBytes: Int64? {
        cached.value(now: now()) { probe(path) }
    }

    /// True when the floor is on and the filesystem is below it. A failed probe does not refuse
    /// ingest (the commit itself still reports a real ENOSPC as 503 storage_unavailable).
    public var isBelowFloor: Bool {
        guard minFreeBytes > 0, let free = freeBytes else { return false }
        return free < minFreeBytes
    }

    public static let statvfsAvailable: Probe = { path in
        var st = statvfs()
        guard statvfs(path, &st) == 0 else { return nil }
        let (bytes, overflow) = Int64(clamping: st.f_bavail).multipliedReportingOverflow(by: Int64(clamping: st.f_frsize))
        return overflow ? Int64.max : bytes
    }
}
