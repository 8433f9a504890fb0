// relayctl tokens / credentials: push tokens APNs marked (410, BadDeviceToken), and the accessories'
// bearer credentials. Only `credentials create` ever prints a secret, once.
import Basics
import Foundation
import RelayCore

extension RelayCtl {
    static var tokens: Command {
        .group("tokens", "Push tokens APNs marked (410 Unregistered, 400 BadDeviceToken): list, show, forget.",
               discussion: """
               Ingest refuses a marked token (410, or 400 bad_device_token) for its hold
               (dispatch.unregisteredQuarantineSeconds, 0 = until forgotten;
               dispatch.badDeviceTokenHoldSeconds), counted from RECORDED, then lets one response
               through as a probe: its 200 removes the mark, another 410/400 renews it. Queued
               responses accepted up to the CUTOFF fail without a push. Forgetting a token makes
               ingest accept it again at once.
               """, [
            .leaf("list", "Every marked token (truncated), its reason, cutoff, when its hold started.",
                  options: databaseOptionSpecs, run: TokensCommand.list),
            .leaf("show", "One marked token in full.",
                  arguments: [ArgumentSpec(name: "hex", help: "The token, or a unique prefix of it.")],
                  options: databaseOptionSpecs, run: TokensCommand.show),
            .leaf("forget", "Remove a token's mark (ingest accepts it again).",
                  arguments: [ArgumentSpec(name: "hex", help: "The complete token.")],
                  options: databaseOptionSpecs, run: TokensCommand.forget),
        ])
    }

    static var credentials: Command {
        .group("credentials", "Accessory bearer credentials: create, list, revoke.",
               discussion: """
               Accessories present a credential to POST /v1/responses. The relay stores only its
               SHA-256 hash: the secret is printed once, by create, and never again.
               """, [
            .leaf("create", "Create a credential for some apps; prints its secret ONCE.",
                  options: [
                      .value("name", "name", "A label for people (fleet, batch, customer)."),
                      .value("apps", "bundle-id,...", "Comma-separated bundle IDs the credential may submit for."),
                  ] + databaseOptionSpecs, run: CredentialsCommand.create),
            .leaf("list", "Id, name, apps, created, last used, revoked (never the secret).",
                  options: databaseOptionSpecs, run: CredentialsCommand.list),
            .leaf("revoke", "Revoke a credential: the next request with it gets 401.",
                  arguments: [ArgumentSpec(name: "id", help: "The credential id (cred_...).")],
                  options: databaseOptionSpecs, run: CredentialsCommand.revoke),
        ])
    }
}

enum TokensCommand {
    struct TokenJSON: Encodable {
        var token: String; var reason: String; var apnsTimestamp: String; var recordedAt: String
        init(_ t: UnregisteredToken) {
            token = t.token; reason = t.reason; apnsTimestamp = isoTime(t.apnsTimestamp); recordedAt = isoTime(t.recordedAt)
        }
    }

    static func list(_ args: ParsedArguments, _ console: Console) throws {
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        let tokens = try storeCall("reading marked tokens") { try store.unregisteredTokens() }
        if args.flag("json") { return emit(console, try renderJSON(tokens.map(TokenJSON.init))) }
        if tokens.isEmpty { return console.out("no marked tokens") }
        emit(console, renderTable(["TOKEN", "REASON", "CUTOFF", "RECORDED"], tokens.map {
            [truncatedToken($0.token), $0.reason, isoTime($0.apnsTimestamp), isoTime($0.recordedAt)]
        }))
    }

    static func show(_ args: ParsedArguments, _ console: Console) throws {
        let prefix = try hexArgument(args)
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        let matches = try storeCall("reading marked tokens") { try store.unregisteredTokens() }.filter { $0.token.hasPrefix(prefix) }
        guard !matches.isEmpty else { throw RuntimeFailure("no marked token starts with \(prefix)") }
        guard matches.count == 1 else { throw RuntimeFailure("\(matches.count) tokens start with \(prefix); give more digits") }
        let t = TokenJSON(matches[0])
        if args.flag("json") { return emit(console, try renderJSON(t)) }
        console.out("token           \(t.token)\nreason          \(t.reason)\ncutoff          \(t.apnsTimestamp)\nrecorded        \(t.recordedAt)")
    }

    static func forget(_ args: ParsedArguments, _ console: Console) throws {
        let token = try hexArgument(args)
        let store = try openStore(args, readOnly: false)
        defer { store.close() }
        let removed = try storeCall("forgetting token") { try store.forgetToken(token) }
        guard removed else { throw RuntimeFailure("\(truncatedToken(token)) is not marked") }
        if args.flag("json") { return emit(console, try renderJSON(["forgotten": token])) }
        console.out("forgot \(truncatedToken(token)): ingest accepts it again")
    }

    private static func hexArgument(_ args: ParsedArguments) throws -> String {
        guard Hex.isHex(args.argument) else { throw UsageError("<hex>: expected hex digits, got '\(args.argument)'") }
        return args.argument.lowercased()
    }
}

enum CredentialsCommand {
    struct CredentialJSON: Encodable {
        var id: String; var name: String; var apps: [String]; var createdAt: String; @Nullable var lastUsedAt: String?; @Nullable var revokedAt: String?
        init(_ c: CredentialRecord) {
            id = c.id; name = c.name; apps = c.apps; createdAt = isoTime(c.createdAt)
            lastUsedAt = c.lastUsedAt.map(isoTime); revokedAt = c.revokedAt.map(isoTime)
        }
    }

    struct CreatedJSON: Encodable { var credential: CredentialJSON; var secret: String }

    static func create(_ args: ParsedArguments, _ console: Console) throws {
        let name = try args.string("name")
        guard !name.isEmpty else { throw UsageError("--name: must not be empty") }
        let appsRaw = try args.string("apps")
        let apps = appsRaw.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        guard apps.allSatisfy({ !$0.isEmpty && !$0.contains(" ") }) else {
            throw UsageError("--apps: expected comma-separated bundle IDs, got '\(appsRaw)'")
        }
        let store = try openStore(args, readOnly: false)
        defer { store.close() }
        let created = try storeCall("creating credential") { try store.createCredential(name: name, apps: apps) }
        // A bundle ID the relay does not serve (a typo, most likely) makes every request with the
        // credential a 400 unknown_app. Created anyway (the app may be added to the config next),
        // but said, on stderr, when a config is at hand to compare with.
        if args.optionalString("db") == nil || args.optionalString("config") != nil,
           let config = try? loadConfig(args.optionalString("config") ?? defaultConfigPath) {
            let unknown = apps.filter { app in !config.apps.contains { $0.bundleID == app } }
            if !unknown.isEmpty {
                console.error("warning: \(unknown.joined(separator: ", ")) not configured in this relay (apps: \(config.apps.map(\.bundleID).joined(separator: ", "))): requests with this credential for \(unknown.count == 1 ? "it" : "them") get 400 unknown_app until added")
            }
        }
        if args.flag("json") {
            return emit(console, try renderJSON(CreatedJSON(credential: CredentialJSON(created.record), secret: created.secret)))
        }
        console.out("""
        created \(created.record.id) (\(name)) for \(apps.joined(separator: ", "))
        secret: \(created.secret)
        This is the only time the secret is shown; the relay keeps only its hash.
        """)
    }

    static func list(_ args: ParsedArguments, _ console: Console) throws {
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        let records = try storeCall("reading credentials") { try store.credentials() }
        if args.flag("json") { return emit(console, try renderJSON(records.map(CredentialJSON.init))) }
        if records.isEmpty { return console.out("no credentials (create one: relayctl credentials create --name N --apps a,b)") }
        emit(console, renderTable(["ID", "NAME", "APPS", "CREATED", "LAST USED", "REVOKED"], records.map { c in
            [c.id, c.name, c.apps.joined(separator: ","), isoTime(c.createdAt), c.lastUsedAt.map(isoTime) ?? "never", c.revokedAt.map(isoTime) ?? "-"]
        }))
    }

    static func revoke(_ args: ParsedArguments, _ console: Console) throws {
        let id = args.argument
        let store = try openStore(args, readOnly: false)
        defer { store.close() }
        guard try storeCall("revoking credential", { try store.revokeCredential(id: id) }) else {
            throw RuntimeFailure("no active credential \(id)")
        }
        if args.flag("json") { return emit(console, try renderJSON(["revoked": id])) }
        console.out("revoked \(id): requests with it now get 401")
    }
}
