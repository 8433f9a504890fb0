// The real binaries: three relay-server processes on one private PostgreSQL, delivering to a
// mock-apns process over TLS/HTTP/2 with ES256 provider tokens. One relay-server is kill -9'd
// mid-load; every 202 must reach mock-apns, and repeats stay within what the dead node leased.
import Foundation
import RelayCore
import Synchronization
import Testing
import TestSupport

private let env = ProcessInfo.processInfo.environment

/// A long-running child process; stderr goes to a file for post-mortems.
final class Daemon {
    let process = Process()

    init(_ path: String, _ args: [String], stderr: String) throws {
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = args
        _ = FileManager.default.createFile(atPath: stderr, contents: nil)
        process.standardError = FileHandle(forWritingAtPath: stderr)
        process.standardOutput = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    func signal(_ sig: Int32, wait: TimeInterval = 20) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, sig)
        let deadline = Date().addingTimeInterval(wait)
        while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

@Suite(.serialized, .enabled(if: env["RELAY_TEST_PG_URL"] != nil,
                             "RELAY_TEST_PG_URL is not set: relay-server on PostgreSQL tests skipped (make test runs them)"))
struct PostgresRelayServerTests {
    static let app = "com.example.companion"

    func waitFor(_ what: String, timeout: TimeInterval = 60, _ ok: () -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if ok() { return }
            Thread.sleep(forTimeInterval: 0.05)
        }
        throw StoreError.invalid("\(what) not ready within \(timeout)s")
    }

    @Test func threeRelayServersWithMockAPNsSurviveAKill9() throws {
        let bin = Relayctl.binDirectory.path
        let pg = try PrivatePostgres()
        let dir = NSTemporaryDirectory() + "relay-bin-nodes-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try spawnAndWait(["/bin/bash", "-c",
                                    "openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out '\(dir)/apns.p8'"])
        #expect(key.status == 0, "\(key.stderr)")

        let mock = try Daemon(bin + "/mock-apns", [
            "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--generate-tls", "--ca-out", dir + "/ca.pem",
            "--ready-file", dir + "/mock.ready", "--token-key", "ITKEY00001:ITTEAM0001:\(dir)/apns.p8", "--bundle-id", Self.app,
        ], stderr: dir + "/mock.log")
        defer { mock.signal(SIGTERM) }
        var mockPort = 0, controlPort = 0
        try waitFor("mock-apns") {
            guard let d = FileManager.default.contents(atPath: dir + "/mock.ready"),
                  let o = try? JSONSerialization.jsonObject(with: d) as? [String: Any],
                  let p = o["port"] as? Int, let c = o["controlPort"] as? Int else { return false }
            mockPort = p
            controlPort = c
            return true
        }

        let store = try PostgresOutboxStore(options: PostgresStoreOptions(url: pg.url, nodeID: "test-observer"))
        defer { store.close() }
        let credential = try store.createCredential(name: "it", apps: [Self.app]).secret

        var nodes: [Daemon] = [], ports: [(ingest: Int, admin: Int)] = []
        defer { for n in nodes { n.signal(SIGTERM) } }
        for i in 1...3 {
            let ingest = try freeLoopbackPort(), admin = try freeLoopbackPort()
            let config = """
                {"listen": {"host": "127.0.0.1", "port": \(ingest)}, "admin": {"host": "127.0.0.1", "port": \(admin)},
                 "store": {"kind": "postgres", "url": "\(pg.url)", "nodeId": "n\(i)", "leaseSeconds": 5},
                 "dispatch": {"maxInflight": 16, "claimBatch": 16, "requestTimeoutMs": 2000, "maxAnswerWaitMs": 2000, "maxQueueWaitMs": 1000, "backoffBaseMs": 50, "backoffCapMs": 200},
                 "ingest": {"rateLimits": {"perPushToken": {"perSecond": 0, "burst": 1}}},
                 "watchdog": false, "log": {"level": "warning"},
                 "apps": [{"bundleID": "\(Self.app)", "environment": "custom", "url": "https://127.0.0.1:\(mockPort)",
                           "caFile": "\(dir)/ca.pem", "token": {"p8Path": "\(dir)/apns.p8", "keyID": "ITKEY00001", "teamID": "ITTEAM0001"}}]}
                """
            try Data(config.utf8).write(to: URL(fileURLWithPath: dir + "/n\(i).json"))
            nodes.append(try Daemon(bin + "/relay-server", ["--config", dir + "/n\(i).json"], stderr: dir + "/n\(i).log"))
            ports.append((ingest, admin))
        }
        for (i, p) in ports.enumerated() {
            try waitFor("relay-server n\(i + 1)") { MiniHTTP.request(port: p.admin, method: "GET", path: "/readyz")?.status == 200 }
        }

        let killed = 1, total = 240
        let accepted = Mutex<[String: Int]>([:]), statuses = Mutex<[Int: Int]>([:]), sent = Mutex(0), dead = Mutex(false)
        let ingestPorts = ports.map(\.ingest)
        let group = DispatchGroup()
        for client in 0..<4 {
            group.enter()
            Thread.detachNewThread {
                var i = client
                while i < total {
                    var target = i % 3
                    if dead.withLock({ $0 }) && target == killed { target = (target + 1) % 3 }
                    let r = MiniHTTP.post(port: ingestPorts[target], credential: credential, index: i, token: String(format: "%064x", i + 1))
                    statuses.withLock { $0[r?.status ?? 0, default: 0] += 1 }
                    if let r, r.status == 202, let id = MiniHTTP.id(r) { accepted.withLock { $0[id] = target } }
                    sent.withLock { $0 += 1 }
                    i += 4
                }
                group.leave()
            }
        }
        while sent.withLock({ $0 }) < total / 3 { Thread.sleep(forTimeInterval: 0.01) }
        nodes[killed].signal(SIGKILL)
        dead.withLock { $0 = true }
        group.wait()

        let ids = Set(accepted.withLock { $0.keys })
        let byStatus = statuses.withLock { $0 }
        #expect(Set(byStatus.keys).isSubset(of: [202, 0]), "\(byStatus)")
        #expect(ids.count >= total - 20)
        #expect(Set(accepted.withLock { $0.values }).count == 3)

        // Every 202 reaches mock-apns (the dead node's rows after their leases expire).
        var deliveredIDs: [String] = []
        try waitFor("all deliveries", timeout: 90) {
            guard let r = MiniHTTP.request(port: controlPort, method: "GET", path: "/deliveries"),
                  let list = try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [[String: Any]] else { return false }
            deliveredIDs = list.compactMap { ($0["apnsId"] as? String)?.lowercased() }
            return ids.isSubset(of: Set(deliveredIDs))
        }
        #expect(ids.isSubset(of: Set(deliveredIDs)))
        // Repeats only from the dead node's leases (at most its maxInflight).
        let repeats = Dictionary(grouping: deliveredIDs, by: { $0 }).values.filter { $0.count > 1 }
        #expect(repeats.count <= 16 && repeats.allSatisfy { $0.count == 2 }, "\(repeats.count) repeated apns-ids")
        try waitFor("outbox empty", timeout: 30) { (try? store.counts().pending) == 0 }
        for id in ids.prefix(50) { #expect(try store.response(id: id)?.state == .delivered) }
    }
}
