// APNs request validation as one pure function: request (+ the connection's auth state) ->
// accepted push or (status, reason). Order of checks: method, path, token, duplicate headers,
// apns-id, provider token, topic, push type, priority, expiration, collapse id, payload.
import Basics
import Foundation
import Synchronization

/// The accessory payload fields, parsed.
public struct AccessoryFields: Sendable, Equatable {
    public var encryptedData: [UInt8]
    public var sessionIdentifier: UUID
    public var keyID: [UInt8]
    public var messageIndex: UInt32
}

/// A request that passed validation.
public struct AcceptedPush: Sendable, Equatable {
    public var apnsID: String            // lowercase
    public var deviceToken: String       // lowercase hex
    public var topic: String
    public var pushType: String
    public var priority: Int?
    public var expiration: Int64?
    public var collapseID: String?
    public var payload: [UInt8]
    public var accessory: AccessoryFields?
    public var claims: ProviderTokenClaims?
}

public enum ValidationResult: Sendable, Equatable {
    case accepted(AcceptedPush)
    /// `apnsID` is echoed on errors too (the client's if valid, else a generated one).
    case rejected(Rejection, apnsID: String)
}

/// Per-connection token state, like APNs: a connection is bound to the team and key ID first
/// used on it, and a new token may replace the current one at most once per `tokenUpdateInterval`.
public struct ConnectionAuthState: Sendable, Equatable {
    public var boundTeamID: String?
    public var boundKeyID: String?
    public var currentToken: String?
    public var currentTokenSince: Int64?
    public init() {}
}

/// Push types APNs knows, with the suffix their `apns-topic` carries after the bundle ID.
public let pushTypeTopicSuffixes: [String: String] = [
    "alert": "", "background": "", "mdm": "",
    "voip": ".voip", "complication": ".complication", "fileprovider": ".pushkit.fileprovider",
    "location": ".location-query", "liveactivity": ".push-type.liveactivity", "pushtotalk": ".voip-ptt",
    "widgets": ".push-type.widgets", "controls": ".push-type.controls",
    "accessory": ".push-type.accessory",
]

public struct RequestValidator: Sendable {
    /// Bundle IDs the provider may push to. Empty = any bundle ID (the suffix is still checked).
    public var allowedBundleIDs: Set<String>
    /// nil = provider-token auth off: `authorization` is ignored (like certificate auth).
    public var tokenVerifier: ProviderTokenVerifier?
    /// Signature/shape check; the server swaps in a cached one. Defaults to the verifier's.
    public var checkTokenShape: (@Sendable (String) -> Result<ProviderTokenClaims, ProviderTokenFailure>)?
    public var maxPayloadBytes = 4096
    /// APNs: 20 minutes between token changes on one connection. 0 disables the check.
    public var tokenUpdateInterval: Int64 = 20 * 60
    /// Fault: answer 403 ExpiredProviderToken for tokens with iat before this (UNIX seconds).
    public var expireTokensIssuedBefore: Int64?

    public init(allowedBundleIDs: Set<String>, tokenVerifier: ProviderTokenVerifier?) {
        self.allowedBundleIDs = allowedBundleIDs
        self.tokenVerifier = tokenVerifier
    }

    /// `clientCertificateSubject`: the verified client certificate's subject
    /// (X509_NAME_oneline form, "/UID=com.example.app/O=.../CN=..."), nil without one. A
    /// connection with a certificate uses certificate auth: no provider token is needed and the
    /// topic's bundle ID must be the certificate's UID.
    public func validate(method: String, path: String, headers: [(String, String)], body: [UInt8],
                         connection: inout ConnectionAuthState, now: Int64,
                         clientCertificateSubject: String? = nil,
                         generateID: () -> UUID = randomUUID) -> ValidationResult {
        // apns-id first, so every answer can echo it.
        let idValues = values("apns-id", headers)
        var apnsID = lowercaseString(generateID())
        var badID = false
        if let sent = idValues.first {
            if isCanonicalUUID(sent) { apnsID = sent.lowercased() } else { badID = true }
        }
        func reject(_ status: Int, _ reason: MockReason, _ detail: String) -> ValidationResult {
            .rejected(Rejection(status, reason, detail: detail), apnsID: apnsID)
        }

        guard method == "POST" else { return reject(405, .methodNotAllowed, "method \(method): only POST") }
        let prefix = "/3/device"
        guard path == prefix || path.hasPrefix(prefix + "/") else { return reject(404, .badPath, "path must be /3/device/<token>") }
        let token = path.dropFirst(prefix.count).drop(while: { $0 == "/" })
        guard !token.isEmpty else { return reject(400, .missingDeviceToken, "no device token in the path") }
        guard PushToken.isValid(token) else {
            return reject(400, .badDeviceToken, "device token must be \(PushToken.ruleText)")
        }

        var seen = Set<String>()
        for (name, _) in headers where name.hasPrefix("apns-") || name == "authorization" {
            if !seen.insert(name).inserted { return reject(400, .duplicateHeaders, "header \(name) repeated") }
        }
        if badID { return reject(400, .badMessageId, "apns-id must be a UUID (8-4-4-4-12 hex)") }

        var claims: ProviderTokenClaims?
        var certificateBundleID: String?
        if let subject = clientCertificateSubject {
            guard let uid = Self.uid(inSubject: subject) else {
                return reject(403, .badCertificate, "client certificate has no UID naming its bundle ID")
            }
            certificateBundleID = uid
        } else if let verifier = tokenVerifier {
            switch checkToken(verifier, header(headers, "authorization"), &connection, now) {
            case .failure(let rejection): return .rejected(rejection, apnsID: apnsID)
            case .success(let c): claims = c
            }
        }

        guard let topic = header(headers, "apns-topic"), !topic.isEmpty else {
            return reject(400, .missingTopic, "apns-topic header missing")
        }
        guard topic.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            return reject(400, .badTopic, "apns-topic has spaces or non-ASCII characters")
        }
        let pushType = header(headers, "apns-push-type") ?? "alert"  // APNs defaults to alert
        guard let suffix = pushTypeTopicSuffixes[pushType] else {
            return reject(400, .invalidPushType, "apns-push-type \(pushType) is not one APNs knows")
        }
        if let rejection = checkTopic(topic, suffix: suffix, pushType: pushType) {
            return .rejected(rejection, apnsID: apnsID)
        }
        if let certificateBundleID, topic.dropLast(suffix.count) != certificateBundleID {
            return reject(400, .topicDisallowed, "the client certificate is for \(certificateBundleID), not \(topic)")
        }

        var priority: Int?
        if let text = header(headers, "apns-priority") {
            guard let p = Int(text), [10, 5, 1].contains(p), text.utf8.allSatisfy(isDigit) else {
                return reject(400, .badPriority, "apns-priority must be 10, 5 or 1")
            }
            priority = p
        }
        var expiration: Int64?
        if let text = header(headers, "apns-expiration") {
            guard !text.isEmpty, text.utf8.allSatisfy(isDigit), let e = Int64(text) else {
                return reject(400, .badExpirationDate, "apns-expiration must be UNIX seconds (0 = deliver once)")
            }
            expiration = e
        }
        let collapseID = header(headers, "apns-collapse-id")
        if let collapseID, collapseID.utf8.count > 64 {
            return reject(400, .badCollapseId, "apns-collapse-id longer than 64 bytes")
        }

        guard !body.isEmpty else { return reject(400, .payloadEmpty, "empty body") }
        guard body.count <= maxPayloadBytes else {
            return reject(413, .payloadTooLarge, "payload \(body.count) bytes > \(maxPayloadBytes)")
        }
        var accessory: AccessoryFields?
        switch parsePayload(body, accessory: pushType == "accessory") {
        case .failure(let rejection): return .rejected(rejection, apnsID: apnsID)
        case .success(let fields): accessory = fields
        }

        return .accepted(AcceptedPush(apnsID: apnsID, deviceToken: token.lowercased(), topic: topic,
                                      pushType: pushType, priority: priority, expiration: expiration,
                                      collapseID: collapseID, payload: body, accessory: accessory,
                                      claims: claims))
    }

    /// The UID attribute of a one-line X.509 subject ("/UID=com.example.app/CN=...").
    static func uid(inSubject subject: String) -> String? {
        for part in subject.split(separator: "/") where part.hasPrefix("UID=") {
            let value = part.dropFirst(4)
            return value.isEmpty ? nil : String(value)
        }
        return nil
    }

    private func checkToken(_ verifier: ProviderTokenVerifier, _ authorization: String?,
                            _ connection: inout ConnectionAuthState, _ now: Int64) -> Result<ProviderTokenClaims, Rejection> {
        guard let authorization, !authorization.isEmpty else { return .failure(ProviderTokenFailure.missing.rejection) }
        let parts = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            return .failure(ProviderTokenFailure.invalid("authorization is not 'bearer <token>'").rejection)
        }
        let token = trimmedSpaces(parts[1])
        let shape = checkTokenShape?(token) ?? verifier.verifySignatureAndShape(token: token)
        let claims: ProviderTokenClaims
        switch shape.flatMap({ verifier.checkTime($0, now: now) }) {
        case .failure(let failure): return .failure(failure.rejection)
        case .success(let c): claims = c
        }
        if let cutoff = expireTokensIssuedBefore, claims.issuedAt < cutoff {
            return .failure(Rejection(403, .expiredProviderToken, detail: "fault: tokens issued before \(cutoff) are expired"))
        }
        if let team = connection.boundTeamID, let key = connection.boundKeyID,
           team != claims.teamID || key != claims.keyID {
            return .failure(Rejection(403, .unrelatedKeyIdInToken,
                                      detail: "connection is bound to key \(key) of team \(team)"))
        }
        if connection.currentToken != token {
            if let since = connection.currentTokenSince, tokenUpdateInterval > 0, now - since < tokenUpdateInterval {
                return .failure(Rejection(429, .tooManyProviderTokenUpdates,
                                          detail: "new token less than \(tokenUpdateInterval)s after the previous one on this connection"))
            }
            connection.currentToken = token
            connection.currentTokenSince = now
        }
        connection.boundTeamID = claims.teamID
        connection.boundKeyID = claims.keyID
        return .success(claims)
    }

    private func checkTopic(_ topic: String, suffix: String, pushType: String) -> Rejection? {
        let base = topic.hasSuffix(suffix) ? String(topic.dropLast(suffix.count)) : nil
        if let base, !base.isEmpty, allowedBundleIDs.isEmpty || allowedBundleIDs.contains(base) {
            if suffix.isEmpty, pushTypeTopicSuffixes.values.contains(where: { !$0.isEmpty && topic.hasSuffix($0) }),
               allowedBundleIDs.isEmpty || !allowedBundleIDs.contains(topic) {
                // e.g. "com.x.push-type.accessory" sent as an alert push
                return Rejection(400, .deviceTokenNotForTopic, detail: "topic suffix does not match apns-push-type \(pushType)")
            }
            return nil
        }
        // The bundle ID is one of ours but the suffix is wrong for the push type.
        let knownBundle = allowedBundleIDs.isEmpty || allowedBundleIDs.contains(where: { topic == $0 || topic.hasPrefix($0 + ".") })
        if knownBundle {
            return Rejection(400, .deviceTokenNotForTopic,
                             detail: "apns-push-type \(pushType) needs apns-topic <bundle id>\(suffix)")
        }
        return Rejection(400, .topicDisallowed, detail: "topic \(topic) is not an allowed bundle ID")
    }

    private func parsePayload(_ body: [UInt8], accessory: Bool) -> Result<AccessoryFields?, Rejection> {
        func bad(_ detail: String) -> Result<AccessoryFields?, Rejection> { .failure(Rejection(400, .badPayload, detail: detail)) }
        guard let object = PayloadJSON.parse(body), let keys = object.objectKeys else {
            return bad("payload is not a JSON object")
        }
        guard let aps = object["aps"], let apsKeys = aps.objectKeys else { return bad("payload has no \"aps\" object") }
        guard accessory else { return .success(nil) }
        guard keys == ["aps"] else { return bad("accessory payload has keys besides \"aps\"") }
        let expected: Set<String> = ["encryptedData", "sessionIdentifier", "keyID", "messageIndex"]
        if let extra = Set(apsKeys).subtracting(expected).sorted().first { return bad("aps.\(extra) is not an accessory field") }
        guard Set(apsKeys).count == apsKeys.count else { return bad("aps has a repeated key") }
        guard let dataText = aps["encryptedData"]?.stringValue, let data = Data(base64Encoded: dataText), !data.isEmpty else {
            return bad("aps.encryptedData must be non-empty base64")
        }
        guard let sessionText = aps["sessionIdentifier"]?.stringValue, isCanonicalUUID(sessionText),
              let session = parseCanonicalUUID(sessionText) else {
            return bad("aps.sessionIdentifier must be a UUID string")
        }
        guard let keyText = aps["keyID"]?.stringValue, let keyID = Data(base64Encoded: keyText), keyID.count == 4 else {
            return bad("aps.keyID must be base64 of 4 bytes")
        }
        guard let indexText = aps["messageIndex"]?.stringValue, !indexText.isEmpty, indexText.utf8.allSatisfy(isDigit),
              indexText == "0" || !indexText.hasPrefix("0"), let index = UInt32(indexText) else {
            return bad("aps.messageIndex must be a decimal string of a UInt32")
        }
        return .success(AccessoryFields(encryptedData: Array(data), sessionIdentifier: session,
                                        keyID: Array(keyID), messageIndex: index))
    }
}

/// A version-4-shaped UUID: 8 random bytes chosen once per process plus a counter. Foundation's
/// `UUID()` on Linux opens /dev/urandom on every call (a tenth of the mock's CPU under load);
/// apns-id and apns-unique-id need uniqueness, not secrecy.
public func randomUUID() -> UUID {
    let n = uuidCounter.add(1, ordering: .relaxed).newValue
    var bytes = (uuidPrefix, n.bigEndian)
    return withUnsafeMutableBytes(of: &bytes) { raw in
        raw[6] = (raw[6] & 0x0F) | 0x40  // version 4
        raw[8] = (raw[8] & 0x3F) | 0x80  // RFC 4122 variant (takes 2 bits of the counter's top byte)
        return UUID(uuid: (raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
                           raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]))
    }
}

/// `uuidString.lowercased()` without Foundation's snprintf round trip.
public func lowercaseString(_ uuid: UUID) -> String {
    withUnsafeBytes(of: uuid.uuid) { UUIDText.format(bytes: $0) }
}

/// A canonical 8-4-4-4-12 UUID string (either case) to its bytes, without Foundation's sscanf.
func parseCanonicalUUID(_ text: String) -> UUID? {
    guard let b = UUIDText.parse(text) else { return nil }
    return UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
}

private let uuidPrefix = UInt64.random(in: 0...UInt64.max)
private let uuidCounter = Atomic<UInt64>(UInt64.random(in: 0...(UInt64.max >> 8)))

/// Leading/trailing spaces and tabs removed, without Foundation's NSString round trip.
func trimmedSpaces(_ text: Substring) -> String {
    let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
    guard let first = text.firstIndex(where: { !isSpace($0) }), let last = text.lastIndex(where: { !isSpace($0) }) else { return "" }
    return String(text[first...last])
}

func header(_ headers: [(String, String)], _ name: String) -> String? {
    headers.first(where: { $0.0 == name })?.1
}

private func values(_ name: String, _ headers: [(String, String)]) -> [String] {
    headers.filter { $0.0 == name }.map(\.1)
}

@inline(__always) private func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }
/// 8-4-4-4-12 hex digits, either case.
func isCanonicalUUID(_ text: String) -> Bool { UUIDText.isCanonical(text) }
