// relayctl against a running relay: RelayCore's RelayService in this process (real HTTP
// listeners, real SQLite store, real dispatcher) with a recording PushTransport in place of
// APNs, and relayctl as a subprocess. Covers send-test (the recorded ciphertext decrypts with
// the accessory's ratchet to the codec's body; the state file continues the chain), the
// read-only commands beside the live writer, retry/purge under load (nothing lost, nothing
// delivered twice), and that every metric the alert rules and dashboard use is exported.
import Foundation
import Ratchet
import RelayCore
import Testing

/// Stands in for APNs: records every push and answers from `decide`.
/// @unchecked Sendable: `sent` is only touched under `lock`.
final class RecordingTransport: PushTransport, @unchecked Sendable {
    private let lock = NSLock()
    private var sent: [(row: OutboxRow, status: Int)] = []
    let decide: @Sendable (OutboxRow) -> PushAnswer

    init(decide: @escaping @Sendable (OutboxRow) -> PushAnswer = { _ in PushAnswer(status: 200, reason: nil, classification: .done) }) {
        self.decide = decide
    }

    func send(_ row: OutboxRow, completion: @escaping @Sendable (PushAnswer) -> Void) {
        let answer = decide(row)
        lock.lock()
        sent.append((row, answer.status ?? 0))
        lock.unlock()
        completion(answer)
    }

    func shutdown() {}

    var pushes: [(row: OutboxRow, status: Int)] { lock.lock(); defer { lock.unlock() }; return sent }
}

/// A relay on ephemeral loopback ports with a temporary database.
final class LiveRelay {
    let directory: URL
    let service: RelayService
    let transport: RecordingTransport
    let credential: String
    static let app = "com.example.companion"

    init(transport: RecordingTransport = RecordingTransport(), tokenRateLimit: Bool = false) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-live-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let json = """
        {"listen": {"host": "127.0.0.1", "port": 0}, "admin": {"host": "127.0.0.1", "port": 0},
         "store": {"path": "relay.db"}, "dispatch": {"maxInflight": 32}, "watchdog": false,
         "ingest": {"rateLimits": {"perPushToken": {"perSecond": \(tokenRateLimit ? 1 : 0), "burst": \(tokenRateLimit ? 2 : 1)}}},
         "apps": [{"bundleID": "\(Self.app)", "environment": "sandbox",
                   "token": {"p8Path": "unused.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]}
        """
        let config = try RelayConfig.parse(Array(json.utf8), baseDirectory: directory.path)
        self.transport = transport
        service = RelayService(config: config, logger: RelayLogger(minimum: .error, capture: true)) { _, _ in transport }
        try service.start()
        credential = try #require(service.store).createCredential(name: "live", apps: [Self.app]).secret
    }

    var dbPath: String { service.config.store.path }
    var ingestURL: String { "http://127.0.0.1:\(service.ingestPort)" }

    func get(_ path: String) throws -> String {
        let reply = try HTTPTestClient.get("http://127.0.0.1:\(service.adminPort)\(path)")
        return reply
    }

    /// Waits (bounded) until nothing is queued, inflight or due soon.
    func waitIdle(timeout: TimeInterval = 10) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let counts = try #require(service.store).counts()
            if (counts.byState[.queued] ?? 0) + (counts.byState[.inflight] ?? 0) == 0 { return }
            Thread.sleep(forTimeInterval: 0.05)
        }
        Issue.record("relay did not become idle within \(timeout)s")
    }

    func stop() {
        service.stop()
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Plain GET for the admin endpoints, through curl (installed by make deps).
enum HTTPTestClient {
    static func get(_ url: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = ["-sS", "--max-time", "10", url]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }
}

@Suite("relayctl against a live relay", .serialized)
struct RelayctlLiveRelayTests {
    static let rootKey = String(repeating: "0123456789abcdef", count: 4)

    @Test func sendTestEncryptsWithAPersistedRatchetAndIsDelivered() throws {
        let relay = try LiveRelay()
        defer { relay.stop() }
        let stateFile = relay.directory.appendingPathComponent("ratchet.json").path
        let args = ["send-test", "--url", relay.ingestURL, "--credential", relay.credential, "--root-key", Self.rootKey,
                    "--key-id", "AQIDBA==", "--count", "3", "--state-file", stateFile, "--wait", "10s", "--text", "on my way"]
        let first = try Relayctl.run(args + ["--json"])
        #expect(first.status == 0, "\(first.stdout)\(first.stderr)")
        let json = try #require(try Relayctl.json(first) as? [String: Any])
        let responses = try #require(json["responses"] as? [[String: Any]])
        #expect(responses.map { $0["index"] as? Int } == [0, 1, 2])
        #expect(responses.allSatisfy { $0["status"] as? Int == 202 && $0["finalState"] as? String == "delivered" })
        // The credential never appears in the output.
        #expect(!first.stdout.contains(relay.credential) && !first.stderr.contains(relay.credential))

        // The state file is written (0600) and a second run continues the chain at index 3.
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: stateFile)[.posixPermissions] as? Int)
        #expect(mode == 0o600)
        let second = try Relayctl.run(args.filter { $0 != "3" && $0 != "--count" })
        #expect(second.status == 0, "\(second.stdout)\(second.stderr)")
        #expect(second.stdout.contains("\n    3  202 "), "\(second.stdout)")

        // What reached "APNs" decrypts with the accessory's receiving ratchet to the codec's body.
        try relay.waitIdle()
        let pushes = relay.transport.pushes.sorted { $0.row.messageIndex < $1.row.messageIndex }
        #expect(pushes.map(\.row.messageIndex) == [0, 1, 2, 3])
        var receiver = ReceivingRatchet(rootSecret: SecretKey(bytes: try #require([UInt8](hex: Self.rootKey))))
        for push in pushes {
            #expect(push.row.keyID == [1, 2, 3, 4])
            #expect(push.row.app == LiveRelay.app)
            let plaintext = try receiver.open(push.row.encryptedData, index: push.row.messageIndex)
            let body = try NotificationResponseBody(decoding: plaintext)
            #expect(body.userText == "on my way")
            #expect(body.actionIdentifier == "com.apple.UNNotificationDefaultActionIdentifier")
        }
        // A state file from another root key is refused rather than reusing or skipping keys.
        let other = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", relay.credential,
                                      "--root-key", String(repeating: "ff", count: 32), "--state-file", stateFile])
        #expect(other.status == 1 && other.stderr.contains("another root key"))
    }

    @Test func sendTestReportsRefusals() throws {
        let relay = try LiveRelay()
        defer { relay.stop() }
        let state = relay.directory.appendingPathComponent("s.json").path
        let bad = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", "rk_wrong", "--root-key", Self.rootKey, "--state-file", state])
        #expect(bad.status == 1)
        #expect(bad.stdout.contains("401"), "\(bad.stdout)")
        // Credential from a file.
        let file = relay.directory.appendingPathComponent("cred").path
        try (relay.credential + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let ok = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", "@" + file, "--root-key", Self.rootKey, "--state-file", state])
        #expect(ok.status == 0, "\(ok.stdout)\(ok.stderr)")
        for args in [["--url", "ftp://x"], ["--url", relay.ingestURL, "--root-key", "abc"], ["--url", relay.ingestURL, "--count", "0"],
                     ["--url", relay.ingestURL, "--key-id", "AQID"], ["--url", relay.ingestURL, "--session", "nope"]] {
            let r = try Relayctl.run(["send-test", "--credential", "x", "--state-file", state] + args)
            #expect(r.status == 64, "\(args): \(r.stderr)")
        }
        let down = try Relayctl.run(["send-test", "--url", "http://127.0.0.1:9", "--credential", "x", "--root-key", Self.rootKey,
                                     "--state-file", relay.directory.appendingPathComponent("t.json").path])
        #expect(down.status == 1)
    }

    @Test func sendTestWaitsOutRateLimitsLikeAnAccessory() throws {
        // 1/s with a burst of 2 per push token: of 4 back-to-back messages at least one gets 429 +
        // Retry-After first (only a 2-second stall between POSTs could avoid it).
        let relay = try LiveRelay(tokenRateLimit: true)
        defer { relay.stop() }
        let r = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", relay.credential, "--root-key", Self.rootKey,
                                  "--count", "4", "--json", "--state-file", relay.directory.appendingPathComponent("s.json").path])
        #expect(r.status == 0, "\(r.stderr)")
        let responses = try #require((try Relayctl.json(r) as? [String: Any])?["responses"] as? [[String: Any]])
        #expect(responses.count == 4 && responses.allSatisfy { $0["status"] as? Int == 202 })
        let metrics = try relay.get("/metrics")
        #expect(metrics.contains("relay_ingest_requests_total{status=\"429\"}"), "no 429 was seen: the test proves nothing")
    }

    @Test func readOnlyCommandsWorkBesideTheRunningWriter() throws {
        let relay = try LiveRelay()
        defer { relay.stop() }
        let sent = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", relay.credential, "--root-key", Self.rootKey,
                                     "--count", "5", "--wait", "10s", "--state-file", relay.directory.appendingPathComponent("s.json").path])
        #expect(sent.status == 0, "\(sent.stdout)\(sent.stderr)")
        let status = try #require(try Relayctl.json(try Relayctl.run(["status", "--db", relay.dbPath, "--json"])) as? [String: Any])
        #expect((status["outbox"] as? [String: Int])?["delivered"] == 5)
        #expect((status["lastHour"] as? [String: Any])?["delivered"] as? Int == 5)
        let list = try Relayctl.run(["list", "--db", relay.dbPath, "--state", "delivered"])
        #expect(list.status == 0 && list.stdout.split(separator: "\n").count == 6)
        let backup = relay.directory.appendingPathComponent("backup.db").path
        #expect(try Relayctl.run(["backup", backup, "--db", relay.dbPath]).status == 0)
        // The server keeps accepting and writing after all of that.
        let more = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", relay.credential, "--root-key", Self.rootKey,
                                     "--wait", "10s", "--state-file", relay.directory.appendingPathComponent("s.json").path])
        #expect(more.status == 0, "\(more.stdout)\(more.stderr)")
    }

    @Test func retryAndPurgeUnderLoadLoseNothingAndDeliverNothingTwice() throws {
        // Every fifth response fails terminally on its first attempt (BadExpirationDate: a
        // failure of the row alone; BadDeviceToken would mark the shared token, docs/api.md
        // "Token marks"); relayctl requeues failed rows and purges delivered ones while traffic flows.
        let transport = RecordingTransport { row in
            row.messageIndex % 5 == 0 && row.attempts == 0
                ? PushAnswer(status: 400, reason: "BadExpirationDate", classification: .terminal("BadExpirationDate"))
                : PushAnswer(status: 200, reason: nil, classification: .done)
        }
        let relay = try LiveRelay(transport: transport)
        defer { relay.stop() }
        let count = 150
        let url = relay.ingestURL, secret = relay.credential, db = relay.dbPath
        let state = relay.directory.appendingPathComponent("s.json").path
        // Two threads of our own (relayctl calls block): the accessory load and the operator.
        let load = ThreadResult<Relayctl.Result>()
        let operatorResults = ThreadResult<[Int32]>()
        load.start {
            try Relayctl.run(["send-test", "--url", url, "--credential", secret, "--root-key", Self.rootKey,
                              "--count", "\(count)", "--json", "--state-file", state])
        }
        operatorResults.start {
            var results: [Int32] = []
            for round in 0..<8 {
                results.append(try Relayctl.run(["retry", "--failed", "--reason", "BadExpirationDate", "--db", db]).status)
                results.append(try Relayctl.run(["purge", "--delivered", "--older-than", "1ms", "--db", db]).status)
                if round % 2 == 0 { results.append(try Relayctl.run(["status", "--db", db]).status) }
            }
            return results
        }
        let loadResult = try load.wait()
        #expect(try operatorResults.wait().allSatisfy { $0 == 0 })
        #expect(loadResult.status == 0, "\(loadResult.stderr)")

        // Drain: requeue what failed after the loop, then wait for the dispatcher.
        try relay.waitIdle()
        #expect(try Relayctl.run(["retry", "--failed", "--db", relay.dbPath]).status == 0)
        try relay.waitIdle()

        let json = try #require(try Relayctl.json(loadResult) as? [String: Any])
        let accepted = try #require(json["responses"] as? [[String: Any]]).compactMap { $0["id"] as? String }
        #expect(accepted.count == count)
        var delivered: [String: Int] = [:]
        for push in transport.pushes where push.status == 200 { delivered[push.row.id, default: 0] += 1 }
        // Nothing lost: every accepted response reached "APNs" successfully...
        #expect(Set(accepted) == Set(delivered.keys))
        // ...and none twice.
        #expect(delivered.values.allSatisfy { $0 == 1 }, "\(delivered.filter { $0.value > 1 })")
        // The first-attempt failures were requeued by relayctl and sent again (a new attempt, not a duplicate delivery).
        let failedFirst = Set(transport.pushes.filter { $0.status == 400 }.map(\.row.id))
        #expect(failedFirst.count == count / 5)
    }

    @Test func everyMetricTheAlertsAndDashboardUseIsExported() throws {
        let relay = try LiveRelay()
        defer { relay.stop() }
        // One request so per-status series exist too.
        _ = try Relayctl.run(["send-test", "--url", relay.ingestURL, "--credential", relay.credential, "--root-key", Self.rootKey,
                              "--wait", "10s", "--state-file", relay.directory.appendingPathComponent("s.json").path])
        let exposition = try relay.get("/metrics")
        let exported = Set(exposition.split(separator: "\n").compactMap { line -> String? in
            let parts = line.split(separator: " ")
            return parts.count >= 3 && parts[0] == "#" && parts[1] == "TYPE" ? String(parts[2]) : nil
        })
        #expect(exported.contains("relay_outbox_responses"), "\(exposition)")
        var used = Set<String>()
        for file in ["deploy/prometheus/alerts.yml", "deploy/grafana/relay-dashboard.json"] {
            let text = try String(contentsOf: Relayctl.repoRoot.appendingPathComponent(file), encoding: .utf8)
            let regex = try Regex("relay_[a-z_]+")
            for match in text.matches(of: regex) { used.insert(String(text[match.range])) }
        }
        #expect(used.count >= 6)
        for name in used {
            let base = ["_bucket", "_sum", "_count"].reduce(name) { n, suffix in
                n.hasSuffix(suffix) && exported.contains(String(n.dropLast(suffix.count))) ? String(n.dropLast(suffix.count)) : n
            }
            #expect(exported.contains(base), "\(name) is used by the alerts or dashboard but relay-server does not export it")
        }
    }
}

/// Runs a closure on a thread of its own; `wait()` returns its result.
/// @unchecked Sendable: `result` is written once before `done` is signalled and read after.
final class ThreadResult<T>: @unchecked Sendable {
    private var result: Result<T, any Error>?
    private let done = DispatchSemaphore(value: 0)

    func start(_ body: @escaping @Sendable () throws -> T) {
        Thread { [self] in
            result = Result { try body() }
            done.signal()
        }.start()
    }

    func wait() throws -> T {
        done.wait()
        return try result!.get()
    }
}
