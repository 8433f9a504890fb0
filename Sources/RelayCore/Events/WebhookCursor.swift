// The per-webhook cursor's rules, once for both stores (docs/events.md "The store's side").
// An outcome commit writes its event and nothing per webhook; each webhook has one cursor row:
// `seq`, through which every event it receives was delivered or handed to a retry row, and the
// hand-out point `claimed_through` of the sender holding it (`epoch`, `lease_until`). A failed
// attempt writes the event's retry row in `webhook_deliveries`; nothing else does.

/// What a turn's exchange does with the cursor.
enum WebhookCursorGrantDecision: Equatable {
    /// The caller holds it under its epoch: hand out on from `claimed_through`.
    case hold
    /// The caller takes it under this new epoch, handing out again from `seq` (whatever the
    /// earlier holder had in flight is sent again: at least once).
    case take(epoch: Int64)
    /// Another sender holds it (its lease runs): no new events for this caller.
    case none
}

enum WebhookCursorRules {
    /// New events examined per exchange at most (the turn stays bounded when the webhook's
    /// `types`/`apps` skip most of them).
    static let scanRows = 1000

    /// `takeUnleased`: a caller without an epoch takes the cursor even under a running lease.
    /// SQLite: one process writes a database, so a sender starting there is the only one and
    /// whatever held the lease died with its process (a restart re-sends at once, not after the
    /// lease). PostgreSQL: another node's sender may be alive; wait for its lease.
    static func grant(storedEpoch: Int64, leaseUntil: Int64, caller: Int64?, now: Int64, takeUnleased: Bool) -> WebhookCursorGrantDecision {
        if let caller, caller == storedEpoch { return .hold }
        if leaseUntil <= now || (takeUnleased && caller == nil) { return .take(epoch: storedEpoch + 1) }
        return .none
    }

    /// The holder's lease, renewed once a quarter of it is used: an idle sender's turns (every
    /// 500 ms) then write nothing, and a live holder's lease (at least 60 s, WebhookSender)
    /// outlasts its longest wait between turns (the receiver pause's 30 s cap).
    static func renewedLease(current: Int64, now: Int64, wanted: Int64) -> Int64 {
        current - now < (wanted - now) * 3 / 4 ? wanted : current
    }

    /// The cursor's new `seq` after the holder reports `through`: never back, never past what
    /// was handed out.
    static func advanced(seq: Int64, claimedThrough: Int64, through: Int64) -> Int64 {
        max(seq, min(through, claimedThrough))
    }

    /// The subscription as the cursor row keeps it (relayctl reads it without the config):
    /// types comma-joined, apps comma-joined or nil for every app. Bundle IDs hold no commas
    /// (StoreRules.checkNewCredential).
    static func encode(_ s: WebhookSubscription) -> (types: String, apps: String?) {
        (s.types.map(\.rawValue).sorted().joined(separator: ","), s.apps.map { $0.sorted().joined(separator: ",") })
    }

    static func decode(name: String, types: String?, apps: String?) -> WebhookSubscription {
        let t = Set((types ?? "").split(separator: ",").compactMap { EventType(rawValue: String($0)) })
        return WebhookSubscription(name: name, types: types == nil ? Set(EventType.allCases) : t,
                                   apps: apps.map { Set($0.split(separator: ",").map(String.init)) })
    }

    /// The subscription as an SQL condition on the events row `e` (literals, quotes doubled).
    static func sqlFilter(_ s: WebhookSubscription) -> String {
        func quoted(_ v: String) -> String { "'" + v.replacing("'", with: "''") + "'" }
        var parts: [String] = []
        if s.types != Set(EventType.allCases) {
            parts.append(s.types.isEmpty ? "0 = 1" : "e.type IN (" + s.types.map(\.rawValue).sorted().map(quoted).joined(separator: ",") + ")")
        }
        if let apps = s.apps {
            parts.append(apps.isEmpty ? "0 = 1" : "e.app IN (" + apps.sorted().map(quoted).joined(separator: ",") + ")")
        }
        return parts.isEmpty ? "1 = 1" : parts.joined(separator: " AND ")
    }

    /// Where the holder has finished: everything handed out under its epoch, except from the
    /// first new event still in flight on.
    static func through(claimedThrough: Int64, inFlight: some Sequence<Int64>) -> Int64 {
        inFlight.min().map { min(claimedThrough, $0 - 1) } ?? claimedThrough
    }
}

/// One `webhook_cursors` row (both stores: webhook, seq, claimed_through, start_seq, epoch,
/// lease_until, types, apps).
struct WebhookCursorRow: Equatable {
    var webhook: String
    /// Every event it receives up to here was delivered or has its retry row.
    var seq: Int64
    /// The holder handed out every event up to here.
    var claimedThrough: Int64
    /// The cursor's first `seq`: events up to here predate the webhook (or the cursor's
    /// migration, whose older events kept their rows).
    var startSeq: Int64
    var epoch: Int64
    var leaseUntil: Int64
    /// The subscription as stored (decoded on use: decoding it on every exchange cost the
    /// writer ~14k instructions a turn, scripts/cg-diff.py).
    var types: String?
    var apps: String?
    var subscription: WebhookSubscription { WebhookCursorRules.decode(name: webhook, types: types, apps: apps) }

    /// Whether the exchange must write the row: `seq`, the epoch or the lease changed, or the
    /// hand-out point when the row keeps it (a caller that keeps its own spares that write).
    func changed(from before: WebhookCursorRow, handOutKeptByCaller: Bool) -> Bool {
        seq != before.seq || epoch != before.epoch || leaseUntil != before.leaseUntil
            || (!handOutKeptByCaller && claimedThrough != before.claimedThrough)
    }

    init(webhook: String, seq: Int64, claimedThrough: Int64, startSeq: Int64, epoch: Int64 = 0, leaseUntil: Int64 = 0,
         subscription: WebhookSubscription? = nil) {
        self.webhook = webhook
        self.seq = seq
        self.claimedThrough = claimedThrough
        self.startSeq = startSeq
        self.epoch = epoch
        self.leaseUntil = leaseUntil
        let encoded = subscription.map(WebhookCursorRules.encode)
        types = encoded?.types
        apps = encoded?.apps
    }

    init(columns c: some StoreColumns) throws {
        guard let w = c.string(0) else { throw StoreError.invalid("malformed webhook_cursors row") }
        webhook = w
        seq = c.int(1) ?? 0
        claimedThrough = c.int(2) ?? 0
        startSeq = c.int(3) ?? 0
        epoch = c.int(4) ?? 0
        leaseUntil = c.int(5) ?? 0
        types = c.string(6)
        apps = c.string(7)
    }
}

extension WebhookCursorRules {
    /// What one exchange did to the cursor: the grant handed to the sender (nil: it does not
    /// hold the cursor), whether the caller keeps its hand-out point (so the row need not record
    /// it), and the new events handed out.
    struct Turn<Event> {
        var grant: WebhookCursorGrant?
        var handOutKept: Bool
        var events: [Event]
    }

    /// The cursor's part of one exchange, for both stores: the caller's report moves `seq` over
    /// its finished prefix (a holder of the current epoch keeps its hand-out point), then the
    /// cursor is held, taken (a new epoch, handed out again from `seq`) or refused per `grant`;
    /// the holder's lease is renewed or released, and with `room` left it is handed the events
    /// after its hand-out point (`newEvents(after, room)`: the events and how far it looked).
    static func turn<Event>(_ row: inout WebhookCursorRow, caller cursor: WebhookCursorPosition?, now: Int64, leaseUntil: Int64,
                            release: Bool, room: Int, takeUnleased: Bool,
                            newEvents: (_ after: Int64, _ room: Int) throws -> (events: [Event], through: Int64)) rethrows -> Turn<Event> {
        var turn = Turn<Event>(grant: nil, handOutKept: false, events: [])
        if let cursor, cursor.epoch == row.epoch {
            if let handedOut = cursor.claimedThrough {
                row.claimedThrough = max(row.seq, handedOut)
                turn.handOutKept = true
            }
            row.seq = advanced(seq: row.seq, claimedThrough: row.claimedThrough, through: cursor.through)
        }
        switch grant(storedEpoch: row.epoch, leaseUntil: row.leaseUntil, caller: cursor?.epoch, now: now, takeUnleased: takeUnleased) {
        case .none:
            return turn
        case .take(let epoch):
            row.epoch = epoch
            row.claimedThrough = row.seq
            row.leaseUntil = 0
            turn.handOutKept = false
        case .hold:
            break
        }
        if release {
            row.leaseUntil = 0
            return turn
        }
        row.leaseUntil = renewedLease(current: row.leaseUntil, now: now, wanted: leaseUntil)
        if room > 0 {
            let found = try newEvents(row.claimedThrough, room)
            row.claimedThrough = found.through
            turn.events = found.events
        }
        turn.grant = WebhookCursorGrant(epoch: row.epoch, claimedThrough: row.claimedThrough)
        return turn
    }
}
