// Injected time and randomness: every decision that depends on them takes them as values so
// unit tests run without sleeps.
import FoundationEssentials
import Glibc

public protocol RelayClock: Sendable {
    /// Milliseconds since 1970 (UTC).
    func nowMillis() -> Int64
}

public struct SystemRelayClock: RelayClock {
    public init() {}
    public func nowMillis() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }
}

/// Monotonic microseconds, for latencies and rate limiting (never for stored times).
public func monotonicMicros() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

/// A source of uniform random numbers in [0, 1). Injected into back-off decisions.
public protocol RandomSource: Sendable {
    func unit() -> Double
}

public struct SystemRandom: RandomSource {
    public init() {}
    public func unit() -> Double { Double.random(in: 0..<1) }
}

/// Monotonic milliseconds, for deadlines (never for stored times).
public func monotonicMillis() -> Int64 { monotonicMicros() / 1000 }
