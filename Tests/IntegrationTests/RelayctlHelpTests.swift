// Golden `--help` output of relayctl's operational commands, by running the binary. The
// expected texts live in Tests/IntegrationTests/Golden/relayctl-help/; after an intended help
// change, regenerate them with RELAYCTL_UPDATE_GOLDEN=1 and review the diff.
import Foundation
import Testing

@Suite("relayctl --help (golden)")
struct RelayctlHelpTests {
    static let commandPaths: [[String]] = [
        [], ["status"], ["list"], ["show"], ["retry"], ["purge"],
        ["tokens"], ["tokens", "list"], ["tokens", "show"], ["tokens", "forget"],
        ["credentials"], ["credentials", "create"], ["credentials", "list"], ["credentials", "revoke"],
        ["events"], ["events", "list"], ["events", "show"], ["events", "replay"],
        ["backup"], ["check-config"], ["send-test"],
    ]

    static let goldenDirectory = Relayctl.repoRoot.appendingPathComponent("Tests/IntegrationTests/Golden/relayctl-help")

    @Test(arguments: commandPaths)
    func helpMatchesGolden(_ path: [String]) throws {
        let result = try Relayctl.run(path + ["--help"])
        #expect(result.status == 0)
        #expect(result.stderr.isEmpty)
        // `-h` is the same help.
        #expect(try Relayctl.run(path + ["-h"]).stdout == result.stdout)
        let file = Self.goldenDirectory.appendingPathComponent((["relayctl"] + path).joined(separator: "-") + ".txt")
        if ProcessInfo.processInfo.environment["RELAYCTL_UPDATE_GOLDEN"] != nil {
            try FileManager.default.createDirectory(at: Self.goldenDirectory, withIntermediateDirectories: true)
            try result.stdout.write(to: file, atomically: true, encoding: .utf8)
        }
        let expected = try String(contentsOf: file, encoding: .utf8)
        #expect(result.stdout == expected, "relayctl \(path.joined(separator: " ")) --help differs from \(file.lastPathComponent)")
    }

    /// docs/operations.md's command table names every option send-test's help lists (its row
    /// is the only place they are summed up; the other rows leave out --config/--db/--json).
    @Test(arguments: [["send-test"]])
    func theOperationsTableNamesEveryOption(_ path: [String]) throws {
        let help = try Relayctl.run(path + ["--help"]).stdout
        let options = help.split(separator: "\n").compactMap { line -> String? in
            let t = line.drop { $0 == " " }
            guard t.hasPrefix("--"), let name = t.split(separator: " ").first else { return nil }
            return name == "--help" ? nil : String(name)
        }
        #expect(!options.isEmpty)
        let runbook = try String(contentsOf: Relayctl.repoRoot.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        let row = try #require(runbook.split(separator: "\n").first { $0.hasPrefix("| `relayctl \(path.joined(separator: " ")) ") })
        for option in options { #expect(row.contains(option), "docs/operations.md: relayctl \(path.joined(separator: " ")) lacks \(option)") }
    }

    @Test func groupsWithoutASubcommandAreUsageErrors() throws {
        for group in ["tokens", "credentials"] {
            let r = try Relayctl.run([group])
            #expect(r.status == 64)
            #expect(r.stderr.contains("SUBCOMMANDS:"))
            #expect(r.stdout.isEmpty)
        }
        let unknown = try Relayctl.run(["stauts"])
        #expect(unknown.status == 64 && unknown.stderr.contains("unknown command 'stauts'"))
    }
}
