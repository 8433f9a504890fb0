// relayctl status: the 3 a.m. overview. Read-only, safe while relay-server runs.
import Foundation
import RelayCore

extension RelayCtl {
    static var status: Command {
        .leaf("status", "Outbox depth, oldest pending response, the last hour's outcomes, DB size.",
              discussion: """
              Outbox depth by state, age of the oldest pending (queued or retry) response, deliveries
              and failures in the last hour by reason, unregistered push tokens, credentials, database
              size. Opens the database read-only: safe while relay-server runs.
              """,
              options: databaseOptionSpecs, run: StatusCommand.run)
    }
}

enum StatusCommand {
    struct Report: Encodable {
        struct Database: Encodable { var kind: String; var path: String; @Nullable var bytes: Int64?; @Nullable var walBytes: Int64? }
        struct LastHour: Encodable { var delivered: Int; var failed: Int; var failedByReason: [String: Int] }
        var database: Database
        var outbox: [String: Int]
        var pending: Int
        @Nullable var oldestPendingAgeSeconds: Int64?
        var lastHour: LastHour
        var unregisteredTokens: Int
        var credentials: Int
        var revokedCredentials: Int
        /// store.retention as configured (defaults with --db) and, for SQLite, the free-space
        /// floor and what is free now on the database's filesystem.
        var retention: Retention
        @Nullable var disk: Disk?
        /// Deliveries still to send and given up, per webhook with any.
        var webhooks: [String: Webhook]
        struct Webhook: Encodable { var pending: Int; var dead: Int }
        struct Retention: Encodable { var deliveredSeconds: Int64; var failedSeconds: Int64; var source: String }
        struct Disk: Encodable { @Nullable var freeBytes: Int64?; var minFreeBytes: Int64 }
    }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let location = try resolveStore(args)
        let store = try openStore(location, readOnly: true)
        let path = OutboxStores.describe(location)  // a PostgreSQL URL without its password
        defer { store.close() }
        let now = nowMillis()
        let counts = try storeCall("reading outbox counts") { try store.counts() }
        let outcomes = try storeCall("reading recent outcomes") { try store.recentOutcomes(since: now - 3_600_000) }
        let tokens = try storeCall("reading unregistered tokens") { try store.unregisteredTokens() }
        let credentials = try storeCall("reading credentials") { try store.credentials() }
        let webhooks = try storeCall("reading webhook deliveries") { try store.webhookDeliveryCounts() }

        var failedByReason: [String: Int] = [:]
        var delivered = 0
        for o in outcomes {
            if o.state == .delivered { delivered += o.count } else { failedByReason[o.reason ?? "unknown", default: 0] += o.count }
        }
        let report = Report(
            database: location.kind == "sqlite"
                ? .init(kind: "sqlite", path: path, bytes: fileSize(path), walBytes: fileSize(path + "-wal"))
                : .init(kind: location.kind, path: path, bytes: nil, walBytes: nil),
            outbox: Dictionary(uniqueKeysWithValues: ResponseState.allCases.map { ($0.rawValue, counts.byState[$0] ?? 0) }),
            pending: counts.pending,
            oldestPendingAgeSeconds: counts.oldestPendingCreatedAt.map { max(0, now - $0) / 1000 },
            lastHour: .init(delivered: delivered, failed: failedByReason.values.reduce(0, +), failedByReason: failedByReason),
            unregisteredTokens: tokens.count,
            credentials: credentials.filter { !$0.isRevoked }.count,
            revokedCredentials: credentials.filter(\.isRevoked).count,
            retention: .init(deliveredSeconds: location.retention.deliveredSeconds, failedSeconds: location.retention.failedSeconds,
                             source: args.optionalString("db") != nil ? "defaults (--db; --config shows the server's)" : "config"),
            disk: location.kind == "sqlite"
                ? .init(freeBytes: FreeSpaceGuard.statvfsAvailable(location.path), minFreeBytes: location.minFreeBytes) : nil,
            webhooks: webhooks.mapValues { Report.Webhook(pending: $0[.pending] ?? 0, dead: $0[.dead] ?? 0) })

        if args.flag("json") { return emit(console, try renderJSON(report)) }
        var rows: [(String, String)] = []
        if let bytes = report.database.bytes, let wal = report.database.walBytes {
            rows.append(("database", "\(path) (\(humanBytes(bytes)), wal \(humanBytes(wal)))"))
        } else {
            rows.append(("database", "\(report.database.kind) \(path)"))
        }
        rows.append(("outbox", ResponseState.allCases.map { "\($0.rawValue) \(report.outbox[$0.rawValue] ?? 0)" }.joined(separator: "  ")))
        rows.append(("oldest pending", report.oldestPendingAgeSeconds.map { formatDuration(millis: $0 * 1000) } ?? "none"))
        let failures = failedByReason.sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }
            .map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        rows.append(("last hour", "delivered \(delivered), failed \(report.lastHour.failed)" + (failures.isEmpty ? "" : " (\(failures))")))
        rows.append(("unregistered tokens", "\(tokens.count)"))
        rows.append(("credentials", "\(report.credentials) active, \(report.revokedCredentials) revoked"))
        rows.append(("retention", location.retention.summary + " (\(report.retention.source))"))
        rows.append(("webhook events", report.webhooks.isEmpty ? "none pending or dead"
            : report.webhooks.sorted { $0.key < $1.key }.map { "\($0.key): pending \($0.value.pending), dead \($0.value.dead)" }.joined(separator: "; ")))
        if let d = report.disk {
            let floor = d.minFreeBytes == 0 ? "no floor" : "ingest refused below \(humanBytes(d.minFreeBytes))"
            rows.append(("free space", (d.freeBytes.map { humanBytes($0) } ?? "unknown") + " (\(floor))"))
        } else {
            rows.append(("free space", "owned by the PostgreSQL server"))
        }
        console.out(rows.map { $0.0.padding(21) + $0.1 }.joined(separator: "\n"))
    }

    static func fileSize(_ path: String) -> Int64 {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber)?.int64Value ?? 0
    }
}
