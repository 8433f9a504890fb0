// relayctl check-config against key material made on the spot with the openssl CLI: a good
// config passes; an expiring certificate, a mismatched key, a non-P-256 .p8 and a busy port
// each fail with the key named, and the exit status says so.
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif
import TestSupport

private func openssl(_ arguments: [String], in directory: URL) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
    process.arguments = arguments
    process.currentDirectoryURL = directory
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    try #require(process.terminationStatus == 0, "openssl \(arguments.joined(separator: " "))")
}

private let opensslAvailable = FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl")

@Suite("relayctl check-config", .enabled(if: opensslAvailable, "openssl CLI not installed"))
struct RelayctlCheckConfigTests {
    let dir: URL

    init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-check-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        try openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "AuthKey.p8"], in: dir)
        try openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "rsa.key"], in: dir)
        try openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "good.key",
                     "-out", "good.pem", "-days", "365", "-subj", "/CN=relay.example"], in: dir)
        try openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "soon.key",
                     "-out", "soon.pem", "-days", "10", "-subj", "/CN=push.example"], in: dir)
    }

    func write(_ json: String) throws -> String {
        let path = dir.appendingPathComponent("relay-\(UUID().uuidString).json").path
        try json.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    func checks(_ result: Relayctl.Result) throws -> [(status: String, subject: String, detail: String)] {
        let json = try #require(try Relayctl.json(result) as? [String: Any])
        let list = try #require(json["checks"] as? [[String: String]])
        return list.map { ($0["status"] ?? "", $0["subject"] ?? "", $0["detail"] ?? "") }
    }

    @Test func aGoodConfigPasses() throws {
        let config = try write("""
        {"listen": {"host": "127.0.0.1", "port": \(try freeLoopbackPort()), "tls": {"certificate": "good.pem", "privateKey": "good.key"}},
         "admin": {"host": "127.0.0.1", "port": \(try freeLoopbackPort())},
         "store": {"path": "relay.db"},
         "apps": [{"bundleID": "com.example.companion", "environment": "sandbox",
                   "token": {"p8Path": "AuthKey.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]}
        """)
        defer { try? FileManager.default.removeItem(at: dir) }
        // Secrets only their owner can read: no warning (SecretsTests and the test below).
        for file in [config, dir.appendingPathComponent("good.key").path, dir.appendingPathComponent("AuthKey.p8").path] { chmod(file, 0o600) }
        let text = try Relayctl.run(["check-config", config])
        #expect(text.status == 0, "\(text.stdout)\(text.stderr)")
        #expect(text.stdout.contains("OK    config"))
        #expect(!text.stdout.contains("FAIL"))
        let result = try Relayctl.run(["check-config", config, "--json"])
        let all = try checks(result)
        #expect(all.allSatisfy { $0.status == "ok" }, "\(all)")
        #expect(all.contains { $0.subject == "listen.tls" && $0.detail.contains("relay.example") })
        #expect(all.contains { $0.subject == "listen.tls key" && $0.detail.contains("matches") })
        #expect(all.contains { $0.subject.hasSuffix("token") && $0.detail.contains("EC P-256") })
        #expect(all.filter { $0.subject.hasSuffix("port") }.count == 2)
    }

    /// A PKCS#12 push certificate (.p12 with its password in a file, no privateKeyPath): the
    /// certificate's validity and the key inside it are checked; a wrong password is named.
    @Test func aPKCS12CertificateIsChecked() throws {
        try openssl(["pkcs12", "-export", "-in", "good.pem", "-inkey", "good.key", "-passout", "pass:p12-pass", "-out", "push.p12"], in: dir)
        try "p12-pass\n".write(to: dir.appendingPathComponent("p12.pass"), atomically: true, encoding: .utf8)
        try "nope\n".write(to: dir.appendingPathComponent("wrong.pass"), atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: dir) }
        func config(passFile: String) throws -> String {
            try write("""
            {"admin": {"enabled": false}, "store": {"path": "relay.db"},
             "apps": [{"bundleID": "com.example.companion", "environment": "sandbox",
                       "certificate": {"certificatePath": "push.p12", "passphraseFile": "\(passFile)"}}]}
            """)
        }
        let good = try checks(try Relayctl.run(["check-config", try config(passFile: "p12.pass"), "--json", "--skip-ports"]))
        #expect(good.contains { $0.status == "ok" && $0.subject.hasSuffix("certificate") && $0.detail.contains("relay.example") }, "\(good)")
        #expect(good.contains { $0.status == "ok" && $0.subject.hasSuffix("certificate key") && $0.detail.contains("inside") }, "\(good)")
        let bad = try checks(try Relayctl.run(["check-config", try config(passFile: "wrong.pass"), "--json", "--skip-ports"]))
        #expect(bad.contains { $0.status == "fail" && $0.subject.hasSuffix("certificate") && $0.detail.contains("wrong passphrase") }, "\(bad)")
    }

    /// events.webhooks: the secret file's lines and the CA file, each named; relay-server
    /// --check-config refuses a bad secret too, without printing it.
    @Test func webhookSecretsAndCAAreChecked() throws {
        let good = "whsec_" + Data(repeating: 7, count: 32).base64EncodedString()
        try "\(good)\n\(good)\n".write(to: dir.appendingPathComponent("rotating.secret"), atomically: true, encoding: .utf8)
        try "whsec_c2hvcnQ=\n".write(to: dir.appendingPathComponent("short.secret"), atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: dir) }
        let config = try write("""
        {"admin": {"enabled": false}, "store": {"path": "relay.db"},
         "apps": [{"bundleID": "com.example.companion", "environment": "sandbox",
                   "token": {"p8Path": "AuthKey.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}],
         "events": {"webhooks": [{"name": "backend", "url": "https://hooks.example.com/relay", "secretFile": "rotating.secret", "caFile": "good.pem"},
                                 {"name": "other", "url": "https://other.example.com/relay", "secretFile": "short.secret", "caFile": "good.key"}]}}
        """)
        let all = try checks(try Relayctl.run(["check-config", config, "--json", "--skip-ports"]))
        #expect(all.contains { $0.status == "ok" && $0.subject == "events.webhooks[0]" && $0.detail.contains("2 secrets") }, "\(all)")
        #expect(all.contains { $0.status == "ok" && $0.subject == "events.webhooks[0].caFile" && $0.detail.contains("relay.example") }, "\(all)")
        #expect(all.contains { $0.status == "fail" && $0.subject == "events.webhooks[1].secretFile" && $0.detail.contains("at least 24") }, "\(all)")
        #expect(all.contains { $0.status == "fail" && $0.subject == "events.webhooks[1].caFile" }, "\(all)")
        #expect(!all.contains { $0.detail.contains("c2hvcnQ") || $0.detail.contains(String(good.dropFirst(6))) })
        let server = try Relayctl.runTool(relayBinary("relay-server"), ["--check-config", "--config", config])
        #expect(server.status == 1 && server.output.contains("events.webhooks[1].secretFile"), "\(server.output)")
        #expect(!server.output.contains("c2hvcnQ"))
    }

    @Test func everyProblemIsNamed() throws {
        let busy = try LoopbackListener(backlog: 1)
        let config = try write("""
        {"listen": {"host": "127.0.0.1", "port": \(try freeLoopbackPort())},
         "admin": {"host": "127.0.0.1", "port": \(busy.port)},
         "store": {"path": "missing-dir/relay.db"},
         "apps": [{"bundleID": "com.example.a", "environment": "sandbox",
                   "token": {"p8Path": "rsa.key", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}},
                  {"bundleID": "com.example.b", "environment": "sandbox",
                   "certificate": {"certificatePath": "soon.pem", "privateKeyPath": "good.key"}},
                  {"bundleID": "com.example.c", "environment": "sandbox",
                   "token": {"p8Path": "nonexistent.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]}
        """)
        defer { try? FileManager.default.removeItem(at: dir) }
        let result = try Relayctl.run(["check-config", config, "--json"])
        #expect(result.status == 1)
        let failed = try checks(result).filter { $0.status == "fail" }
        func failure(_ subject: String, _ needle: String) -> Bool { failed.contains { $0.subject == subject && $0.detail.contains(needle) } }
        #expect(failure("admin port", "in use"), "\(failed)")
        #expect(failure("store.path", "missing-dir"), "\(failed)")
        #expect(failure("apps[0] com.example.a token", "RSA"), "\(failed)")
        #expect(failure("apps[1] com.example.b certificate", "within 30 days"), "\(failed)")
        #expect(failure("apps[1] com.example.b certificate key", "not the certificate's private key"), "\(failed)")
        #expect(failure("apps[2] com.example.c token", "nonexistent.p8"), "\(failed)")
        #expect(failed.count == 6, "\(failed)")

        // --skip-ports drops the port check; a shorter expiry window accepts the 10-day certificate.
        let relaxed = try checks(try Relayctl.run(["check-config", config, "--json", "--skip-ports", "--expiry-days", "5"])).filter { $0.status == "fail" }
        #expect(!relaxed.contains { $0.subject == "admin port" })
        #expect(!relaxed.contains { $0.subject == "apps[1] com.example.b certificate" })
        #expect(relaxed.count == 4, "\(relaxed)")

        let text = try Relayctl.run(["check-config", config])
        #expect(text.status == 1 && text.stderr.contains("6 check(s) failed"))
    }

    /// The warnings relay-server logs at start, listed by check-config too: a key file every
    /// user can read, a PostgreSQL URL without sslmode=verify-full, cleartext to APNs. The
    /// password in the URL shows in neither check-config, relay-server --check-config nor status.
    @Test func exposedSecretsAreWarnedAboutAndPasswordsNeverShown() throws {
        defer { try? FileManager.default.removeItem(at: dir) }
        chmod(dir.appendingPathComponent("AuthKey.p8").path, 0o644)
        let config = try write("""
        {"admin": {"enabled": false},
         "store": {"kind": "postgres", "url": "postgresql://relay@db.invalid:5432/relay?connect_timeout=2&password=hunter2-secret"},
         "apps": [{"bundleID": "com.example.companion", "environment": "custom", "url": "http://apns.example:2197", "allowInsecureTransport": true,
                   "token": {"p8Path": "AuthKey.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]}
        """)
        chmod(config, 0o600)
        let result = try Relayctl.run(["check-config", config, "--json", "--skip-ports"])
        #expect(!(result.stdout + result.stderr).contains("hunter2"), "\(result.stdout)")
        let warned = try checks(result).filter { $0.status == "warn" }
        #expect(warned.contains { $0.subject == "apps[0].token.p8Path" && $0.detail.contains("every user") }, "\(warned)")
        #expect(warned.contains { $0.subject == "store.url" && $0.detail.contains("verify-full") && $0.detail.contains("db.invalid") }, "\(warned)")
        #expect(warned.contains { $0.subject == "apps[0].url" && $0.detail.contains("cleartext") }, "\(warned)")
        #expect(!warned.contains { $0.subject == "config" }, "\(warned)")
        #expect(try checks(result).contains { $0.subject == "store" && $0.detail.contains("password=***") })

        let status = try Relayctl.run(["status", "--config", config])
        #expect(status.status == 1 && status.stderr.contains("password=***") && !status.stderr.contains("hunter2"), "\(status.stderr)")

        let server = try RelayChild(relayBinary("relay-server"), ["--config", config, "--check-config"], name: "relay-server")
        #expect(server.wait(seconds: 15) == 0)
        #expect(server.stderr.contains("warning: apps[0].token.p8Path: ") && server.stderr.contains("warning: store.url: "), "\(server.stderr)")
        #expect(!server.stderr.contains("hunter2"))
    }

    @Test func anUnparseableConfigFailsNamingTheKey() throws {
        defer { try? FileManager.default.removeItem(at: dir) }
        let config = try write(#"{"listen": {"port": 99999}, "apps": []}"#)
        let r = try Relayctl.run(["check-config", config])
        #expect(r.status == 1)
        #expect(r.stdout.contains("FAIL") && r.stdout.contains("listen.port"), "\(r.stdout)")
        #expect(try Relayctl.run(["check-config", config, "--expiry-days", "-1"]).status == 64)
        #expect(try Relayctl.run(["check-config", "a.json", "b.json"]).status == 64)
    }
}
