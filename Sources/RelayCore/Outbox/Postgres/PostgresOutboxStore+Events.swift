// PostgresOutboxStore: delivery events (docs/events.md). Events are inserted by the
// transaction that commits their outcome (apply, claim), copied from the response rows by one
// INSERT ... SELECT; nothing per webhook (each reads the events after its cursor,
// WebhookCursor.swift). Nodes insert under a
// transaction-level advisory lock, so seq order is commit order on every node (the feed's
// cursor and the sender's order never skip a late commit).
import FoundationEssentials
import Synchronization

extension PostgresOutboxStore {
    static let eventLockKey: Int64 = 0x5245_4C41_5945_5654  // "RELAYEVT"

    public var eventSettings: EventStoreSettings {
        get { sharedEventSettings.withLock { $0 } }
        set { sharedEventSettings.withLock { $0 = newValue } }
    }

    /// After a commit that wrote events of `credentials` (this node's only; other nodes' are
    /// found by polling).
    func eventsCommitted(_ credentials: Set<String>) {
        observers.committed(OutboxCommit(events: EventsCommitted(credentials: credentials)))
    }

    static let eventColumns = EventRecord.columnNames.map { "e.\($0)" }.joined(separator: ", ")

    /// Under the events lock, once per process and settings: the configured webhooks' cursors.
    /// Believed made only once the transaction commits: a rolled-back (or retried) one makes
    /// them again, so a new webhook's cursor starts before the events of that transaction.
    private func ensureCursorsOnce(_ c: PostgresConnection) throws {
        let hooks = eventSettings.webhooks
        guard cursorsReadyFor.withLock({ $0 != hooks }) else { return }
        try Self.ensureCursors(hooks, c)
        c.afterCommit.append { [weak self] in self?.cursorsReadyFor.withLock { $0 = hooks } }
    }

    /// In the outcome's transaction: one event per response id (now terminal), in order.
    /// Returns each written event's credential.
    @discardableResult
    func insertResponseEvents(_ c: PostgresConnection, responseIDs: [String], now: Int64) throws -> [String?] {
        guard !responseIDs.isEmpty else { return [] }
        let eventIDs = ids.withLock { g in responseIDs.map { _ in g.mint(nowMillis: now).id } }
        try c.query("SELECT pg_advisory_xact_lock($1)", [.int(Self.eventLockKey)])
        try ensureCursorsOnce(c)
        let rows = try c.query("""
            WITH ev AS (
                INSERT INTO events (id, type, created_at, credential_id, app, push_token, response_id, session_id, key_id, message_index,
                                    state, status, reason, attempts, accepted_at, finished_at)
                SELECT x.eid, CASE r.state WHEN 'delivered' THEN 'response.delivered' ELSE 'response.failed' END, $1, r.credential_id, r.app,
                       r.push_token, r.id, r.session_id, r.key_id, r.message_index, r.state, r.last_status, r.last_reason, r.attempts,
                       r.created_at, r.updated_at
                FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS x(rid, eid, n) JOIN responses r ON r.id = x.rid
                WHERE r.state IN ('delivered','failed')
                ORDER BY x.n
                RETURNING credential_id
            )
            SELECT credential_id FROM ev
            """, [.int(now), .textArray(responseIDs), .textArray(eventIDs)])
        return rows.map { $0.first?.string }
    }

    /// token.unregistered for the token's recorded 410, once per owner
    /// (StoreRules.tokenUnregisteredEvents).
    func insertTokenEvents(_ c: PostgresConnection, token: String, owners: [(credentialID: String, app: String)], unregisteredAt: Int64, now: Int64) throws {
        guard !owners.isEmpty else { return }
        let eventIDs = ids.withLock { g in owners.map { _ in g.mint(nowMillis: now).id } }
        try c.query("SELECT pg_advisory_xact_lock($1)", [.int(Self.eventLockKey)])
        try ensureCursorsOnce(c)
        try c.query("""
            INSERT INTO events (id, type, created_at, credential_id, app, push_token, unregistered_at)
            SELECT x.eid, 'token.unregistered', $1, x.cred, x.app, $5, $6
            FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS x(eid, cred, app, n) ORDER BY x.n
            """, [.int(now), .textArray(eventIDs), .textArray(owners.map(\.credentialID)), .textArray(owners.map(\.app)),
                  .text(token), .int(unregisteredAt)])
    }

    // MARK: the feed and relayctl (query connection)

    /// By the credential's index (events_credential): `next` is the last event returned.
    public func eventPage(credentialID: String, after sequence: Int64, limit: Int) throws -> EventPage {
        try read { c in
            let events = try c.query("SELECT \(Self.eventColumns) FROM events e WHERE e.credential_id = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3",
                                     [.text(credentialID), .int(sequence), .int(Int64(max(0, limit)))]).map { try EventRecord(columns: $0).stored }
            return EventPage(events: events, next: events.last?.sequence ?? sequence)
        }
    }

    public func eventCredentials(after sequence: Int64, limit: Int) throws -> EventOwners {
        try read { c in
            var through = sequence
            var credentials: Set<String> = []
            var examined = 0
            for r in try c.query("SELECT credential_id, max(seq), count(*) FROM (SELECT credential_id, seq FROM events WHERE seq > $1 ORDER BY seq LIMIT $2) x GROUP BY credential_id",
                                 [.int(sequence), .int(Int64(max(0, limit)))]) {
                if let cred = r[0].string { credentials.insert(cred) }
                through = max(through, r[1].int ?? sequence)
                examined += Int(r[2].int ?? 0)
            }
            return EventOwners(through: through, credentials: credentials, examined: examined)
        }
    }

    /// Nodes starting together both insert; the first commit wins and both read it.
    public func feedCursorKey() throws -> [UInt8] {
        let fresh = RelayCrypto.randomBytes(FeedCursor.keyLength)
        return try write { c in
            try c.query("INSERT INTO feed_cursor_key (id, key) VALUES (1, $1) ON CONFLICT (id) DO NOTHING", [.bytes(fresh)])
            guard let key = try c.query("SELECT key FROM feed_cursor_key WHERE id = 1").first?.first?.bytes, key.count == FeedCursor.keyLength else {
                throw StoreError.invalid("feed_cursor_key holds no \(FeedCursor.keyLength)-byte key")
            }
            return key
        }
    }

    public func lastEventSequence() throws -> Int64 {
        try read { c in try c.query("SELECT max(seq) FROM events").first?.first?.int ?? 0 }
    }

    public func event(id: String) throws -> StoredEvent? {
        try read { c in
            try c.query("SELECT \(Self.eventColumns) FROM events e WHERE e.id = $1", [.text(id.lowercased())]).first.map { try EventRecord(columns: $0).stored }
        }
    }

    public func listEvents(type: EventType?, limit: Int) throws -> [StoredEvent] {
        try read { c in
            try c.query("SELECT \(Self.eventColumns) FROM events e WHERE $1::text IS NULL OR e.type = $1 ORDER BY e.seq DESC LIMIT $2",
                        [type.map { .text($0.rawValue) } ?? .null, .int(Int64(max(0, limit)))]).map { try EventRecord(columns: $0).stored }
        }
    }


    static func cursors(_ c: PostgresConnection, webhook: String? = nil) throws -> [WebhookCursorRow] {
        try c.query("SELECT \(WebhookColumns.cursors) FROM webhook_cursors WHERE $1::text IS NULL OR webhook = $1 ORDER BY webhook",
                    [webhook.map { .text($0) } ?? .null]).map(WebhookCursorRow.init(columns:))
    }

    /// Retry rows as they are, and the events without a row as the cursor places them (as
    /// SQLiteOutboxStore.webhookDeliveries).
    public func webhookDeliveries(_ filter: WebhookDeliveryFilter) throws -> [WebhookDeliveryRecord] {
        let limit = Int64(max(0, filter.limit))
        return try read { c in
            var out: [WebhookDeliveryRecord] = []
            for cur in try Self.cursors(c, webhook: filter.webhook) {
                var binds: [PGValue] = [.text(cur.webhook)]
                func bind(_ v: PGValue) -> String {
                    binds.append(v)
                    return "$\(binds.count)"
                }
                var eventSQL = ""
                if let t = filter.type { eventSQL += " AND e.type = " + bind(.text(t.rawValue)) }
                if let id = filter.eventID { eventSQL += " AND e.id = " + bind(.text(id)) }
                var parts: [String] = []
                let stateSQL = filter.state.map { " AND d.state = '\($0.rawValue)'" } ?? ""
                parts.append("SELECT \(WebhookColumns.deliveries), \(Self.eventColumns) FROM webhook_deliveries d JOIN events e ON e.seq = d.seq WHERE d.webhook = $1\(stateSQL)\(eventSQL)")
                if let range = WebhookDeliveryRules.rowlessRange(cur, state: filter.state) {
                    let rowless = WebhookDeliveryRules.rowlessStateSQL(cur)
                    parts.append("""
                        SELECT $1::text, \(rowless.state), (\(rowless.attempts))::bigint, NULL::bigint, e.created_at, NULL::text, e.created_at, \(Self.eventColumns)
                        FROM events e WHERE \(range.sql) AND \(WebhookCursorRules.sqlFilter(cur.subscription))\(eventSQL)
                          AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.seq = e.seq AND d.webhook = $1)
                        """)
                }
                let l = bind(.int(limit))
                out += try c.query("SELECT * FROM (" + parts.joined(separator: " UNION ALL ") + ") x ORDER BY 8 LIMIT \(l)", binds)
                    .map { try WebhookDeliveryRecord(columns: $0) }
            }
            return Array(out.sorted { ($0.event.sequence, $0.webhook) < ($1.event.sequence, $1.webhook) }.prefix(Int(limit)))
        }
    }

    /// The sender's backlog gauge (every 10 s): pending retry rows and events after the cursor
    /// that the webhook receives, at most `webhookBacklogCountCap` in all (StoreRules).
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? {
        try pendingWebhookDeliveries(webhook: webhook, cap: StoreRules.webhookBacklogCountCap)
    }

    func pendingWebhookDeliveries(webhook: String, cap: Int) throws -> Int {
        try read { c in
            let after = try Self.cursors(c, webhook: webhook).first.map { cur in try Self.countAfterCursor(cur, cap: cap, c) } ?? 0
            return WebhookDeliveryRules.backlog(pendingRows: try Self.countPendingRows(webhook, cap: cap, c), rowlessPending: after, cap: cap)
        }
    }

    static func countPendingRows(_ webhook: String, cap: Int, _ c: PostgresConnection) throws -> Int {
        Int(try c.query("SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE webhook = $1 AND state = 'pending' LIMIT $2) x",
                        [.text(webhook), .int(Int64(max(0, cap)))]).first?.first?.int ?? 0)
    }

    /// Events pending without a row (WebhookDeliveryRules.rowlessPending), counted up to `cap`.
    static func countAfterCursor(_ cur: WebhookCursorRow, cap: Int, _ c: PostgresConnection) throws -> Int {
        Int(try c.query("SELECT count(*) FROM (SELECT 1 FROM events e WHERE e.seq > $1 AND \(WebhookCursorRules.sqlFilter(cur.subscription)) LIMIT $2) x",
                        [.int(WebhookDeliveryRules.pendingAfter(cur)), .int(Int64(max(0, cap)))]).first?.first?.int ?? 0)
    }

    public func webhookDeliveryCounts() throws -> [String: [WebhookDeliveryState: Int]] {
        try read { c in
            let rows = try c.query("SELECT webhook, state, count(*) FROM webhook_deliveries WHERE state IN ('pending','dead') GROUP BY webhook, state")
                .compactMap { r in
                    r[0].string.flatMap { w in r[1].string.flatMap(WebhookDeliveryState.init(rawValue:)).map { (webhook: w, state: $0, count: Int(r[2].int ?? 0)) } }
                }
            let rowless = try Self.cursors(c).map { cur in (webhook: cur.webhook, count: try Self.countAfterCursor(cur, cap: Int(Int64.max), c)) }
            return WebhookDeliveryRules.counts(rows: rows, rowlessPending: rowless)
        }
    }

    // MARK: operator actions and retention

    public func replayWebhookDelivery(eventID: String, webhook: String?) throws -> Int {
        let now = clock.nowMillis()
        return try writeTransaction { c in
            guard let e = try c.query("SELECT seq, type, app FROM events WHERE id = $1", [.text(eventID.lowercased())]).first, let seq = e[0].int,
                  let type = e[1].string.flatMap(EventType.init(rawValue:)) else { return 0 }
            var n = try c.run("""
                UPDATE webhook_deliveries SET \(WebhookDeliveryRules.replaySetSQL(now: "$1"))
                WHERE seq = $2 AND ($3::text IS NULL OR webhook = $3)
                """, [.int(now), .int(seq), webhook.map { .text($0) } ?? .null]).affected
            for cur in try Self.cursors(c, webhook: webhook) where WebhookDeliveryRules.replayAddsRow(cur, seq: seq, type: type, app: e[2].string ?? "") {
                n += try c.run("""
                    INSERT INTO webhook_deliveries (webhook, seq, state, attempts, next_attempt_at, updated_at) VALUES ($1, $2, 'pending', $4, $3, $3)
                    ON CONFLICT (seq, webhook) DO NOTHING
                    """, [.text(cur.webhook), .int(seq), .int(now), .int(Int64(WebhookDeliveryRules.replayedRowAttempts))]).affected
            }
            return n
        }
    }

    public func replayDeadWebhookDeliveries(webhook: String) throws -> Int {
        let now = clock.nowMillis()
        return try write { c in
            try c.run("UPDATE webhook_deliveries SET \(WebhookDeliveryRules.replaySetSQL(now: "$1")) WHERE webhook = $2 AND state = 'dead'",
                      [.int(now), .text(webhook)]).affected
        }
    }

    public func purgeEvents(types: [EventType], olderThan: Int64, limit: Int) throws -> PurgedEvents {
        guard !types.isEmpty, limit > 0 else { return PurgedEvents() }
        let olderThan = clock.toDatabase(olderThan)
        return try writeTransaction { c in
            let doomed = try c.query("SELECT seq, type, app FROM events WHERE created_at < $1 AND type = ANY($2::text[]) ORDER BY seq LIMIT $3",
                                     [.int(olderThan), .textArray(types.map(\.rawValue)), .int(Int64(limit))])
            let seqs = doomed.compactMap { $0[0].int }
            guard !seqs.isEmpty else { return PurgedEvents() }
            var pending: [String: Int] = [:]
            var withRow: Set<String> = []
            for r in try c.query("DELETE FROM webhook_deliveries WHERE seq = ANY($1::bigint[]) RETURNING webhook, state, seq", [.intArray(seqs)]) {
                guard let w = r[0].string else { continue }
                withRow.insert("\(r[2].int ?? 0) \(w)")
                if r[1].string == WebhookDeliveryState.pending.rawValue { pending[w, default: 0] += 1 }
            }
            let cursors = try Self.cursors(c)
            for r in doomed {
                guard let seq = r[0].int else { continue }
                let type = r[1].string.flatMap(EventType.init(rawValue:)) ?? .responseDelivered
                for cur in cursors where !withRow.contains("\(seq) \(cur.webhook)") && WebhookDeliveryRules.rowlessPending(cur, seq: seq, type: type, app: r[2].string ?? "") {
                    pending[cur.webhook, default: 0] += 1
                }
            }
            return PurgedEvents(events: try c.run("DELETE FROM events WHERE seq = ANY($1::bigint[])", [.intArray(seqs)]).affected, pendingDeliveries: pending)
        }
    }

    /// One pass of the bound, as SQLiteOutboxStore.trimWebhookBacklogs (WebhookDeliveryRules.trim,
    /// WebhookCursorRules.skipped), the cursor row locked against the sender's exchange.
    public func trimWebhookBacklogs(max: Int) throws -> [String: Int] {
        // Counted on the query connection first (bounded); the write counts only a backlog that is over.
        let names = try eventSettings.webhooks.map(\.name).filter { try pendingWebhookDeliveries(webhook: $0, cap: max + 1) > max }
        guard !names.isEmpty else { return [:] }
        let cap = WebhookDeliveryRules.trimCountCap(max: max)
        return try writeTransaction { c in
            var dropped: [String: Int] = [:]
            for name in names {
                guard var cur = try c.query("SELECT \(WebhookColumns.cursors) FROM webhook_cursors WHERE webhook = $1 FOR UPDATE", [.text(name)])
                    .first.map(WebhookCursorRow.init(columns:)) else { continue }
                let trim = WebhookDeliveryRules.trim(pendingRows: try Self.countPendingRows(name, cap: cap, c),
                                                     rowlessPending: try Self.countAfterCursor(cur, cap: cap, c), max: max)
                if trim.skipEvents > 0 {
                    let skipped = try c.query("""
                        SELECT max(seq), count(*) FROM (SELECT e.seq FROM events e WHERE e.seq > $1 AND \(WebhookCursorRules.sqlFilter(cur.subscription)) ORDER BY e.seq LIMIT $2) x
                        """, [.int(WebhookDeliveryRules.pendingAfter(cur)), .int(Int64(trim.skipEvents))]).first
                    WebhookCursorRules.skipped(&cur, to: skipped?[0].int ?? cur.seq)
                    try c.run("UPDATE webhook_cursors SET seq = $1, claimed_through = $2, epoch = $3, lease_until = $4 WHERE webhook = $5",
                              [.int(cur.seq), .int(cur.claimedThrough), .int(cur.epoch), .int(cur.leaseUntil), .text(name)])
                    dropped[name] = Int(skipped?[1].int ?? 0)
                }
                if trim.dropRows > 0 {
                    dropped[name, default: 0] += try c.run("""
                        DELETE FROM webhook_deliveries WHERE webhook = $1 AND seq IN
                            (SELECT seq FROM webhook_deliveries WHERE webhook = $1 AND state = 'pending' ORDER BY next_attempt_at, seq LIMIT $2)
                        """, [.text(name), .int(Int64(trim.dropRows))]).affected
                }
            }
            return dropped
        }
    }

    // MARK: WebhookOutbox

    /// One transaction: the cursor row locked first (FOR UPDATE), so two nodes' exchanges for
    /// one webhook take turns: only the holder of the cursor's epoch (or the first after its
    /// lease ended) is handed new events; retry rows are shared out by SKIP LOCKED. The
    /// sender's times are the node's clock: compared and stored in the database's (One clock).
    public func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], cursor: WebhookCursorPosition?, now: Int64,
                                                leaseUntil: Int64, limit: Int, releaseCursor: Bool) throws -> WebhookExchange {
        let subscription = eventSettings.webhooks.first { $0.name == webhook } ?? WebhookSubscription(name: webhook)
        return try writeTransaction { [clock] c in
            let now = clock.toDatabase(now), leaseUntil = clock.toDatabase(leaseUntil)
            var row = try Self.lockedCursor(subscription, c)
            let sorted = WebhookCursorRules.sortResults(results, epoch: row.epoch)
            let dropped = try Self.recordRowResults(webhook: webhook, sorted.rowResults.map { results[$0] }, clock, c)
            let stale = (dropped.map { sorted.rowResults[$0] } + sorted.stale).sorted()
            try Self.insertRetryRows(webhook: webhook, sorted.newRows.map { results[$0] }, clock, c)
            var claimed = try Self.claimRows(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit, clock, c)
            let before = row
            let turn = try WebhookCursorRules.turn(&row, caller: cursor, now: now, leaseUntil: leaseUntil, release: releaseCursor,
                                                   room: limit - claimed.count, takeUnleased: false) { after, room in
                try Self.newEvents(after: after, room: room, subscription, c)
            }
            claimed += turn.events.map { e in
                var e = e
                e.createdAt = clock.toLocal(e.createdAt)
                return WebhookDelivery(source: .record(e), attempts: 0, firstAttemptAt: nil, claim: row.epoch, fromCursor: true)
            }
            let grant = turn.grant
            if row.changed(from: before, handOutKeptByCaller: turn.handOutKept) {
                try c.run("UPDATE webhook_cursors SET seq = $1, claimed_through = $2, epoch = $3, lease_until = $4 WHERE webhook = $5",
                          [.int(row.seq), .int(row.claimedThrough), .int(row.epoch), .int(row.leaseUntil), .text(webhook)])
            }
            return WebhookExchange(staleResults: stale, claimed: claimed, cursor: grant)
        }
    }

    /// The webhook's cursor row, locked; made (under the events lock, so it starts exactly
    /// after the newest committed event) when missing.
    private static func lockedCursor(_ w: WebhookSubscription, _ c: PostgresConnection) throws -> WebhookCursorRow {
        let select = "SELECT \(WebhookColumns.cursors) FROM webhook_cursors WHERE webhook = $1 FOR UPDATE"
        if let r = try c.query(select, [.text(w.name)]).first { return try WebhookCursorRow(columns: r) }
        try c.query("SELECT pg_advisory_xact_lock($1)", [.int(eventLockKey)])
        try ensureCursors([w], c)
        guard let r = try c.query(select, [.text(w.name)]).first else { throw StoreError.invalid("webhook_cursors has no row for \(w.name)") }
        return try WebhookCursorRow(columns: r)
    }

    /// Under the events lock (the caller's): each webhook has a cursor, a new one after the
    /// newest event, and names its subscription.
    static func ensureCursors(_ hooks: [WebhookSubscription], _ c: PostgresConnection) throws {
        guard !hooks.isEmpty else { return }
        let encoded = hooks.map(WebhookCursorRules.encode)
        try c.run("""
            INSERT INTO webhook_cursors (webhook, seq, claimed_through, start_seq, types, apps)
            SELECT w.name, m.m, m.m, m.m, w.types, w.apps
            FROM unnest($1::text[], $2::text[], $3::text[]) AS w(name, types, apps), (SELECT coalesce(max(seq), 0) AS m FROM events) m
            ON CONFLICT (webhook) DO UPDATE SET types = excluded.types, apps = excluded.apps
            WHERE webhook_cursors.types IS DISTINCT FROM excluded.types OR webhook_cursors.apps IS DISTINCT FROM excluded.apps
            """, [.textArray(hooks.map(\.name)), .textArray(encoded.map(\.types)), .textArray(encoded.map(\.apps))])
    }

    /// The events after `after` that the subscription receives, at most `room`, examining at
    /// most WebhookCursorRules.scanRows (seq order is commit order: nothing later can appear
    /// below what is visible).
    private static func newEvents(after: Int64, room: Int, _ subscription: WebhookSubscription,
                                  _ c: PostgresConnection) throws -> (events: [EventRecord], through: Int64) {
        guard let end = try c.query("SELECT max(seq) FROM (SELECT seq FROM events WHERE seq > $1 ORDER BY seq LIMIT $2) x",
                                    [.int(after), .int(Int64(WebhookCursorRules.scanRows))]).first?.first?.int else { return ([], after) }
        let events = try c.query("""
            SELECT \(eventColumns) FROM events e WHERE e.seq > $1 AND e.seq <= $2 AND \(WebhookCursorRules.sqlFilter(subscription)) ORDER BY e.seq LIMIT $3
            """, [.int(after), .int(end), .int(Int64(room))]).map { try EventRecord(columns: $0) }
        return (events, events.count == room ? events[events.count - 1].sequence : end)
    }

    /// Due first, then commit order, over the index `webhook_deliveries_due` (EventClaimPlanTests
    /// reads the plan). Binds: webhook, now, limit, lease until.
    static let claimSQL = """
            WITH d AS (
                UPDATE webhook_deliveries w SET lease_until = $4, claim = w.claim + 1
                FROM (SELECT seq FROM webhook_deliveries WHERE webhook = $1 AND state = 'pending' AND next_attempt_at <= $2 AND lease_until <= $2
                      ORDER BY next_attempt_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED) c
                WHERE w.webhook = $1 AND w.seq = c.seq
                RETURNING w.seq, w.next_attempt_at, w.attempts, w.first_attempt_at, w.claim
            )
            SELECT d.attempts, d.first_attempt_at, d.claim, \(eventColumns) FROM d JOIN events e ON e.seq = d.seq ORDER BY d.next_attempt_at, d.seq
            """

    /// SKIP LOCKED: two nodes' senders claiming the same webhook take different rows. The
    /// event's columns, not its body: the sender renders it on its own thread. `now` and
    /// `leaseUntil` in the database's clock.
    private static func claimRows(webhook: String, now: Int64, leaseUntil: Int64, limit: Int, _ clock: DatabaseClock,
                                  _ c: PostgresConnection) throws -> [WebhookDelivery] {
        guard limit > 0 else { return [] }
        let rows = try c.query(claimSQL, [.text(webhook), .int(now), .int(Int64(limit)), .int(leaseUntil)])
        return try rows.map { r in
            WebhookDelivery(source: .record(try EventRecord(columns: r, offset: 3)), attempts: Int(r[0].int ?? 0), firstAttemptAt: r[1].int.map(clock.toLocal),
                            claim: r[2].int ?? 0)
        }
    }

    private static func changes(_ results: [WebhookAttemptRecord], _ clock: DatabaseClock) -> [(id: String, claim: Int64, change: WebhookResultChange)] {
        results.map { r in
            var change = WebhookResultChange(r.result)
            change.attemptedAt = clock.toDatabase(change.attemptedAt)
            change.nextAttemptAt = change.nextAttemptAt.map(clock.toDatabase)
            return (id: r.eventID.lowercased(), claim: r.claim, change: change)
        }
    }

    /// Retry rows' results; returns the positions in `results` of those dropped (claimed again
    /// since, or no longer pending).
    private static func recordRowResults(webhook: String, _ results: [WebhookAttemptRecord], _ clock: DatabaseClock,
                                         _ c: PostgresConnection) throws -> [Int] {
        guard !results.isEmpty else { return [] }
        let changes = changes(results, clock)
        let applied = try c.run("""
            UPDATE webhook_deliveries d SET state = x.state, attempts = d.attempts + x.attempted,
                first_attempt_at = CASE WHEN x.attempted = 1 THEN coalesce(d.first_attempt_at, x.at) ELSE d.first_attempt_at END,
                next_attempt_at = coalesce(x.next, d.next_attempt_at), lease_until = 0, last_error = x.error, updated_at = x.at
            FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::bigint[], $8::bigint[])
                WITH ORDINALITY AS x(id, state, at, next, error, claim, attempted, ord)
            JOIN events e ON e.id = x.id
            WHERE d.webhook = $1 AND d.seq = e.seq AND d.state = 'pending' AND d.claim = x.claim
            RETURNING x.ord
            """, [.text(webhook), .textArray(changes.map(\.id)), .textArray(changes.map(\.change.state.rawValue)),
                  .intArray(changes.map(\.change.attemptedAt)), .intArray(changes.map(\.change.nextAttemptAt)),
                  .textArray(changes.map(\.change.error)), .intArray(changes.map(\.claim)), .intArray(changes.map { $0.change.attempted ? 1 : 0 })]).rows
        let recorded = Set(applied.compactMap { $0[0].int.map { Int($0) - 1 } })   // ORDINALITY counts from 1
        return results.indices.filter { !recorded.contains($0) }
    }

    /// New events' failed attempts (or local failures): their retry rows.
    private static func insertRetryRows(webhook: String, _ results: [WebhookAttemptRecord], _ clock: DatabaseClock, _ c: PostgresConnection) throws {
        guard !results.isEmpty else { return }
        let changes = changes(results, clock)
        _ = try c.run("""
            INSERT INTO webhook_deliveries (webhook, seq, state, attempts, first_attempt_at, next_attempt_at, last_error, updated_at)
            SELECT $1, e.seq, x.state, x.attempted, CASE WHEN x.attempted = 1 THEN x.at END, coalesce(x.next, x.at), x.error, x.at
            FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::bigint[]) AS x(id, state, at, next, error, attempted)
            JOIN events e ON e.id = x.id
            ON CONFLICT (seq, webhook) DO NOTHING
            """, [.text(webhook), .textArray(changes.map(\.id)), .textArray(changes.map(\.change.state.rawValue)),
                  .intArray(changes.map(\.change.attemptedAt)), .intArray(changes.map(\.change.nextAttemptAt)),
                  .textArray(changes.map(\.change.error)), .intArray(changes.map { $0.change.attempted ? 1 : 0 })])
    }
}
