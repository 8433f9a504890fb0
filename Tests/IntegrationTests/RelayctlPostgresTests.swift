// relayctl against the PostgreSQL store (issue 8): the same commands through --config with
// store.kind "postgres". Uses RELAY_TEST_PG_URL (make test starts a throwaway cluster with
// scripts/pg-test.sh) and a schema of its own; skipped without it.
import Foundation
import Testing

private let pgURL: String? = {
    let v = ProcessInfo.processInfo.environment["RELAY_TEST_PG_URL"] ?? ""
    return v.isEmpty ? nil : v
}()

private func psql(_ sql: String) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
    process.arguments = [pgURL ?? "", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql]
    process.standardOutput = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    try #require(process.terminationStatus == 0, "psql \(sql)")
}

@Suite("relayctl on PostgreSQL", .enabled(if: pgURL != nil && FileManager.default.isExecutableFile(atPath: "/usr/bin/psql"),
                                            "RELAY_TEST_PG_URL not set (make test sets it)"))
struct RelayctlPostgresTests {
    @Test func commandsWorkThroughAPostgresConfig() throws {
        let schema = "relayctl_\(UUID().uuidString.prefix(8).lowercased())"
        try psql("CREATE SCHEMA \(schema)")
        defer { try? psql("DROP SCHEMA \(schema) CASCADE") }
        let base = try #require(pgURL)
        let url = base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)&application_name=\(schema)"
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-pg-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let config = dir.appendingPathComponent("relay.json").path
        let json: [String: Any] = [
            "store": ["kind": "postgres", "url": url],
            "apps": [["bundleID": "com.example.companion", "environment": "sandbox",
                      "token": ["p8Path": "k.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"]]],
        ]
        try JSONSerialization.data(withJSONObject: json).write(to: URL(fileURLWithPath: config))

        // The first writer migrates the schema, as relay-server would on start.
        let created = try Relayctl.run(["credentials", "create", "--name", "pg", "--apps", "com.example.companion", "--config", config, "--json"])
        #expect(created.status == 0, "\(created.stderr)")
        let status = try #require(try Relayctl.json(try Relayctl.run(["status", "--config", config, "--json"])) as? [String: Any])
        let database = try #require(status["database"] as? [String: Any])
        #expect(database["kind"] as? String == "postgres")
        #expect(database["bytes"] is NSNull)   // docs/relayctl-json.md: null for PostgreSQL
        #expect(database["walBytes"] is NSNull)
        #expect(status["credentials"] as? Int == 1)
        #expect((status["outbox"] as? [String: Int])?.values.reduce(0, +) == 0)
        #expect(try Relayctl.run(["list", "--config", config]).stdout == "no responses match\n")
        let listed = try #require(try Relayctl.json(try Relayctl.run(["credentials", "list", "--config", config, "--json"])) as? [[String: Any]])
        #expect(listed.count == 1)
        // The password never shows: describe() redacts it (the test URL may have none).
        let backup = try Relayctl.run(["backup", dir.appendingPathComponent("b.db").path, "--config", config])
        #expect(backup.status == 1 && backup.stderr.contains("pg_dump"))
        let check = try Relayctl.run(["check-config", config, "--skip-ports", "--json"])
        let checks = try #require((try Relayctl.json(check) as? [String: Any])?["checks"] as? [[String: String]])
        #expect(checks.contains { $0["subject"] == "store" && $0["status"] == "ok" }, "\(checks)")
    }
}
