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
    /// What the store handed over: the stores give the event's columns, rendered by `event` on
    /// the caller's thread (the sender's), not on the store's writer.
    enum Source: Sendable, Equatable {
        case stored(StoredEvent)
        case record(EventRecord)
    }
    let source: Source
    /// Attempts made before this one.
    public var attempts: Int
    /// When the first attempt was made (nil before it): `retryForSeconds` counts from here.
    public var firstAttemptAt: Int64?
    /// The claim generation this delivery was handed out under: every claim and every replay
    /// bumps the row's, and a result is recorded only under the generation it was claimed with,
    /// so a late answer to an earlier claim never overwrites what a later one wrote.
    public var claim: Int64

    public init(event: StoredEvent, attempts: Int, firstAttemptAt: Int64?, claim: Int64 = 0) {
        self.init(source: .stored(event), attempts: attempts, firstAttemptAt: firstAttemptAt, claim: claim)
    }

    init(source: Source, attempts: Int, firstAttemptAt: Int64?, claim: Int64) {
        self.source = source
        self.attempts = attempts
        self.firstAttemptAt = firstAttemptAt
        self.claim = claim
    }

    /// The event with its body, rendered on each read: read it once.
    public var event: StoredEvent {
        switch source {
        case .stored(let e): e
        case .record(let r): r.stored
        }
    }

    public var eventID: String {
        switch source {
        case .stored(let e): e.id
        case .record(let r): r.id
        }
    }

    public var eventCreatedAt: Int64 {
        switch source {
        case .stored(let e): e.createdAt
        case .record(let r): r.createdAt
        }
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
    /// Never sent: the request could not be set up here (libcurl out of memory, an option
    /// refused) at `failedAt`. Pending again, due at `at`; not an attempt (attempts and the
    /// retry window unchanged), `error` kept as the last error.
    case notSent(failedAt: Int64, at: Int64, error: String)
}

/// One result to record, with the claim generation its delivery was claimed under.
public struct WebhookAttemptRecord: Sendable, Equatable {
    public var eventID: String
    public var claim: Int64
    public var result: WebhookAttemptResult

    public init(eventID: String, claim: Int64, result: WebhookAttemptResult) {
        self.eventID = eventID
        self.claim = claim
        self.result = result
    }

    public init(_ delivery: WebhookDelivery, _ result: WebhookAttemptResult) {
        self.init(eventID: delivery.eventID, claim: delivery.claim, result: result)
    }
}

/// What one `recordAndClaimWebhookDeliveries` did.
public struct WebhookExchange: Sendable, Equatable {
    /// Results not recorded because their delivery was claimed again (a lease that ended, a
    /// replay) or left the pending state meanwhile.
    public var stale: Int
    public var claimed: [WebhookDelivery]

    public init(stale: Int, claimed: [WebhookDelivery]) {
        self.stale = stale
        self.claimed = claimed
    }
}

/// The store side of webhook delivery. Both backends implement it; the sender calls it from its
/// own thread (the calls may block on the store).
public protocol WebhookOutbox: AnyObject, Sendable {
    /// Up to `limit` pending deliveries of `webhook` whose next attempt is due at `now`, due
    /// first, then oldest event first; each is leased (not returned again) until `leaseUntil`, so a crashed or slow
    /// sender's deliveries come back after the lease. Each claim bumps the row's claim generation
    /// (returned in `WebhookDelivery.claim`).
    func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int) throws -> [WebhookDelivery]
    /// Records attempts made on claimed deliveries (one transaction). A result whose claim is
    /// not the row's current one, or whose row is no longer pending, is dropped; returns how
    /// many were.
    @discardableResult
    func recordWebhookResults(webhook: String, _ results: [WebhookAttemptRecord]) throws -> Int
    /// `recordWebhookResults` then `claimWebhookDeliveries` (`limit` may be 0) in one transaction:
    /// the sender's one write per turn.
    func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], now: Int64, leaseUntil: Int64,
                                         limit: Int) throws -> WebhookExchange
    /// How many deliveries of `webhook` are pending (due or not, leased or not), for the
    /// `relay_webhook_backlog` gauge; nil when the store does not count them (the default).
    func pendingWebhookDeliveries(webhook: String) throws -> Int?
}

extension WebhookOutbox {
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? { nil }

    /// Two calls (two transactions); the stores do both in one.
    public func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], now: Int64, leaseUntil: Int64,
                                                limit: Int) throws -> WebhookExchange {
        let stale = results.isEmpty ? 0 : try recordWebhookResults(webhook: webhook, results)
        return WebhookExchange(stale: stale, claimed: limit > 0 ? try claimWebhookDeliveries(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit) : [])
    }
}
