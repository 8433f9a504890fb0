// What a push token is, for every module: ingest refuses, PushClient refuses locally, mock-apns
// answers BadDeviceToken and relayctl refuses an option by this one rule.

/// An APNs push token as text: 2 to 200 hex digits, an even count, either case (stored and sent
/// lowercase). Apple does not fix the length (64 digits today); 200 leaves room and bounds what a
/// caller can make the relay store and index.
public enum PushToken {
    public static let maxHexDigits = 200

    /// The rule's wording, for error messages.
    public static let ruleText = "an even number (2 to \(maxHexDigits)) of hex digits"

    /// The rule on the token's bytes.
    @inlinable
    public static func isValid(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        isValidLength(bytes.count) && bytes.allSatisfy(Hex.isDigit)
    }

    @inlinable
    public static func isValidLength(_ hexDigits: Int) -> Bool {
        hexDigits >= 2 && hexDigits <= maxHexDigits && hexDigits % 2 == 0
    }

    public static func isValid(_ text: some StringProtocol) -> Bool {
        isValidLength(text.utf8.count) && text.utf8.allSatisfy(Hex.isDigit)
    }

    /// The token lowercased when it keeps the rule, else nil.
    public static func canonical(_ text: some StringProtocol) -> String? {
        guard isValid(text) else { return nil }
        return String(decoding: text.utf8.map { $0 >= 0x41 && $0 <= 0x46 ? $0 | 0x20 : $0 }, as: UTF8.self)
    }
}
