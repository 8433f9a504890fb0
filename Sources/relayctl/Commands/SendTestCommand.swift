// relayctl send-test: acts as an accessory. Builds notification response bodies with the codec,
// encrypts each with a sending ratchet whose state is persisted to a file *before* the message
// leaves (as Apple requires: an index is never reused, even after a crash), POSTs them to
// /v1/responses with a credential, and reports ids and statuses. With mock-apns verifying the
// same root secret, a delivered result proves the whole path. The sending itself is
// ResponseSender's, the same as `accessory send`'s; this command only differs in where the root
// secret and ratchet state come from and in how it reports.
import Basics
import Foundation
import Ratchet
import RelayCore

extension RelayCtl {
    static var sendTest: Command {
        .leaf("send-test", "Act as an accessory: encrypt test responses and POST them to a relay.",
              discussion: """
              Each response body (notification id, source = the app's bundle ID, action, user text) is
              sealed with the next key of a sending ratchet started from --root-key; the ratchet state
              is written to --state-file before each POST, so a rerun continues at the next index and
              never reuses a key. Without --root-key a random root secret is used (the relay accepts
              it, but mock-apns cannot decrypt it). Push token and session default to values derived
              from the root secret. Sending is `accessory send`'s (libcurl): a transport failure, a 5xx or
              a 429 is retried with the same sealed message (the relay deduplicates it; 429 waits its
              Retry-After), up to --retries times. --wait polls GET /v1/responses/<id> until each response is
              delivered or failed. Exit 0 when every POST was accepted (and, with --wait, delivered).
              """,
              options: [
                  .value("url", "url", "The relay's ingest base URL, e.g. http://127.0.0.1:8080."),
                  .value("credential", "secret|@file", "The bearer credential, or @path of a file holding it."),
                  .value("count", "n", "How many responses to send, 1...10000 (default 1).", required: false),
                  .value("root-key", "64 hex", "The accessory-to-host root secret (32 bytes).", required: false),
                  .value("key-id", "base64", "The ratchet keyID, 4 bytes (default: SHA-384 prefix of the root key).", required: false),
                  .value("push-token", "hex", "The push token (default: derived from the root key).", required: false),
                  .value("session", "uuid", "The session identifier (default: derived from the root key).", required: false),
                  .value("app", "bundle-id", "Sent as \"app\" (needed when the credential has several apps).", required: false),
                  .value("text", "text", "User text of each response (default: \"relayctl send-test <index>\").", required: false),
                  .value("state-file", "path", "Ratchet state file (default: ~/.local/state/relayctl/send-test-<root key hash>.json).", required: false),
                  .value("wait", "duration", "Poll each accepted response until delivered or failed, at most this long.", required: false),
                  ResponseSender.retriesOption,
              ], run: SendTestCommand.run)
    }
}

enum SendTestCommand {
    /// What the state file holds: the ratchet position plus which root secret it belongs to.
    struct StateFile: Codable {
        var rootKeyHash: String
        var ratchet: SendingRatchetState
    }

    struct Sent: Encodable {
        var index: UInt32
        var status: Int
        @Nullable var id: String?
        @Nullable var state: String?
        @Nullable var error: String?
        /// --wait only (null without): what GET /v1/responses/<id> last said.
        @Nullable var finalState: String? = nil
        @Nullable var lastStatus: Int? = nil
        @Nullable var lastReason: String? = nil
    }

    struct Output: Encodable {
        var url: String
        var keyID: String
        var pushToken: String
        var sessionIdentifier: String
        var stateFile: String
        var responses: [Sent]
    }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let sender = try ResponseSender(args)
        let count = try args.optionalInt("count", in: 1...10_000) ?? 1
        let rootKeyBytes: [UInt8]
        if args.optionalString("root-key") != nil {
            rootKeyBytes = try args.hex("root-key", length: 32)
        } else {
            rootKeyBytes = RelayCrypto.randomBytes(32)
            console.error("note: no --root-key: using a random root secret; mock-apns cannot decrypt these responses")
        }
        let rootHash = RelayCrypto.sha256(rootKeyBytes).hexString
        let keyID: [UInt8]
        if args.optionalString("key-id") != nil {
            keyID = try args.base64("key-id")
            guard keyID.count == 4 else { throw UsageError("--key-id: expected base64 of 4 bytes, got \(keyID.count) bytes") }
        } else {
            keyID = Ratchet.keyID(publicKey: rootKeyBytes)
        }
        let pushToken: String
        if let t = args.optionalString("push-token") {
            guard let canonical = PushToken.canonical(t) else { throw UsageError("--push-token: expected \(PushToken.ruleText)") }
            pushToken = canonical
        } else {
            pushToken = RelayCrypto.sha256(Array("push-token".utf8) + rootKeyBytes).hexString
        }
        let session: String
        if let s = args.optionalString("session") {
            guard let bytes = UUIDText.parse(s) else { throw UsageError("--session: expected a UUID, got '\(s)'") }
            session = UUIDText.format(bytes, uppercase: true)
        } else {
            // A version-4 UUID made of the root key's hash: the same session on every run.
            var b = Array(RelayCrypto.sha256(Array("session".utf8) + rootKeyBytes).prefix(16))
            b[6] = (b[6] & 0x0f) | 0x40
            b[8] = (b[8] & 0x3f) | 0x80
            session = UUIDText.format(b, uppercase: true)
        }
        let wait = try args.optionalDuration("wait")
        let app = args.optionalString("app")
        let statePath = args.optionalString("state-file") ?? defaultStatePath(rootHash: rootHash)

        let ratchet = try loadRatchet(path: statePath, rootKey: rootKeyBytes, rootHash: rootHash)
        let identity = ResponseSender.Identity(pushToken: pushToken, sessionIdentifier: session, keyID: keyID, app: app)
        var output = Output(url: sender.base, keyID: Base64.encode(keyID), pushToken: pushToken,
                            sessionIdentifier: session, stateFile: statePath, responses: [])
        for n in 0..<count {
            let plaintext = try ResponseSender.plaintext(source: app ?? "relayctl.send-test",
                                                         text: args.optionalString("text") ?? "relayctl send-test \(n)")
            let r = try sender.send(plaintext, ratchet: ratchet, as: identity) { state in
                try persist(StateFile(rootKeyHash: rootHash, ratchet: state), to: statePath)
            }
            output.responses.append(Sent(index: r.index, status: r.status, id: r.id, state: r.state, error: r.error))
        }

        if let wait {
            let deadline = Date().addingTimeInterval(Double(wait) / 1000)
            for i in output.responses.indices {
                guard let id = output.responses[i].id else { continue }
                while true {
                    let (status, fields) = try sender.lookup(id)
                    let state = fields["state"] as? String
                    output.responses[i].finalState = state
                    output.responses[i].lastStatus = fields["lastStatus"] as? Int
                    output.responses[i].lastReason = fields["lastReason"] as? String
                    if state == "delivered" || state == "failed" || status != 200 || Date() >= deadline { break }
                    Thread.sleep(forTimeInterval: 0.1)
                }
            }
        }

        if args.flag("json") {
            emit(console, try renderJSON(output))
        } else {
            var lines = ["sending as keyID \(output.keyID), token \(truncatedToken(pushToken)), session \(session)",
                         "ratchet state: \(statePath)"]
            let rows = output.responses.map { r in
                ["\(r.index)", "\(r.status)", r.id ?? "-", r.error ?? r.state ?? "-"]
                    + (wait == nil ? [] : [[r.finalState, lastAnswer(status: r.lastStatus, reason: r.lastReason)].compactMap { $0 }.joined(separator: " ")])
            }
            lines.append(renderTable(["INDEX", "HTTP", "ID", "STATE"] + (wait == nil ? [] : ["NOW"]), rows, rightAligned: [0]))
            emit(console, lines.joined(separator: "\n"))
        }
        let accepted = output.responses.filter { $0.status == 202 || $0.status == 200 }.count
        if accepted < count { throw RuntimeFailure("\(count - accepted) of \(count) responses not accepted") }
        if wait != nil {
            let delivered = output.responses.filter { $0.finalState == "delivered" }.count
            if delivered < count { throw RuntimeFailure("\(count - delivered) of \(count) responses not delivered in time") }
        }
    }

    static func defaultStatePath(rootHash: String) -> String {
        let env = ProcessInfo.processInfo.environment
        let base = env["XDG_STATE_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? env["HOME"].map { $0 + "/.local/state" } ?? FileManager.default.currentDirectoryPath
        return base + "/relayctl/send-test-\(rootHash.prefix(16)).json"
    }

    static func loadRatchet(path: String, rootKey: [UInt8], rootHash: String) throws -> SendingRatchet {
        guard let data = FileManager.default.contents(atPath: path) else {
            return SendingRatchet(rootSecret: SecretKey(bytes: rootKey))
        }
        let file: StateFile
        do { file = try JSONDecoder().decode(StateFile.self, from: data) } catch {
            throw RuntimeFailure("ratchet state file \(path) is unreadable: \(error)")
        }
        guard file.rootKeyHash == rootHash else {
            throw RuntimeFailure("ratchet state file \(path) belongs to another root key; pass --state-file")
        }
        do { return try SendingRatchet(state: file.ratchet) } catch {
            throw RuntimeFailure("ratchet state file \(path): \(error)")
        }
    }

    static func persist(_ state: StateFile, to path: String) throws {
        let dir = (path as NSString).deletingLastPathComponent
        if !dir.isEmpty { try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700]) }
        let data = try JSONEncoder().encode(state)
        try replaceFileDurably(path, data)
    }
}
