// relayctl retry / purge: the two commands that change the outbox. Each store call is one SQLite
// transaction on the write connection (purge: one per batch of rows; it waits for relay-server's
// writer, never fights it), and
// neither ever changes a row in state inflight: that row belongs to the dispatcher.
import Foundation
import RelayCore

extension RelayCtl {
    static var retry: Command {
        .leaf("retry", "Requeue failed or retry-scheduled responses for another attempt now.",
              discussion: """
              Give response ids, or --failed (optionally with --reason). Attempt counts are kept and the
              TTL is extended to at least an hour. Only failed and retry rows are requeued: inflight
              rows belong to the dispatcher and delivered rows are never sent twice (the state is
              re-checked inside the transaction). Safe while relay-server runs. Exits 1 when a named id
              is missing or could not be requeued.
              """,
              arguments: [ArgumentSpec(name: "id", help: "Response ids to requeue.", required: false, variadic: true)],
              options: [
                  .flag("failed", "Requeue every failed response (instead of ids)."),
                  .value("reason", "reason", "With --failed: only those that failed with this reason (e.g. BadTopic).", required: false),
              ] + databaseOptionSpecs, run: RetryCommand.run)
    }

    static var purge: Command {
        .leaf("purge", "Delete old delivered or failed responses, with counts.",
              discussion: """
              Deletes terminal responses (and their attempts) last updated longer ago than
              --older-than, 64 rows per transaction, so relay-server's ingest never waits long for
              the lock. Queued, retry and inflight rows are never purged. Safe while relay-server runs,
              also below store.minFreeBytes. store.retention does the same by itself. SQLite reuses
              the freed pages; the file shrinks only with VACUUM.
              """,
              options: [
                  .flag("delivered", "Purge delivered responses."),
                  .flag("failed", "Purge failed responses (give both flags for both)."),
                  .value("older-than", "duration", "Age threshold: 90s, 15m, 2h, 7d, 1h30m."),
                  .flag("dry-run", "Only count what would be deleted."),
              ] + databaseOptionSpecs, run: PurgeCommand.run)
    }
}

enum RetryCommand {
    struct Output: Encodable {
        struct Skipped: Encodable { var id: String; var reason: String }
        var requeued: Int
        var skipped: [Skipped]
    }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let ids = args.positionals
        if args.flag("failed") {
            guard ids.isEmpty else { throw UsageError("give either response ids or --failed, not both") }
        } else {
            guard !ids.isEmpty else { throw UsageError("expected response ids or --failed") }
            guard args.optionalString("reason") == nil else { throw UsageError("--reason only goes with --failed") }
        }
        let store = try openStore(args, readOnly: false)
        defer { store.close() }

        var output = Output(requeued: 0, skipped: [])
        if args.flag("failed") {
            output.requeued = try storeCall("requeueing failed responses") { try store.requeueFailed(reason: args.optionalString("reason")) }
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
                    let moved = try eligible.filter { id in try store.response(id: id)?.state != .queued }
                    output.skipped += moved.map { .init(id: $0, reason: "changed state meanwhile (dispatcher)") }
                }
            }
        }
        if args.flag("json") {
            emit(console, try renderJSON(output))
        } else {
            console.out((["requeued \(output.requeued)"] + output.skipped.map { "skipped \($0.id): \($0.reason)" }).joined(separator: "\n"))
        }
        let failed = output.skipped.filter { $0.reason != "already queued" }
        if !failed.isEmpty { throw RuntimeFailure("\(failed.count) of \(ids.count) responses not requeued") }
    }
}

enum PurgeCommand {
    /// `deleted`: a count for each state asked for (--delivered, --failed), null for the other.
    struct Output: Encodable {
        struct Deleted: Encodable { @Nullable var delivered: Int?; @Nullable var failed: Int? }
        var dryRun: Bool; var olderThanSeconds: Int64; var deleted: Deleted
    }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let states = [ResponseState.delivered, .failed].filter { args.flag($0.rawValue) }
        guard !states.isEmpty else { throw UsageError("say which rows: --delivered and/or --failed") }
        guard let olderThan = try args.optionalDuration("older-than") else { throw UsageError("missing required option '--older-than <duration>'") }
        let dryRun = args.flag("dry-run")
        let store = try openStore(args, readOnly: dryRun)
        defer { store.close() }
        let cutoff = nowMillis() - olderThan
        var counts: [ResponseState: Int] = [:]
        for state in states {
            counts[state] = try storeCall("purging \(state.rawValue) responses") {
                try store.purge(state: state, olderThan: cutoff, dryRun: dryRun)
            }
        }
        let output = Output(dryRun: dryRun, olderThanSeconds: olderThan / 1000,
                            deleted: .init(delivered: counts[.delivered], failed: counts[.failed]))
        if args.flag("json") { return emit(console, try renderJSON(output)) }
        let verb = dryRun ? "would delete" : "deleted"
        console.out(states.map { "\(verb) \(counts[$0] ?? 0) \($0.rawValue) responses older than \(formatDuration(millis: olderThan))" }
            .joined(separator: "\n"))
    }
}
