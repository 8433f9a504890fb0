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

    /// What decoding does with the unused low bits of the last digit (RFC 4648 section 3.5).
    public enum TrailingBits: Sendable {
        /// They must be zero, so one byte string has exactly one spelling.
        case mustBeZero
        /// Ignored, as most decoders do: the ingest API has always accepted them.
        case ignored
    }

    /// Strict decoding: only `alphabet`'s digits, no whitespace, padding required (`padding:
    /// true`, length a multiple of 4) or forbidden (`padding: false`), unused trailing bits as
    /// `trailingBits` says. Nil otherwise.
    public static func decode(_ text: some StringProtocol, alphabet: Alphabet = .standard, padding: Bool = true,
                              trailingBits: TrailingBits = .mustBeZero) -> [UInt8]? {
        if let out = text.utf8.withContiguousStorageIfAvailable({
            decode($0, alphabet: alphabet, padding: padding, trailingBits: trailingBits)
        }) {
            return out
        }
        var copy = String(text)
        return copy.withUTF8 { decode($0, alphabet: alphabet, padding: padding, trailingBits: trailingBits) }
    }

    /// The same over bytes (the ingest path decodes straight out of the request body).
    public static func decode(_ b: UnsafeBufferPointer<UInt8>, alphabet: Alphabet = .standard, padding: Bool = true,
                              trailingBits: TrailingBits = .mustBeZero) -> [UInt8]? {
        guard let p = b.baseAddress, !b.isEmpty else { return [] }
        var n = b.count
        if padding {
            guard n % 4 == 0 else { return nil }
            // At most two: a third "=", or one in the middle, fails the digit check below.
            if p[n - 1] == UInt8(ascii: "=") { n -= 1 }
            if p[n - 1] == UInt8(ascii: "=") { n -= 1 }
        }
        let rest = n % 4
        guard rest != 1 else { return nil }
        let fullQuads = n / 4
        let outCount = fullQuads * 3 + (rest == 0 ? 0 : rest - 1)
        var ok = true
        // One pointer per call: indexing the lazily initialised table per digit pays a
        // `swift_once` check each time.
        let table = alphabet == .standard ? standardValues : urlValues
        let out = table.withUnsafeBufferPointer { t in [UInt8](unsafeUninitializedCapacity: outCount) { o, initialized in
            @inline(__always) func value(_ c: UInt8) -> UInt32 { UInt32(t[Int(c)]) }
            var i = 0, w = 0
            for _ in 0..<fullQuads {
                let a = value(p[i]), c = value(p[i + 1]), d = value(p[i + 2]), e = value(p[i + 3])
                guard a | c | d | e < 64 else { ok = false; initialized = 0; return }
                let v = a << 18 | c << 12 | d << 6 | e
                o[w] = UInt8(truncatingIfNeeded: v >> 16)
                o[w + 1] = UInt8(truncatingIfNeeded: v >> 8)
                o[w + 2] = UInt8(truncatingIfNeeded: v)
                i += 4
                w += 3
            }
            if rest > 0 {
                let a = value(p[i]), c = value(p[i + 1])
                let d = rest == 3 ? value(p[i + 2]) : 0
                guard a | c | d < 64 else { ok = false; initialized = 0; return }
                let v = a << 18 | c << 12 | d << 6
                if trailingBits == .mustBeZero {
                    let unused = rest == 2 ? v & 0xFFFF : v & 0xFF
                    guard unused == 0 else { ok = false; initialized = 0; return }
                }
                o[w] = UInt8(truncatingIfNeeded: v >> 16)
                if rest == 3 { o[w + 1] = UInt8(truncatingIfNeeded: v >> 8) }
            }
            initialized = outCount
        } }
        return ok ? out : nil
    }

    /// 6-bit value per byte, 0xFF for bytes outside the alphabet.
    private static let standardValues = valueTable(standardDigits)
    private static let urlValues = valueTable(urlDigits)

    private static func valueTable(_ digits: StaticString) -> [UInt8] {
        var t = [UInt8](repeating: 0xFF, count: 256)
        let d = UnsafeBufferPointer(start: digits.utf8Start, count: digits.utf8CodeUnitCount)
        for (i, c) in d.enumerated() { t[Int(c)] = UInt8(i) }
        return t
    }
}
