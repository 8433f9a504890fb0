// Secrets hygiene (issue 16, finding 5): PostgreSQL passwords redacted through libpq's own
// parser in every spelling, http:// APNs URLs refused unless loopback or allowed, warnings for
// secret files others can read and for PostgreSQL without sslmode=verify-full, and the mTLS key.
import Foundation
import Testing
@testable import RelayCore

@Suite struct PostgresRedactionTests {
    /// Each spelling libpq accepts for a password. The old text-based redactor printed all but
    /// the first (userinfo) one as written.
    static let forms: [(url: String, secret: String)] = [
        ("postgresql://relay:s3cret@db:5432/relay", "s3cret"),
        ("postgresql://relay@db/relay?password=s3cret", "s3cret"),
        ("postgresql://relay@db/relay?sslmode=require&password=s3cret&connect_timeout=3", "s3cret"),
        ("postgresql://relay:s3%40cr%65t@db/relay", "s3@cret"),
        ("postgres://relay:s3cret@db1:5432,db2:5433/relay", "s3cret"),
        ("host=db password=s3cret dbname=relay", "s3cret"),
        ("host=db password = s3cret dbname=relay", "s3cret"),
        ("host=db password='s3 cret' dbname=relay", "s3 cret"),
        (#"host=db password='it\'s s3cret' dbname=relay"#, "it's s3cret"),
        ("host=db\tpassword=s3cret\ndbname=relay", "s3cret"),
        ("host=db sslpassword=keypass dbname=relay", "keypass"),
    ]

    @Test(arguments: forms)
    func everyFormOfPasswordIsRedacted(_ form: (url: String, secret: String)) throws {
        let shown = redactPostgresURL(form.url)
        #expect(!shown.contains(form.secret) && !shown.contains("s3cret") && !shown.contains("cr%65t"), "\(shown)")
        #expect(shown.contains("password=***"), "\(shown)")
        // What is shown is libpq's reading: it parses back to the same settings, password aside.
        let original = try #require(PostgresConnInfo(form.url)), back = try #require(PostgresConnInfo(shown))
        #expect(original.options.filter { !$0.secret } == back.options.filter { !$0.secret }, "\(shown)")
    }

    @Test func urlsWithoutPasswordsKeepEverythingElse() throws {
        let shown = redactPostgresURL("postgresql://relay@db.internal:6432/relay?sslmode=verify-full&application_name=a%20b")
        #expect(shown == "user=relay dbname=relay host=db.internal port=6432 application_name='a b' sslmode=verify-full")
        #expect(!shown.contains("password"))
    }

    /// libpq quotes the fragment it cannot decode, which can be the password itself.
    @Test func anUnparseableURLIsNeverShownAndFailsTheConfigWithoutTheSecret() throws {
        let url = "postgresql://relay:pa%zzword@db/relay"
        #expect(!redactPostgresURL(url).contains("pa%zz"))
        let problem = try #require(postgresURLProblem(url))
        #expect(problem.contains("percent") && !problem.contains("pa%zz") && !problem.contains("word"), "\(problem)")
        let json = #"{"store":{"kind":"postgres","url":"\#(url)"},"apps":[{"bundleID":"a.b","token":{"p8Path":"k.p8","keyID":"ABCDEFGHIJ","teamID":"ABCDEFGHIJ"}}]}"#
        #expect(throws: ConfigError.self) { try RelayConfig.parse(Array(json.utf8)) }
        do { _ = try RelayConfig.parse(Array(json.utf8)) } catch let e as ConfigError {
            #expect(e.key == "store.url" && !e.message.contains("zzword"), "\(e)")
        }
        let good = json.replacingOccurrences(of: url, with: "postgresql://relay@db/relay?sslmode=verify-full")
        var c = try RelayConfig.parse(Array(good.utf8))
        #expect(throws: ConfigError(key: "RELAY_DB_URL", message: try #require(postgresURLProblem(url)))) {
            try c.applyEnvironment(["RELAY_DB_URL": url])
        }
    }

    @Test func libpqMessagesAreScrubbedOfThePassword() throws {
        let info = try #require(PostgresConnInfo("host=db password='p w' dbname=relay"))
        #expect(info.scrub(#"FATAL: no such user "p w" here"#) == #"FATAL: no such user "***" here"#)
        #expect(info.scrub("nothing secret") == "nothing secret")
    }
}

@Suite struct PostgresTransportWarningTests {
    static func warning(_ url: String, _ env: [String: String] = [:]) -> String? {
        RelayConfig.postgresTransportProblem(url, environment: env)
    }

    @Test func remoteWithoutVerifyFullWarns() {
        #expect(Self.warning("postgresql://relay@db.internal/relay")?.contains("sslmode=prefer") == true)
        #expect(Self.warning("host=db.internal sslmode=require dbname=relay")?.contains("sslmode=require") == true)
        #expect(Self.warning("postgresql://relay@db.internal/relay?sslmode=verify-ca")?.contains("verify-full") == true)
        // One remote host among local ones is enough; the warning names it.
        #expect(Self.warning("host=127.0.0.1,db2.example sslmode=verify-ca")?.contains("db2.example") == true)
        #expect(Self.warning("hostaddr=10.0.0.5 dbname=relay")?.contains("10.0.0.5") == true)
        // libpq falls back to PGHOST when the URL names no host.
        #expect(Self.warning("dbname=relay", ["PGHOST": "db.internal"]) != nil)
    }

    @Test func verifiedOrLocalConnectionsDoNotWarn() {
        #expect(Self.warning("postgresql://relay@db.internal/relay?sslmode=verify-full") == nil)
        #expect(Self.warning("postgresql://relay@db.internal/relay", ["PGSSLMODE": "verify-full"]) == nil)
        #expect(Self.warning("postgresql://relay@localhost/relay") == nil)
        #expect(Self.warning("postgresql://relay@127.0.0.1:5432/relay") == nil)
        #expect(Self.warning("postgresql://relay@[::1]:5432/relay") == nil)
        #expect(Self.warning("host=/var/run/postgresql dbname=relay") == nil)
        #expect(Self.warning("dbname=relay") == nil)  // the Unix socket
        // hostaddr is where libpq connects; host then only names the server.
        #expect(Self.warning("host=db.example hostaddr=127.0.0.1 dbname=relay") == nil)
        #expect(Self.warning("host=localhost hostaddr=10.1.2.3 dbname=relay")?.contains("10.1.2.3") == true)
    }
}

@Suite struct InsecureAPNsTransportTests {
    static func config(url: String, allow: Bool? = nil, environment: String = "custom") throws -> RelayConfig {
        let allowKey = allow.map { #","allowInsecureTransport":\#($0)"# } ?? ""
        let urlKey = environment == "custom" ? #","url":"\#(url)""# : ""
        let json = #"{"apps":[{"bundleID":"a.b","environment":"\#(environment)"\#(urlKey)\#(allowKey),"token":{"p8Path":"/k.p8","keyID":"ABCDEFGHIJ","teamID":"ABCDEFGHIJ"}}]}"#
        return try RelayConfig.parse(Array(json.utf8))
    }

    @Test(arguments: ["http://apns.example.com:2197", "http://10.0.0.7", "http://127.0.0.1.evil.example", "http://user@apns.example",
                      "http://[2001:db8::1]:2197", "http://localhost.example"])
    func cleartextToAnotherHostIsRefused(_ url: String) throws {
        do {
            _ = try Self.config(url: url)
            Issue.record("\(url) accepted")
        } catch let e as ConfigError {
            #expect(e.key == "apps[0].url" && e.message.contains("allowInsecureTransport"), "\(e)")
        }
        // The app may say so; then relay-server warns at start.
        let allowed = try Self.config(url: url, allow: true)
        #expect(allowed.apps[0].allowInsecureTransport)
        #expect(allowed.warnings(configPath: nil).contains { $0.key == "apps[0].url" && $0.message.contains("cleartext") })
    }

    @Test(arguments: ["http://127.0.0.1:2197", "http://127.8.9.10", "http://[::1]:2197/", "http://localhost", "https://apns.example.com"])
    func loopbackOrHTTPSIsAcceptedWithoutWarning(_ url: String) throws {
        let c = try Self.config(url: url)
        #expect(!c.warnings(configPath: nil).contains { $0.key == "apps[0].url" })
    }

    @Test func allowInsecureTransportOnlyWithCustom() throws {
        #expect(throws: ConfigError(key: "apps[0].allowInsecureTransport", message: "only allowed with environment \"custom\"")) {
            try Self.config(url: "", allow: true, environment: "production")
        }
    }
}

@Suite struct SecretFileWarningTests {
    @Test func filesOthersCanReadAreNamed() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("secrets-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        for name in ["k.p8", "tls.key", "tls.pem", "relay.json", "cert.pem", "cert.key", "pass"] {
            try "x".write(toFile: "\(dir)/\(name)", atomically: false, encoding: .utf8)
            chmod("\(dir)/\(name)", 0o600)
        }
        let json = #"""
        {"listen":{"tls":{"certificate":"tls.pem","privateKey":"tls.key"}},
         "apps":[{"bundleID":"a.b","token":{"p8Path":"k.p8","keyID":"ABCDEFGHIJ","teamID":"ABCDEFGHIJ"}},
                 {"bundleID":"a.c","certificate":{"certificatePath":"cert.pem","privateKeyPath":"cert.key","passphraseFile":"pass"}}]}
        """#
        let c = try RelayConfig.parse(Array(json.utf8), baseDirectory: dir)
        #expect(c.warnings(configPath: "\(dir)/relay.json").isEmpty)
        chmod("\(dir)/tls.pem", 0o644)  // a certificate is public
        #expect(c.warnings(configPath: "\(dir)/relay.json").isEmpty)

        let exposed = ["relay.json": "config", "tls.key": "listen.tls.privateKey", "k.p8": "apps[0].token.p8Path",
                       "cert.key": "apps[1].certificate.privateKeyPath", "pass": "apps[1].certificate.passphraseFile"]
        for (file, key) in exposed {
            chmod("\(dir)/\(file)", 0o644)
            let w = c.warnings(configPath: "\(dir)/relay.json")
            #expect(w.count == 1 && w[0].key == key && w[0].message.contains("every user") && w[0].message.contains("0644"), "\(file): \(w)")
            chmod("\(dir)/\(file)", 0o602)
            #expect(c.warnings(configPath: "\(dir)/relay.json").first?.message.contains("written by every user") == true)
            chmod("\(dir)/\(file)", 0o600)
        }
    }

    /// Group access is fine for the service's own group (root:accessory-relay 0640, as
    /// operations.md installs keys), not for a group this process is not in.
    @Test func groupAccessDependsOnTheGroup() {
        #expect(RelayConfig.exposure(mode: 0o640, group: 999, asRoot: false, processGroups: [999, 5]) == nil)
        let foreign = RelayConfig.exposure(mode: 0o640, group: 4242, asRoot: false, processGroups: [999])
        #expect(foreign?.contains("group") == true && foreign?.contains("0640") == true, "\(foreign ?? "")")
        #expect(RelayConfig.exposure(mode: 0o620, group: 4242, asRoot: false, processGroups: [999])?.contains("written by group") == true)
        // As root the service's group cannot be told: only "other" counts.
        #expect(RelayConfig.exposure(mode: 0o640, group: 4242, asRoot: true, processGroups: [0]) == nil)
        #expect(RelayConfig.exposure(mode: 0o604, group: 0, asRoot: true, processGroups: [0]) != nil)
        #expect(RelayConfig.exposure(mode: 0o100600, group: 4242, asRoot: false, processGroups: []) == nil)
    }
}

@Suite struct ClientCAConfigTests {
    @Test func clientCAIsReadAndSurvivesTheEnvironmentOverride() throws {
        let json = #"{"listen":{"tls":{"certificate":"c.pem","privateKey":"c.key","clientCA":"clients.pem"}},"apps":[{"bundleID":"a.b","token":{"p8Path":"k.p8","keyID":"ABCDEFGHIJ","teamID":"ABCDEFGHIJ"}}]}"#
        var c = try RelayConfig.parse(Array(json.utf8), baseDirectory: "/etc/relay")
        #expect(c.listen.tls?.clientCAPath == "/etc/relay/clients.pem")
        try c.applyEnvironment(["RELAY_TLS_CERTIFICATE": "/run/c.pem", "RELAY_TLS_PRIVATE_KEY": "/run/c.key"])
        #expect(c.listen.tls == RelayConfig.TLS(certificatePath: "/run/c.pem", privateKeyPath: "/run/c.key", clientCAPath: "/etc/relay/clients.pem"))
        #expect(c.unreadableFile()?.key == "listen.tls.certificate")
        #expect(throws: ConfigError.self) {
            try RelayConfig.parse(Array(json.replacingOccurrences(of: #""clientCA":"clients.pem""#, with: #""clientCA":"""#).utf8))
        }
    }
}
