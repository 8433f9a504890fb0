// The command tree and its dispatcher. To add a command group (`status`, `list`,
// `credentials`, ...): write a `static var <name>: Command` in its own file (see
// RatchetCommands.swift) and append it to `RelayCtl.root.subcommands`. Parsing, `--help` at
// every level and the exit-code policy come from here and Arguments.swift.
import BuildInfo

/// Exit statuses (sysexits.h for usage).
enum ExitStatus {
    static let ok: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 64
}

/// One node of the tree: a group (has subcommands) or a leaf (has `run`).
struct Command {
    var name: String
    /// One line, shown in the parent's list and at the top of `--help`.
    var abstract: String
    /// Optional paragraphs after the usage line.
    var discussion: String = ""
    var options: [OptionSpec] = []
    /// Leaves only: positional arguments, in order.
    var arguments: [ArgumentSpec] = []
    var subcommands: [Command] = []
    /// Leaves only. Throws `UsageError` (exit 64) or `RuntimeFailure` (exit 1).
    var run: ((ParsedArguments, Console) throws -> Void)? = nil

    static func group(_ name: String, _ abstract: String, discussion: String = "", _ subcommands: [Command]) -> Command {
        Command(name: name, abstract: abstract, discussion: discussion, subcommands: subcommands)
    }

    static func leaf(_ name: String, _ abstract: String, discussion: String = "", arguments: [ArgumentSpec] = [],
                     options: [OptionSpec], run: @escaping (ParsedArguments, Console) throws -> Void) -> Command {
        Command(name: name, abstract: abstract, discussion: discussion, options: options + [.json], arguments: arguments, run: run)
    }
}

enum RelayCtl {
    static var root: Command {
        .group("relayctl", "Operate the accessory notification relay and check its cryptography.",
               discussion: "'relayctl --version [--json]' prints the version and the git commit it was built from.", [
            status, list, show, retry, purge, tokens, credentials, events, backup, sendTest, checkConfig,
            ratchet, accessory,
        ])
    }

    /// Runs one invocation and returns the process exit status.
    static func run(_ arguments: [String], console: Console = Console()) -> Int32 {
        var path = [root.name]
        var command = root
        var rest = arguments[...]
        if arguments.first == "--version" {
            return version(Array(arguments.dropFirst()), console: console)
        }
        // Walk down the groups.
        while command.run == nil {
            guard let word = rest.first else {
                console.error(help(for: command, path: path))
                return ExitStatus.usage
            }
            if isHelp(word) || word == "help" {
                console.out(help(for: command, path: path))
                return ExitStatus.ok
            }
            guard let next = command.subcommands.first(where: { $0.name == word }) else {
                let what = word.hasPrefix("-") ? "unknown option '\(word)'" : "unknown command '\(word)'"
                console.error("error: \(what) for '\(path.joined(separator: " "))'\n"
                              + "Run '\(path.joined(separator: " ")) --help' to see the commands.")
                return ExitStatus.usage
            }
            rest = rest.dropFirst()
            path.append(next.name)
            command = next
        }
        if rest.contains(where: isHelp) {
            console.out(help(for: command, path: path))
            return ExitStatus.ok
        }
        let invocation = path.joined(separator: " ")
        do {
            let parsed = try ParsedArguments(Array(rest), options: command.options, positionals: command.arguments)
            try command.run!(parsed, console)
            return ExitStatus.ok
        } catch let error as UsageError {
            console.error("error: \(error.message)\nRun '\(invocation) --help' for usage.")
            return ExitStatus.usage
        } catch let error as RuntimeFailure {
            console.error("error: \(error.message)")
            return ExitStatus.failure
        } catch {
            console.error("error: \(error)")
            return ExitStatus.failure
        }
    }

    /// `relayctl --version [--json]`: the only option of the root.
    private static func version(_ rest: [String], console: Console) -> Int32 {
        switch rest {
        case []:
            console.out(BuildInfo.versionLine("relayctl"))
        case ["--json"]:
            console.out(JSON.object([("program", .string("relayctl")), ("version", .string(BuildInfo.version)),
                                     ("commit", .string(BuildInfo.commit))]).rendered)
        default:
            console.error("error: '--version' takes only '--json'\nRun 'relayctl --help' for usage.")
            return ExitStatus.usage
        }
        return ExitStatus.ok
    }

    private static func isHelp(_ word: String) -> Bool { word == "--help" || word == "-h" }

    /// swift-argument-parser-style help for a group or a leaf.
    static func help(for command: Command, path: [String]) -> String {
        let invocation = path.joined(separator: " ")
        var lines = ["OVERVIEW: \(command.abstract)", ""]
        if command.run == nil {
            lines.append("USAGE: \(invocation) <subcommand>")
            if !command.discussion.isEmpty { lines += ["", command.discussion] }
            lines += ["", "SUBCOMMANDS:"]
            let width = command.subcommands.map(\.name.count).max() ?? 0
            for sub in command.subcommands {
                lines.append("  " + sub.name.padding(width) + "   " + sub.abstract)
            }
            lines += ["", "  See '\(invocation) <subcommand> --help' for details."]
        } else {
            let usage = (command.arguments.map(\.usageFragment) + command.options.map(\.usageFragment)).joined(separator: " ")
            lines.append("USAGE: \(invocation) \(usage)")
            if !command.discussion.isEmpty { lines += ["", command.discussion] }
            if !command.arguments.isEmpty {
                lines += ["", "ARGUMENTS:"]
                let width = command.arguments.map(\.helpLabel.count).max() ?? 0
                for argument in command.arguments {
                    lines.append("  " + argument.helpLabel.padding(width) + "   " + argument.help)
                }
            }
            lines += ["", "OPTIONS:"]
            let all = command.options + [OptionSpec.help]
            let width = all.map(\.helpLabel.count).max() ?? 0
            for option in all {
                lines.append("  " + option.helpLabel.padding(width) + "   " + option.help)
            }
        }
        return lines.joined(separator: "\n")
    }
}

extension String {
    func padding(_ width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}
