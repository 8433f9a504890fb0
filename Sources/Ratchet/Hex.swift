import Basics

// Ratchet's public spelling of the shared hex codec (Basics.Hex).
extension Array where Element == UInt8 {
    /// Parses hexadecimal digits (either case, no separators, even count). Empty input is an
    /// empty array. Returns nil for anything else.
    public init?(hex: some StringProtocol) {
        guard let bytes = Hex.decode(hex) else { return nil }
        self = bytes
    }

    /// Lowercase hexadecimal, two digits per byte.
    public var hexString: String { Hex.encode(self) }
}
