// UUID text (RFC 9562 8-4-4-4-12) without Foundation's formatter and parser, which go through
// sscanf and were a large share of every ingest.

public enum UUIDText {
    /// 8-4-4-4-12 text of 16 bytes (lowercase unless `uppercase`).
    public static func format(_ b: [UInt8], uppercase: Bool = false) -> String {
        precondition(b.count == 16)
        return b.withUnsafeBytes { format(bytes: $0, uppercase: uppercase) }
    }

    /// 8-4-4-4-12 text of the 16 bytes at `raw` (e.g. `withUnsafeBytes(of: uuid.uuid)`).
    public static func format(bytes raw: UnsafeRawBufferPointer, uppercase: Bool = false) -> String {
        precondition(raw.count == 16)
        var high: UInt64 = 0, low: UInt64 = 0
        for i in 0..<8 {
            high = high << 8 | UInt64(raw[i])
            low = low << 8 | UInt64(raw[i + 8])
        }
        return format(high: high, low: low, uppercase: uppercase)
    }

    /// 8-4-4-4-12 text of a UUID given as its big-endian high and low 64 bits, formatted
    /// straight into the String (no byte arrays).
    public static func format(high: UInt64, low: UInt64, uppercase: Bool = false) -> String {
        String(unsafeUninitializedCapacity: 36) { out in
            let digits: StaticString = uppercase ? "0123456789ABCDEF" : "0123456789abcdef"
            let d = digits.utf8Start
            var o = 0
            for k in 0..<32 {
                if k == 8 || k == 12 || k == 16 || k == 20 {
                    out[o] = UInt8(ascii: "-")
                    o += 1
                }
                let word = k < 16 ? high : low
                let shift = UInt64(60 - 4 * (k % 16))
                out[o] = d[Int((word >> shift) & 0xf)]
                o += 1
            }
            return 36
        }
    }

    /// True for 8-4-4-4-12 hex digits (either case), nothing around them.
    public static func isCanonical(_ s: some StringProtocol) -> Bool {
        let u = s.utf8
        guard u.count == 36 else { return false }
        for (i, b) in u.enumerated() {
            if i == 8 || i == 13 || i == 18 || i == 23 { if b != 0x2D { return false } } else if !Hex.isDigit(b) { return false }
        }
        return true
    }

    /// The 16 bytes of an 8-4-4-4-12 hex UUID (either case), or nil.
    public static func parse(_ s: String) -> [UInt8]? {
        var s = s
        return s.withUTF8 { parse($0) }
    }

    public static func parse(_ utf8: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: 16)
        let ok = out.withUnsafeMutableBytes { parse(utf8, into: $0) }
        return ok ? out : nil
    }

    /// The first 8 bytes of an 8-4-4-4-12 hex UUID (either case) read big-endian, as a signed
    /// bit pattern (the relay's SQLite rowid of the response with this id). Nil when the text is
    /// not a UUID.
    public static func high64(_ s: String) -> Int64? {
        var s = s
        return s.withUTF8 { high64($0) }
    }

    public static func high64(_ utf8: UnsafeBufferPointer<UInt8>) -> Int64? {
        var t: (UInt64, UInt64) = (0, 0)
        return withUnsafeMutableBytes(of: &t) { b -> Int64? in
            guard parse(utf8, into: b) else { return nil }
            var h: UInt64 = 0
            for i in 0..<8 { h = h << 8 | UInt64(b[i]) }
            return Int64(bitPattern: h)
        }
    }

    /// Writes the 16 bytes of an 8-4-4-4-12 hex UUID (either case) into `out` (16 bytes);
    /// false, with `out` unspecified, when the text is not one.
    public static func parse(_ utf8: UnsafeBufferPointer<UInt8>, into out: UnsafeMutableRawBufferPointer) -> Bool {
        guard utf8.count == 36, out.count == 16 else { return false }
        var o = 0
        var i = 0
        while i < 36 {
            if i == 8 || i == 13 || i == 18 || i == 23 {
                guard utf8[i] == UInt8(ascii: "-") else { return false }
                i += 1
                continue
            }
            guard let h = Hex.value(utf8[i]), let l = Hex.value(utf8[i + 1]) else { return false }
            out[o] = h << 4 | l
            o += 1
            i += 2
        }
        return true
    }

    /// 8-4-4-4-12 hex digits (either case) as the canonical uppercase String, or nil: the same
    /// rule as `parse` followed by `format(uppercase: true)`, in one pass with no byte array
    /// (the ingest path runs it for every request).
    public static func canonicalUppercase(_ utf8: UnsafeBufferPointer<UInt8>) -> String? {
        guard utf8.count == 36, let p = utf8.baseAddress else { return nil }
        var ok = true
        let s = String(unsafeUninitializedCapacity: 36) { out in
            for k in 0..<36 {
                let b = p[k]
                if k == 8 || k == 13 || k == 18 || k == 23 {
                    guard b == UInt8(ascii: "-") else { ok = false; return 0 }
                    out[k] = b
                    continue
                }
                let upper = b & 0xDF   // maps a-f to A-F
                guard b &- 0x30 < 10 || upper &- 0x41 < 6 else { ok = false; return 0 }
                out[k] = b &- 0x30 < 10 ? b : upper
            }
            return 36
        }
        return ok ? s : nil
    }
}
