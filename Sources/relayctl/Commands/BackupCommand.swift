// relayctl backup: a consistent, compacted copy of the database with SQLite's VACUUM INTO,
// taken inside one read transaction on a read-only connection: safe while relay-server writes.
import Foundation
import RelayCore

extension RelayCtl {
    static var backup: Command {
        .leaf("backup", "Write a consistent copy of the database (SQLite VACUUM INTO).",
              discussion: """
              One read transaction on a read-only connection: safe while relay-server writes. The copy
              is compacted and needs no WAL to restore. Refuses to overwrite an existing file; created
              mode 0600 (it holds credential hashes, push tokens and ciphertext).
              """,
              arguments: [ArgumentSpec(name: "path", help: "The backup file to create.")],
              options: databaseOptionSpecs, run: BackupCommand.run)
    }
}

enum BackupCommand {
    struct Output: Encodable { var source: String; var backup: String; var bytes: Int64; var responses: Int64 }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let target = args.argument
        guard !target.isEmpty else { throw UsageError("<path>: must not be empty") }
        let location = try resolveStore(args)
        guard location.kind == "sqlite" else {
            throw RuntimeFailure("backup copies a SQLite database; for store.kind \"\(location.kind)\" use the database's own tools (pg_dump, docs/postgres.md)")
        }
        let source = location.path
        guard !FileManager.default.fileExists(atPath: target) else { throw RuntimeFailure("\(target) exists; refusing to overwrite") }
        // Same existence, permission and schema checks as every other command.
        try openStore(location, readOnly: true).close()

        let previous = umask(0o077)
        defer { umask(previous) }
        do {
            let db = try SQLiteDatabase(path: source, readOnly: true)  // closed by its deinit
            try db.execute("VACUUM INTO '\(target.replacingOccurrences(of: "'", with: "''"))'")
        } catch {
            throw RuntimeFailure("backup of \(source) to \(target) failed: \(error)")
        }
        // Prove the copy opens and count what it holds.
        var copied = location
        copied.path = target
        let copy = try openStore(copied, readOnly: true)
        let responses = try storeCall("reading the backup") { Int64(try copy.counts().byState.values.reduce(0, +)) }
        copy.close()
        let out = Output(source: source, backup: target, bytes: StatusCommand.fileSize(target), responses: responses)
        if args.flag("json") { return emit(console, try renderJSON(out)) }
        console.out("backed up \(source) to \(target) (\(humanBytes(out.bytes)), \(responses) responses)")
    }
}
