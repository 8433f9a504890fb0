// relayctl backup: a consistent, compacted copy of the database with SQLite's VACUUM INTO,
// taken inside one read transaction on a read-only connection: safe while relay-server writes.
import Foundation
import RelayCore

enum BackupCommand {
    static let help = """
    USAGE: relayctl backup <path> [--config <file>] [--db <path>] [--json]

    Writes a consistent copy of the database to <path> (SQLite VACUUM INTO: one read
    transaction, compacted, no WAL needed to restore). Safe while relay-server runs. Refuses to
    overwrite an existing file. The copy is created mode 0600: it holds credential hashes,
    push tokens and ciphertext.

    ARGUMENTS:
      <path>            the backup file to create

    OPTIONS:
      --config <file>   relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>       database file, overriding the config
      --json            machine-readable output
      -h, --help        show this help

    """

    struct Output: Encodable { var source: String; var backup: String; var bytes: Int64; var responses: Int64 }

    static func run(_ arguments: [String]) throws {
        let options = try OptionScanner(arguments, command: "backup", valued: databaseOptions, flagNames: ["json"])
        guard options.positionals.count == 1, let target = options.positionals.first, !target.isEmpty else {
            throw OpsError.usage("backup: expected exactly one target path")
        }
        let source = try resolveDatabasePath(options)
        guard FileManager.default.fileExists(atPath: source) else { throw OpsError.runtime("database \(source) does not exist") }
        guard !FileManager.default.fileExists(atPath: target) else { throw OpsError.runtime("backup: \(target) exists; refusing to overwrite") }
        // Validates schema and readability the same way every other command does.
        try openStore(path: source, readOnly: true).close()

        let previous = umask(0o077)
        defer { umask(previous) }
        do {
            let db = try SQLiteDatabase(path: source, readOnly: true)  // closed by its deinit
            try db.execute("VACUUM INTO '\(target.replacingOccurrences(of: "'", with: "''"))'")
        } catch {
            throw OpsError.runtime("backup of \(source) to \(target) failed: \(error)")
        }
        // Prove the copy opens and count what it holds.
        let copy = try openStore(path: target, readOnly: true)
        let responses = try storeCall("reading the backup") { Int64(try copy.counts().byState.values.reduce(0, +)) }
        copy.close()
        let out = Output(source: source, backup: target, bytes: StatusCommand.fileSize(target), responses: responses)
        if options.flag("json") { writeStdout(try renderJSON(out)); return }
        writeStdout("backed up \(source) to \(target) (\(humanBytes(out.bytes)), \(responses) responses)\n")
    }
}
