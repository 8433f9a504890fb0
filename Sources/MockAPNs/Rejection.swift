// The APNs error responses the mock can produce: status + {"reason": ...}.
import Foundation

/// APNs' documented reasons, plus `BadPayload`, which is the mock's own (APNs is lenient about
/// payload shape; the mock is strict about accessory payloads so client bugs show up in tests).
public enum MockReason: String, Sendable, CaseIterable, Codable {
    case badCollapseId = "BadCollapseId"
    case badDeviceToken = "BadDeviceToken"
    case badExpirationDate = "BadExpirationDate"
    case badMessageId = "BadMessageId"
    case badPriority = "BadPriority"
    case badTopic = "BadTopic"
    case deviceTokenNotForTopic = "DeviceTokenNotForTopic"
    case duplicateHeaders = "DuplicateHeaders"
    case idleTimeout = "IdleTimeout"
    case invalidPushType = "InvalidPushType"
    case missingDeviceToken = "MissingDeviceToken"
    case missingTopic = "MissingTopic"
    case payloadEmpty = "PayloadEmpty"
    case topicDisallowed = "TopicDisallowed"
    case badCertificate = "BadCertificate"
    case badCertificateEnvironment = "BadCertificateEnvironment"
    case expiredProviderToken = "ExpiredProviderToken"
    case forbidden = "Forbidden"
    case invalidProviderToken = "InvalidProviderToken"
    case missingProviderToken = "MissingProviderToken"
    case unrelatedKeyIdInToken = "UnrelatedKeyIdInToken"
    case badEnvironmentKeyIdInToken = "BadEnvironmentKeyIdInToken"
    case badPath = "BadPath"
    case methodNotAllowed = "MethodNotAllowed"
    case expiredToken = "ExpiredToken"
    case unregistered = "Unregistered"
    case payloadTooLarge = "PayloadTooLarge"
    case tooManyProviderTokenUpdates = "TooManyProviderTokenUpdates"
    case tooManyRequests = "TooManyRequests"
    case internalServerError = "InternalServerError"
    case serviceUnavailable = "ServiceUnavailable"
    case shutdown = "Shutdown"
    /// Mock-only: the body is not the JSON shape the push type requires.
    case badPayload = "BadPayload"

    /// The status APNs pairs with the reason.
    public var status: Int {
        switch self {
        case .badCertificate, .badCertificateEnvironment, .expiredProviderToken, .forbidden,
             .invalidProviderToken, .missingProviderToken, .unrelatedKeyIdInToken, .badEnvironmentKeyIdInToken:
            return 403
        case .badPath: return 404
        case .methodNotAllowed: return 405
        case .expiredToken, .unregistered: return 410
        case .payloadTooLarge: return 413
        case .tooManyProviderTokenUpdates, .tooManyRequests: return 429
        case .internalServerError: return 500
        case .serviceUnavailable, .shutdown: return 503
        default: return 400
        }
    }
}

/// One error answer. `reason` is a string so fault plans can inject any status/reason pair.
public struct Rejection: Sendable, Equatable, Error {
    public var status: Int
    public var reason: String
    /// Mock-only hint naming the field at fault; sent as "detail" next to "reason".
    public var detail: String?
    /// 410 only: when the token stopped being valid (ms since 1970).
    public var timestampMs: Int64?

    public init(_ status: Int, _ reason: MockReason, detail: String? = nil) {
        self.init(status: status, reason: reason.rawValue, detail: detail)
    }

    public init(status: Int, reason: String, detail: String? = nil, timestampMs: Int64? = nil) {
        self.status = status
        self.reason = reason
        self.detail = detail
        self.timestampMs = timestampMs
    }

    /// The JSON body APNs sends: {"reason":"..."} plus "timestamp" for 410.
    public func body() -> [UInt8] {
        var object: [String: Any] = ["reason": reason]
        if let timestampMs { object["timestamp"] = timestampMs }
        if let detail { object["detail"] = detail }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return Array(data)
    }
}
