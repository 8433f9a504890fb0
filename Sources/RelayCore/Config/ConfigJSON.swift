// The configuration file as JSON: any value kept as it was written (ConfigJSON), the reader that
// walks it naming each key path in errors (ConfigReader), members named twice, and the decoder's
// error text. RelayConfig.swift turns these into settings.
import Basics
import FoundationEssentials

extension RelayConfig {
    /// The key path of the first member named twice in one object ("listen", "apps[0].token"),
    /// nil if none. JSONDecoder keeps the last silently, so a block pasted and edited in the
    /// wrong place would win unnoticed. `_` comment keys may repeat. Only called on bytes
    /// JSONDecoder accepted (so nesting is balanced and bounded).
    static func firstDuplicateKey(_ bytes: [UInt8]) -> String? {
        struct Frame {
            var isObject: Bool
            var path: String
            var keys: Set<String> = []
            var key = ""
            var expectingKey = true
            var index = 0
        }
        var stack: [Frame] = []
        func childPath() -> String {
            guard let top = stack.last else { return "" }
            if top.isObject { return top.path.isEmpty ? top.key : "\(top.path).\(top.key)" }
            return "\(top.path)[\(top.index)]"
        }
        return bytes.withUnsafeBufferPointer { buffer -> String? in
            var i = 0
            while i < bytes.count {
                switch bytes[i] {
                case UInt8(ascii: "\""):
                    // Decoded, so an escaped spelling of a name is the same name.
                    var token = JSONScanner(buffer)
                    token.pos = i
                    let name = (try? token.string()) ?? ""
                    let end = token.pos - 1  // the closing quote
                    if let top = stack.last, top.isObject, top.expectingKey {
                        if !name.hasPrefix("_") && !stack[stack.count - 1].keys.insert(name).inserted {
                            return top.path.isEmpty ? name : "\(top.path).\(name)"
                        }
                        stack[stack.count - 1].key = name
                        stack[stack.count - 1].expectingKey = false
                    }
                    i = end
                case UInt8(ascii: "{"): stack.append(Frame(isObject: true, path: childPath()))
                case UInt8(ascii: "["): stack.append(Frame(isObject: false, path: childPath()))
                case UInt8(ascii: "}"), UInt8(ascii: "]"): if !stack.isEmpty { stack.removeLast() }
                case UInt8(ascii: ","):
                    if !stack.isEmpty {
                        if stack[stack.count - 1].isObject { stack[stack.count - 1].expectingKey = true } else { stack[stack.count - 1].index += 1 }
                    }
                default: break
                }
                i += 1
            }
            return nil
        }
    }

    /// DecodingError's text without Foundation's NSError plumbing: the parser's own message
    /// (it names the line and column) when there is one.
    static func describe(_ error: any Error) -> String {
        guard case DecodingError.dataCorrupted(let context) = error else { return "\(error)" }
        if let underlying = context.underlyingError { return "\(underlying)" }
        return context.debugDescription
    }
}

/// Any JSON value, decoded with FoundationEssentials' JSONDecoder (the relay does not link
/// Foundation's JSONSerialization). Booleans and numbers stay distinct: `1` is not `true`.
enum ConfigJSON: Decodable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([ConfigJSON])
    case object([String: ConfigJSON])

    init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null; return }
        if let b = try? c.decode(Bool.self) { self = .bool(b); return }
        if let d = try? c.decode(Double.self) { self = .number(d); return }
        if let s = try? c.decode(String.self) { self = .string(s); return }
        if let a = try? c.decode([ConfigJSON].self) { self = .array(a); return }
        self = .object(try c.decode([String: ConfigJSON].self))
    }
}

/// Walks the parsed JSON, remembering the key path for error messages.
struct ConfigReader {
    let value: ConfigJSON
    let path: String
    let base: String
    var dict: [String: ConfigJSON] = [:]

    init(_ value: ConfigJSON, path: String, base: String) {
        self.value = value
        self.path = path
        self.base = base
    }

    func key(_ k: String) -> String { path.isEmpty ? k : "\(path).\(k)" }

    func resolve(_ p: String) -> String {
        if p.hasPrefix("/") || base.isEmpty { return p }
        return base.hasSuffix("/") ? base + p : base + "/" + p
    }

    mutating func object(allowed: Set<String>) throws {
        guard case .object(let d) = value else { throw ConfigError(key: path.isEmpty ? "(root)" : path, message: "must be an object") }
        for k in d.keys where !k.hasPrefix("_") && !allowed.contains(k) {
            throw ConfigError(key: key(k), message: "unknown key (allowed: \(allowed.sorted().joined(separator: ", ")))")
        }
        dict = d
    }

    func raw(_ k: String) -> ConfigJSON? {
        guard let v = dict[k] else { return nil }
        if case .null = v { return nil }
        return v
    }

    func child(_ k: String) throws -> ConfigReader? {
        guard let v = raw(k) else { return nil }
        return ConfigReader(v, path: key(k), base: base)
    }

    func array(_ k: String) throws -> [ConfigReader]? {
        guard let v = raw(k) else { return nil }
        guard case .array(let a) = v else { throw ConfigError(key: key(k), message: "must be an array") }
        return a.enumerated().map { ConfigReader($0.element, path: "\(key(k))[\($0.offset)]", base: base) }
    }

    func string(_ k: String) throws -> String? {
        guard let v = raw(k) else { return nil }
        guard case .string(let s) = v else { throw ConfigError(key: key(k), message: "must be a string") }
        return s
    }

    func path(_ k: String) throws -> String? {
        guard let s = try string(k) else { return nil }
        guard !s.isEmpty else { throw ConfigError(key: key(k), message: "must not be empty") }
        return resolve(s)
    }

    func bool(_ k: String) throws -> Bool? {
        guard let v = raw(k) else { return nil }
        guard case .bool(let b) = v else { throw ConfigError(key: key(k), message: "must be true or false") }
        return b
    }

    func int(_ k: String, _ range: ClosedRange<Int>) throws -> Int? {
        guard let v = raw(k) else { return nil }
        guard case .number(let n) = v, let i = Int(exactly: n) else {
            throw ConfigError(key: key(k), message: "must be an integer in \(range.lowerBound)...\(range.upperBound)")
        }
        guard range.contains(i) else { throw ConfigError(key: key(k), message: "must be an integer in \(range.lowerBound)...\(range.upperBound)") }
        return i
    }

    /// An integer >= 0 (0 usually meaning "off" or "forever"), at most `max`.
    func nonNegative(_ k: String, max: Int64) throws -> Int64? {
        guard let v = raw(k) else { return nil }
        guard case .number(let n) = v, let i = Int64(exactly: n), i >= 0 else {
            throw ConfigError(key: key(k), message: "must be a non-negative integer")
        }
        guard i <= max else { throw ConfigError(key: key(k), message: "must be at most \(max)") }
        return i
    }

    func double(_ k: String, _ range: ClosedRange<Double>) throws -> Double? {
        guard let v = raw(k) else { return nil }
        guard case .number(let d) = v else { throw ConfigError(key: key(k), message: "must be a number") }
        guard range.contains(d) else { throw ConfigError(key: key(k), message: "must be in \(range.lowerBound)...\(range.upperBound)") }
        return d
    }
}
