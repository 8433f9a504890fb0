// The operator's whole path with the real binaries: relayctl check-config -> relay-server (run
// under the reproducible part of the systemd sandbox: private /proc with subset=pid, no W+X
// memory, every system call recorded) -> relayctl credentials create -> relayctl send-test ->
// mock-apns decrypts each push with the accessory's root secret -> relayctl status. Then the
// recorded system calls and socket families are checked against the unit's filters.
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

private let binaries = ["relay-server", "mock-apns", "relayctl"].map { Relayctl.binDirectory.appendingPathComponent($0).path }
private let endToEndAvailable = binaries.allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
    && FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl")

/// A started child process with its stderr captured to a file.
private final class Child {
    let process = Process()
    let log: URL

    init(_ executable: String, _ arguments: [String], log: URL, environment: [String: String] = [:]) throws {
        self.log = log
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)  // a failure surfaces as FileHandle(forWritingTo:) throwing below
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardOutput = try FileHandle(forWritingTo: log)
        process.standardError = try FileHandle(forWritingTo: log)
        process.standardInput = FileHandle.nullDevice
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        try process.run()
    }

    var output: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    /// Polls (bounded) until `found` returns a value from the log, or fails.
    func waitFor<T>(_ what: String, timeout: TimeInterval = 20, _ found: (String) -> T?) throws -> T {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let value = found(output) { return value }
            guard process.isRunning else { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        throw SeedError(message: "\(what) not seen; log:\n\(output)")
    }

    /// SIGTERM to `pid` (default: the child itself) and wait for the child to exit.
    func terminate(pid: Int32? = nil) -> Int32 {
        if process.isRunning { kill(pid ?? process.processIdentifier, SIGTERM) }
        process.waitUntilExit()
        return process.terminationStatus
    }

    deinit { if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() } }
}

private func firstMatch(_ text: String, _ pattern: String) -> String? {
    guard let regex = try? Regex(pattern), let m = text.firstMatch(of: regex), m.output.count > 1,
          let sub = m.output[1].substring else { return nil }
    return String(sub)
}

@Suite("end to end: relayctl + relay-server + mock-apns", .serialized, .enabled(if: endToEndAvailable, "binaries or openssl missing"))
struct RelayctlEndToEndTests {
    @Test func sendTestIsDeliveredAndDecryptedUnderTheUnitSandbox() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-e2e-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { if ProcessInfo.processInfo.environment["RELAYCTL_TEST_KEEP"] == nil { try? FileManager.default.removeItem(at: dir) } }
        let bundle = "com.example.e2e", apnsKeyID = "E2EKEY0001", teamID = "E2ETEAM001"
        let rootKey = String(repeating: "a5", count: 32), ratchetKeyID = "AQIDBA=="
        let p8 = dir.appendingPathComponent("apns.p8").path
        let gen = Process()
        gen.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        gen.arguments = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", p8]
        try gen.run()
        gen.waitUntilExit()
        try #require(gen.terminationStatus == 0)

        // mock-apns: TLS on an ephemeral port, verifying ratchet traffic with the root secret.
        let ready = dir.appendingPathComponent("mock-ready.json").path
        let mock = try Child(binaries[1], ["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--generate-tls",
                                           "--ca-out", dir.appendingPathComponent("ca.pem").path,
                                           "--token-key", "\(apnsKeyID):\(teamID):\(p8)", "--bundle-id", bundle,
                                           "--root-secret", "\(ratchetKeyID):\(rootKey)", "--ready-file", ready],
                             log: dir.appendingPathComponent("mock.log"))
        let mockInfo: [String: Any] = try mock.waitFor("mock-apns ready file") { _ in
            FileManager.default.contents(atPath: ready).flatMap { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] }
        }
        let apnsPort = try #require(mockInfo["port"] as? Int), controlPort = try #require(mockInfo["controlPort"] as? Int)
        defer { _ = mock.terminate() }

        let config = dir.appendingPathComponent("relay.json").path
        try """
        {"listen": {"host": "127.0.0.1", "port": 0}, "admin": {"host": "127.0.0.1", "port": 0},
         "store": {"path": "relay.db"}, "watchdog": false, "log": {"format": "json", "level": "info"},
         "apps": [{"bundleID": "\(bundle)", "environment": "custom", "url": "https://127.0.0.1:\(apnsPort)", "caFile": "ca.pem",
                   "token": {"p8Path": "apns.p8", "keyID": "\(apnsKeyID)", "teamID": "\(teamID)"}}]}
        """.write(toFile: config, atomically: true, encoding: .utf8)

        let check = try Relayctl.run(["check-config", config])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")

        // relay-server, sandboxed where this machine allows it (root, strace, python3).
        let trace = dir.appendingPathComponent("relay.trace").path
        let sandbox = Relayctl.repoRoot.appendingPathComponent("deploy/systemd/sandbox-run.sh").path
        let sandboxed = getuid() == 0 && ["/usr/bin/strace", "/usr/bin/unshare", "/usr/bin/python3"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
        if sandboxed {
            // Like the unit's User=: an unprivileged owner for the state, the relay run as it.
            let chown = Process()
            chown.executableURL = URL(fileURLWithPath: "/bin/chown")
            chown.arguments = ["-R", "65534:65534", dir.path]
            try chown.run()
            chown.waitUntilExit()
            try #require(chown.terminationStatus == 0)
        }
        let relay = sandboxed
            ? try Child(sandbox, [trace, binaries[0], "--config", config], log: dir.appendingPathComponent("relay.log"),
                        environment: ["SANDBOX_USER": "65534:65534"])
            : try Child(binaries[0], ["--config", config], log: dir.appendingPathComponent("relay.log"))
        let ingest = try relay.waitFor("relay-server ready line") { firstMatch($0, #"ready.*"ingest":"127\.0\.0\.1:(\d+)""#) }
        var relayStopped = false
        defer { if !relayStopped { _ = relay.terminate(pid: relayPID(relay, sandboxed: sandboxed)) } }

        let created = try Relayctl.run(["credentials", "create", "--name", "e2e", "--apps", bundle, "--config", config, "--json"])
        #expect(created.status == 0, "\(created.stderr)")
        let secret = try #require((try Relayctl.json(created) as? [String: Any])?["secret"] as? String)

        let sent = try Relayctl.run(["send-test", "--url", "http://127.0.0.1:\(ingest)", "--credential", secret, "--root-key", rootKey,
                                     "--key-id", ratchetKeyID, "--count", "5", "--wait", "20s", "--text", "e2e reply",
                                     "--state-file", dir.appendingPathComponent("ratchet.json").path, "--json"])
        #expect(sent.status == 0, "\(sent.stdout)\(sent.stderr)\n\(relay.output)")
        let ids = ((try? Relayctl.json(sent) as? [String: Any])?["responses"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
        #expect(ids.count == 5)

        // mock-apns decrypted every push as the iPhone would.
        let deliveriesText = try HTTPTestClient.get("http://127.0.0.1:\(controlPort)/deliveries")
        let deliveries = try #require(try JSONSerialization.jsonObject(with: Data(deliveriesText.utf8)) as? [[String: Any]])
        #expect(Set(deliveries.compactMap { ($0["apnsId"] as? String)?.lowercased() }) == Set(ids.map { $0.lowercased() }))
        #expect(deliveries.allSatisfy { $0["verified"] as? Bool == true }, "\(deliveriesText)")
        #expect(deliveries.allSatisfy { ($0["response"] as? [String: Any])?["userText"] as? String == "e2e reply" })
        #expect(Set(deliveries.compactMap { $0["messageIndex"] as? Int }) == [0, 1, 2, 3, 4])

        let status = try #require(try Relayctl.json(try Relayctl.run(["status", "--config", config, "--json"])) as? [String: Any])
        #expect((status["outbox"] as? [String: Int])?["delivered"] == 5)

        // SIGTERM drains and exits 0.
        let exit = relay.terminate(pid: relayPID(relay, sandboxed: sandboxed))
        relayStopped = true
        #expect(exit == 0, "\(relay.output)")

        if sandboxed {
            // relayctl ran as root beside the server: SQLite handed the files it created to the
            // database's owner, so the service user is never locked out.
            for suffix in ["", "-wal", "-shm"] {
                let path = dir.appendingPathComponent("relay.db" + suffix).path
                guard FileManager.default.fileExists(atPath: path) else { continue }
                let owner = try FileManager.default.attributesOfItem(atPath: path)[.ownerAccountID] as? Int
                #expect(owner == 65534, "relay.db\(suffix) owned by \(owner ?? -1)")
            }
            let checked = try Relayctl.runTool(Relayctl.repoRoot.appendingPathComponent("deploy/systemd/check-trace.sh").path, [trace])
            #expect(checked.status == 0, "\(checked.output)")
            #expect(checked.output.contains("distinct system calls"))
        }
    }

    /// Under sandbox-run.sh the child is strace (same pid through unshare/sh/python execs);
    /// relay-server is strace's child, and it is the one that must get SIGTERM.
    private func relayPID(_ child: Child, sandboxed: Bool) -> Int32? {
        guard sandboxed else { return nil }
        let pid = child.process.processIdentifier
        let children = (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? ""
        return children.split(separator: " ").first.flatMap { Int32($0) }
    }
}

extension Relayctl {
    /// Runs any tool (scripts) with combined output.
    static func runTool(_ executable: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
