// Argument parsing helpers shared by every relayctl command: options are `--name value`,
// `--name=value` or boolean `--flag`; positionals only where a command declares them
// (`ArgumentSpec`). Typed accessors turn bad values into `UsageError`s that name the option,
// so commands never see unvalidated strings.
import Foundation
import Ratchet

/// Bad invocation: message on stderr, exit 64.
struct UsageError: Error {
    var message: String
    init(_ message: String) { self.message = message }
}

/// The command ran and failed: message on stderr, exit 1.
struct RuntimeFailure: Error {
    var message: String
    init(_ message: String) { self.message = message }
}

struct OptionSpec {
    var name: String              // without the leading "--"
    var valueName: String?        // nil: a boolean flag
    var help: String
    var required: Bool = false

    static func value(_ name: String, _ valueName: String, _ help: String, required: Bool = true) -> OptionSpec {
        OptionSpec(name: name, valueName: valueName, help: help, required: required)
    }
    static func flag(_ name: String, _ help: String) -> OptionSpec {
        OptionSpec(name: name, valueName: nil, help: help)
    }
    static let json = flag("json", "Print one JSON object on stdout instead of text.")
    static let help = OptionSpec(name: "help", valueName: nil, help: "Show help for this command.")

    var helpLabel: String {
        if name == "help" { return "-h, --help" }
        return valueName.map { "--\(name) <\($0)>" } ?? "--\(name)"
    }
    var usageFragment: String { required ? helpLabel : "[\(helpLabel)]" }
}

/// A positional argument, e.g. `show <id>`, `retry <id>...`.
struct ArgumentSpec {
    var name: String
    var help: String
    var required: Bool = true
    /// Takes every remaining positional (only the last spec may).
    var variadic: Bool = false

    var helpLabel: String { "<\(name)>" + (variadic ? "..." : "") }
    var usageFragment: String { required ? helpLabel : "[\(helpLabel)]" }
}

struct ParsedArguments {
    private var values: [String: String] = [:]
    private var flags: Set<String> = []
    /// Positionals in order, already checked against the command's `ArgumentSpec`s.
    private(set) var positionals: [String] = []

    init(_ arguments: [String], options: [OptionSpec], positionals specs: [ArgumentSpec] = []) throws {
        let byName = Dictionary(options.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        var i = 0
        while i < arguments.count {
            let word = arguments[i]
            i += 1
            guard word.hasPrefix("--"), word.count > 2 else {
                let takesMore = specs.last?.variadic == true || positionals.count < specs.count
                guard takesMore, !(word.hasPrefix("-") && word.count > 1) else {
                    throw UsageError(word.hasPrefix("-") ? "unknown option '\(word)'" : "unexpected argument '\(word)'")
                }
                positionals.append(word)
                continue
            }
            var name = String(word.dropFirst(2))
            var inlineValue: String? = nil
            if let eq = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: eq)...])
                name = String(name[..<eq])
            }
            guard let spec = byName[name] else { throw UsageError("unknown option '--\(name)'") }
            guard values[name] == nil, !flags.contains(name) else { throw UsageError("option '--\(name)' given more than once") }
            if spec.valueName == nil {
                guard inlineValue == nil else { throw UsageError("option '--\(name)' takes no value") }
                flags.insert(name)
            } else if let inlineValue {
                values[name] = inlineValue
            } else {
                // "--reason --config x" is a missing value, not the reason "--config" (then "x" a
                // stray argument): a value that looks like an option needs the --name=value form.
                guard i < arguments.count, !arguments[i].hasPrefix("--") else {
                    throw UsageError("option '--\(name)' needs a value <\(spec.valueName!)>")
                }
                values[name] = arguments[i]
                i += 1
            }
        }
        for spec in options where spec.required && values[spec.name] == nil {
            throw UsageError("missing required option '--\(spec.name) <\(spec.valueName ?? "")>'")
        }
        for (i, spec) in specs.enumerated() where spec.required && positionals.count <= i {
            throw UsageError("missing argument \(spec.helpLabel)")
        }
    }

    func flag(_ name: String) -> Bool { flags.contains(name) }

    func string(_ name: String) throws -> String {
        guard let value = values[name] else { throw UsageError("missing required option '--\(name)'") }
        return value
    }

    func optionalString(_ name: String) -> String? { values[name] }

    /// Hex bytes; `length` (in bytes) is enforced when given.
    func hex(_ name: String, length: Int? = nil, allowEmpty: Bool = true) throws -> [UInt8] {
        try parseHex(name, try string(name), length: length, allowEmpty: allowEmpty)
    }

    func optionalHex(_ name: String, length: Int? = nil) throws -> [UInt8]? {
        guard let value = values[name] else { return nil }
        return try parseHex(name, value, length: length, allowEmpty: true)
    }

    private func parseHex(_ name: String, _ value: String, length: Int?, allowEmpty: Bool) throws -> [UInt8] {
        guard let bytes = [UInt8](hex: value) else {
            throw UsageError("--\(name): not hexadecimal (even number of 0-9, a-f digits expected)")
        }
        if let length, bytes.count != length {
            throw UsageError("--\(name): expected \(length * 2) hex digits (\(length) bytes), got \(value.count)")
        }
        if !allowEmpty, bytes.isEmpty { throw UsageError("--\(name): must not be empty") }
        return bytes
    }

    /// A decimal UInt32 (0...4294967295).
    func uint32(_ name: String) throws -> UInt32 {
        let value = try string(name)
        guard !value.isEmpty, value.allSatisfy(\.isASCIIDigit), let n = UInt32(value) else {
            throw UsageError("--\(name): expected a decimal integer 0...\(UInt32.max), got '\(value)'")
        }
        return n
    }

    /// A decimal Int within `range`.
    func int(_ name: String, in range: ClosedRange<Int>) throws -> Int {
        let value = try string(name)
        guard !value.isEmpty, value.allSatisfy(\.isASCIIDigit), let n = Int(value), range.contains(n) else {
            throw UsageError("--\(name): expected a decimal integer \(range.lowerBound)...\(range.upperBound), got '\(value)'")
        }
        return n
    }

    /// Standard base64 (RFC 4648, with padding), as APNs payloads carry it.
    func base64(_ name: String) throws -> [UInt8] {
        let value = try string(name)
        guard let data = Data(base64Encoded: value) else { throw UsageError("--\(name): not valid base64") }
        return [UInt8](data)
    }
}

extension Character {
    var isASCIIDigit: Bool { isASCII && isNumber }
}
