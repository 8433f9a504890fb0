// What a webhook's deliveries are, once for both stores (docs/events.md "The store's side"):
// which events count as pending, delivered or dead given the cursor and the retry rows (the
// listings, the counts, the backlog gauge, retention's tally), what a replay changes, where an
// exchange records each result, and how the backlog bound trims. The stores only read and write
// what these decide. (Expiry, an event given up on after `retryForSeconds`, is decided by the
// sender: WebhookRetryPolicy.)

/// The events without a retry row that a listing shows: `after < seq <= through`.
struct WebhookSeqRange: Equatable {
    var after: Int64
    /// nil: no upper end.
    var through: Int64?

    /// The range as an SQL condition on the events row `e`.
    var sql: String { "e.seq > \(after)" + (through.map { " AND e.seq <= \($0)" } ?? "") }
}

/// One pass of the backlog bound: how many of the oldest events after the cursor it skips, then
/// how many retry rows (due first) it drops.
struct WebhookBacklogTrim: Equatable {
    var skipEvents: Int
    var dropRows: Int
}

enum WebhookDeliveryRules {
    // MARK: listing and counting

    /// An event without a retry row is pending after this point: after the cursor, which never
    /// goes back before its start.
    static func pendingAfter(_ c: WebhookCursorRow) -> Int64 { max(c.seq, c.startSeq) }

    /// The events without a row a listing of `state` shows (nil: none, every dead delivery has
    /// its row). Through the cursor delivered, after it pending, before the cursor's start none
    /// (the webhook did not exist yet).
    static func rowlessRange(_ c: WebhookCursorRow, state: WebhookDeliveryState?) -> WebhookSeqRange? {
        switch state {
        case nil: WebhookSeqRange(after: c.startSeq, through: nil)
        case .pending: WebhookSeqRange(after: pendingAfter(c), through: nil)
        case .delivered: WebhookSeqRange(after: c.startSeq, through: c.seq)
        case .dead: nil
        }
    }

    /// An event without a row, in the listed range: through the cursor delivered at its first
    /// attempt (a failed attempt has a row), after it pending and never attempted.
    static func rowlessState(seq: Int64, _ c: WebhookCursorRow) -> (state: WebhookDeliveryState, attempts: Int) {
        seq <= c.seq ? (.delivered, 1) : (.pending, 0)
    }

    /// `rowlessState` as SQL expressions on the events row `e` (state text, attempts integer).
    static func rowlessStateSQL(_ c: WebhookCursorRow) -> (state: String, attempts: String) {
        ("CASE WHEN e.seq <= \(c.seq) THEN '\(WebhookDeliveryState.delivered.rawValue)' ELSE '\(WebhookDeliveryState.pending.rawValue)' END",
         "CASE WHEN e.seq <= \(c.seq) THEN 1 ELSE 0 END")
    }

    /// Whether the event `seq` (without a row for this webhook) is still pending for it.
    static func rowlessPending(_ c: WebhookCursorRow, seq: Int64, type: EventType, app: String) -> Bool {
        seq > pendingAfter(c) && c.subscription.receives(type: type, app: app)
    }

    /// relayctl's counts per webhook: pending and dead retry rows, plus the events pending
    /// without a row (`rowlessPending` per cursor). Delivered is not counted.
    static func counts(rows: [(webhook: String, state: WebhookDeliveryState, count: Int)],
                       rowlessPending: [(webhook: String, count: Int)]) -> [String: [WebhookDeliveryState: Int]] {
        var out: [String: [WebhookDeliveryState: Int]] = [:]
        for r in rows where r.state != .delivered && r.count > 0 { out[r.webhook, default: [:]][r.state, default: 0] += r.count }
        for r in rowlessPending where r.count > 0 { out[r.webhook, default: [:]][.pending, default: 0] += r.count }
        return out
    }

    /// The backlog gauge: pending retry rows and rowless pending events, each counted up to
    /// `cap`, at most `cap` in all.
    static func backlog(pendingRows: Int, rowlessPending: Int, cap: Int) -> Int {
        min(pendingRows + rowlessPending, cap)
    }

    // MARK: replay

    /// A replayed retry row (`now`: the SQL placeholder of the time): pending, due now, its
    /// lease ended and its generation bumped (a late result of the earlier claim is then
    /// dropped), its retry window restarted. Attempts are kept.
    static func replaySetSQL(now: String) -> String {
        "state = 'pending', next_attempt_at = \(now), lease_until = 0, claim = claim + 1, first_attempt_at = NULL, updated_at = \(now)"
    }

    /// A webhook whose cursor passed the event without a row (it was delivered) gets a new
    /// pending row on replay; one before the webhook existed or not received by it gets none.
    static func replayAddsRow(_ c: WebhookCursorRow, seq: Int64, type: EventType, app: String) -> Bool {
        c.startSeq < seq && seq <= c.seq && c.subscription.receives(type: type, app: app)
    }

    /// A new replay row's attempts: the delivery that passed the cursor was one.
    static let replayedRowAttempts = 1

    // MARK: the backlog bound

    /// The most one pass drops (at least one): counting stays bounded by the bound, however far
    /// over a backlog is; the retention sweep runs passes until one is not full.
    static func trimPerPass(max: Int) -> Int { Swift.max(1, max) }

    /// How far a pass counts the retry rows and the events after the cursor (each, with LIMIT):
    /// enough to tell how much of `trimPerPass` is over.
    static func trimCountCap(max: Int) -> Int { Swift.max(0, max) + trimPerPass(max: max) }

    /// One pass, from the pending retry rows and the rowless pending events, each counted up to
    /// `trimCountCap`: the oldest events after the cursor go first (they stay, the feed lists
    /// them), then the retry rows due first, until `max` are left or the pass is full.
    static func trim(pendingRows: Int, rowlessPending: Int, max: Int) -> WebhookBacklogTrim {
        let over = min(pendingRows + rowlessPending - Swift.max(0, max), trimPerPass(max: max))
        guard over > 0 else { return WebhookBacklogTrim(skipEvents: 0, dropRows: 0) }
        let skip = min(over, rowlessPending)
        return WebhookBacklogTrim(skipEvents: skip, dropRows: over - skip)
    }

    /// Whether a pass that dropped `dropped` may have left the backlog over: run another.
    static func trimPassWasFull(dropped: Int, max: Int) -> Bool { dropped >= trimPerPass(max: max) }
}

extension WebhookCursorRules {
    /// The backlog bound skipped the events after the cursor through `to`: `seq` moves there and
    /// the cursor starts a new epoch with no lease. The holder's results of what it was handed
    /// are then stale (a dropped event gets no retry row, so it is dropped and counted once),
    /// and the next exchange takes the cursor and hands out again from the new `seq`.
    static func skipped(_ row: inout WebhookCursorRow, to: Int64) {
        row.seq = max(row.seq, to)
        row.claimedThrough = row.seq
        row.epoch += 1
        row.leaseUntil = 0
    }

    /// How one exchange records the sender's results, by position in `results`: a retry row's
    /// result goes to its row (under its claim generation: the store drops it if claimed again
    /// since); a new event's result under the cursor's current epoch inserts its retry row unless
    /// it was delivered (the cursor's advance covers that: recorded, nothing written); one under
    /// an older epoch is stale (the cursor was taken or skipped since: whatever it reports is
    /// handed out again, or was dropped).
    static func sortResults(_ results: [WebhookAttemptRecord], epoch: Int64)
        -> (rowResults: [Int], newRows: [Int], stale: [Int]) {
        var rowResults: [Int] = [], newRows: [Int] = [], stale: [Int] = []
        for (i, r) in results.enumerated() {
            if !r.fromCursor {
                rowResults.append(i)
            } else if r.claim != epoch {
                stale.append(i)
            } else if case .delivered = r.result {
                continue
            } else {
                newRows.append(i)
            }
        }
        return (rowResults, newRows, stale)
    }
}
