// A value that is expensive to read (a statvfs, an outbox count, a write probe) and may be a
// little stale: read at most once per period, whoever asks in between gets the last reading.
import Synchronization

final class TimedValue<Value: Sendable>: Sendable {
    private let slot = Mutex<(at: Int64, value: Value)?>(nil)
    /// In the unit of the times passed to `value(now:read:)`.
    let maxAge: Int64

    init(maxAge: Int64) { self.maxAge = maxAge }

    /// The value read less than `maxAge` before `now`, or `read()`'s fresh one (also when the
    /// clock went back past the last reading). Concurrent callers of an expired value may each
    /// read once; none waits for another's read.
    func value(now: Int64, read: () -> Value) -> Value {
        if let c = slot.withLock({ $0 }), now >= c.at, now - c.at < maxAge { return c.value }
        let fresh = read()
        slot.withLock { $0 = (now, fresh) }
        return fresh
    }
}
