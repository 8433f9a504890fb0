// What an event row holds and how its body is rendered, once for both stores. A store writes
// the columns in the outcome's own transaction (copied from the response row by the same
// statement that follows the outcome's UPDATE); the body is rendered when it is read. The
// columns never change after the insert, so every read renders the same bytes: the webhook
// body, the feed's entry and the signature all cover the same text (docs/events.md).
import Basics
import Synchronization

/// `events.*` the store reads (given at start, like IngestStoreSettings; a restart changes it).
public struct EventStoreSettings: Sendable, Equatable {
    /// `events.webhooks[]` as the store sees them: each has a cursor over the events it
    /// receives (WebhookCursor.swift), made before this process's first event.
    public var webhooks: [WebhookSubscription]
    /// `events.maxBacklogPerWebhook`: pending deliveries per webhook above which the oldest
    /// are dropped (counted, logged).
    public var maxBacklogPerWebhook: Int

    public static let defaultMaxBacklogPerWebhook = 1_000_000

    public init(webhooks: [WebhookSubscription] = [], maxBacklogPerWebhook: Int = defaultMaxBacklogPerWebhook) {
        self.webhooks = webhooks
        self.maxBacklogPerWebhook = maxBacklogPerWebhook
    }
}

/// One events row: the columns both stores keep (the `data` of the body, never the sealed box).
struct EventRecord: Sendable, Equatable {
    var id: String
    var sequence: Int64
    var type: EventType
    var createdAt: Int64
    var credentialID: String?
    var app: String
    var pushToken: String
    /// Response events only (nil for token.unregistered).
    var responseID: String?
    var sessionIdentifier: String?
    var keyID: [UInt8]?
    var messageIndex: Int64?
    var state: String?
    var status: Int64?
    var reason: String?
    var attempts: Int64?
    var acceptedAt: Int64?
    var finishedAt: Int64?
    /// token.unregistered: APNs' timestamp.
    var unregisteredAt: Int64?

    /// The stores' SELECT column order (each backend's `eventColumns`).
    static let columnNames = [
        "seq", "id", "type", "created_at", "credential_id", "app", "push_token", "response_id", "session_id", "key_id",
        "message_index", "state", "status", "reason", "attempts", "accepted_at", "finished_at", "unregistered_at",
    ]
}

/// The decoding, rendering and conversion live in an extension, so the struct keeps its
/// memberwise initializer (every optional field defaults to nil).
extension EventRecord {
    init(columns c: some StoreColumns, offset o: Int = 0) throws {
        guard c.columnCount >= o + 18, let seq = c.int(o), let id = c.string(o + 1),
              let type = c.string(o + 2).flatMap(EventType.init(rawValue:)) else {
            throw StoreError.invalid("malformed events row")
        }
        self.init(id: id, sequence: seq, type: type, createdAt: c.int(o + 3) ?? 0, credentialID: c.string(o + 4), app: c.string(o + 5) ?? "",
                  pushToken: c.string(o + 6) ?? "", responseID: c.string(o + 7), sessionIdentifier: c.string(o + 8), keyID: c.bytes(o + 9),
                  messageIndex: c.int(o + 10), state: c.string(o + 11), status: c.int(o + 12), reason: c.string(o + 13),
                  attempts: c.int(o + 14), acceptedAt: c.int(o + 15), finishedAt: c.int(o + 16), unregisteredAt: c.int(o + 17))
    }

    /// `{"type":...,"timestamp":...,"data":{...}}`: times as GET /v1/responses/<id> writes them
    /// (IngestService.iso), keyID as the request sent it (padded base64). Appended byte by byte
    /// (string interpolation cost ~2x as much per webhook event); EventBodyTests pins the bytes.
    var body: [UInt8] {
        var w = JSONBytes(capacity: 384 + pushToken.utf8.count)
        w.raw("{\"type\":\"")
        w.text(type.rawValue)
        w.raw("\",\"timestamp\":")
        w.time(createdAt)
        w.raw(",\"data\":{")
        switch type {
        case .tokenUnregistered:
            w.raw("\"pushToken\":"); w.string(pushToken)
            w.raw(",\"app\":"); w.string(app)
            w.raw(",\"unregisteredAt\":"); w.time(unregisteredAt)
        case .responseDelivered, .responseFailed:
            w.raw("\"id\":"); w.string(responseID)
            w.raw(",\"app\":"); w.string(app)
            w.raw(",\"pushToken\":"); w.string(pushToken)
            w.raw(",\"sessionIdentifier\":"); w.string(sessionIdentifier)
            w.raw(",\"keyID\":"); w.string(keyID.map { Basics.Base64.encode($0) })
            w.raw(",\"messageIndex\":"); w.int(messageIndex)
            w.raw(",\"state\":"); w.string(state)
            w.raw(",\"status\":"); w.int(status)
            w.raw(",\"reason\":"); w.string(reason)
            w.raw(",\"attempts\":"); w.int(attempts)
            w.raw(",\"acceptedAt\":"); w.time(acceptedAt)
            w.raw(",\"finishedAt\":"); w.time(finishedAt)
        }
        w.raw("}}")
        return w.bytes
    }

    var stored: StoredEvent {
        StoredEvent(id: id, sequence: sequence, type: type, createdAt: createdAt, credentialID: credentialID, app: app, body: body)
    }
}

/// The event body's JSON values appended to one byte array.
private struct JSONBytes {
    var bytes: [UInt8] = []

    init(capacity: Int) { bytes.reserveCapacity(capacity) }

    mutating func raw(_ s: StaticString) {
        s.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    /// Text known to need no escaping (an enum's raw value).
    mutating func text(_ s: String) { bytes.append(contentsOf: s.utf8) }

    /// A JSON string (escaped as `jsonString` does), or null.
    mutating func string(_ s: String?) {
        guard let s else { return raw("null") }
        JSONString.append(s, to: &bytes)
    }

    mutating func int(_ i: Int64?) {
        guard let i else { return raw("null") }
        bytes.append(contentsOf: String(i).utf8)
    }

    /// `"2026-12-05T17:30:24.123Z"` (IngestService.iso), or null.
    mutating func time(_ t: Int64?) {
        guard let t else { return raw("null") }
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: IngestService.iso(t).utf8)
        bytes.append(UInt8(ascii: "\""))
    }
}

/// A webhook's delivery of one event as relayctl lists it.
public struct WebhookDeliveryRecord: Sendable, Equatable {
    public var webhook: String
    public var state: WebhookDeliveryState
    public var event: StoredEvent
    public var attempts: Int
    public var firstAttemptAt: Int64?
    public var nextAttemptAt: Int64
    public var lastError: String?
    public var updatedAt: Int64
}

public struct WebhookDeliveryFilter: Sendable {
    public var webhook: String?
    public var state: WebhookDeliveryState?
    public var type: EventType?
    public var eventID: String?
    public var limit: Int

    public init(webhook: String? = nil, state: WebhookDeliveryState? = nil, type: EventType? = nil, eventID: String? = nil, limit: Int = 100) {
        self.webhook = webhook
        self.eventID = eventID?.lowercased()
        self.state = state
        self.type = type
        self.limit = limit
    }
}

/// Events this process committed, by type: relay_events_created_total. Added to after each
/// commit that wrote events (a rolled-back transaction's events are not counted).
public final class EventTally: Sendable {
    // Atomics, not a locked dictionary: SQLite's writer adds after every commit that wrote events.
    private let delivered = Atomic<Int>(0), failed = Atomic<Int>(0), unregistered = Atomic<Int>(0)
    public init() {}
    public func add(_ type: EventType, _ n: Int) {
        guard n > 0 else { return }
        switch type {
        case .responseDelivered: delivered.add(n, ordering: .relaxed)
        case .responseFailed: failed.add(n, ordering: .relaxed)
        case .tokenUnregistered: unregistered.add(n, ordering: .relaxed)
        }
    }
    public func add(_ other: [EventType: Int]) {
        for (type, n) in other { add(type, n) }
    }
    /// The types with a count above zero.
    public var counts: [EventType: Int] {
        let all: [(EventType, Int)] = [(.responseDelivered, delivered.load(ordering: .relaxed)), (.responseFailed, failed.load(ordering: .relaxed)),
                                       (.tokenUnregistered, unregistered.load(ordering: .relaxed))]
        return Dictionary(uniqueKeysWithValues: all.filter { $0.1 > 0 })
    }
}

/// The store's event side beyond what the sender calls: the feed, relayctl and retention.
public protocol EventStore: WebhookOutbox {
    /// Given once at start (RelayService), before the first outcome is applied.
    var eventSettings: EventStoreSettings { get set }
    /// What this process committed (relay_events_created_total).
    var eventsCreated: EventTally { get }
    /// The credentials of the events committed after `sequence` (any process's), looking at
    /// the next `limit` events at most. Commit order is sequence order, so polling on from
    /// `through` misses none.
    func eventCredentials(after sequence: Int64, limit: Int) throws -> EventOwners
    /// The credential's events after `sequence`, in commit order, at most `limit`; `next` is
    /// where the following read starts: the last event returned, else `sequence`, or past a
    /// whole stretch of other credentials' events examined (a store may examine a bounded
    /// stretch per read instead of keeping an index by credential). It moves past others'
    /// events no finer than that stretch: the feed's cursor must not count them.
    func eventPage(credentialID: String, after sequence: Int64, limit: Int) throws -> EventPage
    /// The newest sequence committed (the feed's start), or 0.
    func lastEventSequence() throws -> Int64
    /// The database's key for the feed's cursors (FeedCursor), made at the first call: every
    /// process and restart on this database seals and opens cursors alike.
    func feedCursorKey() throws -> [UInt8]
    func event(id: String) throws -> StoredEvent?
    /// Every credential's events, newest first (relayctl).
    func listEvents(type: EventType?, limit: Int) throws -> [StoredEvent]
    func webhookDeliveries(_ filter: WebhookDeliveryFilter) throws -> [WebhookDeliveryRecord]
    /// The event's deliveries (of `webhook`, or every webhook's) pending again, due now, same
    /// id, attempts kept. Returns how many.
    func replayWebhookDelivery(eventID: String, webhook: String?) throws -> Int
    /// Every dead delivery of `webhook` pending again. Returns how many.
    func replayDeadWebhookDeliveries(webhook: String) throws -> Int
    /// Deliveries by webhook and state.
    func webhookDeliveryCounts() throws -> [String: [WebhookDeliveryState: Int]]
    /// Deletes up to `limit` events of `types` created before `olderThan` (oldest first) with
    /// their deliveries, in one transaction.
    func purgeEvents(types: [EventType], olderThan: Int64, limit: Int) throws -> PurgedEvents
    /// One pass of the backlog bound (WebhookDeliveryRules.trim): moves each webhook over `max`
    /// past its oldest events after the cursor (under a new epoch), then drops its retry rows
    /// due first, at most `max` in all per webhook; returns the dropped count per webhook (only
    /// those that dropped some). A full pass may leave it over: call again.
    func trimWebhookBacklogs(max: Int) throws -> [String: Int]
}

/// One commit's events, as `OutboxCommit.events` reports them (this process's commits only;
/// other nodes' events are found by `eventCredentials`).
public struct EventsCommitted: Sendable, Equatable {
    /// Their credentials, when the commit has them at hand (PostgreSQL's INSERT ... RETURNING);
    /// nil: `eventCredentials(after: after, limit: count)` gives them (SQLite, whose writer
    /// does not read them back: that would cost every response, polled or not).
    public var credentials: Set<String>?
    /// The sequence just before the commit's first event, and how many it wrote (SQLite).
    public var after: Int64
    public var count: Int

    public init(credentials: Set<String>?, after: Int64 = 0, count: Int = 0) {
        self.credentials = credentials
        self.after = after
        self.count = count
    }
}

/// What one `purgeEvents` deleted.
public struct PurgedEvents: Sendable, Equatable {
    public var events: Int
    /// Deliveries still pending (never delivered, retrying) deleted with their events, by webhook:
    /// those events never reach that webhook.
    public var pendingDeliveries: [String: Int]

    public init(events: Int = 0, pendingDeliveries: [String: Int] = [:]) {
        self.events = events
        self.pendingDeliveries = pendingDeliveries
    }
}

/// What `eventCredentials` looked at.
public struct EventOwners: Sendable, Equatable {
    /// The last sequence looked at (the one asked after when there was none).
    public var through: Int64
    public var credentials: Set<String>
    /// Events looked at: `limit` when there may be more.
    public var examined: Int
}

public struct EventPage: Sendable, Equatable {
    public var events: [StoredEvent]
    public var next: Int64

    public init(events: [StoredEvent], next: Int64) {
        self.events = events
        self.next = next
    }
}

extension EventStore {
    /// One page's events (tests, tools).
    public func events(credentialID: String, after sequence: Int64, limit: Int) throws -> [StoredEvent] {
        try eventPage(credentialID: credentialID, after: sequence, limit: limit).events
    }
}
