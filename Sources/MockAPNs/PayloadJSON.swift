// A small strict JSON reader (RFC 8259; tokens: Basics.JSONScanner) for push payloads.
// Foundation's JSONSerialization was a fifth of the mock's CPU time per request under load;
// payloads are at most 4 KiB and the validator only needs objects and strings, so a direct
// UTF-8 reader is enough and faster.

import Basics

indirect enum PayloadJSON: Equatable {
    case object([(key: String, value: PayloadJSON)])
    case array([PayloadJSON])
    case string(String)
    case number
    case bool(Bool)
    case null

    static func == (lhs: PayloadJSON, rhs: PayloadJSON) -> Bool {
        switch (lhs, rhs) {
        case (.object(let a), .object(let b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.key == $1.key && $0.value == $1.value }
        case (.array(let a), .array(let b)): return a == b
        case (.string(let a), .string(let b)): return a == b
        case (.number, .number), (.null, .null): return true
        case (.bool(let a), .bool(let b)): return a == b
        default: return false
        }
    }

    /// The member of an object (the last one if a key repeats, as JSONSerialization does).
    subscript(key: String) -> PayloadJSON? {
        guard case .object(let members) = self else { return nil }
        return members.last(where: { $0.key == key })?.value
    }

    var objectKeys: [String]? {
        guard case .object(let members) = self else { return nil }
        return members.map(\.key)
    }

    var stringValue: String? {
        guard case .string(let s) = self else { return nil }
        return s
    }

    /// nil for anything that is not exactly one JSON value (surrounding whitespace allowed).
    static func parse(_ bytes: [UInt8]) -> PayloadJSON? {
        bytes.withUnsafeBufferPointer { buffer in
            var reader = Reader(scanner: JSONScanner(buffer))
            guard let value = reader.value(depth: 0) else { return nil }
            reader.scanner.skipWhitespace()
            return reader.scanner.atEnd ? value : nil
        }
    }

    /// The grammar above tokens (Basics.JSONScanner): builds the whole tree, nil on any error.
    private struct Reader {
        var scanner: JSONScanner
        static let maxDepth = 64

        mutating func value(depth: Int) -> PayloadJSON? {
            guard depth < Self.maxDepth else { return nil }
            scanner.skipWhitespace()
            guard let c = scanner.peek() else { return nil }
            switch c {
            case UInt8(ascii: "{"): return object(depth: depth)
            case UInt8(ascii: "["): return array(depth: depth)
            case UInt8(ascii: "\""): return (try? scanner.string()).map(PayloadJSON.string)
            case UInt8(ascii: "t"): return (try? scanner.literal("true")).map { .bool(true) }
            case UInt8(ascii: "f"): return (try? scanner.literal("false")).map { .bool(false) }
            case UInt8(ascii: "n"): return (try? scanner.literal("null")).map { .null }
            default: return (try? scanner.number()).map { _ in .number }
            }
        }

        mutating func object(depth: Int) -> PayloadJSON? {
            scanner.pos += 1
            var members: [(key: String, value: PayloadJSON)] = []
            scanner.skipWhitespace()
            if scanner.peek() == UInt8(ascii: "}") { scanner.pos += 1; return .object(members) }
            while true {
                scanner.skipWhitespace()
                guard scanner.peek() == UInt8(ascii: "\""), let key = try? scanner.string() else { return nil }
                guard (try? scanner.expect(UInt8(ascii: ":"), "")) != nil, let v = value(depth: depth + 1) else { return nil }
                members.append((key, v))
                scanner.skipWhitespace()
                switch scanner.peek() {
                case UInt8(ascii: ","): scanner.pos += 1
                case UInt8(ascii: "}"): scanner.pos += 1; return .object(members)
                default: return nil
                }
            }
        }

        mutating func array(depth: Int) -> PayloadJSON? {
            scanner.pos += 1
            var items: [PayloadJSON] = []
            scanner.skipWhitespace()
            if scanner.peek() == UInt8(ascii: "]") { scanner.pos += 1; return .array(items) }
            while true {
                guard let v = value(depth: depth + 1) else { return nil }
                items.append(v)
                scanner.skipWhitespace()
                switch scanner.peek() {
                case UInt8(ascii: ","): scanner.pos += 1
                case UInt8(ascii: "]"): scanner.pos += 1; return .array(items)
                default: return nil
                }
            }
        }
    }
}
