// relayctl list / show: what is in the outbox, and everything about one response.
// Read-only, safe while relay-server runs.
import Basics
import Foundation
import RelayCore

/// JSON shape of one outbox row (list and show). Full push token: JSON is for scripts.
struct ResponseJSON: Encodable {
    var id: String
    var app: String
    var pushToken: String
    var sessionIdentifier: String
    var keyID: String
    var messageIndex: UInt32
    var encryptedDataBytes: Int
    var credentialID: String
    var state: String
    var attempts: Int
    var nextAttemptAt: String
    var createdAt: String
    var expiresAt: String
    var updatedAt: String
    @Nullable var lastStatus: Int?
    @Nullable var lastReason: String?

    init(_ row: OutboxRow) {
        id = row.id; app = row.app; pushToken = row.pushToken; sessionIdentifier = row.sessionIdentifier
        keyID = Data(row.keyID).base64EncodedString(); messageIndex = row.messageIndex
        encryptedDataBytes = row.encryptedData.count; credentialID = row.credentialID; state = row.state.rawValue
        attempts = row.attempts; nextAttemptAt = isoTime(row.nextAttemptAt); createdAt = isoTime(row.createdAt)
        expiresAt = isoTime(row.expiresAt); updatedAt = isoTime(row.updatedAt); lastStatus = row.lastStatus; lastReason = row.lastReason
    }
}

struct AttemptJSON: Encodable {
    var attemptedAt: String
    @Nullable var status: Int?
    @Nullable var reason: String?
    @Nullable var apnsTimestamp: String?
    @Nullable var latencyMillis: Double?

    init(_ a: AttemptRecord) {
        attemptedAt = isoTime(a.attemptedAt); status = a.status; reason = a.reason
        apnsTimestamp = a.apnsTimestamp.map(isoTime); latencyMillis = a.latencyMicros.map { Double($0) / 1000 }
    }
}

/// "410 Unregistered", "503 ServiceUnavailable", "transport: <message>", "-" when never tried.
func lastAnswer(status: Int?, reason: String?) -> String {
    switch (status, reason) {
    case (nil, nil): return "-"
    case (let s?, nil): return "\(s)"
    case (nil, let r?): return r
    case (let s?, let r?): return "\(s) \(r)"
    }
}

extension RelayCtl {
    static var list: Command {
        .leaf("list", "Outbox rows, newest first, filtered by state, app, token prefix, age.",
              discussion: """
              Columns: id, app, token prefix, keyID, index, state, attempts, last APNs answer, age.
              Opens the database read-only: safe while relay-server runs. --json prints full tokens.
              """,
              options: [
                  .value("state", "state", "Only rows in this state: \(stateNames()).", required: false),
                  .value("app", "bundle-id", "Only rows for this app.", required: false),
                  .value("token", "hex-prefix", "Only rows whose push token starts with these hex digits.", required: false),
                  .value("since", "duration", "Only rows accepted within this long: 90s, 15m, 2h, 7d.", required: false),
                  .value("limit", "n", "At most n rows, 1...100000 (default 50).", required: false),
              ] + databaseOptionSpecs, run: ListCommand.run)
    }

    static var show: Command {
        .leaf("show", "Every field of one response and every APNs attempt for it.",
              discussion: "Attempts: time, HTTP status, reason, APNs timestamp (410), latency. Read-only.",
              arguments: [ArgumentSpec(name: "id", help: "The response id (the apns-id that POST /v1/responses returned).")],
              options: databaseOptionSpecs, run: ShowCommand.run)
    }
}

enum ListCommand {
    static func run(_ args: ParsedArguments, _ console: Console) throws {
        var filter = OutboxFilter(limit: try args.optionalInt("limit", in: 1...100_000) ?? 50)
        if let s = args.optionalString("state") { filter.state = try parseState(s) }
        filter.app = args.optionalString("app")
        if let t = args.optionalString("token") {
            guard Hex.isHex(t) else { throw UsageError("--token: expected hex digits, got '\(t)'") }
            filter.tokenPrefix = t.lowercased()
        }
        let now = nowMillis()
        if let since = try args.optionalDuration("since") { filter.createdSince = now - since }
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        let rows = try storeCall("listing responses") { try store.list(filter) }

        if args.flag("json") { return emit(console, try renderJSON(rows.map(ResponseJSON.init))) }
        if rows.isEmpty { return console.out("no responses match") }
        let table = rows.map { r in
            [r.id, r.app, truncatedToken(r.pushToken), Data(r.keyID).base64EncodedString(), "\(r.messageIndex)",
             r.state.rawValue, "\(r.attempts)", lastAnswer(status: r.lastStatus, reason: r.lastReason),
             formatDuration(millis: now - r.createdAt)]
        }
        emit(console, renderTable(["ID", "APP", "TOKEN", "KEYID", "INDEX", "STATE", "ATTEMPTS", "LAST", "AGE"], table, rightAligned: [4, 6, 8]))
    }
}

enum ShowCommand {
    struct Output: Encodable { var response: ResponseJSON; var attempts: [AttemptJSON] }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let id = args.argument
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        guard let row = try storeCall("reading response", { try store.response(id: id) }) else {
            throw RuntimeFailure("no response with id \(id)")
        }
        let attempts = try storeCall("reading attempts") { try store.attempts(responseID: row.id) }
        let out = Output(response: ResponseJSON(row), attempts: attempts.map(AttemptJSON.init))
        if args.flag("json") { return emit(console, try renderJSON(out)) }
        let r = out.response
        let fields: [(String, String)] = [
            ("id", r.id), ("state", r.state), ("app", r.app), ("push token", r.pushToken),
            ("session", r.sessionIdentifier), ("key ID", r.keyID), ("message index", "\(r.messageIndex)"),
            ("encrypted data", "\(r.encryptedDataBytes) bytes"), ("credential", r.credentialID),
            ("attempts", "\(r.attempts)"), ("last answer", lastAnswer(status: r.lastStatus, reason: r.lastReason)),
            ("created", r.createdAt), ("updated", r.updatedAt), ("next attempt", r.nextAttemptAt), ("expires", r.expiresAt),
        ]
        var text = fields.map { $0.0.padding(16) + $0.1 }.joined(separator: "\n") + "\n"
        if attempts.isEmpty {
            text += "\nno attempts yet\n"
        } else {
            text += "\n" + renderTable(["#", "AT", "STATUS", "REASON", "APNS TIMESTAMP", "LATENCY"], out.attempts.enumerated().map { i, a in
                ["\(i + 1)", a.attemptedAt, a.status.map(String.init) ?? "transport", a.reason ?? "-",
                 a.apnsTimestamp ?? "-", a.latencyMillis.map { String(format: "%.1f ms", $0) } ?? "-"]
            }, rightAligned: [0, 5])
        }
        emit(console, text)
    }
}
