// Ingest validation: a pure function from (content type, body bytes) to a canonical
// NewResponse or a client error naming the field. No I/O; unit tested as a table.
import Basics
import FoundationEssentials

/// What an HTTP client sees for a refused request. Never carries secrets, tokens or ciphertext.
public struct ClientError: Error, Equatable, Sendable {
    public var status: Int
    public var code: String
    public var field: String?
    public var message: String
    /// The caller's own stored response the refusal is about (409 `index_reused`), never another
    /// credential's.
    public var responseID: String?

    public init(status: Int, code: String, field: String?, message: String, responseID: String? = nil) {
        self.status = status
        self.code = code
        self.field = field
        self.message = message
        self.responseID = responseID
    }

    /// `{"error":"<code>","field":"<name>","message":"..."}`, then `"id"` when there is one.
    public var jsonBody: String {
        var s = "{\"error\":\(jsonString(code))"
        if let field { s += ",\"field\":\(jsonString(field))" }
        s += ",\"message\":\(jsonString(message))"
        if let responseID { s += ",\"id\":\(jsonString(responseID))" }
        return s + "}"
    }
}

/// JSON string literal with the escapes RFC 8259 requires.
public func jsonString(_ s: String) -> String { JSONString.quote(s) }

public struct IngestLimits: Sendable {
    /// Request bodies above this are 413.
    public var maxBodyBytes: Int = 16384
    /// APNs payload limit.
    public var maxAPNsPayloadBytes: Int = 4096
    public init(maxBodyBytes: Int = 16384, maxAPNsPayloadBytes: Int = 4096) {
        self.maxBodyBytes = maxBodyBytes
        self.maxAPNsPayloadBytes = maxAPNsPayloadBytes
    }
}

public enum IngestValidation {
    public static let fields: Set<String> = ["pushToken", "sessionIdentifier", "keyID", "messageIndex", "encryptedData", "app"]
    /// AES-GCM combined box: 12-byte nonce + 16-byte tag + at least 0 bytes of ciphertext.
    public static let minimumSealedBytes = 28

    /// Size of the APNs body PushClient builds for this response (AccessoryPayload.jsonBody):
    /// {"aps":{"encryptedData":"<b64>","sessionIdentifier":"<UUID>","keyID":"<b64>","messageIndex":"<n>"}}
    public static func apnsPayloadLength(encryptedBytes: Int, keyIDBytes: Int = 4, messageIndex: UInt32) -> Int {
        let skeleton = #"{"aps":{"encryptedData":"","sessionIdentifier":"","keyID":"","messageIndex":""}}"#.utf8.count
        var digits = 1
        var rest = messageIndex
        while rest >= 10 { rest /= 10; digits += 1 }   // String(messageIndex).utf8.count, without the String
        return skeleton + Base64.encodedCount(encryptedBytes, padding: true) + 36 + Base64.encodedCount(keyIDBytes, padding: true) + digits
    }

    /// The Content-Type must be `application/json` as an RFC 9110 8.3.1 media type: type and
    /// subtype in any case, then any number of `; name=value` parameters (value a token or a
    /// quoted-string; unknown names allowed). A `charset` other than utf-8 (any case) is refused,
    /// as is a value that is not one media type (two Content-Type fields arrive comma-joined:
    /// HTTPGlue).
    public static func checkContentType(_ value: String?) -> ClientError? {
        func refuse(_ message: String) -> ClientError {
            ClientError(status: 415, code: "unsupported_media_type", field: "content-type", message: message)
        }
        guard var value else { return refuse("Content-Type must be application/json") }
        // The common exact value without a scan.
        if value == "application/json" { return nil }
        return value.withUTF8 { u -> ClientError? in
            switch MediaType.check(u) {
            case .json: return nil
            case .otherType: return refuse("Content-Type must be application/json")
            case .malformed: return refuse("Content-Type must be one media type (RFC 9110 8.3.1), application/json")
            case .otherCharset: return refuse("only charset=utf-8 is accepted")
            }
        }
    }

    public static func validate(contentType: String?, body: [UInt8], limits: IngestLimits = .init()) -> Result<NewResponse, ClientError> {
        if let e = checkContentType(contentType) { return .failure(e) }
        guard body.count <= limits.maxBodyBytes else {
            return .failure(ClientError(status: 413, code: "body_too_large", field: "body", message: "body exceeds \(limits.maxBodyBytes) bytes"))
        }
        if let fast = body.withUnsafeBufferPointer({ fastValidate($0, limits: limits) }) { return .success(fast) }
        return validateInFull(body: body, limits: limits)
    }

    /// The general path: any JSON, every check in order, the first failure named. Also the
    /// reference the fast path (FastValidation.swift) is tested against.
    static func validateInFull(body: [UInt8], limits: IngestLimits) -> Result<NewResponse, ClientError> {
        let members: [(String, JSONMember)]
        do {
            members = try JSONReader.readObject(body)
        } catch {
            return .failure(bad("invalid_json", "body", error.message))
        }
        // One slot per known field: a [String: JSONMember] would hash every key twice.
        var slots: [JSONMember?] = [nil, nil, nil, nil, nil, nil]
        for (k, v) in members {
            guard let i = fieldSlot(k) else { return .failure(bad("unknown_field", k, "unknown field")) }
            guard slots[i] == nil else { return .failure(bad("duplicate_field", k, "field appears more than once")) }
            slots[i] = v
        }
        func value(_ name: String) -> JSONMember? { fieldSlot(name).flatMap { slots[$0] } }
        func required(_ name: String) -> Result<String, ClientError> {
            guard let v = value(name) else { return .failure(bad("missing_field", name, "\(name) is required")) }
            guard case .string(let s) = v else { return .failure(bad("invalid_\(snake(name))", name, "\(name) must be a string")) }
            return .success(s)
        }

        // pushToken: Basics.PushToken, the one rule.
        let token: String
        switch required("pushToken") {
        case .failure(let e): return .failure(e)
        case .success(let s):
            let u = s.utf8
            guard PushToken.isValid(s) else {
                return .failure(bad("invalid_push_token", "pushToken", "pushToken must be \(PushToken.ruleText)"))
            }
            token = u.contains(where: { $0 >= 0x41 && $0 <= 0x46 }) ? ASCII.lowercased(s) : s
        }

        let session: String
        switch required("sessionIdentifier") {
        case .failure(let e): return .failure(e)
        case .success(let s):
            guard s.utf8.count == 36, let bytes = UUIDText.parse(s) else {
                return .failure(bad("invalid_session_identifier", "sessionIdentifier", "sessionIdentifier must be a UUID"))
            }
            session = UUIDText.format(bytes, uppercase: true)
        }

        let keyID: [UInt8]
        switch required("keyID") {
        case .failure(let e): return .failure(e)
        case .success(let s):
            guard let k = Base64.decode(s, trailingBits: .ignored), k.count == 4 else {
                return .failure(bad("invalid_key_id", "keyID", "keyID must be base64 of exactly 4 bytes"))
            }
            keyID = k
        }

        let index: UInt32
        guard let rawIndex = value("messageIndex") else { return .failure(bad("missing_field", "messageIndex", "messageIndex is required")) }
        let digits: String
        switch rawIndex {
        case .number(let n): digits = n
        case .string(let s): digits = s
        default: return .failure(bad("invalid_message_index", "messageIndex", "messageIndex must be an integer or a decimal string"))
        }
        guard !digits.isEmpty, digits.utf8.count <= 10, digits.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
              let v = UInt64(digits), v <= UInt64(UInt32.max) else {
            return .failure(bad("invalid_message_index", "messageIndex", "messageIndex must be an integer in 0...4294967295"))
        }
        index = UInt32(v)

        let sealed: [UInt8]
        switch required("encryptedData") {
        case .failure(let e): return .failure(e)
        case .success(let s):
            guard let d = Base64.decode(s, trailingBits: .ignored) else {
                return .failure(bad("invalid_encrypted_data", "encryptedData", "encryptedData must be standard base64"))
            }
            guard d.count >= minimumSealedBytes else {
                return .failure(bad("invalid_encrypted_data", "encryptedData", "encryptedData must decode to at least \(minimumSealedBytes) bytes (nonce + tag)"))
            }
            let size = apnsPayloadLength(encryptedBytes: d.count, keyIDBytes: keyID.count, messageIndex: index)
            guard size <= limits.maxAPNsPayloadBytes else {
                return .failure(bad("payload_too_large", "encryptedData", "the APNs payload would be \(size) bytes; the limit is \(limits.maxAPNsPayloadBytes)"))
            }
            sealed = d
        }

        var app: String?
        if let a = value("app") {
            guard case .string(let s) = a, !s.isEmpty, s.utf8.count <= 255 else {
                return .failure(bad("invalid_app", "app", "app must be a non-empty bundle ID string"))
            }
            app = s
        }
        return .success(NewResponse(app: app, pushToken: token, sessionIdentifier: session, keyID: keyID, messageIndex: index, encryptedData: sealed))
    }

    /// Index of a known field (the same names as `fields`), nil for anything else.
    static func fieldSlot(_ name: String) -> Int? {
        switch name {
        case "pushToken": 0
        case "sessionIdentifier": 1
        case "keyID": 2
        case "messageIndex": 3
        case "encryptedData": 4
        case "app": 5
        default: nil
        }
    }

    private static func bad(_ code: String, _ field: String, _ message: String) -> ClientError {
        ClientError(status: 400, code: code, field: field, message: message)
    }

    private static func snake(_ camel: String) -> String {
        var out = ""
        for c in camel {
            if c.isUppercase { out += "_" + c.lowercased() } else { out.append(c) }
        }
        return out.replacing("i_d", with: "id")
    }
}

/// RFC 9110 8.3.1 media-type syntax over bytes, for `checkContentType`:
/// `type "/" subtype *( OWS ";" OWS [ token "=" ( token / quoted-string ) ] )`.
enum MediaType {
    enum Verdict: Equatable { case json, otherType, malformed, otherCharset }

    static func check(_ u: UnsafeBufferPointer<UInt8>) -> Verdict {
        var i = 0
        let n = u.count
        func skipOWS() { while i < n, u[i] == 0x20 || u[i] == 0x09 { i += 1 } }
        func token() -> Range<Int>? {
            let start = i
            while i < n, isTokenByte(u[i]) { i += 1 }
            return i > start ? start..<i : nil
        }
        func equalsLowercased(_ r: Range<Int>, _ s: StaticString) -> Bool {
            guard r.count == s.utf8CodeUnitCount else { return false }
            for k in 0..<r.count where u[r.lowerBound + k] | 0x20 != s.utf8Start[k] | 0x20 { return false }
            return true
        }
        skipOWS()
        guard let type = token(), i < n, u[i] == 0x2F else { return .malformed }
        i += 1
        guard let subtype = token() else { return .malformed }
        let isJSON = equalsLowercased(type, "application") && equalsLowercased(subtype, "json")
        var charsets = 0
        var badCharset = false
        while true {
            skipOWS()
            if i == n { break }
            guard u[i] == 0x3B else { return .malformed }   // ";"
            i += 1
            skipOWS()
            if i == n || u[i] == 0x3B { continue }           // an empty parameter is allowed
            guard let name = token(), i < n, u[i] == 0x3D else { return .malformed }
            i += 1
            var value: [UInt8] = []
            if i < n, u[i] == 0x22 {                          // quoted-string
                i += 1
                var closed = false
                while i < n {
                    let c = u[i]
                    if c == 0x22 { closed = true; i += 1; break }
                    if c == 0x5C {                            // quoted-pair
                        guard i + 1 < n, isQuotedText(u[i + 1]) || u[i + 1] == 0x22 || u[i + 1] == 0x5C else { return .malformed }
                        value.append(u[i + 1])
                        i += 2
                        continue
                    }
                    guard isQuotedText(c) else { return .malformed }
                    value.append(c)
                    i += 1
                }
                guard closed else { return .malformed }
            } else {
                guard let v = token() else { return .malformed }
                value = Array(u[v])
            }
            if equalsLowercased(name, "charset") {
                // Two charsets are ambiguous even when both say utf-8.
                charsets += 1
                let utf8: StaticString = "utf-8"
                if charsets > 1 || value.count != 5 || (0..<5).contains(where: { value[$0] | 0x20 != utf8.utf8Start[$0] }) { badCharset = true }
            }
        }
        return !isJSON ? .otherType : badCharset ? .otherCharset : .json
    }

    /// tchar (RFC 9110 5.6.2).
    static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        case 0x21, 0x23, 0x24, 0x25, 0x26, 0x27, 0x2A, 0x2B, 0x2D, 0x2E, 0x5E, 0x5F, 0x60, 0x7C, 0x7E: return true
        default: return false
        }
    }

    /// qdtext, and what a quoted-pair may escape besides DQUOTE and backslash (RFC 9110 5.6.4).
    static func isQuotedText(_ b: UInt8) -> Bool {
        b == 0x09 || b == 0x20 || b == 0x21 || (b >= 0x23 && b <= 0x5B) || (b >= 0x5D && b <= 0x7E) || b >= 0x80
    }
}
