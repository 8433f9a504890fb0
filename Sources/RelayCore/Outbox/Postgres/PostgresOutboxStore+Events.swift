// PostgresOutboxStore: delivery events (docs/events.md). Events are inserted by the
// transaction that commits their outcome (apply, claim), copied from the response rows by one
// INSERT ... SELECT that also writes each matching webhook's delivery. Nodes insert under a
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

    /// The webhooks as three parallel arrays for the fan-out's unnest: name, types and apps
    /// (comma-joined; nil = every app). Bundle IDs hold no commas (StoreRules.checkNewCredential).
    private func webhookParams() -> [PGValue] {
        let hooks = eventSettings.webhooks
        return [.textArray(hooks.map(\.name)), .textArray(hooks.map { $0.types.map(\.rawValue).sorted().joined(separator: ",") }),
                .textArray(hooks.map { $0.apps.map { $0.sorted().joined(separator: ",") } })]
    }

    private static let fanOutSQL = """
        INSERT INTO webhook_deliveries (webhook, seq, state, next_attempt_at, updated_at)
        SELECT w.name, ev.seq, 'pending', $1, $1 FROM ev
        JOIN unnest($2::text[], $3::text[], $4::text[]) AS w(name, types, apps)
          ON ev.type = ANY(string_to_array(w.types, ',')) AND (w.apps IS NULL OR ev.app = ANY(string_to_array(w.apps, ',')))
        """

    /// In the outcome's transaction: one event per response id (now terminal), in order.
    /// Returns each written event's credential.
    @discardableResult
    func insertResponseEvents(_ c: PostgresConnection, responseIDs: [String], now: Int64) throws -> [String?] {
        guard !responseIDs.isEmpty else { return [] }
        let eventIDs = ids.withLock { g in responseIDs.map { _ in g.mint(nowMillis: now).id } }
        try c.query("SELECT pg_advisory_xact_lock($1)", [.int(Self.eventLockKey)])
        let rows = try c.query("""
            WITH ev AS (
                INSERT INTO events (id, type, created_at, credential_id, app, push_token, response_id, session_id, key_id, message_index,
                                    state, status, reason, attempts, accepted_at, finished_at)
                SELECT x.eid, CASE r.state WHEN 'delivered' THEN 'response.delivered' ELSE 'response.failed' END, $1, r.credential_id, r.app,
                       r.push_token, r.id, r.session_id, r.key_id, r.message_index, r.state, r.last_status, r.last_reason, r.attempts,
                       r.created_at, r.updated_at
                FROM unnest($5::text[], $6::text[]) WITH ORDINALITY AS x(rid, eid, n) JOIN responses r ON r.id = x.rid
                WHERE r.state IN ('delivered','failed')
                ORDER BY x.n
                RETURNING seq, type, app, credential_id
            ), fan AS (\(Self.fanOutSQL))
            SELECT credential_id FROM ev
            """, [.int(now)] + webhookParams() + [.textArray(responseIDs), .textArray(eventIDs)])
        return rows.map { $0.first?.string }
    }

    /// token.unregistered for the token's recorded 410, once per owner
    /// (StoreRules.tokenUnregisteredEvents).
    func insertTokenEvents(_ c: PostgresConnection, token: String, owners: [(credentialID: String, app: String)], unregisteredAt: Int64, now: Int64) throws {
        guard !owners.isEmpty else { return }
        let eventIDs = ids.withLock { g in owners.map { _ in g.mint(nowMillis: now).id } }
        try c.query("SELECT pg_advisory_xact_lock($1)", [.int(Self.eventLockKey)])
        try c.query("""
            WITH ev AS (
                INSERT INTO events (id, type, created_at, credential_id, app, push_token, unregistered_at)
                SELECT x.eid, 'token.unregistered', $1, x.cred, x.app, $8, $9
                FROM unnest($5::text[], $6::text[], $7::text[]) WITH ORDINALITY AS x(eid, cred, app, n) ORDER BY x.n
                RETURNING seq, type, app
            ), fan AS (\(Self.fanOutSQL))
            SELECT count(*) FROM ev
            """, [.int(now)] + webhookParams() + [.textArray(eventIDs), .textArray(owners.map(\.credentialID)), .textArray(owners.map(\.app)),
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

    static let deliveryColumns = "d.webhook, d.state, d.attempts, d.first_attempt_at, d.next_attempt_at, d.last_error, d.updated_at"

    public func webhookDeliveries(_ filter: WebhookDeliveryFilter) throws -> [WebhookDeliveryRecord] {
        var clauses: [String] = []
        var binds: [PGValue] = []
        func bind(_ v: PGValue) -> String {
            binds.append(v)
            return "$\(binds.count)"
        }
        if let w = filter.webhook { clauses.append("d.webhook = " + bind(.text(w))) }
        if let s = filter.state { clauses.append("d.state = " + bind(.text(s.rawValue))) }
        if let t = filter.type { clauses.append("e.type = " + bind(.text(t.rawValue))) }
        if let id = filter.eventID { clauses.append("e.id = " + bind(.text(id))) }
        let whereSQL = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        let limit = bind(.int(Int64(max(0, filter.limit))))
        return try read { [binds] c in
            try c.query("SELECT \(Self.deliveryColumns), \(Self.eventColumns) FROM webhook_deliveries d JOIN events e ON e.seq = d.seq \(whereSQL) ORDER BY d.seq, d.webhook LIMIT \(limit)", binds)
                .map { try WebhookDeliveryRecord(columns: $0) }
        }
    }

    /// The sender's backlog gauge (every 10 s): counted over the pending rows' partial index,
    /// at most `webhookBacklogCountCap` entries (StoreRules).
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? {
        try pendingWebhookDeliveries(webhook: webhook, cap: StoreRules.webhookBacklogCountCap)
    }

    func pendingWebhookDeliveries(webhook: String, cap: Int) throws -> Int {
        try read { c in
            Int(try c.query("SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE webhook = $1 AND state = 'pending' LIMIT $2) x",
                            [.text(webhook), .int(Int64(max(0, cap)))]).first?.first?.int ?? 0)
        }
    }

    public func webhookDeliveryCounts() throws -> [String: [WebhookDeliveryState: Int]] {
        try read { c in
            var out: [String: [WebhookDeliveryState: Int]] = [:]
            for r in try c.query("SELECT webhook, state, count(*) FROM webhook_deliveries WHERE state IN ('pending','dead') GROUP BY webhook, state") {
                if let w = r[0].string, let s = r[1].string.flatMap(WebhookDeliveryState.init(rawValue:)) { out[w, default: [:]][s] = Int(r[2].int ?? 0) }
            }
            return out
        }
    }

    // MARK: operator actions and retention

    public func replayWebhookDelivery(eventID: String, webhook: String?) throws -> Int {
        let now = clock.nowMillis()
        return try write { c in
            try c.run("""
                UPDATE webhook_deliveries d SET state = 'pending', next_attempt_at = $1, lease_until = 0, claim = d.claim + 1, first_attempt_at = NULL, updated_at = $1
                FROM events e WHERE e.id = $2 AND d.seq = e.seq AND ($3::text IS NULL OR d.webhook = $3)
                """, [.int(now), .text(eventID.lowercased()), webhook.map { .text($0) } ?? .null]).affected
        }
    }

    public func replayDeadWebhookDeliveries(webhook: String) throws -> Int {
        let now = clock.nowMillis()
        return try write { c in
            try c.run("""
                UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = $1, lease_until = 0, claim = claim + 1, first_attempt_at = NULL, updated_at = $1
                WHERE webhook = $2 AND state = 'dead'
                """, [.int(now), .text(webhook)]).affected
        }
    }

    public func purgeEvents(types: [EventType], olderThan: Int64, limit: Int) throws -> PurgedEvents {
        guard !types.isEmpty, limit > 0 else { return PurgedEvents() }
        let olderThan = clock.toDatabase(olderThan)
        return try writeTransaction { c in
            let seqs = try c.query("SELECT seq FROM events WHERE created_at < $1 AND type = ANY($2::text[]) ORDER BY seq LIMIT $3",
                                   [.int(olderThan), .textArray(types.map(\.rawValue)), .int(Int64(limit))]).compactMap { $0[0].int }
            guard !seqs.isEmpty else { return PurgedEvents() }
            var pending: [String: Int] = [:]
            for r in try c.query("DELETE FROM webhook_deliveries WHERE seq = ANY($1::bigint[]) RETURNING webhook, state", [.intArray(seqs)])
            where r[1].string == WebhookDeliveryState.pending.rawValue {
                if let w = r[0].string { pending[w, default: 0] += 1 }
            }
            return PurgedEvents(events: try c.run("DELETE FROM events WHERE seq = ANY($1::bigint[])", [.intArray(seqs)]).affected, pendingDeliveries: pending)
        }
    }

    public func trimWebhookBacklogs(max: Int) throws -> [String: Int] {
        // Counted on the query connection first (bounded); the write counts only a backlog that is over.
        let names = try eventSettings.webhooks.map(\.name).filter { try pendingWebhookDeliveries(webhook: $0, cap: max + 1) > max }
        guard !names.isEmpty else { return [:] }
        return try writeTransaction { c in
            var dropped: [String: Int] = [:]
            for name in names {
                let n = Int(try c.query("SELECT count(*) FROM webhook_deliveries WHERE webhook = $1 AND state = 'pending'", [.text(name)]).first?.first?.int ?? 0)
                guard n > max else { continue }
                dropped[name] = try c.run("""
                    DELETE FROM webhook_deliveries WHERE webhook = $1 AND seq IN
                        (SELECT seq FROM webhook_deliveries WHERE webhook = $1 AND state = 'pending' ORDER BY next_attempt_at, seq LIMIT $2)
                    """, [.text(name), .int(Int64(n - max))]).affected
            }
            return dropped
        }
    }

    // MARK: WebhookOutbox

    /// The sender's times are the node's clock: compared and stored in the database's (One clock).
    public func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int) throws -> [WebhookDelivery] {
        guard limit > 0 else { return [] }
        return try write { [clock] c in try Self.claimWebhookDeliveries(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit, clock, c) }
    }

    @discardableResult
    public func recordWebhookResults(webhook: String, _ results: [WebhookAttemptRecord]) throws -> Int {
        guard !results.isEmpty else { return 0 }
        return try writeTransaction { [clock] c in try Self.recordWebhookResults(webhook: webhook, results, clock, c) }
    }

    public func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], now: Int64, leaseUntil: Int64,
                                                limit: Int) throws -> WebhookExchange {
        guard !results.isEmpty || limit > 0 else { return WebhookExchange(stale: 0, claimed: []) }
        return try writeTransaction { [clock] c in
            let stale = try Self.recordWebhookResults(webhook: webhook, results, clock, c)
            return WebhookExchange(stale: stale, claimed: try Self.claimWebhookDeliveries(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit, clock, c))
        }
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
    /// event's columns, not its body: the sender renders it on its own thread.
    private static func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int, _ clock: DatabaseClock,
                                               _ c: PostgresConnection) throws -> [WebhookDelivery] {
        guard limit > 0 else { return [] }
        let rows = try c.query(claimSQL, [.text(webhook), .int(clock.toDatabase(now)), .int(Int64(limit)), .int(clock.toDatabase(leaseUntil))])
        return try rows.map { r in
            WebhookDelivery(source: .record(try EventRecord(columns: r, offset: 3)), attempts: Int(r[0].int ?? 0), firstAttemptAt: r[1].int.map(clock.toLocal),
                            claim: r[2].int ?? 0)
        }
    }

    /// Returns how many results were dropped (claimed again since, or no longer pending).
    private static func recordWebhookResults(webhook: String, _ results: [WebhookAttemptRecord], _ clock: DatabaseClock,
                                             _ c: PostgresConnection) throws -> Int {
        guard !results.isEmpty else { return 0 }
        let changes = results.map { r in
            var change = WebhookResultChange(r.result)
            change.attemptedAt = clock.toDatabase(change.attemptedAt)
            change.nextAttemptAt = change.nextAttemptAt.map(clock.toDatabase)
            return (id: r.eventID.lowercased(), claim: r.claim, change: change)
        }
        let applied = try c.run("""
            UPDATE webhook_deliveries d SET state = x.state, attempts = d.attempts + x.attempted,
                first_attempt_at = CASE WHEN x.attempted = 1 THEN coalesce(d.first_attempt_at, x.at) ELSE d.first_attempt_at END,
                next_attempt_at = coalesce(x.next, d.next_attempt_at), lease_until = 0, last_error = x.error, updated_at = x.at
            FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::bigint[], $8::bigint[]) AS x(id, state, at, next, error, claim, attempted)
            JOIN events e ON e.id = x.id
            WHERE d.webhook = $1 AND d.seq = e.seq AND d.state = 'pending' AND d.claim = x.claim
            """, [.text(webhook), .textArray(changes.map(\.id)), .textArray(changes.map(\.change.state.rawValue)),
                  .intArray(changes.map(\.change.attemptedAt)), .intArray(changes.map(\.change.nextAttemptAt)),
                  .textArray(changes.map(\.change.error)), .intArray(changes.map(\.claim)), .intArray(changes.map { $0.change.attempted ? 1 : 0 })]).affected
        return results.count - applied
    }
}
