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
        if state.cursorsReadyFor != state.events.webhooks { try ensureCursors(db: db, state: state) }
        let (id, seq) = state.eventIDs.mint(nowMillis: now)
        let type: EventType = delivered ? .responseDelivered : .responseFailed
        let st = try db.held(&state.statements.insertResponseEvent, """
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
    }

    /// token.unregistered for the token's recorded 410, once per owner
    /// (StoreRules.tokenUnregisteredEvents).
    static func recordTokenEvents(token: String, owners: [(credentialID: String, app: String)], unregisteredAt: Int64, now: Int64,
                                  db: SQLiteDatabase, state: WriterState) throws {
        if state.cursorsReadyFor != state.events.webhooks { try ensureCursors(db: db, state: state) }
        for (credential, app) in owners {
            let (id, seq) = state.eventIDs.mint(nowMillis: now)
            try db.run("""
                INSERT INTO events (seq, id, type, created_at, credential_id, app, push_token, unregistered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                """, [.integer(seq), .text(id), .text(EventType.tokenUnregistered.rawValue), .integer(now), .text(credential), .text(app),
                      .text(token), .integer(unregisteredAt)])
            state.batch.eventWritten(seq: seq, .tokenUnregistered)
        }
    }

    /// Before this process's first event, and again after `eventSettings` changed: every
    /// configured webhook has a cursor (a new one starts after the newest event: it receives
    /// the events committed from now on) and the row names its subscription (relayctl reads
    /// it). Rolled back with its transaction: the exchange makes a missing cursor too.
    static func ensureCursors(db: SQLiteDatabase, state: WriterState) throws {
        for w in state.events.webhooks { try ensureCursor(w, db: db) }
        state.cursorsReadyFor = state.events.webhooks
    }

    static func ensureCursor(_ w: WebhookSubscription, db: SQLiteDatabase) throws {
        let (types, apps) = WebhookCursorRules.encode(w)
        try db.run("""
            INSERT INTO webhook_cursors (webhook, seq, claimed_through, start_seq, types, apps)
            SELECT ?1, m, m, m, ?2, ?3 FROM (SELECT coalesce(max(seq), 0) AS m FROM events) WHERE 1
            ON CONFLICT (webhook) DO UPDATE SET types = excluded.types, apps = excluded.apps
            WHERE types IS NOT excluded.types OR apps IS NOT excluded.apps
            """, [.text(w.name), .text(types), apps.map { .text($0) } ?? .null])
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


    /// Every webhook's cursor (those this database ever had), by name.
    static func cursors(_ db: SQLiteDatabase, webhook: String? = nil) throws -> [WebhookCursorRow] {
        try db.query("SELECT \(WebhookColumns.cursors) FROM webhook_cursors WHERE ?1 IS NULL OR webhook = ?1 ORDER BY webhook",
                     [webhook.map { .text($0) } ?? .null]).map(WebhookCursorRow.init(columns:))
    }

    /// Retry rows as they are, and the events without a row as the cursor places them
    /// (WebhookDeliveryRules.rowlessRange and rowlessState).
    public func webhookDeliveries(_ filter: WebhookDeliveryFilter) throws -> [WebhookDeliveryRecord] {
        let limit = Int64(max(0, filter.limit))
        return try read { db in
            var out: [WebhookDeliveryRecord] = []
            for c in try Self.cursors(db, webhook: filter.webhook) {
                var parts: [String] = []
                var binds: [SQLValue] = [.text(c.webhook)]
                var eventClauses: [String] = []
                if let t = filter.type { eventClauses.append("e.type = ?\(binds.count + 1)"); binds.append(.text(t.rawValue)) }
                if let id = filter.eventID { eventClauses.append("e.seq = ?\(binds.count + 1) AND e.id = ?\(binds.count + 2)"); binds += [.integer(UUIDText.high64(id) ?? 0), .text(id)] }
                let eventSQL = eventClauses.map { " AND " + $0 }.joined()
                let stateSQL = filter.state.map { " AND d.state = '\($0.rawValue)'" } ?? ""
                parts.append("SELECT \(WebhookColumns.deliveries), \(Self.eventColumns) FROM webhook_deliveries d JOIN events e ON e.seq = d.seq WHERE d.webhook = ?1\(stateSQL)\(eventSQL)")
                if let range = WebhookDeliveryRules.rowlessRange(c, state: filter.state) {
                    let rowless = WebhookDeliveryRules.rowlessStateSQL(c)
                    parts.append("""
                        SELECT ?1, \(rowless.state), \(rowless.attempts), NULL, e.created_at, NULL, e.created_at, \(Self.eventColumns)
                        FROM events e WHERE \(range.sql) AND \(WebhookCursorRules.sqlFilter(c.subscription))\(eventSQL)
                          AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.seq = e.seq AND d.webhook = ?1)
                        """)
                }
                binds.append(.integer(limit))
                let sql = "SELECT * FROM (" + parts.joined(separator: " UNION ALL ") + ") ORDER BY 8 LIMIT ?\(binds.count)"
                out += try db.query(sql, binds).map { try WebhookDeliveryRecord(columns: $0) }
            }
            return Array(out.sorted { ($0.event.sequence, $0.webhook) < ($1.event.sequence, $1.webhook) }.prefix(Int(limit)))
        }
    }

    /// The sender's backlog gauge (every 10 s): the pending retry rows (their partial index)
    /// and the events after the cursor that the webhook receives, at most
    /// `webhookBacklogCountCap` in all (StoreRules), as docs/operations.md says.
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? {
        try pendingWebhookDeliveries(webhook: webhook, cap: StoreRules.webhookBacklogCountCap)
    }

    func pendingWebhookDeliveries(webhook: String, cap: Int) throws -> Int {
        try read { db in
            let after = try Self.cursors(db, webhook: webhook).first.map { c in try Self.countAfterCursor(c, cap: cap, db) } ?? 0
            return WebhookDeliveryRules.backlog(pendingRows: try Self.countPendingRows(webhook, cap: cap, db), rowlessPending: after, cap: cap)
        }
    }

    /// The webhook's pending retry rows, counted up to `cap` (their partial index).
    static func countPendingRows(_ webhook: String, cap: Int, _ db: SQLiteDatabase) throws -> Int {
        Int(try db.query("SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE webhook = ? AND state = 'pending' LIMIT ?)",
                         [.text(webhook), .integer(Int64(max(0, cap)))]).first?[0].int ?? 0)
    }

    /// Events pending without a row (WebhookDeliveryRules.rowlessPending), counted up to `cap`
    /// (over the seq range).
    static func countAfterCursor(_ c: WebhookCursorRow, cap: Int, _ db: SQLiteDatabase) throws -> Int {
        Int(try db.query("SELECT count(*) FROM (SELECT 1 FROM events e WHERE e.seq > ? AND \(WebhookCursorRules.sqlFilter(c.subscription)) LIMIT ?)",
                         [.integer(WebhookDeliveryRules.pendingAfter(c)), .integer(Int64(max(0, cap)))]).first?[0].int ?? 0)
    }

    public func webhookDeliveryCounts() throws -> [String: [WebhookDeliveryState: Int]] {
        try read { db in
            var rows: [(webhook: String, state: WebhookDeliveryState, count: Int)] = []
            for s in [WebhookDeliveryState.pending, .dead] {
                for r in try db.query("SELECT webhook, count(*) FROM webhook_deliveries WHERE state = '\(s.rawValue)' GROUP BY webhook") {
                    if let w = r[0].string { rows.append((w, s, Int(r[1].int ?? 0))) }
                }
            }
            let rowless = try Self.cursors(db).map { c in (webhook: c.webhook, count: try Self.countAfterCursor(c, cap: .max, db)) }
            return WebhookDeliveryRules.counts(rows: rows, rowlessPending: rowless)
        }
    }

    // MARK: operator actions and retention (writer)

    /// A retry row, pending and due now: the existing one replayed, or a new one where the
    /// cursor passed the event without a row (WebhookDeliveryRules.replaySetSQL, replayAddsRow).
    public func replayWebhookDelivery(eventID: String, webhook: String?) throws -> Int {
        let id = eventID.lowercased()
        guard let seq = UUIDText.high64(id) else { return 0 }
        let now = clock.nowMillis()
        return try write { db in
            guard let e = try db.query("SELECT type, app FROM events WHERE seq = ? AND id = ?", [.integer(seq), .text(id)]).first,
                  let type = e[0].string.flatMap(EventType.init(rawValue:)) else { return 0 }
            var binds: [SQLValue] = [.integer(now), .integer(seq)]
            if let webhook { binds.append(.text(webhook)) }
            var n = try db.run("""
                UPDATE webhook_deliveries SET \(WebhookDeliveryRules.replaySetSQL(now: "?1"))
                WHERE seq = ?2\(webhook == nil ? "" : " AND webhook = ?3")
                """, binds)
            for c in try Self.cursors(db, webhook: webhook) where WebhookDeliveryRules.replayAddsRow(c, seq: seq, type: type, app: e[1].string ?? "") {
                n += try db.run("""
                    INSERT OR IGNORE INTO webhook_deliveries (webhook, seq, state, attempts, next_attempt_at, updated_at) VALUES (?, ?, 'pending', ?, ?, ?)
                    """, [.text(c.webhook), .integer(seq), .integer(Int64(WebhookDeliveryRules.replayedRowAttempts)), .integer(now), .integer(now)])
            }
            return n
        }
    }

    public func replayDeadWebhookDeliveries(webhook: String) throws -> Int {
        let now = clock.nowMillis()
        return try write { db in
            try db.run("UPDATE webhook_deliveries SET \(WebhookDeliveryRules.replaySetSQL(now: "?1")) WHERE webhook = ?2 AND state = 'dead'",
                       [.integer(now), .text(webhook)])
        }
    }

    /// An event deleted while still pending for a webhook (a pending retry row, or after the
    /// cursor and received by it) is counted for that webhook: it never reaches it.
    public func purgeEvents(types: [EventType], olderThan: Int64, limit: Int) throws -> PurgedEvents {
        guard !types.isEmpty, limit > 0 else { return PurgedEvents() }
        let typeList = "(" + types.map { "'\($0.rawValue)'" }.joined(separator: ",") + ")"
        return try write { db in
            // seq is time-ordered: the oldest events are the lowest rowids.
            let doomed = try db.query("SELECT seq, type, app FROM events WHERE created_at < ? AND type IN \(typeList) ORDER BY seq LIMIT ?",
                                      [.integer(olderThan), .integer(Int64(limit))])
            let cursors = try Self.cursors(db)
            var pending: [String: Int] = [:]
            for r in doomed {
                guard let seq = r[0].int else { continue }
                var withRow: Set<String> = []
                for d in try db.query("SELECT webhook, state FROM webhook_deliveries WHERE seq = ?", [.integer(seq)]) {
                    guard let w = d[0].string else { continue }
                    withRow.insert(w)
                    if d[1].string == WebhookDeliveryState.pending.rawValue { pending[w, default: 0] += 1 }
                }
                let type = r[1].string.flatMap(EventType.init(rawValue:)) ?? .responseDelivered
                for c in cursors where !withRow.contains(c.webhook) && WebhookDeliveryRules.rowlessPending(c, seq: seq, type: type, app: r[2].string ?? "") {
                    pending[c.webhook, default: 0] += 1
                }
                try db.run("DELETE FROM webhook_deliveries WHERE seq = ?", [.integer(seq)])
                try db.run("DELETE FROM events WHERE seq = ?", [.integer(seq)])
            }
            return PurgedEvents(events: doomed.count, pendingDeliveries: pending)
        }
    }

    /// One pass of the bound (WebhookDeliveryRules.trim): the cursor skips the oldest events
    /// after it (they stay; the feed lists them) under a new epoch, then, if the retry rows alone
    /// are over, those due first are dropped. Counts are bounded (trimCountCap).
    public func trimWebhookBacklogs(max: Int) throws -> [String: Int] {
        // Counted on the reader first (bounded): the writer, which ingest waits for, counts only
        // a backlog that is over.
        let names = try eventSettings.webhooks.map(\.name).filter { try pendingWebhookDeliveries(webhook: $0, cap: max + 1) > max }
        guard !names.isEmpty else { return [:] }
        let cap = WebhookDeliveryRules.trimCountCap(max: max)
        return try write { db in
            var dropped: [String: Int] = [:]
            for name in names {
                guard var c = try Self.cursors(db, webhook: name).first else { continue }
                let trim = WebhookDeliveryRules.trim(pendingRows: try Self.countPendingRows(name, cap: cap, db),
                                                     rowlessPending: try Self.countAfterCursor(c, cap: cap, db), max: max)
                if trim.skipEvents > 0 {
                    let skipped = try db.query("""
                        SELECT max(seq), count(*) FROM (SELECT e.seq FROM events e WHERE e.seq > ? AND \(WebhookCursorRules.sqlFilter(c.subscription)) ORDER BY e.seq LIMIT ?)
                        """, [.integer(WebhookDeliveryRules.pendingAfter(c)), .integer(Int64(trim.skipEvents))]).first
                    WebhookCursorRules.skipped(&c, to: skipped?[0].int ?? c.seq)
                    try db.run("UPDATE webhook_cursors SET seq = ?, claimed_through = ?, epoch = ?, lease_until = ? WHERE webhook = ?",
                               [.integer(c.seq), .integer(c.claimedThrough), .integer(c.epoch), .integer(c.leaseUntil), .text(name)])
                    dropped[name] = Int(skipped?[1].int ?? 0)
                }
                if trim.dropRows > 0 {
                    dropped[name, default: 0] += try db.run("""
                        DELETE FROM webhook_deliveries WHERE webhook = ? AND seq IN
                            (SELECT seq FROM webhook_deliveries WHERE webhook = ? AND state = 'pending' ORDER BY next_attempt_at, seq LIMIT ?)
                        """, [.text(name), .text(name), .integer(Int64(trim.dropRows))])
                }
            }
            return dropped
        }
    }
}
