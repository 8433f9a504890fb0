// Shared plumbing of the operational commands (status, list, show, retry, purge, tokens,
// credentials, backup, send-test, check-config): typed option helpers on top of Arguments.swift,
// the database a command works on, and output (aligned tables, JSON, durations, truncated tokens).
import Basics
import Foundation
import RelayCore

extension ParsedArguments {
    /// A duration option ("90s", "15m", "2h", "7d", "1h30m") in milliseconds.
    func optionalDuration(_ name: String) throws -> Int64? {
        guard let raw = optionalString(name) else { return nil }
        guard let ms = parseDurationMillis(raw), ms > 0 else {
            throw UsageError("--\(name): expected a duration like 90s, 15m, 2h, 7d or 1h30m, got '\(raw)'")
        }
        return ms
    }

    func optionalInt(_ name: String, in range: ClosedRange<Int>) throws -> Int? {
        optionalString(name) == nil ? nil : try int(name, in: range)
    }

    /// The single positional of a command declaring exactly one.
    var argument: String { positionals[0] }
}

/// Writes command output that already ends in a newline (Console.out adds one).
func emit(_ console: Console, _ text: String) {
    console.out(text.hasSuffix("\n") ? String(text.dropLast()) : text)
}

/// "90s", "15m", "2h", "7d", "1h30m", "500ms" -> milliseconds. Nil for anything else.
func parseDurationMillis(_ text: String) -> Int64? {
    // "ms" before "m" and "s": the first matching suffix wins.
    let units: [(String, Int64)] = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000), ("w", 604_800_000)]
    var rest = Substring(text)
    var total: Int64 = 0
    guard !rest.isEmpty else { return nil }
    while !rest.isEmpty {
        let digits = rest.prefix { $0.isASCII && $0.isNumber }
        guard !digits.isEmpty, let n = Int64(digits) else { return nil }
        rest = rest.dropFirst(digits.count)
        guard let (suffix, factor) = units.first(where: { rest.hasPrefix($0.0) }) else { return nil }
        rest = rest.dropFirst(suffix.count)
        let (product, overflow1) = n.multipliedReportingOverflow(by: factor)
        let (sum, overflow2) = total.addingReportingOverflow(product)
        guard !overflow1, !overflow2 else { return nil }
        total = sum
    }
    return total
}

/// Compact human duration: "0s", "42s", "3m12s", "5h03m", "2d04h".
func formatDuration(millis: Int64) -> String {
    let s = max(0, millis / 1000)
    switch s {
    case ..<60: return "\(s)s"
    case ..<3600: return "\(s / 60)m\(String(format: "%02d", s % 60))s"
    case ..<86400: return "\(s / 3600)h\(String(format: "%02d", (s % 3600) / 60))m"
    default: return "\(s / 86400)d\(String(format: "%02d", (s % 86400) / 3600))h"
    }
}

func nowMillis() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded()) }

/// ISO 8601 UTC with milliseconds, for JSON and `show`.
func isoTime(_ millis: Int64) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    formatter.timeZone = TimeZone(identifier: "UTC")
    return formatter.string(from: Date(timeIntervalSince1970: Double(millis) / 1000))
}

/// Push tokens are long and identify a device: tables show the first 8 hex digits.
func truncatedToken(_ token: String) -> String { token.count > 10 ? String(token.prefix(8)) + "…" : token }

func humanBytes(_ n: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(n)
    var unit = 0
    while value >= 1024, unit < units.count - 1 { value /= 1024; unit += 1 }
    return unit == 0 ? "\(n) B" : String(format: "%.1f %@", value, units[unit])
}

/// Columns padded to their widest cell, two spaces apart; `rightAligned` for numbers.
func renderTable(_ header: [String], _ rows: [[String]], rightAligned: Set<Int> = []) -> String {
    var widths = header.map(\.count)
    for row in rows { for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) } }
    func line(_ cells: [String]) -> String {
        var out = ""
        for (i, cell) in cells.enumerated() {
            let pad = String(repeating: " ", count: max(0, widths[i] - cell.count))
            let isLast = i == cells.count - 1
            out += rightAligned.contains(i) ? pad + cell : (isLast ? cell : cell + pad)
            if !isLast { out += "  " }
        }
        return out
    }
    return ([line(header)] + rows.map(line)).joined(separator: "\n") + "\n"
}

/// An optional field of `--json` output written as `null` when absent, never left out: every
/// object of a command has the same keys (docs/relayctl-json.md), so scripts need no "has key" checks.
/// (Synthesized Encodable skips nil optionals; a non-optional wrapper makes it call encode.)
@propertyWrapper
struct Nullable<Value: Encodable>: Encodable {
    var wrappedValue: Value?
    init(wrappedValue: Value?) { self.wrappedValue = wrappedValue }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        if let wrappedValue { try container.encode(wrappedValue) } else { try container.encodeNil() }
    }
}

/// `--json` output: stable key order so scripts and diffs are predictable.
func renderJSON<T: Encodable>(_ value: T) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
    return String(decoding: try encoder.encode(value), as: UTF8.self) + "\n"
}

// MARK: - which database

/// relay-server's default config path; relayctl uses the same so both agree without flags.
let defaultConfigPath = RelayConfig.defaultPath

/// `--config` and `--db`, accepted by every command that reads the database.
let databaseOptionSpecs: [OptionSpec] = [
    .value("config", "file", "relay-server's config, naming the database (default: \(defaultConfigPath)).", required: false),
    .value("db", "path", "The database file, overriding the config (e.g. a backup).", required: false),
]

/// The store a command works on: `--db` (a SQLite file, e.g. a backup) wins; otherwise the
/// config's store (`--config`, default as the server): SQLite or PostgreSQL.
func resolveStore(_ args: ParsedArguments) throws -> RelayConfig.Store {
    if let db = args.optionalString("db") {
        var config = RelayConfig()
        config.store.path = db
        return config.store
    }
    return try loadConfig(args.optionalString("config") ?? defaultConfigPath).store
}

/// Opens the outbox through RelayCore's factory. Read-only commands use a read-only connection
/// (SQLite: WAL reader beside a running relay-server; PostgreSQL: no writes, no migrations).
/// A missing SQLite file is an error, never created: run as root that would leave a root-owned
/// file the service user cannot open.
func openStore(_ location: RelayConfig.Store, readOnly: Bool) throws -> any OutboxStore {
    if location.kind == "sqlite" {
        let path = location.path
        guard FileManager.default.fileExists(atPath: path) else {
            throw RuntimeFailure("database \(path) does not exist (start relay-server once to create it, or pass --db)")
        }
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw RuntimeFailure("database \(path) is not readable by this user (run as root or as the service user: sudo -u accessory-relay relayctl ...)")
        }
    }
    do {
        // A writable open migrates, and relayctl must never migrate an SQLite file: not one given
        // by mistake (it would get the relay's tables), not one an older relay-server still runs
        // on (v5 rebuilds `responses` under it). The read-only open refuses any schema version
        // but the current one, so writers go through it first. (PostgreSQL: the first writer
        // creates and migrates the shared schema under its advisory lock, as a node would.)
        if !readOnly && location.kind == "sqlite" {
            try OutboxStores.open(location, readOnly: true).close()
        }
        // Checkpoints are the server's job: see SQLiteStoreOptions.backgroundCheckpoints.
        return try OutboxStores.open(location, readOnly: readOnly, backgroundCheckpoints: false)
    } catch {
        throw RuntimeFailure("cannot open \(OutboxStores.describe(location)): \(error)")
    }
}

func openStore(_ args: ParsedArguments, readOnly: Bool) throws -> any OutboxStore {
    try openStore(try resolveStore(args), readOnly: readOnly)
}

/// Runs a store call, turning store errors into runtime failures with context.
func storeCall<T>(_ what: String, _ body: () throws -> T) throws -> T {
    do { return try body() } catch let error as RuntimeFailure { throw error } catch {
        throw RuntimeFailure("\(what): \(error)")
    }
}

func stateNames() -> String { ResponseState.allCases.map(\.rawValue).joined(separator: "|") }

func parseState(_ raw: String) throws -> ResponseState {
    guard let s = ResponseState(rawValue: raw.lowercased()) else {
        throw UsageError("--state: expected one of \(stateNames()), got '\(raw)'")
    }
    return s
}

