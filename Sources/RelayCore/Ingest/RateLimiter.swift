// Token buckets keyed by credential hash or push token. The bucket arithmetic is a pure value
// (`TokenBucket.take`) with time passed in; the limiter only adds a lock and a bounded map.
import Synchronization

public struct RateLimit: Sendable, Equatable {
    /// Sustained requests per second; 0 disables the limit.
    public var perSecond: Double
    /// Bucket size: requests allowed in a burst.
    public var burst: Double
    public init(perSecond: Double, burst: Double) {
        self.perSecond = perSecond
        self.burst = burst
    }
}

public struct TokenBucket: Sendable, Equatable {
    public var tokens: Double
    public var updatedMicros: Int64

    public init(limit: RateLimit, nowMicros: Int64) {
        tokens = limit.burst
        updatedMicros = nowMicros
    }

    /// Takes one token if available. Otherwise returns the whole seconds until one is (>= 1,
    /// for Retry-After).
    public mutating func take(limit: RateLimit, nowMicros: Int64) -> (allowed: Bool, retryAfterSeconds: Int) {
        let elapsed = Double(max(0, nowMicros - updatedMicros)) / 1e6
        tokens = min(limit.burst, tokens + elapsed * limit.perSecond)
        updatedMicros = nowMicros
        if tokens >= 1 {
            tokens -= 1
            return (true, 0)
        }
        let wait = (1 - tokens) / limit.perSecond
        return (false, max(1, Int(wait.rounded(.up))))
    }
}

public final class RateLimiter: Sendable {
    public let limit: RateLimit
    private let maxKeys: Int
    private let buckets = Mutex<[String: TokenBucket]>([:])

    public init(limit: RateLimit, maxKeys: Int = 100_000) {
        self.limit = limit
        self.maxKeys = maxKeys
    }

    /// Whether `take` would succeed now, without taking (a key never charged always may).
    /// `key` is only built when some key has been charged: in the usual case (nobody charged)
    /// this costs a lock and no string work.
    public func wouldAllow(_ key: @autoclosure () -> String, nowMicros: Int64 = monotonicMicros()) -> (allowed: Bool, retryAfterSeconds: Int) {
        guard limit.perSecond > 0 else { return (true, 0) }
        return buckets.withLock { b in
            guard !b.isEmpty, var copy = b[key()] else { return (true, 0) }
            return copy.take(limit: limit, nowMicros: nowMicros)
        }
    }

    public func take(_ key: String, nowMicros: Int64 = monotonicMicros()) -> (allowed: Bool, retryAfterSeconds: Int) {
        guard limit.perSecond > 0 else { return (true, 0) }
        return buckets.withLock { b in
            if b.count >= maxKeys, b[key] == nil {
                // Full buckets carry no state worth keeping: drop them to bound memory.
                let limit = self.limit
                b = b.filter { _, v in
                    var copy = v
                    return copy.take(limit: limit, nowMicros: nowMicros).allowed == false || copy.tokens + 1 < limit.burst
                }
                if b.count >= maxKeys { b.removeAll(keepingCapacity: true) }
            }
            var bucket = b[key] ?? TokenBucket(limit: limit, nowMicros: nowMicros)
            let r = bucket.take(limit: limit, nowMicros: nowMicros)
            b[key] = bucket
            return r
        }
    }
}
