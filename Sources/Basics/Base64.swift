// RFC 4648 base64: standard (section 4) and URL-safe (section 5) alphabets, padding chosen by
// the caller (APNs payloads carry padded standard base64; JWS and credential secrets unpadded
// base64url).

public enum Base64 {
    public enum Alphabet: Sendable {
        case standard  // + /
        case url       // - _
    }

    private static let standardDigits: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    private static let urlDigits: StaticString = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

    /// Length of the encoding of `count` bytes.
    public static func encodedCount(_ count: Int, padding: Bool) -> Int {
        padding ? (count + 2) / 3 * 4 : (count * 4 + 2) / 3
    }

    /// Appends the encoding of `bytes` to `out`, no line breaks.
    public static func append(_ bytes: [UInt8], to out: inout [UInt8], alphabet: Alphabet = .standard, padding: Bool = true) {
        let n = bytes.count
        let encoded = encodedCount(n, padding: padding)
        let start = out.count
        // Grow once, then write through pointers, not element-wise appends: PushClient runs
        // this for every push.
        out.append(contentsOf: repeatElement(0, count: encoded))
        let a = (alphabet == .standard ? standardDigits : urlDigits).utf8Start
        let pad = UInt8(ascii: "=")
        bytes.withUnsafeBufferPointer { src in
            out.withUnsafeMutableBufferPointer { dst in
                var i = 0, o = start
                while i + 3 <= n {
                    let v = UInt32(src[i]) << 16 | UInt32(src[i + 1]) << 8 | UInt32(src[i + 2])
                    dst[o] = a[Int(v >> 18)]; dst[o + 1] = a[Int((v >> 12) & 63)]
                    dst[o + 2] = a[Int((v >> 6) & 63)]; dst[o + 3] = a[Int(v & 63)]
                    i += 3; o += 4
                }
                if n - i == 1 {
                    let v = UInt32(src[i]) << 16
                    dst[o] = a[Int(v >> 18)]; dst[o + 1] = a[Int((v >> 12) & 63)]
                    if padding { dst[o + 2] = pad; dst[o + 3] = pad }
                } else if n - i == 2 {
                    let v = UInt32(src[i]) << 16 | UInt32(src[i + 1]) << 8
                    dst[o] = a[Int(v >> 18)]; dst[o + 1] = a[Int((v >> 12) & 63)]
                    dst[o + 2] = a[Int((v >> 6) & 63)]
                    if padding { dst[o + 3] = pad }
                }
            }
        }
    }

    public static func encode(_ bytes: [UInt8], alphabet: Alphabet = .standard, padding: Bool = true) -> String {
        var out = [UInt8]()
        append(bytes, to: &out, alphabet: alphabet, padding: padding)
        return String(decoding: out, as: UTF8.self)
    }

    /// Strict, canonical decoding: only `alphabet`'s digits, no whitespace, padding required
    /// (`padding: true`, length a multiple of 4) or forbidden (`padding: false`), and unused
    /// trailing bits zero, so one byte string has one spelling. Nil otherwise.
    public static func decode(_ text: some StringProtocol, alphabet: Alphabet = .standard, padding: Bool = true) -> [UInt8]? {
        var digits = Array(text.utf8)
        if padding {
            guard digits.count % 4 == 0 else { return nil }
            var pads = 0
            while pads < 2, digits.last == UInt8(ascii: "=") { digits.removeLast(); pads += 1 }
            // A third "=" (or one in the middle) fails the digit check below.
        }
        let rest = digits.count % 4
        guard rest != 1 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(digits.count * 3 / 4)
        var acc: UInt32 = 0, bits = 0
        for c in digits {
            guard let v = value(c, alphabet) else { return nil }
            acc = acc << 6 | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
                acc &= (1 << UInt32(bits)) - 1
            }
        }
        guard acc == 0 else { return nil }  // non-zero unused bits: not canonical
        return out
    }

    @inline(__always)
    private static func value(_ c: UInt8, _ alphabet: Alphabet) -> UInt8? {
        switch c {
        case 0x41...0x5A: return c - 0x41
        case 0x61...0x7A: return c - 0x61 + 26
        case 0x30...0x39: return c - 0x30 + 52
        case UInt8(ascii: "+") where alphabet == .standard, UInt8(ascii: "-") where alphabet == .url: return 62
        case UInt8(ascii: "/") where alphabet == .standard, UInt8(ascii: "_") where alphabet == .url: return 63
        default: return nil
        }
    }
}
