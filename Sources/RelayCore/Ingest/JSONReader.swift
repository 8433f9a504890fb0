// A small strict JSON reader for ingest bodies: RFC 8259 grammar, UTF-8 validated, nesting
// bounded, duplicate keys reported. It reads one top-level object and keeps scalar members;
// nested values are syntax-checked and reported as `.nested` without being materialised.
// Faster than JSONSerialization for these small flat bodies and never recursion-unbounded.

import Basics

enum JSONMember: Equatable {
    case string(String)
    /// The number's literal text (grammar-checked).
    case number(String)
    case bool(Bool)
    case null
    case nested
}

struct JSONReadError: Error, Equatable {
    var message: String
}

struct JSONReader {
    static let maxDepth = 16

    /// Parses `bytes` as a JSON object. Members in order; duplicate keys are kept for the caller
    /// to reject.
    static func readObject(_ bytes: [UInt8]) throws(JSONReadError) -> [(String, JSONMember)] {
        var r = JSONReader(bytes: bytes)
        r.skipWhitespace()
        guard r.peek() == UInt8(ascii: "{") else { throw JSONReadError(message: "body must be a JSON object") }
        let members = try r.object(depth: 1, keep: true)
        r.skipWhitespace()
        guard r.pos == bytes.count else { throw JSONReadError(message: "unexpected data after the JSON object at byte \(r.pos)") }
        return members
    }

    private let bytes: [UInt8]
    private var pos = 0

    private init(bytes: [UInt8]) { self.bytes = bytes }

    private func peek() -> UInt8? { pos < bytes.count ? bytes[pos] : nil }

    private mutating func skipWhitespace() {
        while pos < bytes.count {
            switch bytes[pos] {
            case 0x20, 0x09, 0x0A, 0x0D: pos += 1
            default: return
            }
        }
    }

    private func fail(_ what: String) -> JSONReadError {
        JSONReadError(message: pos >= bytes.count ? "unexpected end of JSON (\(what))" : "invalid JSON at byte \(pos): \(what)")
    }

    private mutating func expect(_ c: UInt8, _ what: String) throws(JSONReadError) {
        skipWhitespace()
        guard peek() == c else { throw fail(what) }
        pos += 1
    }

    private mutating func object(depth: Int, keep: Bool) throws(JSONReadError) -> [(String, JSONMember)] {
        guard depth <= Self.maxDepth else { throw JSONReadError(message: "JSON nested deeper than \(Self.maxDepth) levels") }
        pos += 1  // '{'
        var members: [(String, JSONMember)] = []
        skipWhitespace()
        if peek() == UInt8(ascii: "}") { pos += 1; return members }
        while true {
            skipWhitespace()
            guard peek() == UInt8(ascii: "\"") else { throw fail("expected a member name string") }
            let key = try string()
            try expect(UInt8(ascii: ":"), "expected ':' after member name")
            let value = try value(depth: depth)
            if keep { members.append((key, value)) }
            skipWhitespace()
            guard let c = peek() else { throw fail("unterminated object") }
            pos += 1
            if c == UInt8(ascii: ",") { continue }
            if c == UInt8(ascii: "}") { return members }
            pos -= 1
            throw fail("expected ',' or '}'")
        }
    }

    private mutating func array(depth: Int) throws(JSONReadError) {
        guard depth <= Self.maxDepth else { throw JSONReadError(message: "JSON nested deeper than \(Self.maxDepth) levels") }
        pos += 1  // '['
        skipWhitespace()
        if peek() == UInt8(ascii: "]") { pos += 1; return }
        while true {
            _ = try value(depth: depth)
            skipWhitespace()
            guard let c = peek() else { throw fail("unterminated array") }
            pos += 1
            if c == UInt8(ascii: ",") { continue }
            if c == UInt8(ascii: "]") { return }
            pos -= 1
            throw fail("expected ',' or ']'")
        }
    }

    private mutating func value(depth: Int) throws(JSONReadError) -> JSONMember {
        skipWhitespace()
        guard let c = peek() else { throw fail("expected a value") }
        switch c {
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "{"): _ = try object(depth: depth + 1, keep: false); return .nested
        case UInt8(ascii: "["): try array(depth: depth + 1); return .nested
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try number())
        default: throw fail("unexpected character")
        }
    }

    private mutating func literal(_ word: String) throws(JSONReadError) {
        let w = Array(word.utf8)
        let n = w.count
        guard pos + n <= bytes.count else { throw fail("truncated literal") }
        for i in 0..<n where bytes[pos + i] != w[i] { throw fail("invalid literal") }
        pos += n
    }

    private mutating func number() throws(JSONReadError) -> String {
        let start = pos
        func digit(_ b: UInt8?) -> Bool { b.map { $0 >= 0x30 && $0 <= 0x39 } ?? false }
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
        return String(decoding: bytes[start..<pos], as: UTF8.self)
    }

    private static func hexValue(_ b: UInt8) -> UInt32? { Hex.value(b).map(UInt32.init) }

    private mutating func hex4() throws(JSONReadError) -> UInt32 {
        guard pos + 4 <= bytes.count else { throw fail("truncated \\u escape") }
        var v: UInt32 = 0
        for i in 0..<4 {
            guard let h = Self.hexValue(bytes[pos + i]) else { throw fail("invalid \\u escape") }
            v = v << 4 | h
        }
        pos += 4
        return v
    }

    /// A string token; validates UTF-8 (no overlongs, no surrogates, max U+10FFFF) and escapes.
    private mutating func string() throws(JSONReadError) -> String {
        pos += 1  // opening quote
        let start = pos
        // Fast path: printable ASCII without escapes (every field we care about).
        while pos < bytes.count {
            let b = bytes[pos]
            if b == UInt8(ascii: "\"") {
                let s = String(decoding: bytes[start..<pos], as: UTF8.self)
                pos += 1
                return s
            }
            if b == UInt8(ascii: "\\") || b < 0x20 || b >= 0x80 { break }
            pos += 1
        }
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
            default: throw JSONReadError(message: "invalid UTF-8 at byte \(pos)")
            }
            guard pos + len <= bytes.count else { throw JSONReadError(message: "invalid UTF-8 at byte \(pos)") }
            for i in 1..<len {
                let c = bytes[pos + i]
                let (l, h): (UInt8, UInt8) = i == 1 ? (lo, hi) : (0x80, 0xBF)
                guard c >= l && c <= h else { throw JSONReadError(message: "invalid UTF-8 at byte \(pos)") }
            }
            out.append(contentsOf: bytes[pos..<pos + len])
            pos += len
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Strict standard base64 (RFC 4648 section 4, padding required, no whitespace).
// Kept beside Basics.Base64: table-driven on the ingest hot path (docs/benchmarks.md, instructions per response); it accepts non-zero unused trailing bits, Basics.Base64.decode does not.
enum Base64 {
    static func decode(_ s: String) -> [UInt8]? {
        var s = s
        return s.withUTF8 { decode($0) }
    }

    /// 6-bit value per byte, 0xFF for bytes outside the alphabet. Read through one pointer per
    /// `decode` call: indexing the lazily initialised global per character paid a `swift_once`
    /// check each time (~90 per request).
    private static let table: [UInt8] = {
        var t = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8.enumerated() { t[Int(c)] = UInt8(i) }
        return t
    }()

    static func decode(_ b: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        guard b.count % 4 == 0 else { return nil }
        guard let p = b.baseAddress, !b.isEmpty else { return [] }
        let n = b.count
        var pad = 0
        if p[n - 1] == UInt8(ascii: "=") { pad += 1 }
        if p[n - 2] == UInt8(ascii: "=") { pad += 1 }
        // Padding only at the very end: "=" anywhere else fails the value check below.
        let fullQuads = pad == 0 ? n / 4 : n / 4 - 1
        let outCount = n / 4 * 3 - pad
        var ok = true
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
            if pad > 0 {
                let a = value(p[i]), c = value(p[i + 1])
                let d = pad == 1 ? value(p[i + 2]) : 0
                guard a | c | d < 64 else { ok = false; initialized = 0; return }
                let v = a << 18 | c << 12 | d << 6
                o[w] = UInt8(truncatingIfNeeded: v >> 16)
                if pad == 1 { o[w + 1] = UInt8(truncatingIfNeeded: v >> 8) }
            }
            initialized = outCount
        } }
        return ok ? out : nil
    }

    static func encodedLength(_ byteCount: Int) -> Int { (byteCount + 2) / 3 * 4 }
}
