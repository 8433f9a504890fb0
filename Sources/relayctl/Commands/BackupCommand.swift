// relayctl backup: a consistent, compacted copy of the database with SQLite's VACUUM INTO,
// taken inside one read transaction on a read-only connection: safe while relay-server writes.
import Basics
import Foundation
import RelayCore

extension RelayCtl {
    static var backup: Command {
        .leaf("backup", "Write a consistent copy of the database (SQLite VACUUM INTO).",
              discussion: """
              One read transaction on a read-only connection: safe while relay-server writes. The copy
              is compacted and needs no WAL to restore. Refuses an existing file or a symbolic link at
              <path>; created mode 0600 (it holds credential hashes, push tokens and ciphertext).
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
        // Same existence, permission and schema checks as every other command.
        try openStore(location, readOnly: true).close()

        // relayctl creates the file (O_EXCL|O_NOFOLLOW, 0600): SQLite would follow a symbolic
        // link at the name. VACUUM INTO fills an existing empty file.
        let fd: Int32
        do { fd = try DurableFile.createNew(target) } catch { throw RuntimeFailure("\(error)") }
        defer { close(fd) }
        var created = stat()
        guard fstat(fd, &created) == 0 else { throw RuntimeFailure("cannot stat \(target): \(String(cString: strerror(errno)))") }
        let previous = umask(0o077)   // any file SQLite adds beside the copy
        defer { umask(previous) }
        do {
            let db = try SQLiteDatabase(path: source, readOnly: true)  // closed by its deinit
            try db.execute("VACUUM INTO '\(target.replacingOccurrences(of: "'", with: "''"))'")
        } catch {
            if isSameFile(target, created) { unlink(target) }
            throw RuntimeFailure("backup of \(source) to \(target) failed: \(error)")
        }
        // Someone who can write the directory could have swapped the name between the create and
        // SQLite's open; the backup is then not where it seems.
        guard isSameFile(target, created) else {
            throw RuntimeFailure("\(target) was replaced while the backup was written; back up into a directory only you can write")
        }
        do { try DurableFile.syncDirectory(of: target) } catch { throw RuntimeFailure("\(error)") }
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

    /// `path` is still the regular file relayctl created (lstat: a link there is not).
    private static func isSameFile(_ path: String, _ created: stat) -> Bool {
        var now = stat()
        return lstat(path, &now) == 0 && (now.st_mode & S_IFMT) == S_IFREG && now.st_dev == created.st_dev && now.st_ino == created.st_ino
    }
}
