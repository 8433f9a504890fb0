/// The plaintext an accessory seals in its response: Apple's example format of length-prefixed
/// UTF-8 strings, in this order: notification identifier, source identifier (bundle ID), action
/// identifier, and optionally the text the person typed.
///
/// Apple does not specify the prefix; we use an unsigned 16-bit **big-endian** byte count before
/// each field (docs/ratchet.md explains why). A body with three fields has no user text; a
/// fourth field, even an empty one, is user text. The three identifiers must not be empty.
/// The whole body is at most `maximumEncodedLength` bytes.
public struct NotificationResponseBody: Equatable, Sendable {
    /// APNs caps the whole push payload at 4096 bytes, so a larger body could never be delivered.
    public static let maximumEncodedLength = 4096
    /// Largest field a 2-byte prefix can describe.
    public static let maximumFieldLength = Int(UInt16.max)

    public var notificationIdentifier: String
    public var sourceIdentifier: String
    public var actionIdentifier: String
    public var userText: String?

    public init(notificationIdentifier: String, sourceIdentifier: String, actionIdentifier: String, userText: String? = nil) {
        self.notificationIdentifier = notificationIdentifier
        self.sourceIdentifier = sourceIdentifier
        self.actionIdentifier = actionIdentifier
        self.userText = userText
    }

    private static let fieldNames = ["notificationIdentifier", "sourceIdentifier", "actionIdentifier", "userText"]

    public func encoded() throws -> [UInt8] {
        var fields: [(String, String)] = [
            ("notificationIdentifier", notificationIdentifier),
            ("sourceIdentifier", sourceIdentifier),
            ("actionIdentifier", actionIdentifier),
        ]
        if let userText { fields.append(("userText", userText)) }
        var out: [UInt8] = []
        for (name, value) in fields {
            let utf8 = Array(value.utf8)
            if name != "userText", utf8.isEmpty { throw RatchetError.emptyField(name) }
            guard utf8.count <= Self.maximumFieldLength else { throw RatchetError.fieldTooLong(field: name, length: utf8.count) }
            out.append(UInt8(utf8.count >> 8))
            out.append(UInt8(utf8.count & 0xff))
            out += utf8
        }
        guard out.count <= Self.maximumEncodedLength else { throw RatchetError.bodyTooLarge(out.count) }
        return out
    }

    /// Strict decoding: three or four fields, each a complete prefix + valid UTF-8, nothing after.
    public init(decoding bytes: [UInt8]) throws {
        guard bytes.count <= Self.maximumEncodedLength else { throw RatchetError.bodyTooLarge(bytes.count) }
        var reader = ByteReader(bytes)
        var values: [String] = []
        for name in Self.fieldNames {
            if name == "userText", reader.remaining == 0 { break }
            guard let length = reader.be(2) else {
                throw reader.remaining == 0 ? RatchetError.truncatedField(name) : RatchetError.truncatedField(name)
            }
            guard let raw = reader.take(Int(length)) else { throw RatchetError.truncatedField(name) }
            guard let value = String(validating: raw, as: UTF8.self) else { throw RatchetError.invalidUTF8(field: name) }
            if name != "userText", value.isEmpty { throw RatchetError.emptyField(name) }
            values.append(value)
        }
        guard reader.remaining == 0 else { throw RatchetError.trailingBytes(reader.remaining) }
        notificationIdentifier = values[0]
        sourceIdentifier = values[1]
        actionIdentifier = values[2]
        userText = values.count == 4 ? values[3] : nil
    }
}
