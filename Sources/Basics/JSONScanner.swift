// The RFC 8259 token rules, once, for the JSON readers built on them (RelayCore's ingest
// JSONReader, MockAPNs' PayloadJSON): whitespace, literals, the number grammar, strings with
// their escapes and strict UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
// The readers keep their own grammar above tokens (what they build, how deep they nest).
// @inlinable: the ingest reader calls these per token, across the module boundary.

/// Why the bytes are not JSON, with the byte offset where it went wrong.
public struct JSONScanError: Error, Equatable, Sendable {
    public var message: String
    public init(message: String) { self.message = message }
}

/// A cursor over JSON text. Each read starts at the token's first byte (strings: the opening
/// quote) and leaves `pos` after it.
public struct JSONScanner {
    public let bytes: UnsafeBufferPointer<UInt8>
    public var pos = 0

    @inlinable
    public init(_ bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    @inlinable
    public var atEnd: Bool { pos >= bytes.count }

    @inlinable
    public func peek() -> UInt8? { pos < bytes.count ? bytes[pos] : nil }

    @inlinable
    public mutating func skipWhitespace() {
        while pos < bytes.count {
            switch bytes[pos] {
            case 0x20, 0x09, 0x0A, 0x0D: pos += 1
            default: return
            }
        }
    }

    /// "unexpected end of JSON (what)" at the end, else "invalid JSON at byte N: what".
    @inlinable
    public func fail(_ what: String) -> JSONScanError {
        JSONScanError(message: pos >= bytes.count ? "unexpected end of JSON (\(what))" : "invalid JSON at byte \(pos): \(what)")
    }

    /// Skips whitespace, then consumes `c` or fails with `what`.
    @inlinable
    public mutating func expect(_ c: UInt8, _ what: String) throws(JSONScanError) {
        skipWhitespace()
        guard peek() == c else { throw fail(what) }
        pos += 1
    }

    /// `true`, `false` or `null`, spelled out exactly.
    @inlinable
    public mutating func literal(_ word: StaticString) throws(JSONScanError) {
        let n = word.utf8CodeUnitCount
        guard pos + n <= bytes.count else { throw fail("truncated literal") }
        for i in 0..<n where bytes[pos + i] != word.utf8Start[i] { throw fail("invalid literal") }
        pos += n
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`; returns the literal's range.
    @inlinable
    public mutating func number() throws(JSONScanError) -> Range<Int> {
        let start = pos
        @inline(__always) func digit(_ b: UInt8?) -> Bool { b.map { $0 >= 0x30 && $0 <= 0x39 } ?? false }
        if peek() == UInt8(ascii: "-") { pos += 1 }
        guard let first = peek(), digit(first) else { throw fail("invalid number") }
        if first == UInt8(ascii: "0") {
            pos += 1
            if digit(peek()) { throw fail("leading zero in number") }
        } else {
            while digit(peek()) { pos += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            pos += 1
            guard digit(peek()) else { throw fail("invalid fraction") }
            while digit(peek()) { pos += 1 }
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            pos += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { pos += 1 }
            guard digit(peek()) else { throw fail("invalid exponent") }
            while digit(peek()) { pos += 1 }
        }
        return start..<pos
    }

    /// A string token, at its opening quote: escapes decoded, control characters refused,
    /// UTF-8 validated.
    @inlinable
    public mutating func string() throws(JSONScanError) -> String {
        pos += 1  // opening quote
        let start = pos
        // Fast path: printable ASCII without escapes.
        while pos < bytes.count {
            let b = bytes[pos]
            if b == UInt8(ascii: "\"") {
                let s = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<pos]), as: UTF8.self)
                pos += 1
                return s
            }
            if b == UInt8(ascii: "\\") || b < 0x20 || b >= 0x80 { break }
            pos += 1
        }
        return try slowString(from: start)
    }

    /// The rest of a string with escapes or non-ASCII bytes, `start` at its first content byte.
    @usableFromInline
    mutating func slowString(from start: Int) throws(JSONScanError) -> String {
        var out: [UInt8] = Array(bytes[start..<pos])
        while true {
            guard pos < bytes.count else { throw fail("unterminated string") }
            let b = bytes[pos]
            if b == UInt8(ascii: "\"") { pos += 1; break }
            if b < 0x20 { throw fail("control character in string") }
            if b == UInt8(ascii: "\\") {
                pos += 1
                guard pos < bytes.count else { throw fail("unterminated escape") }
                let e = bytes[pos]
                pos += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if scalar >= 0xD800 && scalar <= 0xDBFF {
                        guard pos + 2 <= bytes.count, bytes[pos] == UInt8(ascii: "\\"), bytes[pos + 1] == UInt8(ascii: "u") else {
                            throw fail("unpaired surrogate escape")
                        }
                        pos += 2
                        let low = try hex4()
                        guard low >= 0xDC00 && low <= 0xDFFF else { throw fail("unpaired surrogate escape") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if scalar >= 0xDC00 && scalar <= 0xDFFF {
                        throw fail("unpaired surrogate escape")
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw fail("invalid \\u escape") }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                default: throw fail("invalid escape")
                }
                continue
            }
            if b < 0x80 { out.append(b); pos += 1; continue }
            // Multi-byte UTF-8 sequence, validated per RFC 3629 table 3-7.
            let len: Int
            var lo: UInt8 = 0x80, hi: UInt8 = 0xBF
            switch b {
            case 0xC2...0xDF: len = 2
            case 0xE0: len = 3; lo = 0xA0
            case 0xE1...0xEC, 0xEE...0xEF: len = 3
            case 0xED: len = 3; hi = 0x9F
            case 0xF0: len = 4; lo = 0x90
            case 0xF1...0xF3: len = 4
            case 0xF4: len = 4; hi = 0x8F
            default: throw JSONScanError(message: "invalid UTF-8 at byte \(pos)")
            }
            guard pos + len <= bytes.count else { throw JSONScanError(message: "invalid UTF-8 at byte \(pos)") }
            for i in 1..<len {
                let c = bytes[pos + i]
                let (l, h): (UInt8, UInt8) = i == 1 ? (lo, hi) : (0x80, 0xBF)
                guard c >= l && c <= h else { throw JSONScanError(message: "invalid UTF-8 at byte \(pos)") }
            }
            out.append(contentsOf: bytes[pos..<pos + len])
            pos += len
        }
        return String(decoding: out, as: UTF8.self)
    }

    @usableFromInline
    mutating func hex4() throws(JSONScanError) -> UInt32 {
        guard pos + 4 <= bytes.count else { throw fail("truncated \\u escape") }
        var v: UInt32 = 0
        for i in 0..<4 {
            guard let h = Hex.value(bytes[pos + i]) else { throw fail("invalid \\u escape") }
            v = v << 4 | UInt32(h)
        }
        pos += 4
        return v
    }
}
