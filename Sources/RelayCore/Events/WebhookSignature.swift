// Standard Webhooks signing (https://www.standardwebhooks.com, "Signature scheme"): the three
// headers of one attempt, as a pure function of the event id, the time and the body. The sender
// calls it per attempt (a new timestamp each time, the same id); tests and docs verify with it.
import Basics
internal import OpenSSLSupport

/// One signing secret, `whsec_<base64>`: the key is the base64-decoded part after the prefix.
/// The decoded bytes are wiped once its HMAC state is made; that is cleansed when the last copy goes.
public final class WebhookSecret: Sendable {
    public static let prefix = "whsec_"
    /// The key's HMAC state (its padded blocks hashed; cleansed when freed).
    private let key: HMACSHA256.Key

    public enum ParseError: Error, Equatable, CustomStringConvertible {
        case missingPrefix, notBase64, tooShort(Int)
        public var description: String {
            switch self {
            case .missingPrefix: "a webhook secret starts with \"whsec_\" followed by base64"
            case .notBase64: "the part after \"whsec_\" is not base64"
            case .tooShort(let n): "the key is \(n) bytes; use at least 24 (e.g. `echo whsec_$(openssl rand -base64 32)`)"
            }
        }
    }

    /// The minimum key length: Standard Webhooks recommends 24 to 64 bytes.
    public static let minimumKeyBytes = 24

    public init(parsing text: String) throws(ParseError) {
        guard text.hasPrefix(Self.prefix) else { throw .missingPrefix }
        guard var key = Basics.Base64.decode(text.dropFirst(Self.prefix.count)) else { throw .notBase64 }
        guard key.count >= Self.minimumKeyBytes else { throw .tooShort(key.count) }
        self.key = HMACSHA256.Key(key)
        wipe(&key)
    }

    /// Any key, for tests of the signing function against published examples with short keys.
    init(key: [UInt8]) { self.key = HMACSHA256.Key(key) }

    func mac(_ message: [UInt8]) -> [UInt8] { key.mac(message) }
}

public enum WebhookSigning {
    /// `<id>.<timestamp>.<body>`: what is signed.
    static func signedContent(id: String, timestamp: String, body: [UInt8]) -> [UInt8] {
        var content = Array(id.utf8)
        content.append(UInt8(ascii: "."))
        content.append(contentsOf: timestamp.utf8)
        content.append(UInt8(ascii: "."))
        content.append(contentsOf: body)
        return content
    }

    /// `v1,<base64 HMAC-SHA256>` for one secret.
    public static func signature(id: String, timestamp: Int64, body: [UInt8], secret: WebhookSecret) -> String {
        "v1," + Basics.Base64.encode(secret.mac(signedContent(id: id, timestamp: String(timestamp), body: body)))
    }

    /// The `webhook-id`, `webhook-timestamp` and `webhook-signature` headers (lowercase names).
    /// Several secrets (a rotation) give space-separated signatures, the first secret's first.
    public static func headers(id: String, timestamp: Int64, body: [UInt8], secrets: [WebhookSecret]) -> [(name: String, value: String)] {
        let content = signedContent(id: id, timestamp: String(timestamp), body: body)
        let signatures = secrets.map { "v1," + Basics.Base64.encode($0.mac(content)) }
        return [("webhook-id", id), ("webhook-timestamp", String(timestamp)), ("webhook-signature", signatures.joined(separator: " "))]
    }

    /// What a receiver does: true when one of the space-separated `v1` signatures matches
    /// (compared in constant time) and the timestamp is within `toleranceSeconds` of `now`.
    public static func verify(id: String, timestamp: String, signatures: String, body: [UInt8], secret: WebhookSecret,
                              nowSeconds: Int64, toleranceSeconds: Int64 = 300) -> Bool {
        guard let t = Int64(timestamp), abs(nowSeconds - t) <= toleranceSeconds else { return false }
        let expected = secret.mac(signedContent(id: id, timestamp: timestamp, body: body))
        var matched = false
        for candidate in signatures.split(separator: " ") {
            guard candidate.hasPrefix("v1,"), let mac = Basics.Base64.decode(candidate.dropFirst(3)) else { continue }
            if constantTimeEqual(mac, expected) { matched = true }
        }
        return matched
    }
}
