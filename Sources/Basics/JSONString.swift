// JSON string literals (RFC 8259 7): the escapes the relay, relayctl and mock-apns write.

public enum JSONString {
    /// `s` as a quoted literal: `"` and `\` escaped, \n \r \t short forms, other controls below
    /// 0x20 as \u00xx (lowercase hex); everything else, DEL and non-ASCII included, as is.
    public static func quote(_ s: String) -> String {
        var out = [UInt8]()
        out.reserveCapacity(s.utf8.count + 2)
        append(s, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `quote(s)`'s bytes to `o`.
    public static func append(_ s: String, to o: inout [UInt8]) {
        o.append(UInt8(ascii: "\""))
        // Most text (ids, tokens, names) needs no escape: one scan, then one copy instead of a
        // switch and an append per byte.
        let copied = s.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
            guard !bytes.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == 0x5C }) else { return false }
            o.append(contentsOf: bytes)
            return true
        } ?? false
        if !copied { appendEscaped(s, to: &o) }
        o.append(UInt8(ascii: "\""))
    }

    private static func appendEscaped(_ s: String, to o: inout [UInt8]) {
        let hex: StaticString = "0123456789abcdef"
        let d = hex.utf8Start
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "\""): o.append(0x5C); o.append(0x22)
            case 0x5C: o.append(0x5C); o.append(0x5C)
            case 0x0A: o.append(0x5C); o.append(UInt8(ascii: "n"))
            case 0x0D: o.append(0x5C); o.append(UInt8(ascii: "r"))
            case 0x09: o.append(0x5C); o.append(UInt8(ascii: "t"))
            case 0..<0x20: o.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, d[Int(b >> 4)], d[Int(b & 0xF)]])
            default: o.append(b)
            }
        }
    }
}
