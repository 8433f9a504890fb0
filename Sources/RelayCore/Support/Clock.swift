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

/// `2026-11-30T06:10:00.123Z` for milliseconds since 1970: RFC 3339 in UTC with milliseconds,
/// the format of every time in logs and API bodies. gmtime_r instead of a Foundation
/// formatter: no ICU, no allocation besides the result.
public func iso8601UTC(millis: Int64) -> String {
    var seconds = time_t(millis >= 0 ? millis / 1000 : (millis - 999) / 1000)
    let fraction = Int(millis - Int64(seconds) * 1000)
    var t = tm()
    gmtime_r(&seconds, &t)
    func pad(_ v: Int32, _ width: Int) -> String {
        let s = String(v)
        return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
    }
    return pad(t.tm_year + 1900, 4) + "-" + pad(t.tm_mon + 1, 2) + "-" + pad(t.tm_mday, 2) + "T"
        + pad(t.tm_hour, 2) + ":" + pad(t.tm_min, 2) + ":" + pad(t.tm_sec, 2) + "." + pad(Int32(fraction), 3) + "Z"
}
