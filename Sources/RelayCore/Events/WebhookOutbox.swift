// Delivery events (issue 24): the records an outcome commit writes, and the boundary between the
// store that keeps them and the webhook sender that delivers them. The store writes an event in
// the same transaction as the outcome it reports; the sender only claims and records attempts.
// All times are integer milliseconds since 1970 (UTC), as in the rest of the store.

/// What an event reports. The raw values are the Standard Webhooks `type` strings.
public enum EventType: String, Sendable, CaseIterable, Codable {
    case responseDelivered = "response.delivered"
    case responseFailed = "response.failed"
    case tokenUnregistered = "token.unregistered"
}

/// One committed event as the sender and the feed read it.
public struct StoredEvent: Sendable, Equatable {
    /// UUIDv7 text: the `webhook-id`, the same on every retry and in the feed.
    public var id: String
    /// Commit order within the store: the feed's cursor and the sender's order.
    public var sequence: Int64
    public var type: EventType
    public var createdAt: Int64
    /// The credential whose response this is (nil for a token event of no credential).
    public var credentialID: String?
    public var app: String
    /// The exact JSON body sent and listed: `{"type": ..., "timestamp": ..., "data": {...}}`.
    public var body: [UInt8]

    public init(id: String, sequence: Int64, type: EventType, createdAt: Int64, credentialID: String?, app: String, body: [UInt8]) {
        self.id = id
        self.sequence = sequence
        self.type = type
        self.createdAt = createdAt
        self.credentialID = credentialID
        self.app = app
        self.body = body
    }
}

/// A configured webhook as the store sees it: which events it receives.
public struct WebhookSubscription: Sendable, Equatable {
    public var name: String
    public var types: Set<EventType>
    /// nil: every app.
    public var apps: Set<String>?

    public init(name: String, types: Set<EventType> = Set(EventType.allCases), apps: Set<String>? = nil) {
        self.name = name
        self.types = types
        self.apps = apps
    }

    public func receives(type: EventType, app: String) -> Bool {
        types.contains(type) && (apps?.contains(app) ?? true)
    }
}

public enum WebhookDeliveryState: String, Sendable, CaseIterable, Codable {
    case pending, delivered, dead
}

/// An event claimed for one webhook, with what is known of its earlier attempts.
public struct WebhookDelivery: Sendable, Equatable {
    public var event: StoredEvent
    /// Attempts made before this one.
    public var attempts: Int
    /// When the first attempt was made (nil before it): `retryForSeconds` counts from here.
    public var firstAttemptAt: Int64?

    public init(event: StoredEvent, attempts: Int, firstAttemptAt: Int64?) {
        self.event = event
        self.attempts = attempts
        self.firstAttemptAt = firstAttemptAt
    }
}

/// What one attempt came to.
public enum WebhookAttemptResult: Sendable, Equatable {
    case delivered(at: Int64)
    /// Not accepted (status, timeout, connection): try again at `at`. `attemptedAt` is when
    /// this attempt was made (it becomes `firstAttemptAt` if none was recorded).
    case retry(attemptedAt: Int64, at: Int64, error: String)
    /// Given up after `retryForSeconds`: kept, visible, replayable.
    case dead(attemptedAt: Int64, error: String)
}

/// The store side of webhook delivery. Both backends implement it; the sender calls it from its
/// own thread (the calls may block on the store).
public protocol WebhookOutbox: AnyObject, Sendable {
    /// Up to `limit` pending deliveries of `webhook` whose next attempt is due at `now`, oldest
    /// event first; each is leased (not returned again) until `leaseUntil`, so a crashed or slow
    /// sender's deliveries come back after the lease.
    func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int) throws -> [WebhookDelivery]
    /// Records attempts made on claimed deliveries (one transaction).
    func recordWebhookResults(webhook: String, _ results: [(eventID: String, result: WebhookAttemptResult)]) throws
    /// How many deliveries of `webhook` are pending (due or not, leased or not), for the
    /// `relay_webhook_backlog` gauge; nil when the store does not count them (the default).
    func pendingWebhookDeliveries(webhook: String) throws -> Int?
}

extension WebhookOutbox {
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? { nil }
}
