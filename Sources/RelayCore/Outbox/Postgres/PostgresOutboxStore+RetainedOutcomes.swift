// PostgresOutboxStore: outcome writes that failed while the database was away are kept and
// written again before this node claims anything or writes newer outcomes. Until then their rows
// stay inflight under this node's lease; without the second write APNs' answer would be lost and
// the row pushed again once the lease expired (issue 30, item 1).
import FoundationEssentials
import Synchronization

/// The outcomes waiting for the database, in the order they were decided, at most one per row
/// and lease epoch. Bounded: past `limit` the oldest are dropped (logged); their rows return at
/// their lease's expiry and are pushed again, as after a node's death.
struct RetainedOutcomes {
    static let limit = 65_536
    private(set) var updates: [DeliveryUpdate] = []
    private var keys: Set<Key> = []
    private var failures = 0
    /// When to try again (monotonic ms): nextDueAt wakes the dispatcher for it, with back-off
    /// (100 ms doubling to 2 s) so a database that stays away is not asked in a loop.
    private(set) var retryAt: Int64 = 0

    struct Key: Hashable {
        var id: String
        var epoch: Int64?
    }

    var isEmpty: Bool { updates.isEmpty }

    /// Keeps `more` after those already kept; returns how many old ones the bound dropped.
    mutating func keep(_ more: [DeliveryUpdate], nowMonotonicMillis now: Int64) -> Int {
        for u in more where keys.insert(Key(id: u.id, epoch: u.leaseEpoch)).inserted { updates.append(u) }
        var dropped = 0
        if updates.count > Self.limit {
            dropped = updates.count - Self.limit
            for u in updates.prefix(dropped) { keys.remove(Key(id: u.id, epoch: u.leaseEpoch)) }
            updates.removeFirst(dropped)
        }
        failures += 1
        retryAt = now + min(2_000, 100 << min(failures - 1, 5))
        return dropped
    }

    /// Hands everything kept to a write (which keeps it again if it fails).
    mutating func take() -> [DeliveryUpdate] {
        defer { self = RetainedOutcomes(failures: failures) }
        return updates
    }

    private init(failures: Int) { self.failures = failures }
    init() {}

    mutating func written() { failures = 0 }

    /// Whether an outcome write that failed with `error` can succeed later as it is: the
    /// database was away, restarting, read-only during a failover, out of resources, or the
    /// statement was cancelled. An error in the statement itself (data, constraint) would fail
    /// again: those outcomes are not kept (their rows return at their lease's expiry).
    static func worthKeeping(after error: any Error) -> Bool {
        switch error as? StoreError {
        case .unavailable?: return true
        case .postgres(let state, _, _)?:
            return PGState.isConnectionLoss(state) || state.hasPrefix("57") || state.hasPrefix("53") || state.hasPrefix("40")
                || state == "25006" || state.isEmpty
        default: return false
        }
    }
}

extension PostgresOutboxStore {
    /// After a failed outcome write: keeps its updates (and those it carried again) if the
    /// failure may pass.
    func retainOutcomes(_ updates: [DeliveryUpdate], after error: any Error) {
        guard !updates.isEmpty, RetainedOutcomes.worthKeeping(after: error) else {
            if !updates.isEmpty {
                logger?.error("push outcomes not recorded; their rows return when their lease expires",
                              ["count": updates.count, "error": "\(error)"])
            }
            return
        }
        let (dropped, kept) = retainedOutcomes.withLock { r in
            (r.keep(updates, nowMonotonicMillis: monotonicMicros() / 1000), r.updates.count)
        }
        logger?.limited(.error, "push outcomes not recorded yet; kept and written again when the database answers",
                        ["kept": kept, "error": "\(error)"])
        if dropped > 0 {
            logger?.error("too many unrecorded push outcomes kept; the oldest dropped (their rows return when their lease expires)",
                          ["dropped": dropped])
        }
    }

    /// On the dispatch connection's thread, before a claim or a newer outcome write: writes the
    /// kept outcomes in their own transaction. Idempotent if an earlier try committed unseen:
    /// rows change only under the lease (owner and epoch) the answer belongs to, and an attempt
    /// already recorded for that row, time and node is not recorded twice. Throws (and keeps
    /// them) while the database is still away; outcomes refused for themselves are dropped
    /// (logged) without holding up what comes after.
    func writeRetainedOutcomes(_ w: PostgresLink) throws {
        let kept = retainedOutcomes.withLock { $0.take() }
        guard !kept.isEmpty else { return }
        do {
            committed(try w.transaction(applying(kept, again: true)))
            retainedOutcomes.withLock { $0.written() }
            logger?.info("kept push outcomes recorded", ["count": kept.count])
        } catch {
            retainOutcomes(kept, after: error)
            if RetainedOutcomes.worthKeeping(after: error) { throw error }
        }
    }

    /// When the kept outcomes should be tried again (RelayClock ms), nil when none are kept.
    func retainedOutcomesDueAt() -> Int64? {
        let retryAt: Int64? = retainedOutcomes.withLock { $0.isEmpty ? nil : $0.retryAt }
        guard let retryAt else { return nil }
        return clock.nowMillis() + max(0, retryAt - monotonicMicros() / 1000)
    }
}
