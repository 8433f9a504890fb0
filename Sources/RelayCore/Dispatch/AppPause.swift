// Paused apps: an answer that says the app's credentials or configuration are wrong stops the
// app's deliveries instead of failing its rows (docs/pushclient.md "Paused apps"). Pure values:
// which answers pause (one table, `PauseRule.reason`), when to probe, and the per-app state the
// DispatcherStateMachine keeps.

public enum PauseRule {
    /// Reasons that concern the app (its key, certificate, team or topic), not the push or the
    /// device: every row of the app would get the same answer, so none is failed for it. An
    /// ExpiredProviderToken reaching the dispatcher is one PushClient could not cure with a new
    /// token (it re-mints and retries once itself: a wrong host clock, a revoked key).
    public static let reasons: Set<String> = [
        "ExpiredProviderToken", "InvalidProviderToken", "MissingProviderToken", "TooManyProviderTokenUpdates",
        "UnrelatedKeyIdInToken", "BadEnvironmentKeyIdInToken",
        "BadCertificate", "BadCertificateEnvironment",
        "MissingTopic", "TopicDisallowed", "BadTopic",
    ]
    /// A transport failure text PushClientTransport gives when the key or certificate files
    /// cannot be used (unreadable .p8, bad PEM, bad PKCS#12): retrying cannot help.
    public static let credentialFilePrefix = "credential_file"

    /// The reason `answer` pauses its app, nil when it does not.
    public static func reason(status: Int?, reason: String?) -> String? {
        guard let reason else { return nil }
        if status == nil { return reason.hasPrefix(credentialFilePrefix) ? credentialFilePrefix : nil }
        return reasons.contains(reason) ? reason : nil
    }
}

/// When a paused app's next probe goes out: 1 s doubling to 5 min, with "equal jitter" (each
/// wait uniform in [ceiling/2, ceiling]): probes never bunch up, and 20 nodes paused together
/// spread out instead of probing in step.
public struct PauseSchedule: Sendable, Equatable {
    public var baseMillis: Int64 = 1_000
    public var capMillis: Int64 = 300_000
    /// While a probe is out, the app's other rows come back this soon: when it succeeds they
    /// go out within this long, and when it fails they are returned to the next probe time.
    public var holdMillis: Int64 = 1_000

    public init(baseMillis: Int64 = 1_000, capMillis: Int64 = 300_000, holdMillis: Int64 = 1_000) {
        self.baseMillis = baseMillis
        self.capMillis = capMillis
        self.holdMillis = holdMillis
    }

    /// Wait before probe number `step` (0 = the first after pausing).
    public func delay(step: Int, random unit: Double) -> Int64 {
        let ceiling = Backoff.ceiling(base: baseMillis, doublings: step, cap: capMillis)
        let u = min(max(unit, 0), 1)
        return max(1, ceiling / 2 + Int64((Double(ceiling - ceiling / 2) * u).rounded(.down)))
    }
}

/// One paused app, as the state machine keeps it.
struct PausedApp: Equatable {
    var reason: String
    /// Probes that failed since the pause (the next wait's step).
    var step: Int
    /// When the next probe may go out (RelayClock ms).
    var probeAt: Int64
    /// The row out as the probe, if any.
    var probe: String?
}
