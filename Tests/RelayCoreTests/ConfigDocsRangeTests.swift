// docs/configuration.md states each numeric key's range ("| `dispatch.claimBatch` | `256` |
// 1-10000. ..."); these tests hold the parser to it: a value one step outside either end is
// refused with an error naming that key, and every key the table documents with a numeric
// default states a range.
import Foundation
import Testing
@testable import RelayCore

@Suite struct ConfigDocsRangeTests {
    struct Row { var key: String; var lo: Int64; var hi: Int64 }

    static let doc: String? = {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/configuration.md")
        return try? String(contentsOf: url, encoding: .utf8)
    }()

    /// Rows `| `key` | `default` | lo-hi...` of the reference table (single keys, no `[]`).
    static var rows: [Row] {
        guard let doc else { return [] }
        var out: [Row] = []
        for line in doc.split(separator: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count >= 4, cells[1].hasPrefix("`"), cells[1].hasSuffix("`"), !cells[1].contains(" ") else { continue }
            let key = String(cells[1].dropFirst().dropLast())
            guard !key.contains("[") else { continue }
            let desc = cells[3]
            let lead = desc.prefix { $0.isNumber || $0 == "-" }
            let parts = lead.split(separator: "-")
            guard parts.count == 2, let lo = Int64(parts[0]), let hi = Int64(parts[1]) else { continue }
            out.append(Row(key: key, lo: lo, hi: hi))
        }
        return out
    }

    static let app = #"{"bundleID":"com.example.app","environment":"sandbox","token":{"p8Path":"/k.p8","keyID":"ABC123DEFG","teamID":"DEF123GHIJ"}}"#

    /// A config with `key` set to `value`, inside whatever the key needs (PostgreSQL keys get a
    /// postgres store).
    static func config(_ key: String, _ value: Int64) -> String {
        let path = key.split(separator: ".").map(String.init)
        var json = "\(value)"
        for name in path.dropFirst().reversed() { json = #"{"\#(name)":\#(json)}"# }
        var sections = [#""apps":[\#(app)]"#]
        if path[0] == "store" {
            let postgresOnly = ["leaseSeconds", "maxClockOffsetSeconds", "requestTimeoutMs", "statementTimeoutMs", "lockTimeoutMs",
                                "idleInTransactionTimeoutMs", "tcpUserTimeoutMs"]
            let inner = String(json.dropFirst().dropLast())   // "name":value
            sections.append(postgresOnly.contains(path[1])
                            ? #""store":{"kind":"postgres","url":"postgresql://db/relay",\#(inner)}"#
                            : #""store":{\#(inner)}"#)
        } else {
            sections.append(#""\#(path[0])":\#(json)"#)
        }
        return "{" + sections.joined(separator: ",") + "}"
    }

    static func refusal(_ key: String, _ value: Int64) -> ConfigError? {
        do {
            _ = try RelayConfig.parse(Array(config(key, value).utf8), baseDirectory: "/etc/relay")
            return nil
        } catch {
            return error as? ConfigError
        }
    }

    @Test func everyDocumentedRangeIsTheParsersRange() throws {
        guard Self.doc != nil else { Issue.record("docs/configuration.md not found"); return }
        let rows = Self.rows
        #expect(rows.count >= 30, "ranges found in docs/configuration.md: \(rows.map(\.key))")
        for row in rows {
            for outside in [row.lo - 1, row.hi + 1] {
                let e = Self.refusal(row.key, outside)
                #expect(e?.key == row.key, "\(row.key) = \(outside) (documented \(row.lo)-\(row.hi)): \(e.map { "\($0)" } ?? "accepted")")
            }
            // Inside the range, no range error for this key (other keys' rules may still object:
            // a lease shorter than the APNs client's hold, a cap below its base).
            for inside in [row.lo, row.hi] {
                if let e = Self.refusal(row.key, inside), e.key == row.key {
                    // The reader's own range messages ("must be an integer in 1...64", "must be
                    // at most N", "must be a non-negative integer").
                    let rangeError = e.message.hasPrefix("must be an integer in") || e.message.hasPrefix("must be at most")
                        || e.message.hasPrefix("must be a non-negative")
                    #expect(!rangeError, "\(row.key) = \(inside) is inside the documented \(row.lo)-\(row.hi) but refused: \(e)")
                }
            }
        }
    }

    /// A row whose default is a plain number states its range.
    @Test func everyNumericKeyStatesItsRange() throws {
        guard let doc = Self.doc else { Issue.record("docs/configuration.md not found"); return }
        let documented = Set(Self.rows.map(\.key))
        var missing: [String] = []
        for line in doc.split(separator: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count >= 4, cells[1].hasPrefix("`"), !cells[1].contains(" "), !cells[1].contains("[") else { continue }
            let key = String(cells[1].dropFirst().dropLast())
            let def = cells[2].split(separator: " ").first.map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "`")) } ?? ""
            if Int64(def) != nil, !documented.contains(key) { missing.append(key) }
        }
        #expect(missing.isEmpty, "numeric keys without a stated range in docs/configuration.md: \(missing)")
    }
}
