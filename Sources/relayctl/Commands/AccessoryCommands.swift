// `relayctl accessory ...`: Apple's accessory key exchange (docs/key-exchange.md). `pair` simulates
// a pairing and writes the accessory's state file, `derive` prints every intermediate value from
// given key material (for firmware teams checking their implementation), `send` posts responses
// from a state file over libcurl the way firmware will.
import Basics
import Foundation
import HTTPClient
import KeyExchange
import Ratchet
import RelayCore

extension RelayCtl {
    static var accessory: Command {
        .group("accessory", "Simulate an accessory: key exchange (X-Wing or P-256 HPKE) and responses (docs/key-exchange.md).", [
            accessoryPair, accessoryDerive, accessorySend,
        ])
    }

    /// Options that choose protocolInfo's spelling (Apple's pages disagree; docs/key-exchange.md).
    static let protocolInfoOptions: [OptionSpec] = [
        .value("suite-name", "text", "protocolInfo's ciphersuite part (default: XWing or P256).", required: false),
        .value("version", "text", "protocolInfo's version part (default: v1).", required: false),
        .value("identifier", "text", "protocolInfo's identifier part verbatim (default: the device UUID).", required: false),
        .value("uuid-case", "upper|lower", "How UUIDs are written in protocolInfo and the contexts (default: upper, as Swift prints a UUID).", required: false),
    ]

    static var accessoryPair: Command {
        .leaf("pair", "Simulate a pairing: make the accessory key pair, encapsulate as the iPhone, derive both sides, write the state file.",
              discussion: """
              The accessory's private key (X-Wing: 32-byte seed; P-256: 32-byte scalar) is random unless
              --private-key is given; --ephemeral makes the iPhone's encapsulation reproducible (X-Wing:
              64-byte eseed; P-256: the ephemeral private key). The state file (mode 0600) holds the key
              material, both internet ratchet roots, the keyID and the accessory's sending ratchet; an
              existing file is not overwritten without --force. Prints what the iPhone side holds.
              """,
              options: [
                  .value("ciphersuite", "xwing|p256", "The accessory's ciphersuite."),
                  .value("out", "path", "Where to write the accessory state (JSON)."),
                  .value("private-key", "hex", "The accessory private key (default: random).", required: false),
                  .value("ephemeral", "hex", "The iPhone's encapsulation randomness (default: random).", required: false),
                  .value("device-uuid", "uuid", "The device UUID (default: random).", required: false),
                  .value("bluetooth-uuid", "uuid", "The Bluetooth identifier (default: random).", required: false),
                  .flag("force", "Overwrite an existing state file."),
              ] + protocolInfoOptions, run: AccessoryCommand.pair)
    }

    static var accessoryDerive: Command {
        .leaf("derive", "Print every intermediate value of the accessory's derivation from given key material.",
              discussion: """
              Either --state FILE, or --ciphersuite with --private-key, --encapsulated-key, --device-uuid and
              --bluetooth-uuid (--public-key is checked against the private key when given). With
              --feature-id also the Bluetooth response key for that feature (session) ID.
              """,
              options: [
                  .value("state", "path", "An accessory state file written by 'accessory pair'.", required: false),
                  .value("ciphersuite", "xwing|p256", "The accessory's ciphersuite.", required: false),
                  .value("private-key", "hex", "X-Wing: the 32-byte seed; P-256: the 32-byte raw scalar.", required: false),
                  .value("public-key", "hex", "The public key's raw representation (X-Wing 1216 bytes, P-256 64).", required: false),
                  .value("encapsulated-key", "hex", "The encapsulated key from the key material (X-Wing 1120 bytes, P-256 65).", required: false),
                  .value("device-uuid", "uuid", "The device UUID of the key material.", required: false),
                  .value("bluetooth-uuid", "uuid", "The Bluetooth identifier used in the internet contexts.", required: false),
                  .value("feature-id", "text", "Also derive the Bluetooth response key for this feature ID.", required: false),
                  .value("bluetooth-reading", "text|data-description", "How \\(protocolInfo) reads in the Bluetooth context (default: text).", required: false),
              ] + protocolInfoOptions, run: AccessoryCommand.derive)
    }
}

typealias AccessoryState = AccessoryStateFile

/// Key material checked and turned into an accessory session.
struct DerivedAccessory {
    var suite: AccessoryCiphersuite
    var key: AccessoryPrivateKey
    var info: ProtocolInfo
    var bluetooth: String
    var encapsulatedKey: [UInt8]
    var session: AccessorySession
    var hostToAccessoryRoot: SecretKey { session.internetRoot(.hostToAccessory, bluetoothIdentifier: bluetooth) }
    var accessoryToHostRoot: SecretKey { session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth) }

    /// From a state file: derived again from the key material (never from the stored roots, which
    /// are checked against it).
    static func load(statePath path: String) throws -> (DerivedAccessory, AccessoryState) {
        guard let data = FileManager.default.contents(atPath: path) else { throw RuntimeFailure("cannot read accessory state \(path)") }
        let state: AccessoryState
        do { state = try JSONDecoder().decode(AccessoryState.self, from: data) } catch {
            throw UsageError("\(path): not an accessory state file: \(error)")
        }
        do {
            let m = try state.keyMaterial()
            return (DerivedAccessory(suite: m.suite, key: m.key, info: state.info, bluetooth: state.bluetoothUUID,
                                     encapsulatedKey: m.encapsulatedKey, session: m.session), state)
        } catch .storedRootsMismatch {
            throw RuntimeFailure("\(path): \(KeyExchangeError.storedRootsMismatch)")
        } catch .unknownValue(field: "ciphersuite", let value) {
            throw UsageError("\(path): ciphersuite: expected xwing or p256, got '\(value)'")
        } catch let .notHexadecimal(field) {
            throw UsageError("\(path): \(field): not hexadecimal")
        } catch {
            throw AccessoryCommand.usage(error, AccessoryCommand.stateFieldNames(path))
        }
    }
}

enum AccessoryCommand {
    /// KeyExchange's field names -> the flag (or state-file field) a user typed.
    typealias FieldNames = [String: String]
    static let flagNames: FieldNames = ["seed": "--private-key", "privateKey": "--private-key", "publicKey": "--public-key",
                                        "encapsulatedKey": "--encapsulated-key", "encapsulationSeed": "--ephemeral"]
    static func stateFieldNames(_ path: String) -> FieldNames {
        ["seed": "\(path): privateKey", "privateKey": "\(path): privateKey", "publicKey": "\(path): publicKey", "encapsulatedKey": "\(path): encapsulatedKey"]
    }

    /// A KeyExchange error as a usage error naming the flag.
    static func usage(_ error: KeyExchangeError, _ names: FieldNames) -> UsageError {
        switch error {
        case let .invalidLength(field, expected, actual):
            return UsageError("\(names[field] ?? field): expected \(expected) bytes, got \(actual)")
        case let .invalidPublicKey(field):
            return UsageError("\(names[field] ?? field): not a valid public key (not on the curve, or of small order)")
        case let .invalidPrivateKey(field):
            return UsageError("\(names[field] ?? field): not a valid private key (P-256: must be 1...n-1)")
        case .publicKeyMismatch:
            return UsageError("\(names["publicKey"] ?? "publicKey"): does not belong to the private key")
        case .invalidEncapsulationKey:
            return UsageError("\(names["publicKey"] ?? "publicKey"): the ML-KEM part fails the FIPS 203 modulus check")
        default:
            return UsageError("\(error)")
        }
    }

    static func build(suite: AccessoryCiphersuite, privateKey: [UInt8], publicKey: [UInt8]?, encapsulatedKey: [UInt8],
                      info: ProtocolInfo, bluetooth: String, names: FieldNames = flagNames) throws -> DerivedAccessory {
        do {
            let key = try AccessoryPrivateKey(suite, privateKey: privateKey, publicKey: publicKey)
            let session = try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: encapsulatedKey)
            return DerivedAccessory(suite: suite, key: key, info: info, bluetooth: bluetooth, encapsulatedKey: encapsulatedKey, session: session)
        } catch {
            throw usage(error, names)
        }
    }

    static func ciphersuite(_ args: ParsedArguments) throws -> AccessoryCiphersuite {
        let text = try args.string("ciphersuite")
        guard let suite = AccessoryCiphersuite(rawValue: text.lowercased()) else {
            throw UsageError("--ciphersuite: expected xwing or p256, got '\(text)'")
        }
        return suite
    }

    static func uppercaseUUIDs(_ args: ParsedArguments) throws -> Bool {
        switch args.optionalString("uuid-case") ?? "upper" {
        case "upper": return true
        case "lower": return false
        case let other: throw UsageError("--uuid-case: expected upper or lower, got '\(other)'")
        }
    }

    /// A UUID option in canonical text (or a random one when absent and `random`).
    static func uuid(_ args: ParsedArguments, _ name: String, upper: Bool, random: Bool) throws -> String {
        guard let text = args.optionalString(name) else {
            guard random else { throw UsageError("missing required option '--\(name) <uuid>'") }
            let u = UUID().uuidString
            return upper ? u : u.lowercased()
        }
        guard let bytes = UUIDText.parse(text) else { throw UsageError("--\(name): expected a UUID (8-4-4-4-12 hex digits), got '\(text)'") }
        return UUIDText.format(bytes, uppercase: upper)
    }

    static func protocolInfo(_ args: ParsedArguments, suite: AccessoryCiphersuite, device: String) -> ProtocolInfo {
        ProtocolInfo(ciphersuite: args.optionalString("suite-name") ?? suite.defaultName,
                     version: args.optionalString("version") ?? ProtocolInfo.defaultVersion,
                     identifier: args.optionalString("identifier") ?? device)
    }

    // MARK: pair

    static func pair(_ args: ParsedArguments, _ console: Console) throws {
        let suite = try ciphersuite(args)
        let out = try args.string("out")
        if FileManager.default.fileExists(atPath: out), !args.flag("force") {
            throw UsageError("--out: \(out) exists (it may hold a ratchet position); pass --force to replace it")
        }
        let upper = try uppercaseUUIDs(args)
        let device = try uuid(args, "device-uuid", upper: upper, random: true)
        let bluetooth = try uuid(args, "bluetooth-uuid", upper: upper, random: true)
        let info = protocolInfo(args, suite: suite, device: device)
        let key: AccessoryPrivateKey
        do {
            if let given = try args.optionalHex("private-key") {
                key = try AccessoryPrivateKey(suite, privateKey: given)
            } else {
                key = AccessoryPrivateKey.generate(suite)
            }
        } catch let error as KeyExchangeError { throw usage(error, flagNames) }
        // The iPhone: encapsulate to the accessory's public key.
        var ephemeral: HPKE.EphemeralInput? = nil
        if let e = try args.optionalHex("ephemeral") {
            if suite == .xWing {
                guard e.count == XWing.encapsulationSeedLength else { throw UsageError("--ephemeral: expected 64 bytes (m || ek_X) for xwing, got \(e.count)") }
                ephemeral = .xWingSeed(e)
            } else {
                do { ephemeral = .p256(try P256PrivateKey(rawRepresentation: e)) } catch {
                    throw usage(error, ["privateKey": "--ephemeral"])
                }
            }
        }
        let encapsulatedKey: [UInt8], host: HPKE.Context
        do {
            (encapsulatedKey, host) = try AccessorySession.hostEncapsulate(ciphersuite: suite, accessoryPublicKey: key.publicKeyRaw,
                                                                          protocolInfo: info, ephemeral: ephemeral)
        } catch { throw RuntimeFailure("encapsulation failed: \(error)") }
        // The accessory: from the stored key material only.
        let accessory = try build(suite: suite, privateKey: key.privateKeyBytes.exportedBytes, publicKey: key.publicKeyRaw,
                                  encapsulatedKey: encapsulatedKey, info: info, bluetooth: bluetooth)
        let hostH2A = try host.exportSecret(context: AccessorySession.internetContext(.hostToAccessory, bluetoothIdentifier: bluetooth), outputByteCount: 32)
        let hostA2H = try host.exportSecret(context: AccessorySession.internetContext(.accessoryToHost, bluetoothIdentifier: bluetooth), outputByteCount: 32)
        guard hostH2A == accessory.hostToAccessoryRoot, hostA2H == accessory.accessoryToHostRoot else {
            throw RuntimeFailure("the iPhone's and the accessory's ratchet roots differ (a bug: please report)")
        }
        let keyID = accessory.session.keyID
        let state = AccessoryState(
            ciphersuite: suite, protocolInfo: info, deviceUUID: device, bluetoothUUID: bluetooth, uuidCase: upper ? "upper" : "lower",
            privateKey: key.privateKeyBytes.exportedBytes, publicKey: key.publicKeyRaw, encapsulatedKey: encapsulatedKey,
            keyID: Base64.encode(keyID),
            hostToAccessoryRoot: accessory.hostToAccessoryRoot.exportedBytes, accessoryToHostRoot: accessory.accessoryToHostRoot.exportedBytes,
            pushToken: RelayCrypto.randomBytes(32).hexString, sessionIdentifier: UUID().uuidString,
            sending: SendingRatchet(rootSecret: accessory.accessoryToHostRoot).state)
        try writeState(state, to: out)
        if args.flag("json") {
            console.out(JSON.object([
                ("stateFile", .string(out)), ("ciphersuite", .string(suite.rawValue)), ("protocolInfo", .string(info.text)),
                ("publicKey", .string(key.publicKeyRaw.hexString)), ("encapsulatedKey", .string(encapsulatedKey.hexString)),
                ("keyID", .object([("hex", .string(keyID.hexString)), ("base64", .string(Base64.encode(keyID)))])),
                ("bluetoothUUID", .string(bluetooth)),
                ("hostToAccessoryRoot", .string(state.hostToAccessoryRoot)), ("accessoryToHostRoot", .string(state.accessoryToHostRoot)),
                ("pushToken", .string(state.pushToken)), ("sessionIdentifier", .string(state.sessionIdentifier)),
            ]).rendered)
            return
        }
        let fields: [(String, String)] = [
            ("state", out), ("ciphersuite", suite.rawValue), ("protocolInfo", info.text),
            ("publicKey", key.publicKeyRaw.hexString), ("encapsulatedKey", encapsulatedKey.hexString),
            ("keyID", Base64.encode(keyID) + " (hex " + keyID.hexString + ")"), ("bluetoothUUID", bluetooth),
            ("hostToAccessoryRoot", state.hostToAccessoryRoot), ("accessoryToHostRoot", state.accessoryToHostRoot),
            ("pushToken", state.pushToken), ("sessionIdentifier", state.sessionIdentifier),
        ]
        console.out(fields.map { "\($0.0): \($0.1)" }.joined(separator: "\n"))
    }

    // MARK: helpers

    /// Durable replace with mode 0600: the file holds the accessory's private key and its ratchet position.
    static func writeState(_ state: AccessoryState, to path: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        let data = try encoder.encode(state)
        try replaceFileDurably(path, data)
    }
}

// MARK: - send

extension RelayCtl {
    static var accessorySend: Command {
        .leaf("send", "Send responses from an accessory state file to a relay the way firmware will (libcurl).",
              discussion: """
              Each response body is sealed with the next key of the state's sending ratchet; the state
              file is rewritten (fsync, rename) with the advanced ratchet BEFORE the message leaves, so
              an index is never reused, even after a crash. A transport failure, a 5xx or a 429 is
              retried with the same index and the same sealed bytes (the relay deduplicates it; 429
              waits its Retry-After); 200 (already accepted) and 202 count as delivered to the relay;
              409 (the index is taken by another credential) and other 4xx are final, and so is a TLS
              handshake refused by either side (a missing or foreign client certificate, an untrusted
              relay certificate: the run stops there). Exit 0 when every response was accepted.
              """,
              options: [
                  .value("state", "path", "The accessory state file ('accessory pair')."),
                  .value("url", "url", "The relay's ingest base URL, e.g. https://relay.example:8443."),
                  .value("credential", "secret|@file", "The bearer credential, or @path of a file holding it."),
                  .value("count", "n", "How many responses to send, 1...10000 (default 1).", required: false),
                  .value("app", "bundle-id", "Sent as \"app\" (needed when the credential has several apps).", required: false),
                  .value("text", "text", "User text of each response (default: \"relayctl accessory send <index>\").", required: false),
                  .value("ca-file", "path", "PEM CA certificate(s) to verify the relay's TLS certificate.", required: false),
                  .value("client-cert", "path", "PEM client certificate, when the relay asks for one.", required: false),
                  .value("client-key", "path", "PEM private key of --client-cert.", required: false),
                  ResponseSender.retriesOption,
                  .flag("http2", "Use HTTP/2 (ALPN over TLS, prior knowledge over http://)."),
              ], run: AccessoryCommand.send)
    }
}

extension AccessoryCommand {
    static func send(_ args: ParsedArguments, _ console: Console) throws {
        let statePath = try args.string("state")
        for name in ["ca-file", "client-cert", "client-key"] {
            if let path = args.optionalString(name), !FileManager.default.isReadableFile(atPath: path) {
                throw UsageError("--\(name): cannot read \(path)")
            }
        }
        if (args.optionalString("client-cert") == nil) != (args.optionalString("client-key") == nil) {
            throw UsageError("--client-cert and --client-key go together")
        }
        let sender = try ResponseSender(args, options: .init(http2: args.flag("http2"), caFile: args.optionalString("ca-file"),
                                                             clientCertificate: args.optionalString("client-cert"),
                                                             clientKey: args.optionalString("client-key")))
        let count = try args.optionalInt("count", in: 1...10_000) ?? 1
        let (derived, loaded) = try DerivedAccessory.load(statePath: statePath)
        var state = loaded
        let ratchet: SendingRatchet
        do { ratchet = try SendingRatchet(state: state.sending) } catch { throw RuntimeFailure("\(statePath): sending: \(error)") }
        let keyID = derived.session.keyID
        let identity = ResponseSender.Identity(pushToken: state.pushToken, sessionIdentifier: state.sessionIdentifier,
                                               keyID: keyID, app: args.optionalString("app"))
        var results: [JSON] = []
        var lines: [String] = []
        var allAccepted = true
        var tlsRefusal: String?
        for n in 0..<count {
            let plaintext = try ResponseSender.plaintext(source: identity.app ?? "relayctl.accessory",
                                                         text: args.optionalString("text") ?? "relayctl accessory send \(n)")
            let outcome = try sender.send(plaintext, ratchet: ratchet, as: identity) { next in
                state.sending = next
                try writeState(state, to: statePath)
            }
            allAccepted = allAccepted && outcome.accepted
            // Every key always present (null when the relay gave none), as send-test's responses.
            results.append(.object([("index", .number(Int64(outcome.index))), ("status", .number(Int64(outcome.status))),
                                    ("attempts", .number(Int64(outcome.attempts))), ("http", .string(outcome.httpVersion)),
                                    ("id", outcome.id.map(JSON.string) ?? .null), ("state", outcome.state.map(JSON.string) ?? .null),
                                    ("error", outcome.error.map(JSON.string) ?? .null)]))
            let what = outcome.status == 409 ? "conflict: the index is taken by another credential (final)" : (outcome.error ?? outcome.state ?? "")
            lines.append("index \(outcome.index): \(outcome.status == 0 ? "no answer" : String(outcome.status)) \(what) (attempts \(outcome.attempts)\(outcome.id.map { ", id \($0)" } ?? ""))")
            if outcome.tlsRefused {
                tlsRefusal = outcome.error ?? "TLS handshake refused"
                break   // every further response would be refused alike
            }
        }
        if args.flag("json") {
            console.out(JSON.object([("stateFile", .string(statePath)), ("keyID", .string(Base64.encode(keyID))),
                                     ("pushToken", .string(state.pushToken)), ("sessionIdentifier", .string(state.sessionIdentifier)),
                                     ("responses", .array(results))]).rendered)
        } else {
            console.out(lines.joined(separator: "\n"))
        }
        if let tlsRefusal {
            throw RuntimeFailure("the TLS handshake with the relay failed and was not retried (\(tlsRefusal)). "
                + "A relay with listen.tls.clientCA needs --client-cert and --client-key issued by that CA; "
                + "a relay certificate this host does not trust needs --ca-file")
        }
        if !allAccepted { throw RuntimeFailure("not every response was accepted") }
    }
}
