// relayctl retry / purge: the two commands that change the outbox. Each store call is one SQLite
// transaction on the write connection (busy-waits for relay-server's writer, never fights it),
// and neither ever changes a row in state inflight: that row belongs to the dispatcher.
import Foundation
import RelayCore

enum RetryCommand {
    static let help = """
    USAGE: relayctl retry <id>... [--config <file>] [--db <path>] [--json]
           relayctl retry --failed [--reason <reason>] [--config <file>] [--db <path>] [--json]

    Requeues responses for another attempt now (attempt count kept, TTL extended to at least an
    hour). Only failed and retry-scheduled rows are requeued: inflight rows belong to the
    dispatcher and delivered rows are never sent twice. Safe while relay-server runs.
    Exit 1 when a named id is missing or could not be requeued.

    ARGUMENTS:
      <id>...             response ids to requeue

    OPTIONS:
      --failed            requeue every failed response (instead of ids)
      --reason <reason>   with --failed: only those that failed with this reason (e.g. BadTopic)
      --config <file>     relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>         database file, overriding the config
      --json              machine-readable output
      -h, --help          show this help

    """

    struct Output: Encodable {
        struct Skipped: Encodable { var id: String; var reason: String }
        var requeued: Int
        var skipped: [Skipped]
    }

    static func run(_ arguments: [String]) throws {
        let options = try OptionScanner(arguments, command: "retry", valued: databaseOptions.union(["reason"]), flagNames: ["json", "failed"])
        let ids = options.positionals
        if options.flag("failed") {
            guard ids.isEmpty else { throw OpsError.usage("retry: give either ids or --failed, not both") }
        } else {
            guard !ids.isEmpty else { throw OpsError.usage("retry: expected response ids or --failed (see relayctl retry --help)") }
            guard options.value("reason") == nil else { throw OpsError.usage("retry: --reason only goes with --failed") }
        }
        let store = try openStore(path: try resolveDatabasePath(options), readOnly: false)
        defer { store.close() }

        var output = Output(requeued: 0, skipped: [])
        if options.flag("failed") {
            output.requeued = try storeCall("requeueing failed responses") { try store.requeueFailed(reason: options.value("reason")) }
        } else {
            var eligible: [String] = []
            for id in ids {
                guard let row = try storeCall("reading response \(id)", { try store.response(id: id) }) else {
                    output.skipped.append(.init(id: id, reason: "not found")); continue
                }
                switch row.state {
                case .failed, .retry: eligible.append(row.id)
                case .queued: output.skipped.append(.init(id: row.id, reason: "already queued"))
                case .inflight: output.skipped.append(.init(id: row.id, reason: "inflight: held by the dispatcher"))
                case .delivered: output.skipped.append(.init(id: row.id, reason: "already delivered: never sent twice"))
                }
            }
            // The store re-checks the state in the same transaction, so a row the dispatcher
            // claimed (or delivered) since the read above is left alone.
            if !eligible.isEmpty {
                output.requeued = try storeCall("requeueing responses") { try store.requeue(ids: eligible) }
                if output.requeued < eligible.count {
                    let now = try eligible.filter { id in try store.response(id: id)?.state != .queued }
                    output.skipped += now.map { .init(id: $0, reason: "changed state meanwhile (dispatcher)") }
                }
            }
        }
        if options.flag("json") {
            writeStdout(try renderJSON(output))
        } else {
            var text = "requeued \(output.requeued)\n"
            for s in output.skipped { text += "skipped \(s.id): \(s.reason)\n" }
            writeStdout(text)
        }
        if output.skipped.contains(where: { $0.reason != "already queued" }) {
            throw OpsError.runtime("retry: \(output.skipped.count) of \(ids.count) not requeued")
        }
    }
}

enum PurgeCommand {
    static let help = """
    USAGE: relayctl purge (--delivered | --failed) --older-than <duration> [--dry-run]
                          [--config <file>] [--db <path>] [--json]

    Deletes terminal responses (and their attempts) last updated longer ago than the duration,
    and prints how many. Queued, retry and inflight rows are never purged. Safe while
    relay-server runs. Freed pages are reused; the file shrinks only with VACUUM.

    OPTIONS:
      --delivered               purge delivered responses
      --failed                  purge failed responses (both flags: both)
      --older-than <duration>   age threshold: 90s, 15m, 2h, 7d, 1h30m
      --dry-run                 only count what would be deleted
      --config <file>           relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>               database file, overriding the config
      --json                    machine-readable output
      -h, --help                show this help

    """

    struct Output: Encodable { var dryRun: Bool; var olderThanSeconds: Int64; var deleted: [String: Int] }

    static func run(_ arguments: [String]) throws {
        let options = try OptionScanner(arguments, command: "purge", valued: databaseOptions.union(["older-than"]),
                                        flagNames: ["json", "delivered", "failed", "dry-run"])
        try options.noPositionals()
        let states = [ResponseState.delivered, .failed].filter { options.flag($0.rawValue) }
        guard !states.isEmpty else { throw OpsError.usage("purge: say which rows: --delivered and/or --failed") }
        guard let olderThan = try options.duration("older-than") else {
            throw OpsError.usage("purge: --older-than <duration> is required (e.g. --older-than 7d)")
        }
        let dryRun = options.flag("dry-run")
        let store = try openStore(path: try resolveDatabasePath(options), readOnly: dryRun)
        defer { store.close() }
        let cutoff = nowMillis() - olderThan
        var output = Output(dryRun: dryRun, olderThanSeconds: olderThan / 1000, deleted: [:])
        for state in states {
            output.deleted[state.rawValue] = try storeCall("purging \(state.rawValue) responses") {
                try store.purge(state: state, olderThan: cutoff, dryRun: dryRun)
            }
        }
        if options.flag("json") { writeStdout(try renderJSON(output)); return }
        let verb = dryRun ? "would delete" : "deleted"
        writeStdout(states.map { "\(verb) \(output.deleted[$0.rawValue] ?? 0) \($0.rawValue) responses older than \(formatDuration(millis: olderThan))" }
            .joined(separator: "\n") + "\n")
    }
}
