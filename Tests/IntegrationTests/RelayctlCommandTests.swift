// relayctl's operational commands, run as the real binary against a temporary database seeded
// with rows in every state: text and --json output, exit codes (0 / 1 runtime / 64 usage), and
// the safety rules (inflight and delivered rows are never requeued, secrets printed only once).
import Foundation
import RelayCore
import Testing

@Suite("relayctl operational commands")
struct RelayctlCommandTests {
    // MARK: status

    @Test func statusCountsEveryState() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let text = try Relayctl.run(["status", "--db", db.path])
        #expect(text.status == 0, "\(text.stderr)")
        #expect(text.stdout.contains("queued 2  inflight 1  retry 1  delivered 2  failed 4"), "\(text.stdout)")
        #expect(text.stdout.contains("delivered 1, failed 1 (TopicDisallowed 1)"), "last hour: \(text.stdout)")
        #expect(text.stdout.contains("unregistered tokens  1"))
        #expect(text.stdout.contains("retention            delivered 86400 s, failed 604800 s (defaults"), "\(text.stdout)")
        #expect(text.stdout.contains("free space") && text.stdout.contains("ingest refused below 1.0 GiB"), "\(text.stdout)")

        let json = try #require(try Relayctl.json(try Relayctl.run(["status", "--db", db.path, "--json"])) as? [String: Any])
        let outbox = try #require(json["outbox"] as? [String: Int])
        #expect(outbox == ["queued": 2, "inflight": 1, "retry": 1, "delivered": 2, "failed": 4])
        #expect(json["pending"] as? Int == 4)
        let age = try #require(json["oldestPendingAgeSeconds"] as? Int)
        // Two hours plus however long seeding and relayctl took (over 100 s on a loaded machine).
        let elapsed = Int((Int64(Date().timeIntervalSince1970 * 1000) - db.seededAtMillis) / 1000)
        #expect((7200...(7201 + elapsed)).contains(age), "oldest pending is the two-hour-old queued row, got \(age)s")
        let lastHour = try #require(json["lastHour"] as? [String: Any])
        #expect(lastHour["delivered"] as? Int == 1)
        #expect(lastHour["failedByReason"] as? [String: Int] == ["TopicDisallowed": 1])
        #expect(json["unregisteredTokens"] as? Int == 1)
        let database = try #require(json["database"] as? [String: Any])
        #expect((database["bytes"] as? Int ?? 0) > 0)
    }

    @Test func statusOnAMissingDatabaseIsARuntimeFailure() throws {
        let r = try Relayctl.run(["status", "--db", "/nonexistent/relay.db"])
        #expect(r.status == 1)
        #expect(r.stderr.contains("does not exist"))
        #expect(r.stdout.isEmpty)
    }

    @Test func configNamesTheDatabaseLikeTheServer() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        // A relative store path resolves against the config's directory, as relay-server does it.
        let config = db.directory.appendingPathComponent("relay.json")
        let app = #""apps": [{"bundleID": "com.example.companion", "environment": "sandbox", "token": {"p8Path": "k.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]"#
        try #"{"store": {"path": "relay.db"}, \#(app)}"#.write(to: config, atomically: true, encoding: .utf8)
        let r = try Relayctl.run(["status", "--config", config.path, "--json"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(((try Relayctl.json(r) as? [String: Any])?["database"] as? [String: Any])?["path"] as? String == db.path)
        // The retention policy shown is the config's.
        try #"{"store": {"path": "relay.db", "retention": {"deliveredSeconds": 3600, "failedSeconds": 0}, "minFreeBytes": 0}, \#(app)}"#.write(to: config, atomically: true, encoding: .utf8)
        let policy = try #require(try Relayctl.json(try Relayctl.run(["status", "--config", config.path, "--json"])) as? [String: Any])
        let retention = try #require(policy["retention"] as? [String: Any])
        #expect(retention["deliveredSeconds"] as? Int == 3600 && retention["failedSeconds"] as? Int == 0 && retention["source"] as? String == "config")
        #expect((policy["disk"] as? [String: Any])?["minFreeBytes"] as? Int == 0)
        let policyText = try Relayctl.run(["status", "--config", config.path])
        #expect(policyText.stdout.contains("delivered 3600 s, failed kept (config)") && policyText.stdout.contains("(no floor)"), "\(policyText.stdout)")
        // RELAY_DB_PATH overrides the file, as for the server.
        let env = try Relayctl.run(["status", "--config", config.path], environment: ["RELAY_DB_PATH": "/nonexistent/x.db"])
        #expect(env.status == 1 && env.stderr.contains("/nonexistent/x.db"))
        // A bad config is a runtime failure naming the key.
        try #"{"store": {"path": "relay.db", "pth": 1}, \#(app)}"#.write(to: config, atomically: true, encoding: .utf8)
        let bad = try Relayctl.run(["list", "--config", config.path])
        #expect(bad.status == 1 && bad.stderr.contains("store.pth"), "\(bad.stderr)")
        let missing = try Relayctl.run(["status", "--config", db.directory.appendingPathComponent("none.json").path])
        #expect(missing.status == 1 && missing.stderr.contains("cannot read config"))
    }

    // MARK: list / show

    @Test func listFiltersAlignsAndTruncates() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let all = try Relayctl.run(["list", "--db", db.path])
        #expect(all.status == 0, "\(all.stderr)")
        let lines = all.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 11)  // header + 10 rows
        // Aligned: every row's STATE cell starts where the header's does.
        let header = try #require(lines.first)
        let stateColumn = try #require(header.range(of: "STATE")).lowerBound.utf16Offset(in: header)
        for line in lines.dropFirst() {
            let cell = String(line.utf16.dropFirst(stateColumn))!.prefix { $0 != " " }
            #expect(["queued", "inflight", "retry", "delivered", "failed"].contains(String(cell)), "\(line)")
        }
        // Tokens are truncated in tables, complete in JSON.
        for token in db.tokens.values { #expect(!all.stdout.contains(token)) }
        #expect(all.stdout.contains(String(db.tokens["inflight"]!.prefix(8)) + "…"))

        let failed = try #require(try Relayctl.json(try Relayctl.run(["list", "--db", db.path, "--state", "failed", "--json"])) as? [[String: Any]])
        #expect(Set(failed.compactMap { $0["id"] as? String }) == Set(["failed-baddevice", "failed-unregistered", "failed-expired", "failed-topic"].map { db.ids[$0]! }))
        #expect(Set(failed.compactMap { $0["pushToken"] as? String }).isSubset(of: Set(db.tokens.values)))

        let recent = try #require(try Relayctl.json(try Relayctl.run(["list", "--db", db.path, "--since", "30m", "--json"])) as? [[String: Any]])
        #expect(Set(recent.compactMap { $0["id"] as? String }) == [db.ids["delivered-recent"]!, db.ids["failed-topic"]!])

        let byToken = try #require(try Relayctl.json(try Relayctl.run(["list", "--db", db.path, "--token", String(db.tokens["retry"]!.prefix(6)).uppercased(), "--json"])) as? [[String: Any]])
        #expect(byToken.compactMap { $0["id"] as? String } == [db.ids["retry"]!])
        #expect(byToken.first?["lastReason"] as? String == "ServiceUnavailable")

        let limited = try #require(try Relayctl.json(try Relayctl.run(["list", "--db", db.path, "--limit", "3", "--json"])) as? [[String: Any]])
        #expect(limited.count == 3)
        let app = try Relayctl.run(["list", "--db", db.path, "--app", "com.other.app"])
        #expect(app.status == 0 && app.stdout == "no responses match\n")
    }

    @Test func listRejectsBadArguments() throws {
        for args in [["--state", "lost"], ["--limit", "0"], ["--limit", "x"], ["--since", "yesterday"], ["--token", "xyz"], ["--token", "\u{FF41}\u{FF42}"], ["--bogus"], ["extra"], ["--state"]] {
            let r = try Relayctl.run(["list", "--db", "/nonexistent"] + args)
            #expect(r.status == 64, "list \(args): \(r.status) \(r.stderr)")
            #expect(r.stderr.hasPrefix("error: "), "\(r.stderr)")
        }
        // An option's value left out before the next option: said so, not read as the value
        // (which used to make "retry --failed --reason --db x" complain about ids and --failed).
        // Fullwidth hex digits are hex to Character.isHexDigit, but no token is ever spelled so.
        let fullwidth = try Relayctl.run(["tokens", "forget", "\u{FF41}\u{FF42}", "--db", "/nonexistent"])
        #expect(fullwidth.status == 64 && fullwidth.stderr.contains("expected hex digits"), "\(fullwidth.status) \(fullwidth.stderr)")
        let r = try Relayctl.run(["retry", "--failed", "--reason", "--db", "/nonexistent"])
        #expect(r.status == 64)
        #expect(r.stderr.hasPrefix("error: option '--reason' needs a value"), "\(r.stderr)")
    }

    @Test func showPrintsEveryFieldAndAttempt() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let id = db.ids["failed-unregistered"]!
        let text = try Relayctl.run(["show", id, "--db", db.path])
        #expect(text.status == 0, "\(text.stderr)")
        for needle in [id, db.tokens["failed-unregistered"]!, "failed", "410 Unregistered", "AQIDBA==", "40 bytes", db.credentialID, "com.example.companion"] {
            #expect(text.stdout.contains(needle), "show lacks \(needle): \(text.stdout)")
        }
        let json = try #require(try Relayctl.json(try Relayctl.run(["show", id, "--db", db.path, "--json"])) as? [String: Any])
        let response = try #require(json["response"] as? [String: Any])
        #expect(response["state"] as? String == "failed")
        #expect(response["messageIndex"] as? Int != nil)
        let attempts = try #require(json["attempts"] as? [[String: Any]])
        #expect(attempts.count == 1)
        #expect(attempts.first?["status"] as? Int == 410)
        #expect(attempts.first?["apnsTimestamp"] is String)

        #expect(try Relayctl.run(["show", "00000000-0000-0000-0000-000000000000", "--db", db.path]).status == 1)
        #expect(try Relayctl.run(["show", "--db", db.path]).status == 64)
        #expect(try Relayctl.run(["show", "a", "b", "--db", db.path]).status == 64)
    }

    // MARK: retry / purge

    @Test func retryRequeuesOnlyFailedAndRetryRows() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        func state(_ role: String) throws -> String? {
            let json = try Relayctl.json(try Relayctl.run(["show", db.ids[role]!, "--db", db.path, "--json"])) as? [String: Any]
            return (json?["response"] as? [String: Any])?["state"] as? String
        }
        let ok = try Relayctl.run(["retry", db.ids["failed-baddevice"]!, db.ids["retry"]!, "--db", db.path, "--json"])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect((try Relayctl.json(ok) as? [String: Any])?["requeued"] as? Int == 2)
        #expect(try state("failed-baddevice") == "queued")
        #expect(try state("retry") == "queued")

        // Inflight belongs to the dispatcher; delivered is never sent twice.
        let refused = try Relayctl.run(["retry", db.ids["inflight"]!, db.ids["delivered-old"]!, "--db", db.path])
        #expect(refused.status == 1)
        #expect(refused.stdout.contains("requeued 0"))
        #expect(refused.stdout.contains("inflight: held by the dispatcher"))
        #expect(refused.stdout.contains("already delivered"))
        #expect(try state("inflight") == "inflight")
        #expect(try state("delivered-old") == "delivered")

        let missing = try Relayctl.run(["retry", "00000000-0000-0000-0000-000000000000", "--db", db.path])
        #expect(missing.status == 1 && missing.stdout.contains("not found"))

        let byReason = try Relayctl.run(["retry", "--failed", "--reason", "TopicDisallowed", "--db", db.path])
        #expect(byReason.status == 0 && byReason.stdout == "requeued 1\n", "\(byReason.stdout)")
        #expect(try state("failed-topic") == "queued")
        #expect(try state("failed-unregistered") == "failed")
        let rest = try Relayctl.run(["retry", "--failed", "--db", db.path, "--json"])
        #expect((try Relayctl.json(rest) as? [String: Any])?["requeued"] as? Int == 2)  // unregistered + expired

        for args in [["retry"], ["retry", "--failed", "x"], ["retry", "x", "--reason", "BadTopic"]] {
            #expect(try Relayctl.run(args + ["--db", db.path]).status == 64, "\(args)")
        }
    }

    @Test func purgeDeletesOnlyOldTerminalRows() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let dry = try Relayctl.run(["purge", "--delivered", "--failed", "--older-than", "1h", "--dry-run", "--db", db.path, "--json"])
        #expect(dry.status == 0, "\(dry.stderr)")
        let dryJSON = try #require(try Relayctl.json(dry) as? [String: Any])
        #expect(dryJSON["deleted"] as? [String: Int] == ["delivered": 1, "failed": 3])
        #expect(dryJSON["dryRun"] as? Bool == true)
        // Nothing deleted by the dry run.
        let before = try #require(try Relayctl.json(try Relayctl.run(["status", "--db", db.path, "--json"])) as? [String: Any])
        #expect((before["outbox"] as? [String: Int])?["failed"] == 4)

        let real = try Relayctl.run(["purge", "--failed", "--older-than", "1h", "--db", db.path])
        #expect(real.status == 0)
        #expect(real.stdout == "deleted 3 failed responses older than 1h00m\n", "\(real.stdout)")
        let after = try #require(try Relayctl.json(try Relayctl.run(["status", "--db", db.path, "--json"])) as? [String: Any])
        #expect(after["outbox"] as? [String: Int] == ["queued": 2, "inflight": 1, "retry": 1, "delivered": 2, "failed": 1])
        #expect(try Relayctl.run(["show", db.ids["failed-baddevice"]!, "--db", db.path]).status == 1)

        for args in [["purge", "--older-than", "1h"], ["purge", "--delivered"], ["purge", "--delivered", "--older-than", "soon"], ["purge", "--queued", "--older-than", "1h"]] {
            #expect(try Relayctl.run(args + ["--db", db.path]).status == 64, "\(args)")
        }
    }

    // MARK: tokens

    @Test func tokensListShowForget() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let token = db.tokens["failed-unregistered"]!
        let list = try Relayctl.run(["tokens", "list", "--db", db.path])
        #expect(list.status == 0 && list.stdout.contains(String(token.prefix(8)) + "…") && !list.stdout.contains(token))
        let listJSON = try #require(try Relayctl.json(try Relayctl.run(["tokens", "list", "--db", db.path, "--json"])) as? [[String: Any]])
        #expect(listJSON.compactMap { $0["token"] as? String } == [token])

        let show = try Relayctl.run(["tokens", "show", String(token.prefix(10)), "--db", db.path])
        #expect(show.status == 0 && show.stdout.contains(token), "\(show.stderr)")
        #expect(try Relayctl.run(["tokens", "show", "ffff", "--db", db.path]).status == 1)
        #expect(try Relayctl.run(["tokens", "show", "zz", "--db", db.path]).status == 64)

        let forget = try Relayctl.run(["tokens", "forget", token, "--db", db.path])
        #expect(forget.status == 0, "\(forget.stderr)")
        #expect(try Relayctl.run(["tokens", "list", "--db", db.path]).stdout == "no marked tokens\n")
        #expect(try Relayctl.run(["tokens", "forget", token, "--db", db.path]).status == 1)
        #expect(try Relayctl.run(["tokens", "--db", db.path]).status == 64)
        #expect(try Relayctl.run(["tokens", "drop", token, "--db", db.path]).status == 64)
    }

    // MARK: credentials

    @Test func credentialSecretIsPrintedOnlyByCreate() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let created = try Relayctl.run(["credentials", "create", "--name", "fleet-b", "--apps", "com.example.companion,com.example.other", "--db", db.path, "--json"])
        #expect(created.status == 0, "\(created.stderr)")
        let json = try #require(try Relayctl.json(created) as? [String: Any])
        let secret = try #require(json["secret"] as? String)
        #expect(secret.hasPrefix("rk_") && secret.count > 40)
        let id = try #require((json["credential"] as? [String: Any])?["id"] as? String)
        #expect((json["credential"] as? [String: Any])?["apps"] as? [String] == ["com.example.companion", "com.example.other"])

        let text = try Relayctl.run(["credentials", "create", "--name", "fleet-c", "--apps", "com.example.companion", "--db", db.path])
        #expect(text.status == 0 && text.stdout.contains("secret: rk_") && text.stdout.contains("only time"))

        // No other command output carries either secret (the seeded one included).
        var everything = ""
        for args in [["status"], ["list"], ["list", "--json"], ["credentials", "list"], ["credentials", "list", "--json"],
                     ["show", db.ids["inflight"]!, "--json"], ["tokens", "list", "--json"]] {
            let r = try Relayctl.run(args + ["--db", db.path])
            #expect(r.status == 0, "\(args): \(r.stderr)")
            everything += r.stdout + r.stderr
        }
        #expect(!everything.contains(secret))
        #expect(!everything.contains(db.credentialSecret))
        #expect(!everything.contains("rk_"))

        let listed = try #require(try Relayctl.json(try Relayctl.run(["credentials", "list", "--db", db.path, "--json"])) as? [[String: Any]])
        #expect(listed.count == 3)
        #expect(listed.first { $0["id"] as? String == db.credentialID }?["lastUsedAt"] is String)

        #expect(try Relayctl.run(["credentials", "revoke", id, "--db", db.path]).status == 0)
        let afterRevoke = try #require(try Relayctl.json(try Relayctl.run(["credentials", "list", "--db", db.path, "--json"])) as? [[String: Any]])
        #expect(afterRevoke.first { $0["id"] as? String == id }?["revokedAt"] is String)
        #expect(try Relayctl.run(["credentials", "revoke", id, "--db", db.path]).status == 1)

        for args in [["credentials", "create", "--apps", "a"], ["credentials", "create", "--name", "x"], ["credentials", "create", "--name", "x", "--apps", ","],
                     ["credentials", "revoke"], ["credentials"], ["credentials", "rotate"]] {
            #expect(try Relayctl.run(args + ["--db", db.path]).status == 64, "\(args)")
        }
    }

    /// A credential for a bundle ID the relay does not serve gets 400 unknown_app on every
    /// request; create used to print its secret without a word. Now it warns (and still creates).
    @Test func createWarnsAboutAppsTheConfigDoesNotServe() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let config = db.directory.appendingPathComponent("relay.json")
        let app = #""apps": [{"bundleID": "com.example.companion", "environment": "sandbox", "token": {"p8Path": "k.p8", "keyID": "ABC123DEFG", "teamID": "DEF123GHIJ"}}]"#
        try #"{"store": {"path": "relay.db"}, \#(app)}"#.write(to: config, atomically: true, encoding: .utf8)
        let typo = try Relayctl.run(["credentials", "create", "--name", "a", "--apps", "com.example.companion,com.example.compainon", "--config", config.path])
        #expect(typo.status == 0, "\(typo.stderr)")
        #expect(typo.stdout.contains("secret: rk_"))
        #expect(typo.stderr.contains("warning: com.example.compainon not configured in this relay (apps: com.example.companion)"), "\(typo.stderr)")
        #expect(!typo.stderr.contains("rk_"))
        let fine = try Relayctl.run(["credentials", "create", "--name", "b", "--apps", "com.example.companion", "--config", config.path])
        #expect(fine.status == 0 && fine.stderr.isEmpty, "\(fine.stderr)")
    }

    @Test func writersNeverCreateAMissingDatabase() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent("relay.db").path
        let r = try Relayctl.run(["credentials", "create", "--name", "x", "--apps", "a.b", "--db", path])
        #expect(r.status == 1)
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    /// Writers used to open the store writable straight away, which migrates: a mistyped --db
    /// got the relay's tables, and a database of an older relay-server was rebuilt under it.
    @Test func writersNeverMigrateAnUnknownSchema() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        // An empty file (what `touch` leaves), another program's database, and one claiming an
        // older relay schema.
        let empty = dir.appendingPathComponent("empty.db").path
        #expect(FileManager.default.createFile(atPath: empty, contents: Data()))
        let foreign = dir.appendingPathComponent("other.db").path
        let older = dir.appendingPathComponent("older.db").path
        for (path, version) in [(foreign, 0), (older, 4)] {
            let db = try SQLiteDatabase(path: path)
            try db.execute("CREATE TABLE t (x)")
            try db.execute("PRAGMA user_version = \(version)")
        }
        let writers: [[String]] = [["credentials", "create", "--name", "x", "--apps", "a.b"], ["credentials", "revoke", "cred_0"],
                                   ["purge", "--delivered", "--older-than", "1d"], ["retry", "--failed"], ["tokens", "forget", "ab"]]
        for (path, version) in [(empty, 0), (foreign, 0), (older, 4)] {
            for args in writers {
                let r = try Relayctl.run(args + ["--db", path])
                #expect(r.status == 1, "\(args) on \(path): \(r.stdout)")
                #expect(r.stderr.contains("schema version \(version), expected"), "\(args): \(r.stderr)")
                #expect(!r.stdout.contains("rk_"))
            }
            let check = try SQLiteDatabase(path: path, readOnly: true)
            #expect(try check.scalar("PRAGMA user_version").int == Int64(version))
            #expect(try check.query("SELECT name FROM sqlite_master WHERE name IN ('responses', 'credentials')").isEmpty, "\(path)")
        }
    }

    // MARK: backup

    @Test func backupIsConsistentPrivateAndNeverOverwrites() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let target = db.directory.appendingPathComponent("backup.db").path
        let r = try Relayctl.run(["backup", target, "--db", db.path])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stdout.contains("10 responses"))
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: target)[.posixPermissions] as? Int)
        #expect(mode & 0o077 == 0, "backup mode \(String(mode, radix: 8))")
        let copy = try #require(try Relayctl.json(try Relayctl.run(["status", "--db", target, "--json"])) as? [String: Any])
        #expect(copy["outbox"] as? [String: Int] == ["queued": 2, "inflight": 1, "retry": 1, "delivered": 2, "failed": 4])
        let again = try Relayctl.run(["backup", target, "--db", db.path])
        #expect(again.status == 1 && again.stderr.contains("refusing to overwrite"))
        #expect(try Relayctl.run(["backup", "--db", db.path]).status == 64)
    }

    @Test("backup to a symbolic link is refused, dangling or not; the link's target is neither created nor written")
    func backupRefusesASymbolicLink() async throws {
        let db = try await SeededDatabase.make()
        defer { db.remove() }
        let link = db.directory.appendingPathComponent("backup.db").path
        let victim = db.directory.appendingPathComponent("victim").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: victim)
        let dangling = try Relayctl.run(["backup", link, "--db", db.path])
        #expect(dangling.status == 1 && dangling.stderr.contains("\(link) is a symbolic link; refusing to create a file through it"), "\(dangling.stderr)")
        #expect(!FileManager.default.fileExists(atPath: victim))
        try Data("victim".utf8).write(to: URL(fileURLWithPath: victim))
        let existing = try Relayctl.run(["backup", link, "--db", db.path])
        #expect(existing.status == 1 && existing.stderr.contains("is a symbolic link"), "\(existing.stderr)")
        #expect(FileManager.default.contents(atPath: victim) == Data("victim".utf8))
    }
}
