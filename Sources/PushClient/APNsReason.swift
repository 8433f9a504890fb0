// The `reason` strings APNs puts in error bodies ({"reason": "..."}), from Apple's "Handling
// notification responses from APNs" table as copied into PROTOCOL.md: 32 documented reasons
// (400: 14, 403: 8, 404: 1, 405: 1, 410: 2, 413: 1, 429: 2, 500: 1, 503: 2). Anything else
// APNs may add later is kept verbatim in `unknown` so logs and the outbox never lose it.

public enum APNsReason: Sendable, Hashable {
    // 400
    case badCollapseId, badDeviceToken, badExpirationDate, badMessageId, badPriority, badTopic
    case deviceTokenNotForTopic, duplicateHeaders, idleTimeout, invalidPushType
    case missingDeviceToken, missingTopic, payloadEmpty, topicDisallowed
    // 403
    case badCertificate, badCertificateEnvironment, expiredProviderToken, forbidden
    case invalidProviderToken, missingProviderToken, unrelatedKeyIdInToken, badEnvironmentKeyIdInToken
    // 404, 405
    case badPath, methodNotAllowed
    // 410
    case expiredToken, unregistered
    // 413
    case payloadTooLarge
    // 429
    case tooManyProviderTokenUpdates, tooManyRequests
    // 500, 503
    case internalServerError, serviceUnavailable, shutdown
    /// A reason string not in Apple's documented table (or a missing reason, as "").
    case unknown(String)

    /// Every documented reason with the HTTP status Apple lists it under, in table order.
    public static let documented: [(reason: APNsReason, status: Int)] = [
        (.badCollapseId, 400), (.badDeviceToken, 400), (.badExpirationDate, 400), (.badMessageId, 400),
        (.badPriority, 400), (.badTopic, 400), (.deviceTokenNotForTopic, 400), (.duplicateHeaders, 400),
        (.idleTimeout, 400), (.invalidPushType, 400), (.missingDeviceToken, 400), (.missingTopic, 400),
        (.payloadEmpty, 400), (.topicDisallowed, 400),
        (.badCertificate, 403), (.badCertificateEnvironment, 403), (.expiredProviderToken, 403),
        (.forbidden, 403), (.invalidProviderToken, 403), (.missingProviderToken, 403),
        (.unrelatedKeyIdInToken, 403), (.badEnvironmentKeyIdInToken, 403),
        (.badPath, 404), (.methodNotAllowed, 405),
        (.expiredToken, 410), (.unregistered, 410),
        (.payloadTooLarge, 413),
        (.tooManyProviderTokenUpdates, 429), (.tooManyRequests, 429),
        (.internalServerError, 500), (.serviceUnavailable, 503), (.shutdown, 503),
    ]

    public init(rawValue: String) {
        switch rawValue {
        case "BadCollapseId": self = .badCollapseId
        case "BadDeviceToken": self = .badDeviceToken
        case "BadExpirationDate": self = .badExpirationDate
        case "BadMessageId": self = .badMessageId
        case "BadPriority": self = .badPriority
        case "BadTopic": self = .badTopic
        case "DeviceTokenNotForTopic": self = .deviceTokenNotForTopic
        case "DuplicateHeaders": self = .duplicateHeaders
        case "IdleTimeout": self = .idleTimeout
        case "InvalidPushType": self = .invalidPushType
        case "MissingDeviceToken": self = .missingDeviceToken
        case "MissingTopic": self = .missingTopic
        case "PayloadEmpty": self = .payloadEmpty
        case "TopicDisallowed": self = .topicDisallowed
        case "BadCertificate": self = .badCertificate
        case "BadCertificateEnvironment": self = .badCertificateEnvironment
        case "ExpiredProviderToken": self = .expiredProviderToken
        case "Forbidden": self = .forbidden
        case "InvalidProviderToken": self = .invalidProviderToken
        case "MissingProviderToken": self = .missingProviderToken
        case "UnrelatedKeyIdInToken": self = .unrelatedKeyIdInToken
        case "BadEnvironmentKeyIdInToken": self = .badEnvironmentKeyIdInToken
        case "BadPath": self = .badPath
        case "MethodNotAllowed": self = .methodNotAllowed
        case "ExpiredToken": self = .expiredToken
        case "Unregistered": self = .unregistered
        case "PayloadTooLarge": self = .payloadTooLarge
        case "TooManyProviderTokenUpdates": self = .tooManyProviderTokenUpdates
        case "TooManyRequests": self = .tooManyRequests
        case "InternalServerError": self = .internalServerError
        case "ServiceUnavailable": self = .serviceUnavailable
        case "Shutdown": self = .shutdown
        default: self = .unknown(rawValue)
        }
    }

    public var rawValue: String {
        switch self {
        case .badCollapseId: "BadCollapseId"
        case .badDeviceToken: "BadDeviceToken"
        case .badExpirationDate: "BadExpirationDate"
        case .badMessageId: "BadMessageId"
        case .badPriority: "BadPriority"
        case .badTopic: "BadTopic"
        case .deviceTokenNotForTopic: "DeviceTokenNotForTopic"
        case .duplicateHeaders: "DuplicateHeaders"
        case .idleTimeout: "IdleTimeout"
        case .invalidPushType: "InvalidPushType"
        case .missingDeviceToken: "MissingDeviceToken"
        case .missingTopic: "MissingTopic"
        case .payloadEmpty: "PayloadEmpty"
        case .topicDisallowed: "TopicDisallowed"
        case .badCertificate: "BadCertificate"
        case .badCertificateEnvironment: "BadCertificateEnvironment"
        case .expiredProviderToken: "ExpiredProviderToken"
        case .forbidden: "Forbidden"
        case .invalidProviderToken: "InvalidProviderToken"
        case .missingProviderToken: "MissingProviderToken"
        case .unrelatedKeyIdInToken: "UnrelatedKeyIdInToken"
        case .badEnvironmentKeyIdInToken: "BadEnvironmentKeyIdInToken"
        case .badPath: "BadPath"
        case .methodNotAllowed: "MethodNotAllowed"
        case .expiredToken: "ExpiredToken"
        case .unregistered: "Unregistered"
        case .payloadTooLarge: "PayloadTooLarge"
        case .tooManyProviderTokenUpdates: "TooManyProviderTokenUpdates"
        case .tooManyRequests: "TooManyRequests"
        case .internalServerError: "InternalServerError"
        case .serviceUnavailable: "ServiceUnavailable"
        case .shutdown: "Shutdown"
        case .unknown(let s): s
        }
    }
}
