// Every relayctl command's --json, pinned: the exact keys of every object and the JSON type of
// every value (docs/relayctl-json.md is the same list in prose). A key renamed, added, dropped or
// retyped fails here; a new command without a pin fails `everyCommandIsPinned`.
import Foundation
import TestSupport
import Testing

/// A parsed JSON value that keeps booleans, integers and other numbers apart (JSONDecoder is strict
/// about each; JSONSerialization would hand back NSNumber for all three).
private indirect enum Value: Decodable, Sendable {
    case bool(Bool), int(Int64), double(Double), string(String), array([Value]), object([String: Value]), null

    init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int64.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([Value].self) { self = .array(a) }
        else { self = .object(try c.decode([String: Value].self)) }
    }
}

/// What a value must be. `.hex`: lowercase hex digits (bytes); `.number`: integer or not;
/// `.map`: an object with keys that are data (states, reasons), each value of one shape; `.null`: null only.
private indirect enum Shape: Sendable {
    case string, hex, int, number, bool, null, nullable(Shape), object([String: Shape]), array(Shape), map(Shape)
}

private func mismatches(_ value: Value, _ shape: Shape, at path: String = "$") -> [String] {
    switch (shape, value) {
    case (.nullable, .null), (.null, .null): return []
    case (.nullable(let inner), _): return mismatches(value, inner, at: path)
    case (.string, .string), (.int, .int), (.number, .int), (.number, .double), (.bool, .bool): return []
    case (.hex, .string(let s)):
        return s.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }) && s.count % 2 == 0 ? [] : ["\(path): not lowercase hex: \(s.prefix(40))"]
    case (.array(let inner), .array(let items)):
        return items.enumerated().flatMap { mismatches($1, inner, at: "\(path)[\($0)]") }
    case (.map(let inner), .object(let members)):
        return members.sorted { $0.key < $1.key }.flatMap { mismatches($1, inner, at: "\(path).\($0)") }
    case (.object(let fields), .object(let members)):
        var out: [String] = []
        let extra = Set(members.keys).subtracting(fields.keys), missing = Set(fields.keys).subtracting(members.keys)
        if !extra.isEmpty { out.append("\(path): unexpected keys \(extra.sorted())") }
        if !missing.isEmpty { out.append("\(path): missing keys \(missing.sorted())") }
        for (key, s) in fields.sorted(by: { $0.key < $1.key }) { if let v = members[key] { out += mismatches(v, s, at: "\(path).\(key)") } }
        return out
    default:
        return ["\(path): expected \(shape), got \(value)".prefix(200).description]
    }
}

/// The commands pinned below; `everyCommandIsPinned` compares it with the help tree.
private let covered: Set<String> = [
    "status", "list", "show", "retry", "purge", "tokens list", "tokens show", "tokens forget",
    "credentials create", "credentials list", "credentials revoke", "events list", "events show", "events replay", "backup", "check-config", "send-test",
    "accessory pair", "accessory derive", "accessory send",
    "ratchet step", "ratchet chain", "ratchet keyid", "ratchet seal", "ratchet open", "ratchet body encode", "ratchet body decode",
]

/// Runs `relayctl <command> <rest> --json` and checks stdout against `shape`; returns the parsed value.
@discardableResult
private func pin(_ command: String, _ rest: [String], _ shape: Shape, status: Int32 = 0, sourceLocation: SourceLocation = #_sourceLocation) throws -> Value {
    #expect(covered.contains(command), "add \(command) to `covered`", sourceLocation: sourceLocation)
    let arguments = command.split(separator: " ").map(String.init) + rest
    let r = try Relayctl.run(arguments + ["--json"])
    #expect(r.status == status, "relayctl \(arguments.joined(separator: " ")): \(r.stderr)", sourceLocation: sourceLocation)
    let value = try JSONDecoder().decode(Value.self, from: Data(r.stdout.utf8))
    let problems = mismatches(value, shape)
    #expect(problems.isEmpty, "relayctl \(command) --json: \(problems)", sourceLocation: sourceLocation)
    return value
}

// MARK: - the shapes (docs/relayctl-json.md)

private let response: Shape = .object([
    "id": .string, "app": .string, "pushToken": .hex, "sessionIdentifier": .string, "keyID": .string, "messageIndex": .int,
    "encryptedDataBytes": .int, "credentialID": .string, "state": .string, "attempts": .int, "nextAttemptAt": .string,
    "createdAt": .string, "expiresAt": .string, "updatedAt": .string, "lastStatus": .nullable(.int), "lastReason": .nullable(.string),
])
private let attempt: Shape = .object([
    "attemptedAt": .string, "status": .nullable(.int), "reason": .nullable(.string), "apnsTimestamp": .nullable(.string),
    "latencyMillis": .nullable(.number),
])
private let token: Shape = .object(["token": .hex, "reason": .string, "apnsTimestamp": .string, "recordedAt": .string])
private let credential: Shape = .object([
    "id": .string, "name": .string, "apps": .array(.string), "createdAt": .string,
    "lastUsedAt": .nullable(.string), "revokedAt": .nullable(.string),
])
private let status: Shape = .object([
    "database": .object(["kind": .string, "path": .string, "bytes": .nullable(.int), "walBytes": .nullable(.int)]),
    "outbox": .object(["queued": .int, "inflight": .int, "retry": .int, "delivered": .int, "failed": .int]),
    "pending": .int, "oldestPendingAgeSeconds": .nullable(.int),
    "lastHour": .object(["delivered": .int, "failed": .int, "failedByReason": .map(.int)]),
    "unregisteredTokens": .int, "credentials": .int, "revokedCredentials": .int,
    "retention": .object(["deliveredSeconds": .int, "failedSeconds": .int, "source": .string]),
    "disk": .nullable(.object(["freeBytes": .nullable(.int), "minFreeBytes": .int])),
    "webhooks": .map(.object(["pending": .int, "dead": .int])),
])
private let event: Shape = .object([
    "id": .string, "sequence": .int, "type": .string, "createdAt": .string, "credentialID": .nullable(.string), "app": .string, "body": .string,
])
private func delivery(event e: Shape) -> Shape {
    .object(["webhook": .string, "state": .string, "attempts": .int, "firstAttemptAt": .nullable(.string), "nextAttemptAt": .string,
             "lastError": .nullable(.string), "updatedAt": .string, "event": e])
}
private let keyID: Shape = .object(["hex": .hex, "base64": .string])
private let pair: Shape = .object([
    "stateFile": .string, "ciphersuite": .string, "protocolInfo": .string, "publicKey": .hex, "encapsulatedKey": .hex,
    "keyID": keyID, "bluetoothUUID": .string, "hostToAccessoryRoot": .hex, "accessoryToHostRoot": .hex,
    "pushToken": .hex, "sessionIdentifier": .string,
])
private func derive(bluetooth: Shape) -> Shape {
    .object([
        "ciphersuite": .string, "hpkeSuite": .object(["name": .string, "kemID": .int, "kdfID": .int, "aeadID": .int]),
        "protocolInfo": .object(["text": .string, "hex": .hex]), "bluetoothUUID": .string,
        "privateKey": .hex, "publicKey": .hex, "keyID": keyID, "encapsulatedKey": .hex,
        "steps": .array(.object(["name": .string, "value": .hex])),
        "contexts": .object(["hostToAccessory": .string, "accessoryToHost": .string]),
        "hostToAccessoryRoot": .hex, "accessoryToHostRoot": .hex, "accessoryToHostMessageKey0": .hex,
        "bluetooth": bluetooth,
    ])
}
private let sent: Shape = .object([
    "index": .int, "status": .int, "id": .nullable(.string), "state": .nullable(.string), "error": .nullable(.string),
    "finalState": .nullable(.string), "lastStatus": .nullable(.int), "lastReason": .nullable(.string),
])
private let accessorySent: Shape = .object([
    "index": .int, "status": .int, "attempts": .int, "http": .string,
    "id": .nullable(.string), "state": .nullable(.string), "error": .nullable(.string),
])

@Suite("relayctl --json (keys and types pinned)", .serialized)
struct RelayctlJSONTests {
    @Test func operationalCommands() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let d = ["--db", db.path]
        try pin("status", [] + d, status)
        guard case .array(let rows) = try pin("list", [] + d, .array(response)) else { Issue.record("list: not an array"); return }
        #expect(rows.count == 10)
        try pin("show", [db.ids["failed-baddevice"]!] + d, .object(["response": response, "attempts": .array(attempt)]))
        try pin("show", [db.ids["queued-1"]!] + d, .object(["response": response, "attempts": .array(attempt)]))
        try pin("retry", [db.ids["failed-baddevice"]!, db.ids["queued-1"]!] + d,
                .object(["requeued": .int, "skipped": .array(.object(["id": .string, "reason": .string]))]))
        let purged: Shape = .object(["dryRun": .bool, "olderThanSeconds": .int, "deleted": .object(["delivered": .nullable(.int), "failed": .nullable(.int)])])
        let dry = try pin("purge", ["--delivered", "--older-than", "1h", "--dry-run"] + d, purged)
        if case .object(let o) = dry, case .object(let deleted) = o["deleted"]! {
            #expect(deleted["failed"].map { if case .null = $0 { true } else { false } } == true, "a state not asked for is null")
        }
        try pin("purge", ["--delivered", "--failed", "--older-than", "1h"] + d, purged)
        try pin("tokens list", [] + d, .array(token))
        let unregistered = db.tokens["failed-unregistered"]!
        try pin("tokens show", [String(unregistered.prefix(6))] + d, token)
        try pin("tokens forget", [unregistered] + d, .object(["forgotten": .hex]))
        let created = try pin("credentials create", ["--name", "pin", "--apps", "a.b,c.d"] + d, .object(["credential": credential, "secret": .string]))
        try pin("credentials list", [] + d, .array(credential))
        guard case .object(let c) = created, case .object(let cred) = c["credential"]!, case .string(let id) = cred["id"]! else { return }
        try pin("credentials revoke", [id] + d, .object(["revoked": .string]))
        guard case .array(let events) = try pin("events list", [] + d, .array(event)) else { Issue.record("events list: not an array"); return }
        // delivered, BadDeviceToken, 410 (its response and its token), expired; then two more.
        #expect(events.count == db.eventIDs.count && db.eventIDs.count == 7)
        try pin("events list", ["--webhook", "backend", "--type", "response.failed"] + d, .array(delivery(event: event)))
        guard case .array(let dead) = try pin("events list", ["--state", "dead"] + d, .array(delivery(event: event))) else { return }
        #expect(dead.count == 1)
        try pin("events show", [db.eventIDs[0]] + d, .object(["event": event, "deliveries": .array(delivery(event: .null))]))
        let replayed = try pin("events replay", ["--dead", "--webhook", "backend"] + d, .object(["replayed": .int]))
        if case .object(let o) = replayed, case .int(let n)? = o["replayed"] { #expect(n == 1) } else { Issue.record("replay: \(replayed)") }
        try pin("events replay", ["--id", db.eventIDs[1]] + d, .object(["replayed": .int]))
        try pin("backup", [db.directory.appendingPathComponent("copy.db").path] + d,
                .object(["source": .string, "backup": .string, "bytes": .int, "responses": .int]))
        try pin("check-config", [db.directory.appendingPathComponent("absent.json").path],
                .object(["config": .string, "ok": .bool, "checks": .array(.object(["status": .string, "subject": .string, "detail": .string]))]), status: 1)
        // Nobody listening: every response fails, the JSON is complete anyway (exit 1).
        let port = try freeLoopbackPort()
        try pin("send-test", ["--url", "http://127.0.0.1:\(port)", "--credential", "rk_x", "--root-key", String(repeating: "ab", count: 32),
                 "--state-file", db.directory.appendingPathComponent("st.json").path, "--retries", "0"],
                .object(["url": .string, "keyID": .string, "pushToken": .hex, "sessionIdentifier": .string, "stateFile": .string,
                         "responses": .array(sent)]), status: 1)
    }

    @Test func accessoryCommands() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-json-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        for suite in ["xwing", "p256"] {
            let state = dir.appendingPathComponent("\(suite).json").path
            try pin("accessory pair", ["--ciphersuite", suite, "--out", state], pair)
            let derived = try pin("accessory derive", ["--state", state], derive(bluetooth: .null))
            try pin("accessory derive", ["--state", state, "--feature-id", "0A1B"],
                    derive(bluetooth: .object(["featureID": .string, "reading": .string, "context": .string, "responseKey": .hex])))
            // The step names are part of the format: the draft's (X-Wing) or RFC 9180's (DHKEM, key schedule).
            guard case .object(let o) = derived, case .array(let steps) = o["steps"]! else { Issue.record("derive: no steps"); continue }
            let names = steps.compactMap { s -> String? in if case .object(let m) = s, case .string(let n) = m["name"]! { n } else { nil } }
            let kem = suite == "xwing"
                ? ["expanded", "d", "z", "sk_X", "pk_M", "pk_X", "ct_M", "ct_X", "ss_M", "ss_X", "label", "kem_shared_secret"]
                : ["pkRm", "dh", "kem_context", "eae_prk", "kem_shared_secret"]
            #expect(names == kem + ["shared_secret", "suite_id", "psk_id_hash", "info_hash", "key_schedule_context", "secret", "key",
                                    "base_nonce", "exporter_secret"])
            if case .object(let h) = o["hpkeSuite"]!, case .int(let kemID) = h["kemID"]! { #expect(kemID == (suite == "xwing" ? 0x647a : 0x0010)) }
            let port = try freeLoopbackPort()
            try pin("accessory send", ["--state", state, "--url", "http://127.0.0.1:\(port)", "--credential", "rk_x", "--retries", "0"],
                    .object(["stateFile": .string, "keyID": .string, "pushToken": .hex, "sessionIdentifier": .string,
                             "responses": .array(accessorySent)]), status: 1)
        }
    }

    @Test func ratchetCommands() throws {
        let key = String(repeating: "11", count: 32)
        try pin("ratchet step", ["--chain-key", key, "--index", "7"], .object(["index": .int, "messageKey": .hex, "nextChainKey": .hex]))
        try pin("ratchet chain", ["--root-key", key, "--count", "2"],
                .object(["steps": .array(.object(["index": .int, "chainKey": .hex, "messageKey": .hex, "nextChainKey": .hex]))]))
        try pin("ratchet keyid", ["--public-key", String(repeating: "04", count: 64)], .object(["keyID": .string, "keyIDHex": .hex]))
        let sealed = try pin("ratchet seal", ["--key", key, "--plaintext", "0102"], .object(["sealed": .string, "sealedHex": .hex]))
        guard case .object(let s) = sealed, case .string(let b64) = s["sealed"]! else { return }
        try pin("ratchet open", ["--key", key, "--sealed", b64], .object(["plaintext": .hex]))
        let body = try pin("ratchet body encode", ["--notification-id", "n", "--source-id", "s", "--action-id", "a"], .object(["body": .hex]))
        guard case .object(let b) = body, case .string(let hex) = b["body"]! else { return }
        try pin("ratchet body decode", ["--body", hex],
                .object(["notificationIdentifier": .string, "sourceIdentifier": .string, "actionIdentifier": .string, "userText": .nullable(.string)]))
    }

    @Test func version() throws {
        let r = try Relayctl.run(["--version", "--json"])
        let problems = mismatches(try JSONDecoder().decode(Value.self, from: Data(r.stdout.utf8)),
                                  .object(["program": .string, "version": .string, "commit": .string]))
        #expect(r.status == 0 && problems.isEmpty, "\(problems)")
    }

    /// Every leaf of `relayctl --help`'s tree takes --json and is in `covered`.
    @Test func everyCommandIsPinned() throws {
        func leaves(_ path: [String]) throws -> [[String]] {
            let help = try Relayctl.run(path + ["--help"]).stdout
            guard let start = help.range(of: "SUBCOMMANDS:\n") else {
                #expect(help.contains("--json"), "relayctl \(path.joined(separator: " ")) has no --json")
                return [path]
            }
            let names = help[start.upperBound...].split(separator: "\n").prefix { $0.hasPrefix("  ") && !$0.hasPrefix("  See ") }
                .compactMap { $0.split(separator: " ").first.map(String.init) }
            return try names.flatMap { try leaves(path + [$0]) }
        }
        let all = Set(try leaves([]).map { $0.joined(separator: " ") })
        #expect(all.count > 20)
        #expect(all == covered, "not pinned: \(all.subtracting(covered).sorted()); gone: \(covered.subtracting(all).sorted())")
    }
}
