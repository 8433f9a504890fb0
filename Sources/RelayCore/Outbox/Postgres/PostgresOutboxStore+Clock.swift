// PostgresOutboxStore: one clock for every node. Leases, due times, pacing, TTLs and the reclaim
// check are times several nodes compare, so the store keeps them all in the database's time. A
// claim (and recoverInflight) reads clock_timestamp() in its own transaction and compares with
// that; every other time the store writes (ingest, outcomes, events) is the node's clock plus
// the offset measured at connect and at each claim. A node whose offset exceeds
// `maxClockOffsetMillis` claims nothing until it is back in bound (its clock is broken and may
// jump). The dispatcher keeps the node's own clock: claimed rows, outcomes and the next due
// time are converted at the store's edge (docs/postgres.md "One clock").
import FoundationEssentials
import Synchronization

/// The database's time as this node reads it: its own clock plus the last measured offset.
final class DatabaseClock: RelayClock, Sendable {
    let local: any RelayClock
    /// Database minus node, in ms (0 until measured: the store measures before any use).
    private let offset = Atomic<Int64>(0)
    private let measuredAt = Atomic<Int64>(.min)   // monotonic ms

    init(local: any RelayClock) { self.local = local }

    func nowMillis() -> Int64 { local.nowMillis() + offsetMillis }
    var offsetMillis: Int64 { offset.load(ordering: .relaxed) }
    var isMeasured: Bool { measuredAt.load(ordering: .relaxed) != .min }

    func set(offsetMillis: Int64) {
        offset.store(offsetMillis, ordering: .relaxed)
        measuredAt.store(monotonicMicros() / 1000, ordering: .relaxed)
    }

    /// Whether a sample is taken: its error is up to half its round trip, so one that took
    /// longer than 250 ms (or a quarter of the bound) would move the offset by noise, and
    /// after a stall of the database (a 30 s round trip) past the bound, refusing claims
    /// although the clocks agree. The first sample is always taken.
    static func takesSample(roundTripMillis: Int64, boundMillis: Int64, measured: Bool) -> Bool {
        !measured || roundTripMillis <= min(250, max(1, boundMillis / 4))
    }

    /// Node time to database time, and back.
    func toDatabase(_ t: Int64) -> Int64 { t + offsetMillis }
    func toLocal(_ t: Int64) -> Int64 { t - offsetMillis }
}

extension PostgresOutboxStore {
    /// Measures the offset on `c`: clock_timestamp() against the node's clock at the middle of
    /// the round trip. A test's database clock is read directly. Returns the database's time.
    @discardableResult
    func measureClockOffset(_ c: PostgresConnection) throws -> Int64 {
        let offset: Int64, databaseTime: Int64
        var roundTrip: Int64 = 0
        if let databaseClock {
            databaseTime = databaseClock.nowMillis()
            offset = databaseTime - clock.local.nowMillis()
        } else {
            let start = monotonicMicros(), before = clock.local.nowMillis()
            guard let db = try c.query("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").first?.first?.int else {
                throw StoreError.invalid("clock_timestamp() returned nothing")
            }
            roundTrip = (monotonicMicros() - start) / 1000
            offset = db - (before + roundTrip / 2)
            databaseTime = db
        }
        let first = !clock.isMeasured, before = clock.offsetMillis
        let fields: KeyValuePairs<String, any Sendable> = ["offset_ms": offset, "round_trip_ms": roundTrip,
                                                           "bound_ms": options.maxClockOffsetMillis]
        guard DatabaseClock.takesSample(roundTripMillis: roundTrip, boundMillis: options.maxClockOffsetMillis, measured: !first) else {
            logger?.limited(.warning, "database clock sample skipped: its round trip was too slow to say the offset", fields)
            return databaseTime
        }
        clock.set(offsetMillis: offset)
        if abs(offset) > options.maxClockOffsetMillis {
            logger?.limited(.error, "this node's clock is off the database's by more than store.maxClockOffsetSeconds: it claims no pushes until fixed (check NTP)", fields)
        } else if first || abs(offset - before) >= 1_000 {
            logger?.info("database clock offset measured", fields)
        }
        return databaseTime
    }

    /// The database's time now, read on `c` (a test's database clock instead), measuring this
    /// node's offset with it.
    func databaseNow(_ c: PostgresConnection) throws -> Int64 {
        try measureClockOffset(c)
    }

    /// The node's clock is within `maxClockOffsetMillis` of the database's.
    var clockOffsetInBound: Bool { abs(clock.offsetMillis) <= options.maxClockOffsetMillis }

    /// Database minus node clock, in seconds (relay_postgres_clock_offset_seconds).
    public var clockOffsetSeconds: Double { Double(clock.offsetMillis) / 1000 }

    /// A claimed row's times in the node's clock (the dispatcher compares them with its own).
    func toLocal(_ row: OutboxRow) -> OutboxRow {
        var r = row
        r.nextAttemptAt = clock.toLocal(r.nextAttemptAt)
        r.createdAt = clock.toLocal(r.createdAt)
        r.expiresAt = clock.toLocal(r.expiresAt)
        r.updatedAt = clock.toLocal(r.updatedAt)
        return r
    }

    /// An outcome's times (decided on the node's clock) in the database's; APNs' own timestamp
    /// is APNs' time and stays as it is.
    func toDatabase(_ u: DeliveryUpdate) -> DeliveryUpdate {
        var d = u
        switch u.outcome {
        case .retry(let at, let until): d.outcome = .retry(at: clock.toDatabase(at), paceTokenUntil: until.map(clock.toDatabase))
        case .release(let at): d.outcome = .release(at: clock.toDatabase(at))
        case .delivered, .failed, .unregistered, .requeue: break
        }
        d.attempt?.attemptedAt = clock.toDatabase(u.attempt?.attemptedAt ?? 0)
        return d
    }
}
