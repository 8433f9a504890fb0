// SQLiteOutboxStore: the webhook sender's exchange (docs/events.md "Webhooks"): one writer job per
// sender turn records the finished attempts, moves the webhook's cursor and hands out the next
// events and due retry rows (the cursor's rules: Events/WebhookCursor.swift).
import FoundationEssentials
import Synchronization

extension SQLiteOutboxStore {
    // MARK: WebhookOutbox (the sender's thread)

    public func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], cursor: WebhookCursorPosition?, now: Int64,
                                                leaseUntil: Int64, limit: Int, releaseCursor: Bool) throws -> WebhookExchange {
        let state = writerState
        return try write { db in
            try Self.exchange(webhook: webhook, results: results, cursor: cursor, now: now, leaseUntil: leaseUntil, limit: limit,
                              release: releaseCursor, db: db, state: state)
        }
    }

    /// One writer job: results, the cursor's advance, due retry rows, then new events.
    private static func exchange(webhook: String, results: [WebhookAttemptRecord], cursor: WebhookCursorPosition?, now: Int64,
                                 leaseUntil: Int64, limit: Int, release: Bool, db: SQLiteDatabase, state: WriterState) throws -> WebhookExchange {
        var row = try heldCursor(webhook, db: db, state: state)
        let sorted = WebhookCursorRules.sortResults(results, epoch: row.epoch)
        var stale = sorted.stale
        for i in sorted.rowResults {
            let r = results[i]
            guard let seq = UUIDText.high64(r.eventID.lowercased()),
                  try recordRowResult(webhook: webhook, seq: seq, claim: r.claim, WebhookResultChange(r.result), db: db, state: state) else {
                stale.append(i)
                continue
            }
        }
        for i in sorted.newRows {
            let r = results[i]
            guard let seq = UUIDText.high64(r.eventID.lowercased()) else { stale.append(i); continue }
            try insertRetryRow(webhook: webhook, seq: seq, WebhookResultChange(r.result), db: db, state: state)
        }
        var claimed = try claimRows(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit, db: db, state: state)
        let before = row
        // The configured subscription (the row's is the same, written at start).
        let subscription = state.events.webhooks.first { $0.name == webhook } ?? row.subscription
        let turn = try WebhookCursorRules.turn(&row, caller: cursor, now: now, leaseUntil: leaseUntil, release: release,
                                               room: limit - claimed.count, takeUnleased: true) { after, room in
            try newEvents(after: after, room: room, subscription, db: db, state: state)
        }
        claimed += turn.events.map { WebhookDelivery(source: .record($0), attempts: 0, firstAttemptAt: nil, claim: row.epoch, fromCursor: true) }
        let grant = turn.grant
        if row.changed(from: before, handOutKeptByCaller: turn.handOutKept) {
            let st = try db.held(&state.statements.writeWebhookCursor, "UPDATE webhook_cursors SET seq = ?, claimed_through = ?, epoch = ?, lease_until = ? WHERE webhook = ?")
            try st.bind(1, row.seq)
            try st.bind(2, row.claimedThrough)
            try st.bind(3, row.epoch)
            try st.bind(4, row.leaseUntil)
            try st.bind(5, webhook)
            try st.stepOnce()
        }
        return WebhookExchange(staleResults: stale.sorted(), claimed: claimed, cursor: grant)
    }

    /// The webhook's cursor, made when missing (a webhook configured since this process wrote
    /// its first event).
    private static func heldCursor(_ webhook: String, db: SQLiteDatabase, state: WriterState) throws -> WebhookCursorRow {
        for attempt in 0..<2 {
            let st = try db.held(&state.statements.readWebhookCursor, "SELECT \(WebhookColumns.cursors) FROM webhook_cursors WHERE webhook = ?")
            try st.bind(1, webhook)
            defer { st.reset() }
            if try st.next() { return try WebhookCursorRow(columns: st) }
            guard attempt == 0 else { break }
            st.reset()
            try ensureCursor(state.events.webhooks.first { $0.name == webhook } ?? WebhookSubscription(name: webhook), db: db)
        }
        throw StoreError.invalid("webhook_cursors has no row for \(webhook)")
    }

    /// The events after `after` that the subscription receives, at most `room`, examining at
    /// most WebhookCursorRules.scanRows; `through` is the last one returned, or the last
    /// examined when fewer than `room` were found.
    private static func newEvents(after: Int64, room: Int, _ subscription: WebhookSubscription, db: SQLiteDatabase,
                                  state: WriterState) throws -> (events: [EventRecord], through: Int64) {
        let st = try db.held(&state.statements.scanNewEvents, "SELECT \(eventColumns) FROM events e WHERE e.seq > ? ORDER BY e.seq LIMIT ?")
        try st.bind(1, after)
        try st.bind(2, Int64(WebhookCursorRules.scanRows))
        defer { st.reset() }
        var out: [EventRecord] = []
        var through = after
        while out.count < room, try st.next() {
            through = st.int(0) ?? through
            guard let type = st.string(2).flatMap(EventType.init(rawValue:)), subscription.receives(type: type, app: st.string(5) ?? "") else { continue }
            out.append(try EventRecord(columns: st, offset: 0))
        }
        return (out, through)
    }

    /// Due first, then commit order, over the index `webhook_deliveries_due`: it reads the due
    /// rows in this order and stops at the limit (SQLiteEventIndexTests reads the plan).
    /// Binds: webhook, now, limit.
    static let claimSQL = """
        SELECT d.attempts, d.first_attempt_at, d.claim, \(eventColumns) FROM webhook_deliveries d JOIN events e ON e.seq = d.seq
        WHERE d.webhook = ?1 AND d.state = 'pending' AND d.next_attempt_at <= ?2 AND d.lease_until <= ?2
        ORDER BY d.next_attempt_at, d.seq LIMIT ?3
        """

    /// The event's columns, not its body: the sender renders it on its own thread.
    /// Held statements (WriterState): the statement cache hashes the SQL text on every lookup.
    private static func claimRows(webhook: String, now: Int64, leaseUntil: Int64, limit: Int, db: SQLiteDatabase,
                                  state: WriterState) throws -> [WebhookDelivery] {
        guard limit > 0 else { return [] }
        let select = try db.held(&state.statements.claimWebhookDeliveries, claimSQL)
        try select.bind(1, webhook)
        try select.bind(2, now)
        try select.bind(3, Int64(limit))
        // Read in place (no [[SQLValue]]), all before the leases are written: they change the
        // index the SELECT walks.
        var found: [(attempts: Int64, firstAttemptAt: Int64?, claim: Int64, event: EventRecord)] = []
        do {
            defer { select.reset() }
            while try select.next() {
                found.append((select.int(0) ?? 0, select.int(1), select.int(2) ?? 0, try EventRecord(columns: select, offset: 3)))
            }
        }
        var out: [WebhookDelivery] = []
        out.reserveCapacity(found.count)
        for r in found {
            let e = r.event
            let claim = r.claim + 1
            let lease = try db.held(&state.statements.leaseWebhookDelivery, "UPDATE webhook_deliveries SET lease_until = ?, claim = ? WHERE webhook = ? AND seq = ?")
            try lease.bind(1, leaseUntil)
            try lease.bind(2, claim)
            try lease.bind(3, webhook)
            try lease.bind(4, e.sequence)
            try lease.stepOnce()
            out.append(WebhookDelivery(source: .record(e), attempts: Int(r.attempts), firstAttemptAt: r.firstAttemptAt, claim: claim))
        }
        return out
    }

    /// A retry row's result; false when dropped (claimed again since, or no longer pending).
    private static func recordRowResult(webhook: String, seq: Int64, claim: Int64, _ c: WebhookResultChange, db: SQLiteDatabase,
                                        state: WriterState) throws -> Bool {
        let st = try db.held(&state.statements.recordWebhookResult, WebhookResultChange.sqliteUpdate)
        try st.bind(1, c.state.rawValue)
        try st.bind(2, Int64(c.attempted ? 1 : 0))
        try st.bind(3, c.attemptedAt)
        try st.bind(4, c.nextAttemptAt ?? 0)
        try st.bind(5, c.error)
        try st.bind(6, webhook)
        try st.bind(7, seq)
        try st.bind(8, claim)
        try st.stepOnce()
        return db.changes > 0
    }

    /// A new event's failed attempt (or local failure): its retry row, as the same result on
    /// an existing row would leave it. Nothing for an event retention deleted meanwhile (a row
    /// without its event would never be claimed nor purged).
    private static func insertRetryRow(webhook: String, seq: Int64, _ c: WebhookResultChange, db: SQLiteDatabase, state: WriterState) throws {
        let st = try db.held(&state.statements.insertDelivery, """
            INSERT OR IGNORE INTO webhook_deliveries (webhook, seq, state, attempts, first_attempt_at, next_attempt_at, last_error, updated_at)
            SELECT ?1, seq, ?3, ?4, CASE WHEN ?4 = 1 THEN ?5 END, ?6, ?7, ?5 FROM events WHERE seq = ?2
            """)
        try st.bind(1, webhook)
        try st.bind(2, seq)
        try st.bind(3, c.state.rawValue)
        try st.bind(4, Int64(c.attempted ? 1 : 0))
        try st.bind(5, c.attemptedAt)
        try st.bind(6, c.nextAttemptAt ?? c.attemptedAt)
        try st.bind(7, c.error)
        try st.stepOnce()
    }
}
