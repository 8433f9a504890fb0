// SQLiteOutboxStore: delivery events (docs/events.md). The writes run inside the writer job
// that commits the outcome (apply, claim, the 410 scan's last transaction), so an event and its
// outcome commit or roll back together; the sender's claims and results are writer jobs too,
// the feed and relayctl read through the reader connection.
import FoundationEssentials
import Synchronization

extension SQLiteOutboxStore {
    public var eventsCreated: EventTally { writerState.tally }

    public var eventSettings: EventStoreSettings {
        get { writerState.sharedEventSettings.withLock { $0 } }
        set { writerState.sharedEventSettings.withLock { $0 = newValue } }
    }

    static let eventColumns = EventRecord.columnNames.map { "e.\($0)" }.joined(separator: ", ")

    /// The event of the outcome just written to the row at `rowid` (terminal), with its
    /// webhooks' deliveries; nothing when there is no such row.
    static func recordResponseEvent(rowid: Int64, delivered: Bool, now: Int64, db: SQLiteDatabase, state: WriterState) throws {
        let (id, seq) = state.eventIDs.mint(nowMillis: now)
        let type: EventType = delivered ? .responseDelivered : .responseFailed
        let st = try db.held(&state.insertResponseEvent, """
            INSERT INTO events (seq, id, type, created_at, credential_id, app, push_token, response_id, session_id, key_id, message_index,
                                state, status, reason, attempts, accepted_at, finished_at)
            SELECT ?, ?, ?, ?, credential_id, app, push_token, id, session_id, key_id, message_index,
                   state, last_status, last_reason, attempts, created_at, updated_at FROM responses WHERE id_high = ?
            """)
        try st.bind(1, seq)
        try st.bind(2, id)
        try st.bind(3, type.rawValue)
        try st.bind(4, now)
        try st.bind(5, rowid)
        try st.stepOnce()
        guard db.changes > 0 else { return }
        state.batch.eventWritten(seq: seq, type)
        guard !state.events.webhooks.isEmpty else { return }
        // (Not RETURNING app: SQLite builds an ephemeral table for it each time.)
        let app = try db.scalar("SELECT app FROM events WHERE seq = ?", [.integer(seq)]).string ?? ""
        try fanOut(seq: seq, type: type, app: app, now: now, db: db, state: state)
    }

    /// token.unregistered for the token's recorded 410, once per owner
    /// (StoreRules.tokenUnregisteredEvents).
    static func recordTokenEvents(token: String, owners: [(credentialID: String, app: String)], unregisteredAt: Int64, now: Int64,
                                  db: SQLiteDatabase, state: WriterState) throws {
        for (credential, app) in owners {
            let (id, seq) = state.eventIDs.mint(nowMillis: now)
            try db.run("""
                INSERT INTO events (seq, id, type, created_at, credential_id, app, push_token, unregistered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                """, [.integer(seq), .text(id), .text(EventType.tokenUnregistered.rawValue), .integer(now), .text(credential), .text(app),
                      .text(token), .integer(unregisteredAt)])
            state.batch.eventWritten(seq: seq, .tokenUnregistered)
            try fanOut(seq: seq, type: .tokenUnregistered, app: app, now: now, db: db, state: state)
        }
    }

    private static func fanOut(seq: Int64, type: EventType, app: String, now: Int64, db: SQLiteDatabase, state: WriterState) throws {
        guard !state.events.webhooks.isEmpty else { return }
        for name in state.events.receivers(type: type, app: app) {
            let st = try db.held(&state.insertDelivery,
                "INSERT INTO webhook_deliveries (webhook, seq, state, next_attempt_at, updated_at) VALUES (?, ?, 'pending', ?, ?)")
            try st.bind(1, name)
            try st.bind(2, seq)
            try st.bind(3, now)
            try st.bind(4, now)
            try st.stepOnce()
        }
    }

    // MARK: the feed and relayctl (reader)

    /// Rows of events examined per feed read. No index by credential: it cost a page write per
    /// outcome commit (docs/events.md); a read
    /// walks the rowid range after the cursor instead, at most this far.
    static let feedScanRows = 10_000

    public func eventPage(credentialID: String, after sequence: Int64, limit: Int) throws -> EventPage {
        try read { db in
            // The stretch examined: the next feedScanRows events of any credential (one reader
            // transaction, so a commit meanwhile is either wholly in it or after its end).
            // A deferred (read) transaction: db.transaction would take the write lock.
            try db.execute("BEGIN")
            defer { try? db.execute("COMMIT") }
            do {
                let stretch = try db.query("SELECT max(seq), count(*) FROM (SELECT seq FROM events WHERE seq > ? ORDER BY seq LIMIT ?)",
                                           [.integer(sequence), .integer(Int64(Self.feedScanRows))]).first
                guard let end = stretch?[0].int else { return EventPage(events: [], next: sequence) }
                let events = try db.query("SELECT \(Self.eventColumns) FROM events e WHERE e.seq > ? AND e.seq <= ? AND e.credential_id = ? ORDER BY e.seq LIMIT ?",
                                          [.integer(sequence), .integer(end), .text(credentialID), .integer(Int64(max(0, limit)))])
                    .map { try EventRecord(columns: $0).stored }
                // Past other credentials' events only a whole stretch at a time: the cursor then
                // tells no more than that 10,000 events went by.
                let full = (stretch?[1].int ?? 0) >= Int64(Self.feedScanRows)
                let next = limit > 0 && events.count == limit ? events[events.count - 1].sequence : full ? end : events.last?.sequence ?? sequence
                return EventPage(events: events, next: next)
            }
        }
    }

    public func eventCredentials(after sequence: Int64, limit: Int) throws -> EventOwners {
        try read { db in
            var through = sequence
            var credentials: Set<String> = []
            var examined = 0
            for r in try db.query("SELECT credential_id, max(seq), count(*) FROM (SELECT credential_id, seq FROM events WHERE seq > ? ORDER BY seq LIMIT ?) GROUP BY credential_id",
                                  [.integer(sequence), .integer(Int64(max(0, limit)))]) {
                if let c = r[0].string { credentials.insert(c) }
                through = max(through, r[1].int ?? sequence)
                examined += Int(r[2].int ?? 0)
            }
            return EventOwners(through: through, credentials: credentials, examined: examined)
        }
    }

    public func feedCursorKey() throws -> [UInt8] {
        if let key = try read({ db in try db.scalar("SELECT key FROM feed_cursor_key WHERE id = 1").bytes }), key.count == FeedCursor.keyLength {
            return key
        }
        let fresh = RelayCrypto.randomBytes(FeedCursor.keyLength)
        return try write { db in
            try db.run("INSERT OR IGNORE INTO feed_cursor_key (id, key) VALUES (1, ?)", [.blob(fresh)])
            guard let key = try db.scalar("SELECT key FROM feed_cursor_key WHERE id = 1").bytes, key.count == FeedCursor.keyLength else {
                throw StoreError.invalid("feed_cursor_key holds no \(FeedCursor.keyLength)-byte key")
            }
            return key
        }
    }

    public func lastEventSequence() throws -> Int64 {
        try read { db in try db.scalar("SELECT max(seq) FROM events").int ?? 0 }
    }

    public func event(id: String) throws -> StoredEvent? {
        let id = id.lowercased()
        guard let seq = UUIDText.high64(id) else { return nil }
        return try read { db in
            try db.query("SELECT \(Self.eventColumns) FROM events e WHERE e.seq = ? AND e.id = ?", [.integer(seq), .text(id)])
                .first.map { try EventRecord(columns: $0).stored }
        }
    }

    public func listEvents(type: EventType?, limit: Int) throws -> [StoredEvent] {
        try read { db in
            try db.query("SELECT \(Self.eventColumns) FROM events e WHERE ?1 IS NULL OR e.type = ?1 ORDER BY e.seq DESC LIMIT ?2",
                         [type.map { .text($0.rawValue) } ?? .null, .integer(Int64(max(0, limit)))]).map { try EventRecord(columns: $0).stored }
        }
    }

    static let deliveryColumns = "d.webhook, d.state, d.attempts, d.first_attempt_at, d.next_attempt_at, d.last_error, d.updated_at"

    public func webhookDeliveries(_ filter: WebhookDeliveryFilter) throws -> [WebhookDeliveryRecord] {
        var clauses: [String] = []
        var binds: [SQLValue] = []
        if let w = filter.webhook { clauses.append("d.webhook = ?"); binds.append(.text(w)) }
        if let s = filter.state { clauses.append("d.state = '\(s.rawValue)'") }
        if let t = filter.type { clauses.append("e.type = ?"); binds.append(.text(t.rawValue)) }
        if let id = filter.eventID { clauses.append("d.seq = ? AND e.id = ?"); binds += [.integer(UUIDText.high64(id) ?? 0), .text(id)] }
        let whereSQL = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        binds.append(.integer(Int64(max(0, filter.limit))))
        return try read { db in
            try db.query("SELECT \(Self.deliveryColumns), \(Self.eventColumns) FROM webhook_deliveries d JOIN events e ON e.seq = d.seq \(whereSQL) ORDER BY d.seq, d.webhook LIMIT ?", binds)
                .map { try WebhookDeliveryRecord(columns: $0) }
        }
    }

    /// The sender's backlog gauge (every 10 s): counted over the pending rows' partial index,
    /// at most `webhookBacklogCountCap` entries (StoreRules).
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? {
        try pendingWebhookDeliveries(webhook: webhook, cap: StoreRules.webhookBacklogCountCap)
    }

    func pendingWebhookDeliveries(webhook: String, cap: Int) throws -> Int {
        try read { db in
            Int(try db.query("SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE webhook = ? AND state = 'pending' LIMIT ?)",
                             [.text(webhook), .integer(Int64(max(0, cap)))]).first?[0].int ?? 0)
        }
    }

    public func webhookDeliveryCounts() throws -> [String: [WebhookDeliveryState: Int]] {
        try read { db in
            var out: [String: [WebhookDeliveryState: Int]] = [:]
            for s in [WebhookDeliveryState.pending, .dead] {
                for r in try db.query("SELECT webhook, count(*) FROM webhook_deliveries WHERE state = '\(s.rawValue)' GROUP BY webhook") {
                    if let w = r[0].string { out[w, default: [:]][s] = Int(r[1].int ?? 0) }
                }
            }
            return out
        }
    }

    // MARK: operator actions and retention (writer)

    public func replayWebhookDelivery(eventID: String, webhook: String?) throws -> Int {
        let id = eventID.lowercased()
        guard let seq = UUIDText.high64(id) else { return 0 }
        let now = clock.nowMillis()
        return try write { db in
            guard try db.scalar("SELECT count(*) FROM events WHERE seq = ? AND id = ?", [.integer(seq), .text(id)]).int == 1 else { return 0 }
            var binds: [SQLValue] = [.integer(now), .integer(now), .integer(seq)]
            if let webhook { binds.append(.text(webhook)) }
            return try db.run("""
                UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = ?, lease_until = 0, claim = claim + 1, first_attempt_at = NULL, updated_at = ?
                WHERE seq = ?\(webhook == nil ? "" : " AND webhook = ?")
                """, binds)
        }
    }

    public func replayDeadWebhookDeliveries(webhook: String) throws -> Int {
        let now = clock.nowMillis()
        return try write { db in
            try db.run("""
                UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = ?, lease_until = 0, claim = claim + 1, first_attempt_at = NULL, updated_at = ?
                WHERE webhook = ? AND state = 'dead'
                """, [.integer(now), .integer(now), .text(webhook)])
        }
    }

    public func purgeEvents(types: [EventType], olderThan: Int64, limit: Int) throws -> PurgedEvents {
        guard !types.isEmpty, limit > 0 else { return PurgedEvents() }
        let typeList = "(" + types.map { "'\($0.rawValue)'" }.joined(separator: ",") + ")"
        return try write { db in
            // seq is time-ordered: the oldest events are the lowest rowids.
            let seqs = try db.query("SELECT seq FROM events WHERE created_at < ? AND type IN \(typeList) ORDER BY seq LIMIT ?",
                                    [.integer(olderThan), .integer(Int64(limit))]).compactMap { $0[0].int }
            var pending: [String: Int] = [:]
            for seq in seqs {
                for r in try db.query("SELECT webhook FROM webhook_deliveries WHERE seq = ? AND state = 'pending'", [.integer(seq)]) {
                    if let w = r[0].string { pending[w, default: 0] += 1 }
                }
                try db.run("DELETE FROM webhook_deliveries WHERE seq = ?", [.integer(seq)])
                try db.run("DELETE FROM events WHERE seq = ?", [.integer(seq)])
            }
            return PurgedEvents(events: seqs.count, pendingDeliveries: pending)
        }
    }

    public func trimWebhookBacklogs(max: Int) throws -> [String: Int] {
        // Counted on the reader first (bounded): the writer, which ingest waits for, counts only
        // a backlog that is over.
        let names = try eventSettings.webhooks.map(\.name).filter { try pendingWebhookDeliveries(webhook: $0, cap: max + 1) > max }
        guard !names.isEmpty else { return [:] }
        return try write { db in
            var dropped: [String: Int] = [:]
            for name in names {
                let n = Int(try db.scalar("SELECT count(*) FROM webhook_deliveries WHERE webhook = ? AND state = 'pending'", [.text(name)]).int ?? 0)
                guard n > max else { continue }
                dropped[name] = try db.run("""
                    DELETE FROM webhook_deliveries WHERE webhook = ? AND seq IN
                        (SELECT seq FROM webhook_deliveries WHERE webhook = ? AND state = 'pending' ORDER BY next_attempt_at, seq LIMIT ?)
                    """, [.text(name), .text(name), .integer(Int64(n - max))])
            }
            return dropped
        }
    }

    // MARK: WebhookOutbox (the sender's thread)

    public func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int) throws -> [WebhookDelivery] {
        guard limit > 0 else { return [] }
        let state = writerState
        return try write { db in try Self.claimWebhookDeliveries(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit, db: db, state: state) }
    }

    @discardableResult
    public func recordWebhookResults(webhook: String, _ results: [WebhookAttemptRecord]) throws -> Int {
        guard !results.isEmpty else { return 0 }
        let state = writerState
        return try write { db in try Self.recordWebhookResults(webhook: webhook, results, db: db, state: state) }
    }

    public func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], now: Int64, leaseUntil: Int64,
                                                limit: Int) throws -> WebhookExchange {
        guard !results.isEmpty || limit > 0 else { return WebhookExchange(stale: 0, claimed: []) }
        let state = writerState
        return try write { db in
            let stale = try Self.recordWebhookResults(webhook: webhook, results, db: db, state: state)
            return WebhookExchange(stale: stale, claimed: try Self.claimWebhookDeliveries(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit,
                                                                                         db: db, state: state))
        }
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
    private static func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int, db: SQLiteDatabase,
                                               state: WriterState) throws -> [WebhookDelivery] {
        guard limit > 0 else { return [] }
        let select = try db.held(&state.claimWebhookDeliveries, claimSQL)
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
            let lease = try db.held(&state.leaseWebhookDelivery, "UPDATE webhook_deliveries SET lease_until = ?, claim = ? WHERE webhook = ? AND seq = ?")
            try lease.bind(1, leaseUntil)
            try lease.bind(2, claim)
            try lease.bind(3, webhook)
            try lease.bind(4, e.sequence)
            try lease.stepOnce()
            out.append(WebhookDelivery(source: .record(e), attempts: Int(r.attempts), firstAttemptAt: r.firstAttemptAt, claim: claim))
        }
        return out
    }

    /// Returns how many results were dropped (claimed again since, or no longer pending).
    private static func recordWebhookResults(webhook: String, _ results: [WebhookAttemptRecord], db: SQLiteDatabase, state: WriterState) throws -> Int {
        var stale = 0
        for r in results {
            guard let seq = UUIDText.high64(r.eventID.lowercased()) else { stale += 1; continue }
            let c = WebhookResultChange(r.result)
            let st = try db.held(&state.recordWebhookResult, WebhookResultChange.sqliteUpdate)
            try st.bind(1, c.state.rawValue)
            try st.bind(2, Int64(c.attempted ? 1 : 0))
            try st.bind(3, c.attemptedAt)
            try st.bind(4, c.nextAttemptAt ?? 0)
            try st.bind(5, c.error)
            try st.bind(6, webhook)
            try st.bind(7, seq)
            try st.bind(8, r.claim)
            try st.stepOnce()
            if db.changes == 0 { stale += 1 }
        }
        return stale
    }
}

/// What one attempt's result writes to its delivery row (both stores).
struct WebhookResultChange {
    var state: WebhookDeliveryState
    /// False for `notSent`: attempts and first_attempt_at are kept.
    var attempted: Bool
    var attemptedAt: Int64
    /// Only for `retry` and `notSent` (otherwise the row's value is kept).
    var nextAttemptAt: Int64?
    var error: String?

    init(_ r: WebhookAttemptResult) {
        switch r {
        case .delivered(let at): self.init(state: .delivered, attempted: true, attemptedAt: at, nextAttemptAt: nil, error: nil)
        case .retry(let attemptedAt, let at, let error): self.init(state: .pending, attempted: true, attemptedAt: attemptedAt, nextAttemptAt: at, error: error)
        case .dead(let attemptedAt, let error): self.init(state: .dead, attempted: true, attemptedAt: attemptedAt, nextAttemptAt: nil, error: error)
        case .notSent(let failedAt, let at, let error): self.init(state: .pending, attempted: false, attemptedAt: failedAt, nextAttemptAt: at, error: error)
        }
    }

    init(state: WebhookDeliveryState, attempted: Bool, attemptedAt: Int64, nextAttemptAt: Int64?, error: String?) {
        self.state = state
        self.attempted = attempted
        self.attemptedAt = attemptedAt
        self.nextAttemptAt = nextAttemptAt
        self.error = error
    }

    /// Binds: state, attempted (1/0), attempted at (first attempt, updated at), next attempt
    /// (0: keep), error, webhook, seq, claim. Only a pending row under the claim the result
    /// was made for is changed: a replay, a later claim or a drop meanwhile wins.
    static let sqliteUpdate = """
        UPDATE webhook_deliveries SET state = ?1, attempts = attempts + ?2,
            first_attempt_at = CASE WHEN ?2 = 1 THEN coalesce(first_attempt_at, ?3) ELSE first_attempt_at END,
            next_attempt_at = CASE WHEN ?4 > 0 THEN ?4 ELSE next_attempt_at END, lease_until = 0, last_error = ?5, updated_at = ?3
        WHERE webhook = ?6 AND seq = ?7 AND state = 'pending' AND claim = ?8
        """
}

extension WebhookDeliveryRecord {
    /// deliveryColumns then the event's columns.
    init(columns c: some StoreColumns) throws {
        guard let webhook = c.string(0), let state = c.string(1).flatMap(WebhookDeliveryState.init(rawValue:)) else {
            throw StoreError.invalid("malformed webhook_deliveries row")
        }
        self.init(webhook: webhook, state: state, event: try EventRecord(columns: c, offset: 7).stored, attempts: Int(c.int(2) ?? 0),
                  firstAttemptAt: c.int(3), nextAttemptAt: c.int(4) ?? 0, lastError: c.string(5), updatedAt: c.int(6) ?? 0)
    }
}

