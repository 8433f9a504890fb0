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

/// An event handed to the sender for one webhook, with what is known of its earlier attempts:
/// either a retry row (`webhook_deliveries`, an event whose earlier attempt failed, or one
/// replayed) or a new event read after the webhook's cursor (no row: attempts 0).
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
    /// The generation this delivery was handed out under: a retry row's claim generation
    /// (every claim and every replay bumps it), or the cursor's epoch for a new event; a result
    /// is recorded only under it, so a late answer to an earlier claim (or to a cursor another
    /// sender took over) never overwrites what a later one wrote.
    public var claim: Int64
    /// A new event read after the cursor (no row yet): a failed attempt writes its retry row.
    public var fromCursor: Bool

    public init(event: StoredEvent, attempts: Int, firstAttemptAt: Int64?, claim: Int64 = 0, fromCursor: Bool = false) {
        self.init(source: .stored(event), attempts: attempts, firstAttemptAt: firstAttemptAt, claim: claim, fromCursor: fromCursor)
    }

    init(source: Source, attempts: Int, firstAttemptAt: Int64?, claim: Int64, fromCursor: Bool = false) {
        self.source = source
        self.attempts = attempts
        self.firstAttemptAt = firstAttemptAt
        self.claim = claim
        self.fromCursor = fromCursor
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

    public var sequence: Int64 {
        switch source {
        case .stored(let e): e.sequence
        case .record(let r): r.sequence
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
    /// The delivery came from the cursor: a failure inserts its row (under the cursor's epoch),
    /// a success writes nothing (the cursor's advance covers it).
    public var fromCursor: Bool

    public init(eventID: String, claim: Int64, result: WebhookAttemptResult, fromCursor: Bool = false) {
        self.eventID = eventID
        self.claim = claim
        self.result = result
        self.fromCursor = fromCursor
    }

    public init(_ delivery: WebhookDelivery, _ result: WebhookAttemptResult) {
        self.init(eventID: delivery.eventID, claim: delivery.claim, result: result, fromCursor: delivery.fromCursor)
    }
}

/// The sender's hold on a webhook's cursor: the epoch it was granted, how far every new event
/// it was handed is finished (delivered, or its failure in the same call's results), and how
/// far it was handed events (the last grant's `claimedThrough`). A holder that keeps its
/// hand-out point spares the store a write per claim: the store then writes the cursor row only
/// when `seq`, the epoch or the lease change (nil: the store keeps it in the row).
public struct WebhookCursorPosition: Sendable, Equatable {
    public var epoch: Int64
    public var through: Int64
    public var claimedThrough: Int64?

    public init(epoch: Int64, through: Int64, claimedThrough: Int64? = nil) {
        self.epoch = epoch
        self.through = through
        self.claimedThrough = claimedThrough
    }
}

/// The cursor as granted by one exchange: the epoch the caller now holds it under, and the
/// last sequence handed out (every event up to it that the webhook receives was returned by
/// this or an earlier exchange under this epoch).
public struct WebhookCursorGrant: Sendable, Equatable {
    public var epoch: Int64
    public var claimedThrough: Int64

    public init(epoch: Int64, claimedThrough: Int64) {
        self.epoch = epoch
        self.claimedThrough = claimedThrough
    }
}

/// What one `recordAndClaimWebhookDeliveries` did.
public struct WebhookExchange: Sendable, Equatable {
    /// The positions in the exchange's `results` of those not recorded, ascending: their
    /// delivery was claimed again (a lease that ended, a replay), left the pending state
    /// meanwhile, or was handed out under a cursor epoch that has passed. The sender counts
    /// sent and dead only for the others.
    public var staleResults: [Int]
    public var stale: Int { staleResults.count }
    /// Due retry rows first, then new events after the cursor in commit order.
    public var claimed: [WebhookDelivery]
    /// The cursor the caller holds after this exchange (nil: another sender holds it, or the
    /// caller released it).
    public var cursor: WebhookCursorGrant?

    public init(staleResults: [Int], claimed: [WebhookDelivery], cursor: WebhookCursorGrant? = nil) {
        self.staleResults = staleResults
        self.claimed = claimed
        self.cursor = cursor
    }
}

/// The store side of webhook delivery. Both backends implement it; the sender calls it from its
/// own thread (the calls may block on the store).
///
/// A store keeps, per webhook, a cursor (the sequence through which every event it receives was
/// delivered or handed to a retry row) and a retry row only for an event whose attempt failed
/// (or that was replayed): an outcome commit writes its event and nothing per webhook.
public protocol WebhookOutbox: AnyObject, Sendable {
    /// The sender's one call per turn, one transaction: records `results` (a retry row's under
    /// its claim generation; a new event's failure inserts its retry row under the cursor's
    /// epoch; results under an older generation or epoch are dropped and counted in `stale`),
    /// advances the cursor to `cursor.through` when the caller holds it under that epoch, then
    /// hands out up to `limit` deliveries: due retry rows (due first, then commit order), each
    /// leased until `leaseUntil` with its generation bumped, then the events after the
    /// cursor's hand-out point that the webhook receives, in commit order. The cursor is
    /// granted to a caller that holds it, or takes it when its lease ended (a new epoch, handed
    /// out again from the cursor: at least once); the grant's lease is renewed to
    /// `leaseUntil`. `releaseCursor` ends the caller's lease (a clean stop).
    func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], cursor: WebhookCursorPosition?, now: Int64,
                                         leaseUntil: Int64, limit: Int, releaseCursor: Bool) throws -> WebhookExchange
    /// How many deliveries of `webhook` are pending (retry rows, and events after its cursor
    /// that it receives), counted up to a cap, for the `relay_webhook_backlog` gauge; nil when
    /// the store does not count them (the default).
    func pendingWebhookDeliveries(webhook: String) throws -> Int?
}

extension WebhookOutbox {
    public func pendingWebhookDeliveries(webhook: String) throws -> Int? { nil }

    public func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], cursor: WebhookCursorPosition?, now: Int64,
                                                leaseUntil: Int64, limit: Int) throws -> WebhookExchange {
        try recordAndClaimWebhookDeliveries(webhook: webhook, results: results, cursor: cursor, now: now, leaseUntil: leaseUntil, limit: limit,
                                            releaseCursor: false)
    }
}
