// The operator's subcommands, registered for the command tree in main.swift.
import Foundation

enum OperationalCommands {
    struct Command: Sendable {
        var name: String
        var summary: String
        var help: String
        var run: @Sendable ([String]) throws -> Void
    }

    static let all: [Command] = [
        Command(name: "status", summary: "outbox depth, oldest pending, last hour's outcomes, DB size", help: StatusCommand.help, run: StatusCommand.run),
        Command(name: "list", summary: "outbox rows, filtered by state, app, token, age", help: ListCommand.help, run: ListCommand.run),
        Command(name: "show", summary: "every field and APNs attempt of one response", help: ShowCommand.help, run: ShowCommand.run),
        Command(name: "retry", summary: "requeue failed or retry-scheduled responses", help: RetryCommand.help, run: RetryCommand.run),
        Command(name: "purge", summary: "delete old delivered or failed responses", help: PurgeCommand.help, run: PurgeCommand.run),
        Command(name: "tokens", summary: "push tokens APNs reported unregistered: list, show, forget", help: TokensCommand.help, run: TokensCommand.run),
        Command(name: "credentials", summary: "accessory credentials: create, list, revoke", help: CredentialsCommand.help, run: CredentialsCommand.run),
        Command(name: "backup", summary: "consistent copy of the database (VACUUM INTO)", help: BackupCommand.help, run: BackupCommand.run),
        Command(name: "send-test", summary: "act as an accessory: encrypt and POST test responses", help: SendTestCommand.help, run: SendTestCommand.run),
        Command(name: "check-config", summary: "validate a config without starting the server", help: CheckConfigCommand.help, run: CheckConfigCommand.run),
    ]

    /// Runs `name` if it is one of these commands and returns its exit status; nil otherwise.
    /// `--help`/`-h` anywhere before `--` prints the command's help (subcommand groups print
    /// their own group help) and exits 0.
    static func dispatch(_ name: String, _ arguments: [String]) -> Int32? {
        guard let command = all.first(where: { $0.name == name }) else { return nil }
        let beforeSeparator = arguments.prefix { $0 != "--" }
        if beforeSeparator.contains("--help") || beforeSeparator.contains("-h") {
            writeStdout(command.help)
            return 0
        }
        do {
            try command.run(arguments)
            return 0
        } catch let error as OpsError {
            writeStderr("relayctl \(name): \(error.message)\n")
            return error.exitCode
        } catch {
            writeStderr("relayctl \(name): \(error)\n")
            return 1
        }
    }
}
