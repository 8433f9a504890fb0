// What came back from APNs, and the pure decision the dispatcher takes from it.
import FoundationEssentials

public enum PushResult: Sendable, Equatable {
    /// 200. `apnsID` is the echoed `apns-id`; `uniqueID` is `apns-unique-id` (sandbox only).
    case delivered(apnsID: String, uniqueID: String?)
    /// APNs (or the client, before any I/O, for a payload over 4096 bytes or a malformed device
    /// token / topic) refused the push. `timestamp` is set only for 410 (when APNs last knew the
    /// token was valid).
    case rejected(status: Int, reason: APNsReason, timestamp: Date?)
    /// No HTTP response: connect/TLS failure, reset, GOAWAY, timeout, or "shutdown".
    case transportFailure(String)
}

public enum PushDecision: Sendable, Equatable {
    /// Delivered; forget it.
    case done
    /// Never retry this push (bad token, unregistered, payload too large, configuration error).
    case terminal(APNsReason)
    /// APNs said ExpiredProviderToken. The client has already minted a new token and forced
    /// fresh connections (and retried once itself); retry the push soon.
    case refreshTokenAndReconnect
    /// 429: retry the same push after a delay (per-device rate, or token churn).
    case retryAfterDelay
    /// 5xx or transport trouble: retry with exponential back-off.
    case backOff
}

/// Pure mapping from a result to what the caller should do. Policy (see docs/pushclient.md):
/// - 403 ExpiredProviderToken -> refresh; every other 403 (InvalidProviderToken included: a
///   bad key, kid or team is a configuration error a new token cannot fix) -> terminal.
/// - 429 TooManyRequests and TooManyProviderTokenUpdates -> retry after a delay (the latter
///   should never happen with TokenPolicy; if it does, minting again would make it worse).
/// - 400 IdleTimeout is a connection-level complaint, not about the push -> back off.
/// - 5xx (any reason) and transport failures -> back off; any other 4xx -> terminal.
public func classify(_ result: PushResult) -> PushDecision {
    switch result {
    case .delivered:
        return .done
    case .transportFailure:
        return .backOff
    case .rejected(let status, let reason, _):
        switch reason {
        case .expiredProviderToken: return .refreshTokenAndReconnect
        case .tooManyRequests, .tooManyProviderTokenUpdates: return .retryAfterDelay
        case .idleTimeout: return .backOff
        case .internalServerError, .serviceUnavailable, .shutdown: return .backOff
        default: break
        }
        switch status {
        case 429: return .retryAfterDelay
        case 400..<500: return .terminal(reason)
        default: return .backOff   // 5xx, or a status APNs never documents
        }
    }
}
