// libcurl 7.88 ends every POST stream with RST_STREAM(STREAM_CLOSED) even after a complete
// response (seen with nghttpd -v: one RST_STREAM per POST, none per GET; the curl CLI does the
// same). Servers with HTTP/2 rapid-reset protection (CVE-2023-44487) count those: Debian's
// nghttp2 1.52 (the mock's and nghttpd's) allows a burst of 1000 resets refilled at 33/s, then
// sends GOAWAY(INTERNAL_ERROR) and closes, failing whatever was in flight. APNs' own limits are
// not published. So a connection slot mirrors that bucket and moves new streams to a fresh
// connection before the budget runs out; at relay-like rates (< 33/s) it never does.
// Pure value: the caller passes monotonic seconds.

struct ResetBudget: Sendable, Equatable {
    static let burst = 1000.0
    static let refillPerSecond = 33.0
    /// Switch connections with this much budget left (streams already started still reset).
    static let margin = 100.0

    private(set) var remaining = ResetBudget.burst
    private var last: Double?

    /// Refills for the time since the last call; true when the next stream should go to a
    /// fresh connection (the caller then calls `reset()`).
    mutating func shouldReplace(now: Double) -> Bool {
        if let last { remaining = min(Self.burst, remaining + max(0, now - last) * Self.refillPerSecond) }
        last = now
        return remaining - 1 < Self.margin
    }

    /// One stream started on the current connection (it will end with one RST_STREAM).
    mutating func started() {
        remaining -= 1
    }

    /// The slot got a new connection for another reason.
    mutating func reset() {
        remaining = Self.burst
    }
}
