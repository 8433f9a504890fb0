// What to do with one APNs answer: pure values in, a DeliveryOutcome out. Clock and randomness
// are parameters, so every branch is unit tested without I/O.

/// How PushClient's `classify` sorted an answer (mirrors PushClient.PushDecision so RelayCore's
/// decisions and tests do not depend on the transport).
public enum AnswerClass: Sendable, Equatable {
    case done
    case terminal(String)
    case refreshTokenAndReconnect
    case retryAfterDelay
    case backOff
}

/// One APNs answer as the dispatcher sees it.
public struct PushAnswer: Sendable, Equatable {
    /// HTTP status; nil when no answer arrived (transport failure, timeout, shutdown).
    public var status: Int?
    /// APNs reason (e.g. "BadDeviceToken") or the transport failure text.
    public var reason: String?
    /// APNs timestamp for 410, milliseconds since 1970.
    public var apnsTimestamp: Int64?
    public var classification: AnswerClass

    public init(status: Int?, reason: String?, apnsTimestamp: Int64? = nil, classification: AnswerClass) {
        self.status = status
        self.reason = reason
        self.apnsTimestamp = apnsTimestamp
        self.classification = classification
    }
}

public struct DeliveryPolicy: Sendable, Equatable {
    /// First back-off ceiling; doubles per attempt (full jitter: uniform in [0, ceiling]).
    public var backoffBaseMillis: Int64 = 1_000
    /// Largest back-off ceiling.
    public var backoffCapMillis: Int64 = 300_000
    /// Delay for every response to a push token after APNs answered TooManyRequests for it.
    public var tooManyRequestsDelayMillis: Int64 = 60_000
    /// Delay before retrying after ExpiredProviderToken (PushClient has already refreshed).
    public var refreshRetryDelayMillis: Int64 = 0
    /// 400 BadDeviceToken marks its token like a 410 (dispatch.badDeviceTokenHoldSeconds > 0).
    public var marksBadDeviceTokens = true

    public init(backoffBaseMillis: Int64 = 1_000, backoffCapMillis: Int64 = 300_000, tooManyRequestsDelayMillis: Int64 = 60_000, refreshRetryDelayMillis: Int64 = 0) {
        self.backoffBaseMillis = backoffBaseMillis
        self.backoffCapMillis = backoffCapMillis
        self.tooManyRequestsDelayMillis = tooManyRequestsDelayMillis
        self.refreshRetryDelayMillis = refreshRetryDelayMillis
    }

    /// Ceiling for the n-th retry (n = attempts made before this one), capped, overflow-safe.
    public func backoffCeiling(priorAttempts n: Int) -> Int64 {
        Backoff.ceiling(base: backoffBaseMillis, doublings: n, cap: backoffCapMillis)
    }

    /// Full jitter (AWS architecture blog): uniform in [0, ceiling], at least 1 ms.
    public func backoffDelay(priorAttempts n: Int, random unit: Double) -> Int64 {
        let ceiling = backoffCeiling(priorAttempts: n)
        let u = min(max(unit, 0), 1)
        return max(1, Int64((Double(ceiling) * u).rounded(.down)))
    }

    /// The outcome for `row` given `answer` at time `now`. A retry that would land after the
    /// row's expiry fails it as "expired" instead.
    public func decide(_ answer: PushAnswer, row: OutboxRow, now: Int64, random unit: Double) -> DeliveryOutcome {
        let retryAt: Int64
        var pace: Int64?
        switch answer.classification {
        case .done:
            return .delivered
        case .terminal(let reason):
            if answer.status == 410 {
                return .unregistered(reason: reason, apnsTimestamp: answer.apnsTimestamp ?? now)
            }
            // The same 400 would answer every push to the token (and errors count against the
            // connection): mark it, so its queued rows fail without a push and ingest refuses it.
            if answer.status == 400, reason == StoreRules.badDeviceTokenReason, marksBadDeviceTokens {
                return .unregistered(reason: reason, apnsTimestamp: now)
            }
            return .failed(reason: reason)
        case .refreshTokenAndReconnect:
            // Retry at once after the first ExpiredProviderToken (PushClient has minted a new
            // token). If the previous answer for this row was the same, the new token was refused
            // too (e.g. a host clock off by an hour): back off instead of looping.
            if row.lastReason == answer.reason, row.attempts > 0 {
                retryAt = now + backoffDelay(priorAttempts: row.attempts, random: unit)
            } else {
                retryAt = now + refreshRetryDelayMillis
            }
        case .retryAfterDelay:
            if answer.reason == "TooManyRequests" {
                retryAt = now + tooManyRequestsDelayMillis
                pace = retryAt
            } else {
                // TooManyProviderTokenUpdates and the like concern our connection, not the token.
                retryAt = now + backoffDelay(priorAttempts: row.attempts, random: unit)
            }
        case .backOff:
            retryAt = now + backoffDelay(priorAttempts: row.attempts, random: unit)
        }
        if retryAt >= row.expiresAt { return .failed(reason: "expired") }
        return .retry(at: retryAt, paceTokenUntil: pace)
    }
}

/// The dispatcher's only way out to APNs. PushClient conforms through `PushClientTransport`;
/// tests inject fakes.
public protocol PushTransport: Sendable {
    /// Sends one response; `completion` runs exactly once, on any thread.
    func send(_ row: OutboxRow, completion: @escaping @Sendable (PushAnswer) -> Void)
    /// Completes everything pending (as transport failures) and releases connections.
    func shutdown()
}
