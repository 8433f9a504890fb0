// When a client may open its next connection to APNs. Apple treats rapid repeated connections
// as a denial-of-service attempt and may block the sender, so every new connection after a
// failure or a retirement waits out an exponential back-off, and no more than `maxNewConnections`
// start per `window`. A pure value: the slots hold it under one lock, clock and randomness are
// parameters (unit tested in ConnectionPacerTests without I/O).

/// How fast a client may open connections (docs/pushclient.md, "Connection discipline").
public struct ConnectionPacing: Sendable, Equatable {
    /// Back-off after the first failure or retirement; doubles per further one without a
    /// successful exchange in between.
    public var backoffBase: Duration
    /// Largest back-off.
    public var backoffCap: Duration
    /// New connections allowed per `window` (all slots of the client together).
    public var maxNewConnections: Int
    /// The sliding window of `maxNewConnections` (a minute; tests scale it down).
    public var window: Duration

    public init(backoffBase: Duration = .seconds(1), backoffCap: Duration = .seconds(60),
                maxNewConnections: Int = 10, window: Duration = .seconds(60)) {
        self.backoffBase = backoffBase
        self.backoffCap = backoffCap
        self.maxNewConnections = maxNewConnections
        self.window = window
    }
}

struct ConnectionPacer: Sendable, Equatable {
    let pacing: ConnectionPacing
    /// Failures and retirements since the last successful exchange.
    private(set) var failures = 0
    /// No connection starts before this (back-off).
    private(set) var notBefore: ContinuousClock.Instant?
    /// Start times of the connections opened within the last `window`, oldest first.
    private(set) var recentOpens: [ContinuousClock.Instant] = []

    init(_ pacing: ConnectionPacing) { self.pacing = pacing }

    /// The back-off after `n` failures (n >= 1), before jitter: base * 2^(n-1), capped.
    func ceiling(failures n: Int) -> Duration {
        guard n > 0 else { return .zero }
        var d = pacing.backoffBase
        for _ in 1..<min(n, 40) {
            d *= 2
            if d >= pacing.backoffCap { return pacing.backoffCap }
        }
        return min(d, pacing.backoffCap)
    }

    /// Jitter in [ceiling/2, ceiling]: spreads the clients of a fleet, yet keeps a floor so the
    /// number of attempts in any window stays bounded by the schedule.
    func delay(failures n: Int, random unit: Double) -> Duration {
        let u = min(max(unit, 0), 1)
        return ceiling(failures: n) * (0.5 + 0.5 * u)
    }

    /// Opens a connection now if allowed (and records it), else returns when to ask again.
    /// While failing, an attempt in progress moves `notBefore` on by one more back-off, so the
    /// other slots do not start attempts of their own before this one has told its outcome.
    mutating func tryOpen(now: ContinuousClock.Instant, random unit: Double) -> ContinuousClock.Instant? {
        let window = pacing.window
        recentOpens.removeAll { now - $0 >= window }
        var wait: ContinuousClock.Instant? = nil
        if let notBefore, notBefore > now { wait = notBefore }
        if recentOpens.count >= max(pacing.maxNewConnections, 1) {
            let freed = recentOpens[recentOpens.count - max(pacing.maxNewConnections, 1)] + pacing.window
            wait = max(wait ?? freed, freed)
        }
        if let wait { return wait }
        recentOpens.append(now)
        if failures > 0 { notBefore = now + delay(failures: failures, random: unit) }
        return nil
    }

    /// A connect, TLS or HTTP/2 setup failure, a GOAWAY, a dead connection or any other end of
    /// a connection the slot did not simply finish with.
    mutating func failed(now: ContinuousClock.Instant, random unit: Double) {
        failures += 1
        let until = now + delay(failures: failures, random: unit)
        if notBefore.map({ $0 < until }) ?? true { notBefore = until }
    }

    /// A response arrived with 200: the server and the path to it work.
    mutating func succeeded() {
        failures = 0
        notBefore = nil
    }
}
