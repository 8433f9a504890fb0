// Issue 30 item 5, on a throwaway cluster: a primary and a streaming standby (pg_basebackup -R,
// scripts/pg-test.sh standby), the real relay-server with both hosts in store.url, the standby
// listed first with target_session_attrs=read-write (docs/postgres.md "Failover").
// - standbyFirstThenPromotion: ingest lands on the primary; the primary is stopped and the
//   standby promoted: the relay answers 202 from the new primary without a restart, and every
//   response answered 202 before the switch is there (the standby is synchronous:
//   synchronous_standby_names = '*', which the docs require for zero loss).
// - aReadOnlyPrimaryAnswers503UntilTheOtherHostTakesWrites: the primary turns read-only under
//   the relay's open sessions (default_transaction_read_only, reloaded): 503
//   storage_unavailable and /readyz fails; the standby is promoted while the old primary stays
//   up read-only: the relay's sessions on it are replaced (SQLSTATE 25006) and it answers 202
//   from the promoted server. Without the 25006 reconnect it keeps answering 503.
import Foundation
import RelayCore
import Testing
import TestSupport

private let env = ProcessInfo.processInfo.environment

/// A private primary with a streaming standby of it, and a relay-server on both.
final class FailoverPair {
    static let app = "com.example.app"
    let primary: PrivatePostgres
    let standbyDir: String
    let standbyURL: String
    let dir: String
    var relay: Daemon?
    var ingestPort = 0, adminPort = 0
    var credential = ""

    /// `synchronous`: the primary waits for the standby at every COMMIT.
    init(synchronous: Bool) throws {
        primary = try PrivatePostgres()
        standbyDir = primary.dir + "-standby"
        let s = try PrivatePostgres.run(["standby", primary.dir, standbyDir])
        guard s.status == 0, let line = s.stdout.split(separator: "\n").last, line.hasPrefix("postgresql://") else {
            throw StoreError.invalid("pg-test.sh standby failed: \(s.stderr)")
        }
        standbyURL = String(line)
        dir = primary.dir + "-relay"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try wait("the standby streaming") { (try? self.sql(self.primary.dir, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")) == "1" }
        if synchronous {
            // Set after the base backup, so the promoted standby does not wait for a standby of its own.
            _ = try sql(primary.dir, "ALTER SYSTEM SET synchronous_standby_names = '*'")
            _ = try sql(primary.dir, "SELECT pg_reload_conf()")
            try wait("the standby synchronous") { (try? self.sql(self.primary.dir, "SELECT sync_state FROM pg_stat_replication")) == "sync" }
        }
        // Migrates the schema and mints the credential on the primary.
        let store = try PostgresOutboxStore(options: PostgresStoreOptions(url: primary.url, nodeID: "failover-observer"))
        defer { store.close() }
        credential = try store.createCredential(name: "failover", apps: [Self.app]).secret
    }

    deinit {
        relay?.signal(SIGTERM)
        _ = try? PrivatePostgres.run(["stop", standbyDir])
        try? FileManager.default.removeItem(atPath: dir)
    }

    func port(_ url: String) -> String { String(url.split(separator: ":").last!.split(separator: "/").first!) }

    /// relay-server with the standby first, then the primary, target_session_attrs=read-write.
    func startRelay() throws {
        let url = "postgresql://relay@127.0.0.1:\(port(standbyURL)),127.0.0.1:\(port(primary.url))/relay?target_session_attrs=read-write"
        let key = try spawnAndWait(["/bin/bash", "-c", "openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out '\(dir)/apns.p8'"])
        guard key.status == 0 else { throw StoreError.invalid("openssl: \(key.stderr)") }
        ingestPort = try freeLoopbackPort()
        adminPort = try freeLoopbackPort()
        let config = """
            {"listen": {"host": "127.0.0.1", "port": \(ingestPort)}, "admin": {"host": "127.0.0.1", "port": \(adminPort)},
             "store": {"kind": "postgres", "url": "\(url)", "nodeId": "failover-1"},
             "apps": [{"bundleID": "\(Self.app)", "environment": "custom", "url": "https://127.0.0.1:9",
                       "token": {"p8Path": "\(dir)/apns.p8", "keyID": "FAILOVER01", "teamID": "FAILTEAM01"}}],
             "ingest": {"rateLimits": {"perPushToken": {"perSecond": 0, "burst": 1}}},
             "watchdog": false, "log": {"level": "warning"}}
            """
        try Data(config.utf8).write(to: URL(fileURLWithPath: dir + "/relay.json"))
        relay = try Daemon(Relayctl.binDirectory.path + "/relay-server", ["--config", dir + "/relay.json"], stderr: dir + "/relay.log")
        try wait("relay-server /readyz") { self.readyz() == 200 }
    }

    func post(_ index: Int) -> MiniHTTP.Reply? {
        MiniHTTP.post(port: ingestPort, credential: credential, index: index, token: String(format: "%064x", index))
    }

    func readyz() -> Int { MiniHTTP.request(port: adminPort, method: "GET", path: "/readyz")?.status ?? 0 }

    func sql(_ clusterDir: String, _ text: String) throws -> String {
        let r = try PrivatePostgres.run(["sql", clusterDir, text])
        guard r.status == 0 else { throw StoreError.invalid("psql: \(r.stderr)") }
        return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func promote() throws {
        let r = try PrivatePostgres.run(["promote", standbyDir])
        guard r.status == 0 else { throw StoreError.invalid("pg-test.sh promote failed: \(r.stderr)") }
    }

    /// Posts (every 100 ms, bounded) until a 202; returns it and every status seen before.
    func postUntilAccepted(from index: Int, timeout: TimeInterval = 30) -> (accepted: MiniHTTP.Reply?, before: [Int], seconds: Double) {
        let start = Date()
        var before: [Int] = [], i = index
        while Date().timeIntervalSince(start) < timeout {
            let r = post(i)
            if r?.status == 202 { return (r, before, Date().timeIntervalSince(start)) }
            before.append(r?.status ?? 0)
            i += 1
            Thread.sleep(forTimeInterval: 0.1)
        }
        return (nil, before, Date().timeIntervalSince(start))
    }

    func wait(_ what: String, timeout: TimeInterval = 30, _ ok: () -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if ok() { return }
            Thread.sleep(forTimeInterval: 0.05)
        }
        throw StoreError.invalid("\(what) not within \(timeout)s")
    }
}

@Suite(.serialized, .enabled(if: env["RELAY_TEST_PG_URL"] != nil,
                             "RELAY_TEST_PG_URL is not set: PostgreSQL failover tests skipped (make test runs them)"))
struct PostgresFailoverTests {
    @Test func standbyFirstThenPromotion() throws {
        let t0 = Date()
        let pair = try FailoverPair(synchronous: true)
        try pair.startRelay()
        // (1) The standby is first in the URL; target_session_attrs=read-write lands on the primary.
        var acked: [String] = []
        for i in 1...20 {
            let r = pair.post(i)
            #expect(r?.status == 202, "\(r?.status ?? 0) \(r?.body ?? "")")
            if let r, let id = MiniHTTP.id(r) { acked.append(id) }
        }
        #expect(acked.count == 20)
        let onPrimary = try PostgresOutboxStore(options: PostgresStoreOptions(url: pair.primary.url, nodeID: "failover-observer"))
        for id in acked { #expect(try onPrimary.response(id: id) != nil, "\(id) not on the primary") }
        onPrimary.close()

        // (3) The primary stops; the standby is promoted; no relay restart.
        try pair.primary.stop()
        try pair.promote()
        let after = pair.postUntilAccepted(from: 100)
        #expect(after.accepted != nil, "no 202 after the promotion: \(after.before)")
        #expect(Set(after.before).isSubset(of: [503, 0]), "\(after.before)")
        if let r = after.accepted, let id = MiniHTTP.id(r) { acked.append(id) }
        #expect(pair.readyz() == 200)
        // Every 202 of before the switch is on the promoted server: 0 lost (synchronous standby).
        let onNew = try PostgresOutboxStore(options: PostgresStoreOptions(url: pair.standbyURL, nodeID: "failover-observer"))
        defer { onNew.close() }
        let lost = try acked.filter { try onNew.response(id: $0) == nil }
        #expect(lost.isEmpty, "\(lost.count) of \(acked.count) acknowledged responses lost")
        print("failover: first 202 after promotion in \(String(format: "%.2f", after.seconds)) s after \(after.before.count) answers \(Set(after.before)); \(acked.count) acknowledged, \(lost.count) lost; test \(String(format: "%.1f", Date().timeIntervalSince(t0))) s")
    }

    @Test func aReadOnlyPrimaryAnswers503UntilTheOtherHostTakesWrites() throws {
        let t0 = Date()
        let pair = try FailoverPair(synchronous: false)
        try pair.startRelay()
        #expect(pair.post(1)?.status == 202)
        // (2) The relay's open sessions on the primary turn read-only; new sessions are refused
        // by target_session_attrs=read-write on both hosts.
        _ = try pair.sql(pair.primary.dir, "ALTER SYSTEM SET default_transaction_read_only = on")
        _ = try pair.sql(pair.primary.dir, "SELECT pg_reload_conf()")
        var refused: MiniHTTP.Reply?
        try pair.wait("a 503") {
            refused = pair.post(2)
            return refused?.status == 503
        }
        #expect(refused?.body.contains("storage_unavailable") == true, "\(refused?.body ?? "")")
        try pair.wait("/readyz 503") { pair.readyz() == 503 }  // its answer is cached for 1 s
        // The other host takes writes (the old primary stays up, read-only): the relay leaves it.
        try pair.promote()
        let after = pair.postUntilAccepted(from: 100)
        #expect(after.accepted != nil, "still no 202 after the promotion: \(after.before)")
        #expect(Set(after.before).isSubset(of: [503, 0]), "\(after.before)")
        try pair.wait("/readyz 200") { pair.readyz() == 200 }
        if let r = after.accepted, let id = MiniHTTP.id(r) {
            let onNew = try PostgresOutboxStore(options: PostgresStoreOptions(url: pair.standbyURL, nodeID: "failover-observer"))
            defer { onNew.close() }
            #expect(try onNew.response(id: id) != nil, "the 202 is not on the promoted server")
        }
        print("read-only primary: 503 storage_unavailable; first 202 after promotion in \(String(format: "%.2f", after.seconds)) s; test \(String(format: "%.1f", Date().timeIntervalSince(t0))) s")
    }
}
