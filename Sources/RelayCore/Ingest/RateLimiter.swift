// Token buckets keyed by credential hash, (app, push token) or client address. The bucket arithmetic is
// a pure value (`TokenBucket.take`) with time passed in; the limiter only adds a lock and a map
// bounded by dropping the least recently used bucket (never all of them at once).
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

/// Slots of RateLimiter's table of dropped buckets (a generic class has no static stored property).
private let droppedSlots = 16_384

public final class RateLimiter<Key: Hashable & Sendable>: Sendable {
    public let limit: RateLimit
    private let buckets: Mutex<Buckets>

    private struct Buckets {
        var recent: RecentMap<Key, TokenBucket>
        /// Buckets dropped from `recent` before they refilled, folded by key hash into a fixed
        /// number of slots (the emptiest wins): a key that comes back starts from its slot, so
        /// pushing a key out with `maxKeys` others never hands it a full budget again. Keys
        /// that share a slot share its debt until it refills (at the limit's own rate).
        var dropped: [TokenBucket?]
    }

    /// At most `maxKeys` buckets; past it the least recently used one is dropped, its debt
    /// kept in a fixed table (see `Buckets.dropped`).
    public init(limit: RateLimit, maxKeys: Int = 100_000) {
        self.limit = limit
        buckets = Mutex(Buckets(recent: RecentMap(capacity: maxKeys), dropped: Array(repeating: nil, count: droppedSlots)))
    }

    public func take(_ key: Key, nowMicros: Int64 = monotonicMicros()) -> (allowed: Bool, retryAfterSeconds: Int) {
        guard limit.perSecond > 0 else { return (true, 0) }
        return buckets.withLock { b in
            let slot = key.hashValue & (droppedSlots - 1)
            let start = b.recent.contains(key) ? nil : b.dropped[slot]
            let result = b.recent.update(key, new: start ?? TokenBucket(limit: limit, nowMicros: nowMicros)) {
                $0.take(limit: limit, nowMicros: nowMicros)
            }
            if let (gone, bucket) = b.recent.takeEvicted() {
                fold(bucket, into: &b.dropped[gone.hashValue & (droppedSlots - 1)], nowMicros: nowMicros)
            }
            return result
        }
    }

    /// Keeps the emptier of `bucket` and `slot`, both refilled to now; a full one is dropped.
    private func fold(_ bucket: TokenBucket, into slot: inout TokenBucket?, nowMicros: Int64) {
        func refilled(_ b: TokenBucket) -> Double {
            min(limit.burst, b.tokens + Double(max(0, nowMicros - b.updatedMicros)) / 1e6 * limit.perSecond)
        }
        let tokens = min(refilled(bucket), slot.map(refilled) ?? limit.burst)
        guard tokens < limit.burst else { slot = nil; return }
        var b = TokenBucket(limit: limit, nowMicros: nowMicros)
        b.tokens = tokens
        slot = b
    }

    /// Whether `take` would allow a request now, without taking anything.
    public func peek(_ key: Key, nowMicros: Int64 = monotonicMicros()) -> (allowed: Bool, retryAfterSeconds: Int) {
        guard limit.perSecond > 0 else { return (true, 0) }
        return buckets.withLock { b in
            var copy: TokenBucket?
            b.recent.updateIfPresent(key) { copy = $0 }
            guard var bucket = copy else { return (true, 0) }
            return bucket.take(limit: limit, nowMicros: nowMicros)
        }
    }

    /// Gives back a token taken by `take` (a charge that turned out not to be owed).
    public func refund(_ key: Key) {
        guard limit.perSecond > 0 else { return }
        buckets.withLock { b in b.recent.updateIfPresent(key) { $0.tokens = min(limit.burst, $0.tokens + 1) } }
    }

    /// Buckets held (tests: the bound).
    var count: Int { buckets.withLock { $0.recent.count } }
    func contains(_ key: Key) -> Bool { buckets.withLock { $0.recent.contains(key) } }
}

/// A map of at most `capacity` entries that drops the least recently updated one to make room:
/// a dictionary to slots of a doubly linked list kept in arrays (no allocation per update once
/// full; slots are reused).
struct RecentMap<Key: Hashable, Value> {
    private var index: [Key: Int] = [:]
    private var keys: [Key] = []
    private var values: [Value] = []
    private var newer: [Int] = []   // towards the most recent; -1 at the head
    private var older: [Int] = []   // towards the least recent; -1 at the tail
    private var head = -1           // most recently updated
    private var tail = -1           // least recently updated
    /// The entry the last `update` pushed out to make room, until `takeEvicted`.
    private var evicted: (Key, Value)?
    let capacity: Int

    init(capacity: Int) { self.capacity = max(1, capacity) }

    var count: Int { index.count }
    func contains(_ key: Key) -> Bool { index[key] != nil }

    /// Runs `body` on the entry for `key` (created from `new` when absent) and makes it the most
    /// recent. Creating one beyond `capacity` reuses the least recent's slot.
    mutating func update<R>(_ key: Key, new: @autoclosure () -> Value, _ body: (inout Value) -> R) -> R {
        if let i = index[key] {
            touch(i)
            return body(&values[i])
        }
        var v = new()
        let r = body(&v)
        let i: Int
        if index.count >= capacity {
            i = tail
            unlink(i)
            index[keys[i]] = nil
            evicted = (keys[i], values[i])
            keys[i] = key
            values[i] = v
        } else {
            i = keys.count
            keys.append(key)
            values.append(v)
            newer.append(-1)
            older.append(-1)
        }
        index[key] = i
        linkAtHead(i)
        return r
    }

    /// The entry the last `update` dropped to make room, once.
    mutating func takeEvicted() -> (Key, Value)? {
        defer { evicted = nil }
        return evicted
    }

    /// The entry for `key`, without changing its recency.
    func value(_ key: Key) -> Value? { index[key].map { values[$0] } }

    /// Runs `body` on the entry for `key` if there is one, without changing its recency.
    mutating func updateIfPresent(_ key: Key, _ body: (inout Value) -> Void) {
        if let i = index[key] { body(&values[i]) }
    }

    private mutating func touch(_ i: Int) {
        guard head != i else { return }
        unlink(i)
        linkAtHead(i)
    }

    private mutating func unlink(_ i: Int) {
        let n = newer[i], o = older[i]
        if n >= 0 { older[n] = o } else { head = o }
        if o >= 0 { newer[o] = n } else { tail = n }
        newer[i] = -1
        older[i] = -1
    }

    private mutating func linkAtHead(_ i: Int) {
        older[i] = head
        newer[i] = -1
        if head >= 0 { newer[head] = i }
        head = i
        if tail < 0 { tail = i }
    }
}
