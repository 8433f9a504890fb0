// A small strict JSON reader (RFC 8259) for push payloads. Foundation's JSONSerialization was a
// fifth of the mock's CPU time per request under load; payloads are at most 4 KiB and the
// validator only needs objects and strings, so a direct UTF-8 reader is enough and faster.

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
            var reader = Reader(bytes: buffer)
            guard let value = reader.value(depth: 0) else { return nil }
            reader.skipWhitespace()
            return reader.index == buffer.count ? value : nil
        }
    }

    private struct Reader {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0
        static let maxDepth = 64

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        mutating func skipWhitespace() {
            while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
        }

        mutating func value(depth: Int) -> PayloadJSON? {
            guard depth < Self.maxDepth else { return nil }
            skipWhitespace()
            guard index < bytes.count else { return nil }
            switch bytes[index] {
            case UInt8(ascii: "{"): return object(depth: depth)
            case UInt8(ascii: "["): return array(depth: depth)
            case UInt8(ascii: "\""): return string().map(PayloadJSON.string)
            case UInt8(ascii: "t"): return literal("true", .bool(true))
            case UInt8(ascii: "f"): return literal("false", .bool(false))
            case UInt8(ascii: "n"): return literal("null", .null)
            default: return number()
            }
        }

        mutating func literal(_ word: StaticString, _ result: PayloadJSON) -> PayloadJSON? {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count else { return nil }
            for i in 0..<count where bytes[index + i] != word.utf8Start[i] { return nil }
            index += count
            return result
        }

        mutating func object(depth: Int) -> PayloadJSON? {
            index += 1
            var members: [(key: String, value: PayloadJSON)] = []
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
            while true {
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\""), let key = string() else { return nil }
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return nil }
                index += 1
                guard let v = value(depth: depth + 1) else { return nil }
                members.append((key, v))
                skipWhitespace()
                guard index < bytes.count else { return nil }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
                return nil
            }
        }

        mutating func array(depth: Int) -> PayloadJSON? {
            index += 1
            var items: [PayloadJSON] = []
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
            while true {
                guard let v = value(depth: depth + 1) else { return nil }
                items.append(v)
                skipWhitespace()
                guard index < bytes.count else { return nil }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
                return nil
            }
        }

        /// At the opening quote. Escapes decoded; control characters and bad UTF-8 refused.
        mutating func string() -> String? {
            index += 1
            let start = index
            // Fast path: no escapes.
            while index < bytes.count {
                let b = bytes[index]
                if b == UInt8(ascii: "\"") {
                    let raw = UnsafeBufferPointer(rebasing: bytes[start..<index])
                    index += 1
                    return String(validating: raw, as: UTF8.self)
                }
                if b == UInt8(ascii: "\\") { break }
                if b < 0x20 { return nil }
                index += 1
            }
            var out = Array(bytes[start..<index])
            while index < bytes.count {
                let b = bytes[index]
                if b == UInt8(ascii: "\"") {
                    index += 1
                    return String(validating: out, as: UTF8.self)
                }
                if b < 0x20 { return nil }
                if b != UInt8(ascii: "\\") { out.append(b); index += 1; continue }
                index += 1
                guard index < bytes.count else { return nil }
                let e = bytes[index]
                index += 1
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
                    guard var scalar = hex4() else { return nil }
                    if (0xD800...0xDBFF).contains(scalar) {
                        // A high surrogate must be followed by an escaped low surrogate.
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else { return nil }
                        index += 2
                        guard let low = hex4(), (0xDC00...0xDFFF).contains(low) else { return nil }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        return nil
                    }
                    guard let u = Unicode.Scalar(scalar) else { return nil }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                default: return nil
                }
            }
            return nil
        }

        mutating func hex4() -> UInt32? {
            guard index + 4 <= bytes.count else { return nil }
            var v: UInt32 = 0
            for _ in 0..<4 {
                guard let d = Hex.value(bytes[index]) else { return nil }
                v = v << 4 | UInt32(d)
                index += 1
            }
            return v
        }

        /// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
        mutating func number() -> PayloadJSON? {
            func digits() -> Int {
                let s = index
                while index < bytes.count, (0x30...0x39).contains(bytes[index]) { index += 1 }
                return index - s
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count else { return nil }
            if bytes[index] == UInt8(ascii: "0") {
                index += 1
            } else {
                guard digits() > 0 else { return nil }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                index += 1
                guard digits() > 0 else { return nil }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { return nil }
            }
            return .number
        }
    }
}
