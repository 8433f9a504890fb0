// relayctl list / show: what is in the outbox, and everything about one response.
// Read-only, safe while relay-server runs.
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
    var lastStatus: Int?
    var lastReason: String?

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
    var status: Int?
    var reason: String?
    var apnsTimestamp: String?
    var latencyMillis: Double?

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

enum ListCommand {
    static let help = """
    USAGE: relayctl list [--state <state>] [--app <bundle-id>] [--token <hex-prefix>]
                         [--since <duration>] [--limit <n>] [--config <file>] [--db <path>] [--json]

    Outbox rows, newest first: id, app, token prefix, keyID, index, state, attempts, last APNs
    answer, age. Read-only: safe while relay-server runs.

    OPTIONS:
      --state <state>       only rows in this state: \(stateNames())
      --app <bundle-id>     only rows for this app
      --token <hex-prefix>  only rows whose push token starts with these hex digits
      --since <duration>    only rows accepted within this long (90s, 15m, 2h, 7d)
      --limit <n>           at most n rows (default 50, max 100000)
      --config <file>       relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>           database file, overriding the config
      --json                machine-readable output (full tokens)
      -h, --help            show this help

    """

    static func run(_ arguments: [String]) throws {
        let options = try OptionScanner(arguments, command: "list", valued: databaseOptions.union(["state", "app", "token", "since", "limit"]), flagNames: ["json"])
        try options.noPositionals()
        var filter = OutboxFilter(limit: try options.int("limit", range: 1...100_000) ?? 50)
        if let s = options.value("state") { filter.state = try parseState(s, command: "list") }
        filter.app = options.value("app")
        if let t = options.value("token") {
            guard isHex(t) else { throw OpsError.usage("list: --token must be hex digits, got '\(t)'") }
            filter.tokenPrefix = t.lowercased()
        }
        let now = nowMillis()
        if let since = try options.duration("since") { filter.createdSince = now - since }
        let store = try openStore(path: try resolveDatabasePath(options), readOnly: true)
        defer { store.close() }
        let rows = try storeCall("listing responses") { try store.list(filter) }

        if options.flag("json") { writeStdout(try renderJSON(rows.map(ResponseJSON.init))); return }
        if rows.isEmpty { writeStdout("no responses match\n"); return }
        let table = rows.map { r in
            [r.id, r.app, truncatedToken(r.pushToken), Data(r.keyID).base64EncodedString(), "\(r.messageIndex)",
             r.state.rawValue, "\(r.attempts)", lastAnswer(status: r.lastStatus, reason: r.lastReason),
             formatDuration(millis: now - r.createdAt)]
        }
        writeStdout(renderTable(["ID", "APP", "TOKEN", "KEYID", "INDEX", "STATE", "ATTEMPTS", "LAST", "AGE"], table, rightAligned: [4, 6, 8]))
    }
}

enum ShowCommand {
    static let help = """
    USAGE: relayctl show <id> [--config <file>] [--db <path>] [--json]

    Every field of one response and every APNs attempt for it (time, status, reason, APNs
    timestamp for 410, latency). Read-only: safe while relay-server runs.

    ARGUMENTS:
      <id>              the response id (the apns-id returned by POST /v1/responses)

    OPTIONS:
      --config <file>   relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>       database file, overriding the config
      --json            machine-readable output
      -h, --help        show this help

    """

    struct Output: Encodable { var response: ResponseJSON; var attempts: [AttemptJSON] }

    static func run(_ arguments: [String]) throws {
        let options = try OptionScanner(arguments, command: "show", valued: databaseOptions, flagNames: ["json"])
        guard options.positionals.count == 1, let id = options.positionals.first else {
            throw OpsError.usage("show: expected exactly one response id (see relayctl show --help)")
        }
        let store = try openStore(path: try resolveDatabasePath(options), readOnly: true)
        defer { store.close() }
        guard let row = try storeCall("reading response", { try store.response(id: id) }) else {
            throw OpsError.runtime("show: no response with id \(id)")
        }
        let attempts = try storeCall("reading attempts") { try store.attempts(responseID: row.id) }
        let out = Output(response: ResponseJSON(row), attempts: attempts.map(AttemptJSON.init))
        if options.flag("json") { writeStdout(try renderJSON(out)); return }
        let r = out.response
        let fields: [(String, String)] = [
            ("id", r.id), ("state", r.state), ("app", r.app), ("push token", r.pushToken),
            ("session", r.sessionIdentifier), ("key ID", r.keyID), ("message index", "\(r.messageIndex)"),
            ("encrypted data", "\(r.encryptedDataBytes) bytes"), ("credential", r.credentialID),
            ("attempts", "\(r.attempts)"), ("last answer", lastAnswer(status: r.lastStatus, reason: r.lastReason)),
            ("created", r.createdAt), ("updated", r.updatedAt), ("next attempt", r.nextAttemptAt), ("expires", r.expiresAt),
        ]
        var text = fields.map { $0.0.padding(toLength: 16, withPad: " ", startingAt: 0) + $0.1 }.joined(separator: "\n") + "\n"
        if attempts.isEmpty {
            text += "\nno attempts yet\n"
        } else {
            text += "\n" + renderTable(["#", "AT", "STATUS", "REASON", "APNS TIMESTAMP", "LATENCY"], out.attempts.enumerated().map { i, a in
                ["\(i + 1)", a.attemptedAt, a.status.map(String.init) ?? "transport", a.reason ?? "-",
                 a.apnsTimestamp ?? "-", a.latencyMillis.map { String(format: "%.1f ms", $0) } ?? "-"]
            }, rightAligned: [0, 5])
        }
        writeStdout(text)
    }
}
