// Hexadecimal text: the one encoder, decoder and digit predicate for every module.

public enum Hex {
    /// True for 0-9, a-f, A-F (ASCII only).
    @inlinable
    public static func isDigit(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x66) || (b >= 0x41 && b <= 0x46)
    }

    /// The value of one hex digit (either case), or nil.
    @inlinable
    public static func value(_ b: UInt8) -> UInt8? {
        switch b {
        case 0x30...0x39: return b - 0x30
        case 0x41...0x46: return b - 0x41 + 10
        case 0x61...0x66: return b - 0x61 + 10
        default: return nil
        }
    }

    /// Non-empty and ASCII hex digits only (any count, either case).
    public static func isHex(_ text: some StringProtocol) -> Bool {
        !text.utf8.isEmpty && text.utf8.allSatisfy(isDigit)
    }

    /// Two digits per byte, lowercase unless `uppercase`.
    public static func encode(_ bytes: some Sequence<UInt8>, uppercase: Bool = false) -> String {
        let digits: StaticString = uppercase ? "0123456789ABCDEF" : "0123456789abcdef"
        let d = digits.utf8Start
        var out = [UInt8]()
        out.reserveCapacity(bytes.underestimatedCount * 2)
        for b in bytes {
            out.append(d[Int(b >> 4)])
            out.append(d[Int(b & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Bytes of an even number of hex digits (either case, no separators). Empty text is an
    /// empty array; anything else is nil.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        let utf8 = text.utf8
        guard utf8.count % 2 == 0 else { return nil }
        var bytes = [UInt8]()
        bytes.reserveCapacity(utf8.count / 2)
        var high: UInt8? = nil
        for c in utf8 {
            guard let v = value(c) else { return nil }
            if let h = high {
                bytes.append(h << 4 | v)
                high = nil
            } else {
                high = v
            }
        }
        return bytes
    }
}
