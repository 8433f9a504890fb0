// Fault plans: what the mock does wrong on purpose. Selection is pure (random number injected)
// so tests can pin it; the server applies the decision.
import Basics
import Foundation

/// One fault rule. Request-level rules match by `deviceToken` (if set) and then by `fraction`
/// (if set, the share of matching requests hit; default all). Connection-level rules
/// (`goAwayAfter`, `closeAfter`) count streams per connection. Connection-start rules
/// (`refuseConnections`, `stallHandshake`, `goAwayBeforeFirstStream`) act on each new
/// connection (`fraction` applies; `deviceToken` cannot: no request has arrived).
public struct FaultRule: Codable, Sendable, Equatable {
    /// Only requests to this device token (hex, case-insensitive).
    public var deviceToken: String?
    /// Share of (matching) requests hit, 0...1. nil = all.
    public var fraction: Double?
    /// Answer with this status (and `reason`; default the status' usual reason).
    public var status: Int?
    public var reason: String?
    /// For 410: the timestamp (ms since 1970) sent; default "now".
    public var timestampMs: Int64?
    /// Delay every matching answer by this many milliseconds.
    public var latencyMs: Int?
    /// Never answer matching requests (the stream stays open until the client gives up).
    public var stall: Bool?
    /// Drop the whole connection instead of answering (no response, no GOAWAY), like a reset.
    public var abort: Bool?
    /// Per connection: send GOAWAY (NO_ERROR) after answering the Nth stream.
    public var goAwayAfter: Int?
    /// Per connection: close the TCP connection abruptly right after answering the Nth stream.
    public var closeAfter: Int?
    /// Per connection: GOAWAY after the Nth error answer (410 does not count), as APNs drops
    /// connections that produce too many errors.
    public var goAwayAfterErrors: Int?
    /// Answer 403 ExpiredProviderToken for provider tokens with iat before this (UNIX seconds).
    public var expireTokensIssuedBefore: Int64?
    /// Close each new connection right after accepting it (before TLS).
    public var refuseConnections: Bool?
    /// Accept each new connection and never read from it: the TLS handshake (or h2c preface)
    /// never completes, until the client gives up.
    public var stallHandshake: Bool?
    /// Complete TLS, send SETTINGS, then GOAWAY(NO_ERROR, last stream 0) before any stream.
    public var goAwayBeforeFirstStream: Bool?

    public init(deviceToken: String? = nil, fraction: Double? = nil, status: Int? = nil, reason: String? = nil,
                timestampMs: Int64? = nil, latencyMs: Int? = nil, stall: Bool? = nil, abort: Bool? = nil,
                goAwayAfter: Int? = nil, closeAfter: Int? = nil, goAwayAfterErrors: Int? = nil,
                expireTokensIssuedBefore: Int64? = nil, refuseConnections: Bool? = nil, stallHandshake: Bool? = nil,
                goAwayBeforeFirstStream: Bool? = nil) {
        self.deviceToken = deviceToken; self.fraction = fraction; self.status = status; self.reason = reason
        self.timestampMs = timestampMs; self.latencyMs = latencyMs; self.stall = stall; self.abort = abort
        self.goAwayAfter = goAwayAfter; self.closeAfter = closeAfter; self.goAwayAfterErrors = goAwayAfterErrors
        self.expireTokensIssuedBefore = expireTokensIssuedBefore
        self.refuseConnections = refuseConnections; self.stallHandshake = stallHandshake
        self.goAwayBeforeFirstStream = goAwayBeforeFirstStream
    }

    /// Acts on new connections rather than on requests.
    var actsOnConnectionStart: Bool { refuseConnections == true || stallHandshake == true || goAwayBeforeFirstStream == true }

    /// Checks ranges and that the rule does something.
    public func validated() throws -> FaultRule {
        if let fraction, !(0...1).contains(fraction) { throw MockConfigurationError("fault: fraction must be within 0...1") }
        if let status, !(400...599).contains(status) { throw MockConfigurationError("fault: status must be within 400...599") }
        if reason != nil, status == nil { throw MockConfigurationError("fault: reason needs a status") }
        if let latencyMs, latencyMs < 0 || latencyMs > 600_000 { throw MockConfigurationError("fault: latencyMs must be within 0...600000") }
        if let n = goAwayAfter, n < 1 { throw MockConfigurationError("fault: goAwayAfter must be >= 1") }
        if let n = closeAfter, n < 1 { throw MockConfigurationError("fault: closeAfter must be >= 1") }
        if let n = goAwayAfterErrors, n < 1 { throw MockConfigurationError("fault: goAwayAfterErrors must be >= 1") }
        if let token = deviceToken, token.isEmpty || !token.utf8.allSatisfy(Hex.isDigit) {
            throw MockConfigurationError("fault: deviceToken must be hex")
        }
        if actsOnConnectionStart && deviceToken != nil {
            throw MockConfigurationError("fault: refuseConnections, stallHandshake and goAwayBeforeFirstStream act before any request: deviceToken cannot apply")
        }
        let acts = status != nil || latencyMs != nil || stall == true || abort == true || goAwayAfter != nil || closeAfter != nil
            || goAwayAfterErrors != nil
            || expireTokensIssuedBefore != nil || actsOnConnectionStart
        if !acts { throw MockConfigurationError("fault: rule does nothing (set status, latencyMs, stall, abort, goAwayAfter, closeAfter, goAwayAfterErrors, expireTokensIssuedBefore, refuseConnections, stallHandshake or goAwayBeforeFirstStream)") }
        return self
    }

    /// CLI form: comma-separated `key=value` with the JSON field names (or their kebab-case
    /// forms), e.g. `status=410,reason=Unregistered,token=ab12`, `stall,fraction=0.1`,
    /// `goaway-after=5`, `latency=20`.
    public init(commandLine text: String) throws {
        self.init()
        for item in text.split(separator: ",") {
            let pair = item.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            let key = pair[0].lowercased().replacingOccurrences(of: "-", with: "")
            let value = pair.count == 2 ? pair[1] : nil
            func need() throws -> String {
                guard let value, !value.isEmpty else { throw MockConfigurationError("fault: \(pair[0]) needs a value") }
                return value
            }
            func int(_ v: String) throws -> Int {
                guard let n = Int(v) else { throw MockConfigurationError("fault: \(pair[0])=\(v) is not an integer") }
                return n
            }
            switch key {
            case "token", "devicetoken": deviceToken = try need().lowercased()
            case "fraction":
                guard let f = Double(try need()) else { throw MockConfigurationError("fault: fraction=\(value ?? "") is not a number") }
                fraction = f
            case "status": status = try int(need())
            case "reason": reason = try need()
            case "timestamp", "timestampms": timestampMs = Int64(try int(need()))
            case "latency", "latencyms": latencyMs = try int(need())
            case "stall": stall = value.map { $0 == "true" || $0 == "1" } ?? true
            case "abort": abort = value.map { $0 == "true" || $0 == "1" } ?? true
            case "goawayafter": goAwayAfter = try int(need())
            case "closeafter": closeAfter = try int(need())
            case "goawayaftererrors": goAwayAfterErrors = try int(need())
            case "expiretokensissuedbefore", "expiretokensbefore": expireTokensIssuedBefore = Int64(try int(need()))
            case "refuseconnections", "refuse": refuseConnections = value.map { $0 == "true" || $0 == "1" } ?? true
            case "stallhandshake": stallHandshake = value.map { $0 == "true" || $0 == "1" } ?? true
            case "goawaybeforefirststream", "goawayfirst": goAwayBeforeFirstStream = value.map { $0 == "true" || $0 == "1" } ?? true
            default: throw MockConfigurationError("fault: unknown key \(pair[0])")
            }
        }
        _ = try validated()
    }

    init() {}

    func matches(deviceToken token: String, random: Double) -> Bool {
        if let want = deviceToken, want.lowercased() != token { return false }
        if let fraction, !(random < fraction) { return false }
        return true
    }
}

/// What to do with one accepted-by-validation request.
public struct FaultDecision: Sendable, Equatable {
    public var rejection: Rejection?
    public var stall = false
    public var abort = false
    public var latencyMs = 0
    public static let none = FaultDecision()
}

/// What to do with a connection the moment it is accepted.
public enum ConnectionStartFault: Sendable, Equatable { case none, refuse, stallHandshake, goAwayBeforeFirstStream }

/// What to do with the connection after answering its Nth stream.
public enum ConnectionFault: Sendable, Equatable { case none, goAway, close }

public struct FaultPlan: Codable, Sendable, Equatable {
    public var rules: [FaultRule]
    public init(rules: [FaultRule] = []) { self.rules = rules }

    /// First matching stall, abort or status rule wins (in rule order); latencies of all matching
    /// rules add up. `random` returns a fresh number in 0..<1 per rule with a fraction.
    public func decide(deviceToken: String, nowMs: Int64, random: () -> Double) -> FaultDecision {
        var decision = FaultDecision()
        let token = deviceToken.lowercased()
        for rule in rules where rule.status != nil || rule.stall == true || rule.abort == true || rule.latencyMs != nil {
            let roll = rule.fraction == nil ? 0 : random()
            guard rule.matches(deviceToken: token, random: roll) else { continue }
            decision.latencyMs += rule.latencyMs ?? 0
            guard decision.rejection == nil, !decision.stall, !decision.abort else { continue }
            if rule.stall == true {
                decision.stall = true
            } else if rule.abort == true {
                decision.abort = true
            } else if let status = rule.status {
                let reason = rule.reason ?? defaultReason(status)
                decision.rejection = Rejection(status: status, reason: reason, detail: "injected fault",
                                               timestampMs: status == 410 ? (rule.timestampMs ?? nowMs) : nil)
            }
        }
        return decision
    }

    /// `streamNumber` counts requests on the connection, `errorNumber` its error answers
    /// other than 410 (this one included), both from 1.
    public func connectionFault(afterStream streamNumber: Int, errors errorNumber: Int = 0) -> ConnectionFault {
        for rule in rules {
            if let n = rule.closeAfter, streamNumber >= n { return .close }
        }
        for rule in rules {
            if let n = rule.goAwayAfter, streamNumber >= n { return .goAway }
            if let n = rule.goAwayAfterErrors, errorNumber >= n { return .goAway }
        }
        return .none
    }

    var countsErrors: Bool { rules.contains { $0.goAwayAfterErrors != nil } }

    /// The first matching connection-start rule decides (in rule order); `random` as in `decide`.
    public func connectionStart(random: () -> Double) -> ConnectionStartFault {
        for rule in rules where rule.actsOnConnectionStart {
            if let fraction = rule.fraction, !(random() < fraction) { continue }
            if rule.refuseConnections == true { return .refuse }
            if rule.stallHandshake == true { return .stallHandshake }
            return .goAwayBeforeFirstStream
        }
        return .none
    }

    /// The earliest-acceptable-iat cut-off across rules (the latest one wins).
    public var expireTokensIssuedBefore: Int64? { rules.compactMap(\.expireTokensIssuedBefore).max() }

    private func defaultReason(_ status: Int) -> String {
        switch status {
        case 400: return MockReason.badDeviceToken.rawValue
        case 403: return MockReason.forbidden.rawValue
        case 410: return MockReason.unregistered.rawValue
        case 413: return MockReason.payloadTooLarge.rawValue
        case 429: return MockReason.tooManyRequests.rawValue
        case 500: return MockReason.internalServerError.rawValue
        case 503: return MockReason.serviceUnavailable.rawValue
        default: return "InjectedFault"
        }
    }
}
