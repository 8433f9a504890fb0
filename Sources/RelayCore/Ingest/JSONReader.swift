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
