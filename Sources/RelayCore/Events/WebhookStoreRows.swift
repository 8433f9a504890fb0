// What both stores share of webhook delivery rows: the columns they select, the change one
// attempt's result makes, and the record decoded from a row.
import FoundationEssentials

/// Column lists both dialects accept (`d` is webhook_deliveries).
enum WebhookColumns {
    static let deliveries = "d.webhook, d.state, d.attempts, d.first_attempt_at, d.next_attempt_at, d.last_error, d.updated_at"
    static let cursors = "webhook, seq, claimed_through, start_seq, epoch, lease_until, types, apps"
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
