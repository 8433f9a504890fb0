// The webhook sender half of issue 24: Standard Webhooks signing (the published example, rotation),
// the back-off table, `events.webhooks` config errors, and the sender against a loopback receiver
// with faults (500s, no answer, connection refused, redirects) and an in-memory outbox.
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import RelayCore

@Suite struct WebhookSigningTests {
    /// The example used across the Standard Webhooks libraries' test suites (and Svix's).
    @Test func publishedExample() throws {
        let secret = WebhookSecret(key: Data(base64Encoded: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")!.map { $0 })
        let body = Array(#"{"test": 2432232314}"#.utf8)
        #expect(WebhookSigning.signature(id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1614265330, body: body, secret: secret)
                == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        // The same through the whsec_ text form (its key is exactly the 24-byte minimum).
        let parsed = try WebhookSecret(parsing: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        let headers = WebhookSigning.headers(id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1614265330, body: body, secrets: [parsed])
        #expect(headers.map(\.name) == ["webhook-id", "webhook-timestamp", "webhook-signature"])
        #expect(headers.map(\.value) == ["msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="])
        #expect(WebhookSigning.verify(id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: "1614265330", signatures: headers[2].value,
                                      body: body, secret: parsed, nowSeconds: 1614265330 + 60))
    }

    @Test func rotationSignsWithBothSecretsEachVerifiable() throws {
        let old = try WebhookSecret(parsing: makeWebhookSecretText(1)), new = try WebhookSecret(parsing: makeWebhookSecretText(2))
        let other = try WebhookSecret(parsing: makeWebhookSecretText(3))
        let body = Array(#"{"type":"response.delivered"}"#.utf8)
        let signature = WebhookSigning.headers(id: "e1", timestamp: 1_800_000_000, body: body, secrets: [old, new])[2].value
        let parts = signature.split(separator: " ").map(String.init)
        #expect(parts.count == 2 && parts.allSatisfy { $0.hasPrefix("v1,") })
        #expect(parts[0] == WebhookSigning.signature(id: "e1", timestamp: 1_800_000_000, body: body, secret: old))
        #expect(parts[1] == WebhookSigning.signature(id: "e1", timestamp: 1_800_000_000, body: body, secret: new))
        for secret in [old, new] {
            #expect(WebhookSigning.verify(id: "e1", timestamp: "1800000000", signatures: signature, body: body, secret: secret, nowSeconds: 1_800_000_000))
        }
        #expect(!WebhookSigning.verify(id: "e1", timestamp: "1800000000", signatures: signature, body: body, secret: other, nowSeconds: 1_800_000_000))
        // Anything signed changed, or too old: refused.
        #expect(!WebhookSigning.verify(id: "e2", timestamp: "1800000000", signatures: signature, body: body, secret: old, nowSeconds: 1_800_000_000))
        #expect(!WebhookSigning.verify(id: "e1", timestamp: "1800000001", signatures: signature, body: body, secret: old, nowSeconds: 1_800_000_000))
        #expect(!WebhookSigning.verify(id: "e1", timestamp: "1800000000", signatures: signature, body: body + [0x20], secret: old, nowSeconds: 1_800_000_000))
        #expect(!WebhookSigning.verify(id: "e1", timestamp: "1800000000", signatures: signature, body: body, secret: old, nowSeconds: 1_800_000_301))
    }

    @Test func secretTextIsChecked() {
        #expect(throws: WebhookSecret.ParseError.missingPrefix) { try WebhookSecret(parsing: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") }
        #expect(throws: WebhookSecret.ParseError.notBase64) { try WebhookSecret(parsing: "whsec_not base64!") }
        #expect(throws: WebhookSecret.ParseError.tooShort(3)) { try WebhookSecret(parsing: "whsec_AAAA") }
    }
}

@Suite struct WebhookRetryPolicyTests {
    @Test("Back-off ceilings: 1 s doubling to 10 min; full jitter; never past the retry window; then dead")
    func table() {
        let p = WebhookRetryPolicy(baseMillis: 1000, capMillis: 600_000, retryForMillis: 86_400_000, pauseCapMillis: 30_000)
        let ceilings: [(attempts: Int, ceiling: Int64)] = [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (9, 256_000), (10, 512_000), (11, 600_000), (40, 600_000), (10_000, 600_000)]
        for (attempts, ceiling) in ceilings { #expect(p.ceiling(afterAttempts: attempts) == ceiling, "attempts \(attempts)") }
        let t0: Int64 = 1_800_000_000_000
        // (attemptsBefore, firstAttemptAt, now, random) -> expected
        let cases: [(Int, Int64?, Int64, Double, WebhookAttemptResult)] = [
            (0, nil, t0, 0.0, .retry(attemptedAt: t0, at: t0, error: "e")),                          // jitter can retry at once
            (0, nil, t0, 0.5, .retry(attemptedAt: t0, at: t0 + 500, error: "e")),
            (0, nil, t0, 0.999_999, .retry(attemptedAt: t0, at: t0 + 999, error: "e")),
            (3, t0, t0 + 7000, 0.5, .retry(attemptedAt: t0 + 7000, at: t0 + 11_000, error: "e")),     // 4th failure: ceiling 8 s
            (20, t0, t0 + 3_600_000, 1.0, .retry(attemptedAt: t0 + 3_600_000, at: t0 + 4_200_000, error: "e")),
            (30, t0, t0 + 86_000_000, 1.0, .retry(attemptedAt: t0 + 86_000_000, at: t0 + 86_400_000, error: "e")), // clamped to the window
            (31, t0, t0 + 86_400_000, 0.3, .dead(attemptedAt: t0 + 86_400_000, error: "e")),
            (31, t0, t0 + 90_000_000, 0.3, .dead(attemptedAt: t0 + 90_000_000, error: "e")),
        ]
        for (before, first, now, random, expected) in cases {
            #expect(p.afterFailure(attemptsBefore: before, firstAttemptAt: first, now: now, error: "e", random: random) == expected,
                    "before \(before) first \(String(describing: first)) now \(now) random \(random)")
        }
        // retryFor 0: the first failure is the last.
        #expect(WebhookRetryPolicy(retryForMillis: 0).afterFailure(attemptsBefore: 0, firstAttemptAt: nil, now: t0, error: "e", random: 0.5)
                == .dead(attemptedAt: t0, error: "e"))
        // A failing receiver: no pause before the first failure, then 1 s doubling to 30 s.
        #expect([0, 1, 2, 3, 5, 6, 100].map { p.receiverPause(failures: $0) } == [0, 1000, 2000, 4000, 16_000, 30_000, 30_000])
    }
}

@Suite struct WebhookConfigTests {
    static let app = #"{"bundleID":"com.example.app","token":{"p8Path":"k","keyID":"ABCDEFGHIJ","teamID":"TEAM123456"}}"#

    static func config(_ webhooks: String) -> String { #"{"apps":[\#(app)],"events":{"webhooks":\#(webhooks)}}"# }

    @Test func parsesEveryKeyAndDefaults() throws {
        let c = try RelayConfig.parse(Array(Self.config(#"""
            [{"name":"backend","url":"https://hooks.example.com/relay","secretFile":"webhook-secret","types":["response.failed","token.unregistered"],
              "apps":["com.example.app"],"caFile":"ca.pem","timeoutMs":5000,"retryForSeconds":3600,"maxConcurrent":4},
             {"name":"local","url":"http://127.0.0.1:9000/","secretFile":"/etc/s"}]
            """#).utf8), baseDirectory: "/etc/relay")
        #expect(c.events.webhooks.count == 2)
        let b = c.events.webhooks[0], l = c.events.webhooks[1]
        #expect(b.name == "backend" && b.url == "https://hooks.example.com/relay" && b.secretFile == "/etc/relay/webhook-secret")
        #expect(b.types == [.responseFailed, .tokenUnregistered] && b.apps == ["com.example.app"] && b.caFile == "/etc/relay/ca.pem")
        #expect(b.timeoutMillis == 5000 && b.retryForSeconds == 3600 && b.maxConcurrent == 4 && !b.allowInsecureTransport)
        #expect(l.types == Set(EventType.allCases) && l.apps == nil && l.caFile == nil)
        #expect(l.timeoutMillis == 10_000 && l.retryForSeconds == 86_400 && l.maxConcurrent == 8)
        #expect(c.events.subscriptions == [WebhookSubscription(name: "backend", types: [.responseFailed, .tokenUnregistered], apps: ["com.example.app"]),
                                           WebhookSubscription(name: "local")])
        // No events key: no webhooks.
        #expect(try RelayConfig.parse(Array(#"{"apps":[\#(Self.app)]}"#.utf8)).events.webhooks.isEmpty)
        // The webhooks thread's nice value: 10 by default, 0-19.
        #expect(c.events.senderNiceness == 10)
        let nice = #"{"apps":[\#(Self.app)],"events":{"webhooks":[],"senderNiceness":@@}}"#
        #expect(try RelayConfig.parse(Array(nice.replacing("@@", with: "19").utf8)).events.senderNiceness == 19)
        #expect(try RelayConfig.parse(Array(nice.replacing("@@", with: "0").utf8)).events.senderNiceness == 0)
        for bad in ["20", "-1", "\"10\""] {
            #expect { _ = try RelayConfig.parse(Array(nice.replacing("@@", with: bad).utf8)) } throws: { "\($0)".contains("events.senderNiceness") }
        }
    }

    /// The sender's thread runs at `niceness` (setpriority on itself): the process's other
    /// threads keep theirs.
    @Test func theSenderThreadRunsAtItsNiceValue() throws {
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let sender = WebhookSender(endpoints: [.init(name: "hook", url: "http://127.0.0.1:1/", secrets: WebhookSenderTests.secrets)],
                                   outbox: outbox, metrics: WebhookMetrics(), logger: RelayLogger(minimum: .error, capture: true), niceness: 7)
        try sender.start()
        defer { sender.stop(grace: .zero) }
        /// Each thread of this process named `name`: its nice value (field 19 of /proc/self/task/<tid>/stat).
        func nice(of name: String) throws -> [Int] {
            try FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").compactMap { tid in
                guard (try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) == name,
                      let stat = try? String(contentsOfFile: "/proc/self/task/\(tid)/stat", encoding: .utf8),
                      let close = stat.lastIndex(of: ")") else { return nil }
                let fields = stat[stat.index(after: close)...].split(separator: " ")
                return Int(fields[16])   // after "pid (comm)": state is fields[0], nice is stat's 19th
            }
        }
        var seen: [Int] = []
        for _ in 0..<200 {   // the thread sets it as it starts
            seen = try nice(of: "webhooks")
            if seen == [7] { break }
            usleep(10_000)
        }
        #expect(seen == [7])
        #expect(getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) == 0)   // this thread's unchanged
    }

    @Test func invalidWebhooksNameTheKey() {
        let ok = #""name":"a","url":"https://h.example/x","secretFile":"s""#
        let cases: [(String, String)] = [
            (#"{"apps":[\#(Self.app)],"events":{"hooks":[]}}"#, "events.hooks"),
            (Self.config(#"{}"#), "events.webhooks"),
            (Self.config(#"[{"url":"https://h.example/x","secretFile":"s"}]"#), "events.webhooks[0].name"),
            (Self.config(#"[{"name":"a b","url":"https://h.example/x","secretFile":"s"}]"#), "events.webhooks[0].name"),
            (Self.config(#"[{\#(ok)},{\#(ok)}]"#), "events.webhooks[1].name"),
            (Self.config(#"[{"name":"a","secretFile":"s"}]"#), "events.webhooks[0].url"),
            (Self.config(#"[{"name":"a","url":"ftp://h.example/x","secretFile":"s"}]"#), "events.webhooks[0].url"),
            (Self.config(#"[{"name":"a","url":"http://hooks.example.com/x","secretFile":"s"}]"#), "events.webhooks[0].url"),
            (Self.config(#"[{"name":"a","url":"https://h.example/x"}]"#), "events.webhooks[0].secretFile"),
            (Self.config(#"[{\#(ok),"types":[]}]"#), "events.webhooks[0].types"),
            (Self.config(#"[{\#(ok),"types":["response.sent"]}]"#), "events.webhooks[0].types[0]"),
            (Self.config(#"[{\#(ok),"apps":["com.other.app"]}]"#), "events.webhooks[0].apps[0]"),
            (Self.config(#"[{\#(ok),"timeoutMs":10}]"#), "events.webhooks[0].timeoutMs"),
            (Self.config(#"[{\#(ok),"retryForSeconds":-1}]"#), "events.webhooks[0].retryForSeconds"),
            (Self.config(#"[{\#(ok),"maxConcurrent":0}]"#), "events.webhooks[0].maxConcurrent"),
            (Self.config(#"[{\#(ok),"allowInsecureTransport":"yes"}]"#), "events.webhooks[0].allowInsecureTransport"),
            (Self.config(#"[{\#(ok),"secret":"whsec_x"}]"#), "events.webhooks[0].secret"),
        ]
        for (json, key) in cases {
            do {
                _ = try RelayConfig.parse(Array(json.utf8))
                Issue.record("accepted: \(json)")
            } catch let e as ConfigError {
                #expect(e.key == key, "\(json) -> \(e)")
            } catch { Issue.record("wrong error \(error)") }
        }
        // Cleartext to another host only when the operator says so, with a warning.
        let insecure = Self.config(#"[{"name":"a","url":"http://hooks.example.com/x","secretFile":"/dev/null","allowInsecureTransport":true}]"#)
        let c = try? RelayConfig.parse(Array(insecure.utf8))
        #expect(c?.events.webhooks.first?.allowInsecureTransport == true)
        #expect(c?.warnings(configPath: nil, environment: [:]).contains { $0.key == "events.webhooks[0].url" } == true)
    }

    @Test func secretFilesHoldOneOrTwoSecrets() throws {
        let dir = TempDir()
        func config(_ contents: String) throws -> RelayConfig {
            try contents.write(toFile: dir.path + "/secret", atomically: true, encoding: .utf8)
            return try RelayConfig.parse(Array(Self.config(#"[{"name":"a","url":"https://h.example/x","secretFile":"secret"}]"#).utf8), baseDirectory: dir.path)
        }
        let one = makeWebhookSecretText(1), two = makeWebhookSecretText(2)
        #expect(try config("\(one)\n").webhookSecrets(0).count == 1)
        let rotating = try config("\(one)\n\n  \(two)  \r\n").webhookSecrets(0)
        let body: [UInt8] = [1]
        #expect(rotating.count == 2)
        #expect(WebhookSigning.signature(id: "x", timestamp: 1, body: body, secret: rotating[1])
                == WebhookSigning.signature(id: "x", timestamp: 1, body: body, secret: try WebhookSecret(parsing: two)))
        for (contents, fragment) in [("", "holds 0 secrets"), ("\(one)\n\(two)\n\(one)\n", "holds 3 secrets"), ("whsec_AAAA\n", "line 1"), ("\(one)\nsecret\n", "line 2")] {
            do {
                _ = try config(contents).webhookSecrets(0)
                Issue.record("accepted \(contents)")
            } catch let e as ConfigError {
                #expect(e.key == "events.webhooks[0].secretFile" && e.message.contains(fragment), "\(e)")
                #expect(!e.message.contains("AAAA") && !e.message.contains(String(one.dropFirst(6))), "the secret must not be in the message: \(e)")
            }
        }
        let missing = try RelayConfig.parse(Array(Self.config(#"[{"name":"a","url":"https://h.example/x","secretFile":"absent"}]"#).utf8), baseDirectory: dir.path)
        #expect(missing.unreadableFile()?.key == "events.webhooks[0].secretFile")
        #expect(throws: ConfigError.self) { try missing.webhookSecrets(0) }
    }
}

/// The sender against a loopback receiver. Times are scaled down (back-off in tens of ms, the
/// window in a second or two); every wait has a generous bound (5-10x what it needs).
@Suite(.serialized) struct WebhookSenderTests {
    static let secrets = [try! WebhookSecret(parsing: makeWebhookSecretText(7)), try! WebhookSecret(parsing: makeWebhookSecretText(8))]

    static func sender(_ url: String, _ outbox: InMemoryWebhookOutbox, metrics: WebhookMetrics, timeoutMillis: Int = 10_000, maxConcurrent: Int = 4,
                       retry: WebhookRetryPolicy = WebhookRetryPolicy(baseMillis: 20, capMillis: 200, retryForMillis: 60_000, pauseCapMillis: 100),
                       secrets: [WebhookSecret] = secrets) -> WebhookSender {
        WebhookSender(endpoints: [.init(name: "hook", url: url, secrets: secrets, timeoutMillis: timeoutMillis, maxConcurrent: maxConcurrent, retry: retry)],
                      outbox: outbox, metrics: metrics, logger: RelayLogger(minimum: .error, capture: true), idlePollMillis: 50)
    }

    /// Every event delivered, each request signed with both secrets, retries with the same id and body.
    static func expectAllArrived(_ events: [StoredEvent], _ receiver: WebhookTestReceiver, _ outbox: InMemoryWebhookOutbox) {
        let requests = receiver.requests
        let byID = Dictionary(grouping: requests, by: \.id)
        #expect(Set(byID.keys) == Set(events.map(\.id)), "unknown or missing ids")
        for event in events {
            for r in byID[event.id] ?? [] {
                #expect(r.body == event.body, "a retry changed the body")
                #expect(r.verified == [true, true], "bad signature on \(event.id): \(r.signature)")
            }
        }
        #expect(outbox.snapshot("hook").allSatisfy { $0.state == .delivered })
    }

    @Test func deliversThroughServerErrorsAndTimeoutsWithValidSignatures() throws {
        // Requests 0-2 answer 500, every 5th later one never answers (the 300 ms timeout), 302 once.
        let receiver = try WebhookTestReceiver(secrets: Self.secrets) { n in
            n < 3 ? .status(500) : n == 4 ? .redirect("http://127.0.0.1:1/elsewhere") : n % 5 == 0 ? .noAnswer : .status(200)
        }
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<20).map { _ in outbox.add() }
        let metrics = WebhookMetrics(webhooks: ["hook"])
        let sender = Self.sender(receiver.url, outbox, metrics: metrics, timeoutMillis: 300)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        Self.expectAllArrived(events, receiver, outbox)
        let counts = metrics.counts("hook")
        #expect(counts.sent == 20 && counts.dead == 0)
        #expect(counts.failedAttempts >= 4, "500 x3, the redirect and at least one timeout were failures: \(counts)")
        #expect(receiver.requests.allSatisfy { $0.httpVersion == "HTTP/1.1" })
        let errors = outbox.snapshot("hook").flatMap(\.errors)
        #expect(errors.contains("HTTP 302"), "the redirect was not followed and counted as a failure: \(errors)")
        #expect(errors.contains("HTTP 500") && errors.contains { $0.lowercased().contains("timed out") }, "\(errors)")
    }

    @Test func connectionRefusedForAWhileThenAcceptedWithoutSpinning() throws {
        let port = try freeLoopbackPort()
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<50).map { _ in outbox.add() }
        let metrics = WebhookMetrics(webhooks: ["hook"])
        let sender = Self.sender("http://127.0.0.1:\(port)/hook", outbox, metrics: metrics, maxConcurrent: 8)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        // 1.5 s with nothing listening. Each event on its own would retry every ~100 ms (back-off
        // capped at 200 ms, full jitter): ~750 attempts for 50 events. The receiver pause (20 ms
        // doubling to 100 ms, one probe at a time) allows ~20.
        Thread.sleep(forTimeInterval: 1.5)
        let attemptsWhileDown = outbox.totalAttempts("hook")
        #expect(attemptsWhileDown >= 3 && attemptsWhileDown <= 60, "attempts while refused: \(attemptsWhileDown)")
        #expect(outbox.snapshot("hook").allSatisfy { $0.state == .pending })
        let receiver = try WebhookTestReceiver(secrets: Self.secrets, port: port)
        defer { receiver.close() }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        Self.expectAllArrived(events, receiver, outbox)
        // Connections are reused: far fewer than requests.
        #expect(receiver.connectionsAccepted <= 8, "connections: \(receiver.connectionsAccepted) for \(receiver.requests.count) requests")
        #expect(metrics.counts("hook").sent == 50)
    }

    @Test("A request that cannot be set up here (libcurl out of memory) is no attempt: no failure, no pause, no dead; sent again")
    func localSetupFailuresAreNotAttempts() throws {
        let receiver = try WebhookTestReceiver(secrets: Self.secrets)
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<3).map { _ in outbox.add() }
        let metrics = WebhookMetrics(webhooks: ["hook"])
        // The first five setups fail: each event at least once, two of them twice (1 s apart).
        // A window of 1 ms: had a local failure been an attempt, the second would be dead.
        let faults = Mutex(5)
        let sender = WebhookSender(
            endpoints: [.init(name: "hook", url: receiver.url, secrets: Self.secrets, maxConcurrent: 4,
                              retry: WebhookRetryPolicy(baseMillis: 20, capMillis: 200, retryForMillis: 1, pauseCapMillis: 100))],
            outbox: outbox, metrics: metrics, logger: RelayLogger(minimum: .error, capture: true), idlePollMillis: 50,
            setupFault: { faults.withLock { n in n > 0 ? { n -= 1; return "out of memory (test)" }() : nil } })
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        Self.expectAllArrived(events, receiver, outbox)
        #expect(outbox.snapshot("hook").allSatisfy { $0.attempts == 1 && $0.errors.isEmpty }, "\(outbox.snapshot("hook"))")
        #expect(outbox.notSent == Array(repeating: "out of memory (test)", count: 5))
        let counts = metrics.counts("hook")
        #expect(counts.sent == 3 && counts.failedAttempts == 0 && counts.dead == 0, "\(counts)")
        #expect(metrics.localFailures("hook") == 5)
    }

    /// A local failure that persists (every setup fails) costs one delivery a second, however
    /// often commits wake the sender: a wake no longer cuts the local wait, and one delivery at
    /// a time is tried while they fail. (Before, each wake started maxConcurrent deliveries
    /// again: hundreds of failed turns, each a store transaction, in two seconds.)
    @Test func aPersistentLocalFailureIsNotRetriedAtEveryWake() throws {
        let receiver = try WebhookTestReceiver(secrets: Self.secrets)
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        for _ in 0..<50 { _ = outbox.add() }
        let sender = WebhookSender(
            endpoints: [.init(name: "hook", url: receiver.url, secrets: Self.secrets, maxConcurrent: 4,
                              retry: WebhookRetryPolicy(baseMillis: 20, capMillis: 200, retryForMillis: 60_000, pauseCapMillis: 2_000))],
            outbox: outbox, metrics: WebhookMetrics(webhooks: ["hook"]), logger: RelayLogger(minimum: .error, capture: true), idlePollMillis: 50,
            setupFault: { "curl built without a needed feature (test)" })
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        for _ in 0..<200 {   // commits waking it, for about two seconds
            sender.wake()
            Thread.sleep(forTimeInterval: 0.01)
        }
        // The first turn's four, then at most one a second (a loaded machine only makes fewer).
        #expect(outbox.notSent.count >= 1 && outbox.notSent.count <= 10, "\(outbox.notSent.count) deliveries not sent")
        #expect(receiver.requests.isEmpty)
    }

    /// Sent and dead are counted once the store has recorded them: while the commit fails the
    /// counters stay put, and each result counts once when a later commit takes it.
    @Test func sentAndDeadAreCountedOnlyOnceTheirCommitSucceeded() throws {
        for (answer, retryFor) in [(200, Int64(60_000)), (503, Int64(0))] {
            let receiver = try WebhookTestReceiver(secrets: Self.secrets) { _ in .status(answer) }
            defer { receiver.close() }
            let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
            for _ in 0..<3 { outbox.add() }
            outbox.commitsFail = true
            let metrics = WebhookMetrics(webhooks: ["hook"])
            let sender = Self.sender(receiver.url, outbox, metrics: metrics,
                                     retry: WebhookRetryPolicy(baseMillis: 20, capMillis: 200, retryForMillis: retryFor, pauseCapMillis: 100))
            try sender.start()
            defer { sender.stop(grace: .seconds(1)) }
            #expect(eventually(30) { receiver.requests.count >= 3 })
            Thread.sleep(forTimeInterval: 0.3)   // several failed commits of those results
            #expect(metrics.counts("hook").sent == 0 && metrics.counts("hook").dead == 0, "HTTP \(answer): \(metrics.counts("hook"))")
            outbox.commitsFail = false
            #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state != .pending } })
            let counts = metrics.counts("hook")
            #expect(answer == 200 ? counts.sent == 3 && counts.dead == 0 : counts.sent == 0 && counts.dead == 3, "HTTP \(answer): \(counts)")
        }
    }

    /// A result the store drops as stale (its delivery was replayed while the request was on its
    /// way) is not counted as sent: the replayed delivery's own answer is, once.
    @Test func aStaleResultIsNotCountedAsSent() throws {
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let receiver = try WebhookTestReceiver(secrets: Self.secrets) { n in
            // The first three requests (one in flight at a time): replayed before the answer, so
            // each answer is stale and its delivery handed out again.
            if n < 3 { outbox.replayPending(webhook: "hook") }
            return .status(200)
        }
        defer { receiver.close() }
        let events = (0..<3).map { _ in outbox.add() }
        let metrics = WebhookMetrics(webhooks: ["hook"])
        let sender = Self.sender(receiver.url, outbox, metrics: metrics, maxConcurrent: 1)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        #expect(receiver.requests.count == 6 && Set(receiver.requests.map(\.id)) == Set(events.map(\.id)))
        #expect(metrics.counts("hook").sent == 3)
        #expect(metrics.staleResults("hook") == 3)
    }

    @Test func deadAfterRetryFor() throws {
        let receiver = try WebhookTestReceiver(secrets: Self.secrets) { _ in .status(503) }
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<5).map { _ in outbox.add() }
        let metrics = WebhookMetrics(webhooks: ["hook"])
        let retry = WebhookRetryPolicy(baseMillis: 20, capMillis: 100, retryForMillis: 800, pauseCapMillis: 50)
        let sender = Self.sender(receiver.url, outbox, metrics: metrics, retry: retry)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .dead } })
        for row in outbox.snapshot("hook") {
            #expect(row.attempts >= 2 && row.lastError == "HTTP 503")
            let window = (row.deadAttemptedAt ?? 0) - (row.firstAttemptAt ?? .max)
            #expect(window >= 800 && window < 10_000, "dead \(window) ms after the first attempt")
        }
        #expect(metrics.counts("hook").dead == 5)
        #expect(Set(receiver.requests.map(\.id)) == Set(events.map(\.id)))
        var page = PrometheusRegistry()
        metrics.collect(into: &page)
        let text = page.render()
        #expect(text.contains(#"relay_webhook_events_dead_total{webhook="hook"} 5"#), "\(text)")
        #expect(text.contains(#"relay_webhook_backlog{webhook="hook"}"#))
    }

    @Test func inOrderWhenTheReceiverAccepts() throws {
        let receiver = try WebhookTestReceiver(secrets: Self.secrets)
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<30).map { _ in outbox.add() }
        let sender = Self.sender(receiver.url, outbox, metrics: WebhookMetrics(), maxConcurrent: 1)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        #expect(receiver.requests.map(\.id) == events.map(\.id))
        #expect(receiver.connectionsAccepted == 1)
    }

    /// The wall clock stepped back an hour while the receiver fails: probes go on at their pace
    /// instead of waiting for the clock to catch up.
    @Test func aClockSteppedBackDoesNotStallTheSender() throws {
        final class SteppedClock: RelayClock {
            let offset = Mutex<Int64>(0)
            func nowMillis() -> Int64 { SystemRelayClock().nowMillis() + offset.withLock { $0 } }
        }
        let receiver = try WebhookTestReceiver(secrets: Self.secrets) { _ in .status(503) }
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        for _ in 0..<3 { outbox.add() }
        let clock = SteppedClock()
        let sender = WebhookSender(endpoints: [.init(name: "hook", url: receiver.url, secrets: Self.secrets,
                                                     retry: WebhookRetryPolicy(baseMillis: 20, capMillis: 100, retryForMillis: 3_600_000_000, pauseCapMillis: 50))],
                                   outbox: outbox, metrics: WebhookMetrics(), logger: RelayLogger(minimum: .error, capture: true), clock: clock, idlePollMillis: 50)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(10) { receiver.requests.count >= 3 })
        clock.offset.withLock { $0 = -3_600_000 }
        // The first events' retries are now due an hour ahead (the store's times); new events are
        // due at once, and the sender, its receiver pause computed on the old clock, must still
        // claim them (one probe at a time, oldest due first).
        let fresh = Set((0..<3).map { _ in outbox.add().id })
        #expect(eventually(10) { receiver.requests.contains { fresh.contains($0.id) } }, "no attempt after the clock stepped back")
    }

    /// A receiver answering with a large body: 4 KiB of it are read, the rest is not, and the
    /// status still decides (2xx delivered, 500 retried).
    @Test func largeAnswerBodiesAreCutAndTheStatusCounts() throws {
        let receiver = try WebhookTestReceiver(secrets: Self.secrets) { n in .largeBody(status: n == 0 ? 500 : 200, bytes: 1 << 20) }
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<3).map { _ in outbox.add() }
        let sender = Self.sender(receiver.url, outbox, metrics: WebhookMetrics(), maxConcurrent: 1)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        #expect(outbox.snapshot("hook").flatMap(\.errors) == ["HTTP 500"])
        #expect(Set(receiver.requests.map(\.id)) == Set(events.map(\.id)))
    }

    @Test func stopsPromptlyWithAttemptsHanging() throws {
        let receiver = try WebhookTestReceiver(secrets: Self.secrets) { _ in .noAnswer }
        defer { receiver.close() }
        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        for _ in 0..<4 { outbox.add() }
        let sender = Self.sender(receiver.url, outbox, metrics: WebhookMetrics(), timeoutMillis: 60_000)
        try sender.start()
        #expect(eventually(30) { receiver.requests.count == 4 })
        let started = Date()
        sender.stop(grace: .milliseconds(200))
        #expect(Date().timeIntervalSince(started) < 5)
        // Aborted, not recorded: they stay leased and pending, sent again after the lease.
        #expect(outbox.snapshot("hook").allSatisfy { $0.state == .pending && $0.attempts == 0 }, "\(outbox.snapshot("hook"))")
    }
}

/// The sender's signatures checked by an independent implementation: Python `standardwebhooks`
/// (the reference library) in scripts/webhook-receiver.py, from a throwaway venv under .build.
/// Skipped, with a message, without python3 or when the package index cannot be reached.
@Suite(.serialized) struct WebhookCrossCheckTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardized.path

    static func run(_ tool: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: tool)
        p.arguments = arguments
        p.currentDirectoryURL = URL(fileURLWithPath: root)
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @Test func pythonStandardWebhooksVerifiesEveryAttempt() throws {
        let venv = try Self.run("/bin/bash", ["-c", "source scripts/lib-webhooks-venv.sh && webhooks_venv_python"])
        guard venv.status == 0, let python = venv.output.split(separator: "\n").last.map(String.init) else {
            print("webhook cross-check: skipped (no python3, or standardwebhooks could not be installed: offline?)")
            return
        }
        let dir = TempDir()
        let secrets = [makeWebhookSecretText(21), makeWebhookSecretText(22)]
        try (secrets.joined(separator: "\n") + "\n").write(toFile: dir.path + "/secret", atomically: true, encoding: .utf8)
        let receiver = Process()
        receiver.executableURL = URL(fileURLWithPath: Self.root + "/" + python)
        receiver.arguments = [Self.root + "/scripts/webhook-receiver.py", "--secret-file", dir.path + "/secret", "--port", "0",
                              "--record", dir.path + "/record.jsonl", "--fail-first", "3"]
        FileManager.default.createFile(atPath: dir.path + "/stdout", contents: nil)
        receiver.standardOutput = FileHandle(forWritingAtPath: dir.path + "/stdout")
        try receiver.run()
        // SIGKILL: the test runner's threads block SIGTERM, and a spawned child inherits the mask.
        defer { kill(receiver.processIdentifier, SIGKILL); receiver.waitUntilExit() }
        var port: Int?
        #expect(eventually(20) {
            let text = (try? String(contentsOfFile: dir.path + "/stdout", encoding: .utf8)) ?? ""
            port = text.split(separator: "\n").first.flatMap { $0.split(separator: ":").last }.flatMap { Int($0) }
            return port != nil
        })
        guard let port else { return }

        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = EventType.allCases.flatMap { type in (0..<4).map { _ in outbox.add(type: type) } }
        let sender = WebhookSender(endpoints: [.init(name: "hook", url: "http://127.0.0.1:\(port)/hook", secrets: try secrets.map { try WebhookSecret(parsing: $0) },
                                                     retry: WebhookRetryPolicy(baseMillis: 20, capMillis: 200, retryForMillis: 60_000, pauseCapMillis: 100))],
                                   outbox: outbox, metrics: WebhookMetrics(), logger: RelayLogger(minimum: .error, capture: true), idlePollMillis: 50)
        try sender.start()
        defer { sender.stop(grace: .seconds(1)) }
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })

        struct Line: Decodable { var id: String; var type: String?; var verified: [Bool] }
        let lines = try String(contentsOfFile: dir.path + "/record.jsonl", encoding: .utf8).split(separator: "\n")
            .map { try JSONDecoder().decode(Line.self, from: Data($0.utf8)) }
        #expect(lines.count >= events.count + 3, "3 answered 500, then each event once at least")
        #expect(Set(lines.map(\.id)) == Set(events.map(\.id)), "unknown or missing ids")
        #expect(lines.allSatisfy { $0.verified == [true, true] }, "standardwebhooks refused a signature: \(lines.filter { $0.verified != [true, true] })")
        let types = Dictionary(uniqueKeysWithValues: events.map { ($0.id, $0.type.rawValue) })
        #expect(lines.allSatisfy { types[$0.id] == $0.type })
    }
}

/// The test receiver's own socket hygiene: it shares the process with every other suite, so a
/// descriptor it touches after closing it belongs to someone else by then.
@Suite struct WebhookTestReceiverTests {
    /// A connection the sender hung up on is closed by its serving thread; `close()` used to
    /// shut it down again by number, and that number was another test's socket by then (a
    /// concurrent HTTP test's client read EOF instead of its response). Here the numbers freed
    /// are taken by socket pairs, which must still carry bytes both ways after `close()`.
    @Test func closeLeavesDescriptorsReusedSinceAlone() throws {
        let receiver = try WebhookTestReceiver(secrets: WebhookSenderTests.secrets)
        defer { receiver.close() }
        for _ in 0..<4 {
            let fd = try connectLoopback(receiver.port)
            let request = Array("POST /hook HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n".utf8)
            #expect(request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == request.count)
            var answer = [UInt8](repeating: 0, count: 256)
            #expect(recv(fd, &answer, answer.count, 0) > 0)
            Glibc.close(fd)
        }
        #expect(eventually(10) { receiver.connectionsOpen == 0 }, "the serving threads did not close their connections")
        // The lowest free numbers, the four just freed among them (unless a concurrent test took one).
        var pairs: [[Int32]] = []
        defer { for p in pairs { Glibc.close(p[0]); Glibc.close(p[1]) } }
        for _ in 0..<32 {
            var p: [Int32] = [0, 0]
            try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &p) == 0)
            pairs.append(p)
        }
        receiver.close()
        for p in pairs {
            for (from, to) in [(p[0], p[1]), (p[1], p[0])] {
                var byte: UInt8 = 0x2a
                #expect(send(from, &byte, 1, Int32(MSG_NOSIGNAL)) == 1, "descriptor \(from) was shut down")
                #expect(recv(to, &byte, 1, Int32(MSG_DONTWAIT)) == 1, "descriptor \(to) was shut down")
            }
        }
    }

    private func connectLoopback(_ port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        var tv = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { Glibc.close(fd); throw CocoaError(.fileReadUnknown) }
        return fd
    }
}
