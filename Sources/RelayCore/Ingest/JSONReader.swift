// A small strict JSON reader for ingest bodies: RFC 8259 grammar (tokens: Basics.JSONScanner),
// nesting bounded, duplicate keys reported. It reads one top-level object and keeps scalar
// members; nested values are syntax-checked and reported as `.nested` without being
// materialised. Faster than JSONSerialization for these small flat bodies and never
// recursion-unbounded.

import Basics

enum JSONMember: Equatable {
    case string(String)
    /// The number's literal text (grammar-checked).
    case number(String)
    case bool(Bool)
    case null
    case nested
}

struct JSONReader {
    static let maxDepth = 16

    /// Parses `bytes` as a JSON object. Members in order; duplicate keys are kept for the caller
    /// to reject.
    static func readObject(_ bytes: [UInt8]) throws(JSONScanError) -> [(String, JSONMember)] {
        try bytes.withUnsafeBufferPointer { buffer throws(JSONScanError) in
            var r = JSONReader(scanner: JSONScanner(buffer))
            r.scanner.skipWhitespace()
            guard r.scanner.peek() == UInt8(ascii: "{") else { throw JSONScanError(message: "body must be a JSON object") }
            let members = try r.object(depth: 1, keep: true)
            r.scanner.skipWhitespace()
            guard r.scanner.atEnd else { throw JSONScanError(message: "unexpected data after the JSON object at byte \(r.scanner.pos)") }
            return members
        }
    }

    private var scanner: JSONScanner

    private init(scanner: JSONScanner) { self.scanner = scanner }

    private mutating func object(depth: Int, keep: Bool) throws(JSONScanError) -> [(String, JSONMember)] {
        guard depth <= Self.maxDepth else { throw JSONScanError(message: "JSON nested deeper than \(Self.maxDepth) levels") }
        scanner.pos += 1  // '{'
        var members: [(String, JSONMember)] = []
        scanner.skipWhitespace()
        if scanner.peek() == UInt8(ascii: "}") { scanner.pos += 1; return members }
        while true {
            scanner.skipWhitespace()
            guard scanner.peek() == UInt8(ascii: "\"") else { throw scanner.fail("expected a member name string") }
            let key = try scanner.string()
            try scanner.expect(UInt8(ascii: ":"), "expected ':' after member name")
            let value = try value(depth: depth)
            if keep { members.append((key, value)) }
            scanner.skipWhitespace()
            guard let c = scanner.peek() else { throw scanner.fail("unterminated object") }
            if c == UInt8(ascii: ",") { scanner.pos += 1; continue }
            if c == UInt8(ascii: "}") { scanner.pos += 1; return members }
            throw scanner.fail("expected ',' or '}'")
        }
    }

    private mutating func array(depth: Int) throws(JSONScanError) {
        guard depth <= Self.maxDepth else { throw JSONScanError(message: "JSON nested deeper than \(Self.maxDepth) levels") }
        scanner.pos += 1  // '['
        scanner.skipWhitespace()
        if scanner.peek() == UInt8(ascii: "]") { scanner.pos += 1; return }
        while true {
            _ = try value(depth: depth)
            scanner.skipWhitespace()
            guard let c = scanner.peek() else { throw scanner.fail("unterminated array") }
            if c == UInt8(ascii: ",") { scanner.pos += 1; continue }
            if c == UInt8(ascii: "]") { scanner.pos += 1; return }
            throw scanner.fail("expected ',' or ']'")
        }
    }

    private mutating func value(depth: Int) throws(JSONScanError) -> JSONMember {
        scanner.skipWhitespace()
        guard let c = scanner.peek() else { throw scanner.fail("expected a value") }
        switch c {
        case UInt8(ascii: "\""): return .string(try scanner.string())
        case UInt8(ascii: "{"): _ = try object(depth: depth + 1, keep: false); return .nested
        case UInt8(ascii: "["): try array(depth: depth + 1); return .nested
        case UInt8(ascii: "t"): try scanner.literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try scanner.literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try scanner.literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            let range = try scanner.number()
            return .number(String(decoding: UnsafeBufferPointer(rebasing: scanner.bytes[range]), as: UTF8.self))
        default: throw scanner.fail("unexpected character")
        }
    }
}

/// Strict standard base64 (RFC 4648 section 4, padding required, no whitespace).
// Kept beside Basics.Base64: table-driven on the ingest hot path; it accepts non-zero unused
// trailing bits, Basics.Base64.decode does not.
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
