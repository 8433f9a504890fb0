// relayctl tokens / credentials: push tokens APNs reported unregistered, and the accessories'
// bearer credentials. Only `credentials create` ever prints a secret, once.
import Foundation
import RelayCore

enum TokensCommand {
    static let help = """
    USAGE: relayctl tokens <subcommand>

    Push tokens APNs reported as unregistered (410). Ingest refuses a listed token with 410
    until the accessory presents it again after APNs' timestamp.

    SUBCOMMANDS:
      list            every unregistered token (truncated), APNs timestamp, when recorded
      show <hex>      one token in full (a unique prefix is enough)
      forget <hex>    remove a token from the list (ingest accepts it again); exact token

    OPTIONS (every subcommand):
      --config <file>   relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>       database file, overriding the config
      --json            machine-readable output
      -h, --help        show this help

    """

    struct TokenJSON: Encodable {
        var token: String; var apnsTimestamp: String; var recordedAt: String
        init(_ t: UnregisteredToken) { token = t.token; apnsTimestamp = isoTime(t.apnsTimestamp); recordedAt = isoTime(t.recordedAt) }
    }

    static func run(_ arguments: [String]) throws {
        guard let sub = arguments.first else { throw OpsError.usage("tokens: expected a subcommand: list, show, forget (see relayctl tokens --help)") }
        let rest = Array(arguments.dropFirst())
        if rest.contains("--help") || rest.contains("-h") { writeStdout(help); return }
        let options = try OptionScanner(rest, command: "tokens \(sub)", valued: databaseOptions, flagNames: ["json"])
        switch sub {
        case "list":
            try options.noPositionals()
            let store = try openStore(path: try resolveDatabasePath(options), readOnly: true)
            defer { store.close() }
            let tokens = try storeCall("reading unregistered tokens") { try store.unregisteredTokens() }
            if options.flag("json") { writeStdout(try renderJSON(tokens.map(TokenJSON.init))); return }
            if tokens.isEmpty { writeStdout("no unregistered tokens\n"); return }
            writeStdout(renderTable(["TOKEN", "APNS TIMESTAMP", "RECORDED"], tokens.map {
                [truncatedToken($0.token), isoTime($0.apnsTimestamp), isoTime($0.recordedAt)]
            }))
        case "show":
            let prefix = try tokenArgument(options, sub)
            let store = try openStore(path: try resolveDatabasePath(options), readOnly: true)
            defer { store.close() }
            let matches = try storeCall("reading unregistered tokens") { try store.unregisteredTokens() }.filter { $0.token.hasPrefix(prefix) }
            guard !matches.isEmpty else { throw OpsError.runtime("tokens show: no unregistered token starts with \(prefix)") }
            guard matches.count == 1 else { throw OpsError.runtime("tokens show: \(matches.count) tokens start with \(prefix); give more digits") }
            let t = TokenJSON(matches[0])
            if options.flag("json") { writeStdout(try renderJSON(t)); return }
            writeStdout("token           \(t.token)\napns timestamp  \(t.apnsTimestamp)\nrecorded        \(t.recordedAt)\n")
        case "forget":
            let token = try tokenArgument(options, sub)
            let store = try openStore(path: try resolveDatabasePath(options), readOnly: false)
            defer { store.close() }
            let removed = try storeCall("forgetting token") { try store.forgetToken(token) }
            if options.flag("json") { writeStdout(try renderJSON(["forgotten": removed])) } else if removed {
                writeStdout("forgot \(truncatedToken(token)): ingest accepts it again\n")
            }
            guard removed else { throw OpsError.runtime("tokens forget: \(truncatedToken(token)) is not in the unregistered list") }
        default:
            throw OpsError.usage("tokens: unknown subcommand '\(sub)' (expected list, show, forget)")
        }
    }

    private static func tokenArgument(_ options: OptionScanner, _ sub: String) throws -> String {
        guard options.positionals.count == 1, let token = options.positionals.first else {
            throw OpsError.usage("tokens \(sub): expected exactly one hex token")
        }
        guard isHex(token) else { throw OpsError.usage("tokens \(sub): '\(token)' is not hex") }
        return token.lowercased()
    }
}

enum CredentialsCommand {
    static let help = """
    USAGE: relayctl credentials <subcommand>

    Bearer credentials accessories present to POST /v1/responses. The relay stores only a hash;
    the secret is printed once, by create.

    SUBCOMMANDS:
      create --name <name> --apps <bundle-id,...>   new credential; prints its secret ONCE
      list                                          id, name, apps, created, last used, revoked
      revoke <id>                                   immediate: the next request with it gets 401

    OPTIONS (every subcommand):
      --config <file>   relay-server config naming the database (default: \(defaultConfigPath))
      --db <path>       database file, overriding the config
      --json            machine-readable output
      -h, --help        show this help

    """

    struct CredentialJSON: Encodable {
        var id: String; var name: String; var apps: [String]; var createdAt: String; var lastUsedAt: String?; var revokedAt: String?
        init(_ c: CredentialRecord) {
            id = c.id; name = c.name; apps = c.apps; createdAt = isoTime(c.createdAt)
            lastUsedAt = c.lastUsedAt.map(isoTime); revokedAt = c.revokedAt.map(isoTime)
        }
    }

    struct CreatedJSON: Encodable { var credential: CredentialJSON; var secret: String }

    static func run(_ arguments: [String]) throws {
        guard let sub = arguments.first else { throw OpsError.usage("credentials: expected a subcommand: create, list, revoke (see relayctl credentials --help)") }
        let rest = Array(arguments.dropFirst())
        if rest.contains("--help") || rest.contains("-h") { writeStdout(help); return }
        switch sub {
        case "create":
            let options = try OptionScanner(rest, command: "credentials create", valued: databaseOptions.union(["name", "apps"]), flagNames: ["json"])
            try options.noPositionals()
            guard let name = options.value("name"), !name.isEmpty else { throw OpsError.usage("credentials create: --name <name> is required") }
            guard let appsRaw = options.value("apps") else { throw OpsError.usage("credentials create: --apps <bundle-id,...> is required") }
            let apps = appsRaw.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            guard !apps.isEmpty, apps.allSatisfy({ !$0.isEmpty && !$0.contains(" ") }) else {
                throw OpsError.usage("credentials create: --apps must be comma-separated bundle IDs, got '\(appsRaw)'")
            }
            let store = try openStore(path: try resolveDatabasePath(options), readOnly: false)
            defer { store.close() }
            let created = try storeCall("creating credential") { try store.createCredential(name: name, apps: apps) }
            if options.flag("json") {
                writeStdout(try renderJSON(CreatedJSON(credential: CredentialJSON(created.record), secret: created.secret)))
            } else {
                writeStdout("""
                created \(created.record.id) (\(name)) for \(apps.joined(separator: ", "))
                secret: \(created.secret)
                This is the only time the secret is shown; the relay keeps only its hash.

                """)
            }
        case "list":
            let options = try OptionScanner(rest, command: "credentials list", valued: databaseOptions, flagNames: ["json"])
            try options.noPositionals()
            let store = try openStore(path: try resolveDatabasePath(options), readOnly: true)
            defer { store.close() }
            let records = try storeCall("reading credentials") { try store.credentials() }
            if options.flag("json") { writeStdout(try renderJSON(records.map(CredentialJSON.init))); return }
            if records.isEmpty { writeStdout("no credentials (create one: relayctl credentials create --name N --apps a,b)\n"); return }
            writeStdout(renderTable(["ID", "NAME", "APPS", "CREATED", "LAST USED", "REVOKED"], records.map { c in
                [c.id, c.name, c.apps.joined(separator: ","), isoTime(c.createdAt), c.lastUsedAt.map(isoTime) ?? "never", c.revokedAt.map(isoTime) ?? "-"]
            }))
        case "revoke":
            let options = try OptionScanner(rest, command: "credentials revoke", valued: databaseOptions, flagNames: ["json"])
            guard options.positionals.count == 1, let id = options.positionals.first else {
                throw OpsError.usage("credentials revoke: expected exactly one credential id")
            }
            let store = try openStore(path: try resolveDatabasePath(options), readOnly: false)
            defer { store.close() }
            let revoked = try storeCall("revoking credential") { try store.revokeCredential(id: id) }
            if options.flag("json") { writeStdout(try renderJSON(["revoked": revoked])) } else if revoked {
                writeStdout("revoked \(id): requests with it now get 401\n")
            }
            guard revoked else { throw OpsError.runtime("credentials revoke: no active credential \(id)") }
        default:
            throw OpsError.usage("credentials: unknown subcommand '\(sub)' (expected create, list, revoke)")
        }
    }
}
