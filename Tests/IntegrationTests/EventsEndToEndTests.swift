// Delivery events end to end (issue 24): relay-server (SQLite) + mock-apns + a webhook receiver on
// loopback that verifies every signature with Python's `standardwebhooks` (the Standard Webhooks
// reference library, independent of the relay's signing code; scripts/webhook-receiver.py in the
// venv of scripts/lib-webhooks-venv.sh, skipped when it cannot be installed). APNs answers 200,
// 400 BadDeviceToken, 400 BadExpirationDate and 410; the receiver refuses connections at first,
// then answers 500, answers each request a second late, and the relay is killed (-9) while one is
// in flight and restarted on its database.
// Every accepted response's terminal event must reach the receiver with a valid signature, the
// 410 token's event too, nothing unknown, and GET /v1/events lists each terminal response once.
import Foundation
import Ratchet
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct EventsEndToEndTests {
    /// The venv's python, or nil (no python3, or the package index cannot be reached).
    static func webhooksPython() -> String? {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/bash")
        p.arguments = ["-c", "source scripts/lib-webhooks-venv.sh && webhooks_venv_python"]
        p.currentDirectoryURL = relayRepoRoot
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return nil }
        let d = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0, let line = String(decoding: d, as: UTF8.self).split(separator: "\n").last else { return nil }
        return line.hasPrefix("/") ? String(line) : relayRepoRoot.appendingPathComponent(String(line)).path
    }

    /// One request as the receiver recorded it.
    struct Received: Decodable {
        var id: String
        var type: String?
        var verified: [Bool]
        var status: Int
        var body: String
    }

    static func received(_ path: String) -> [Received] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
        // A line being written when read is incomplete: skip it (read again later).
        return text.split(separator: "\n").compactMap { try? JSONDecoder().decode(Received.self, from: Data($0.utf8)) }
    }

    /// Every event of `credential`'s feed, paged with `limit` (the cursor followed to the end).
    static func feed(_ h: RelayHarness, credential: String, limit: Int = 7) throws -> [[String: Any]] {
        var events: [[String: Any]] = []
        var after: String?
        for _ in 0..<1000 {
            let query = "/v1/events?limit=\(limit)" + (after.map { "&after=\($0)" } ?? "")
            let r = try relayHTTP(h.relayPort, "GET", query, headers: [("Authorization", "Bearer \(credential)")])
            guard r.status == 200 else { throw RelayITError("GET \(query) -> \(r.status) \(r.text)") }
            let page = r.json["events"] as? [[String: Any]] ?? []
            events += page
            guard let next = r.json["next"] as? String else { throw RelayITError("no next in \(r.text)") }
            if page.isEmpty && next == after { return events }
            after = next
        }
        throw RelayITError("feed did not end")
    }

    /// An ingest body for `token`: the accessory's next response with another push token.
    static func body(_ accessory: TestAccessory, token: String) throws -> [UInt8] {
        let text = String(decoding: try accessory.nextBody().body, as: UTF8.self)
        return Array(text.replacingOccurrences(of: "\"pushToken\":\"\(accessory.pushToken)\"", with: "\"pushToken\":\"\(token)\"").utf8)
    }

    static func randomToken() -> String { (0..<32).map { _ in UInt8.random(in: 0...255) }.hexString }

    @Test func everyTerminalEventReachesAVerifyingReceiverThroughFaultsAndAKill() throws {
        guard let python = Self.webhooksPython() else {
            print("events end to end: skipped (no python3, or standardwebhooks could not be installed: offline?)")
            return
        }
        let start = Date()
        func phase(_ what: String) { print("events end to end: \(what) at +\(Int(Date().timeIntervalSince(start)))s") }
        let accessory = TestAccessory()
        let badToken = Self.randomToken(), expiryToken = Self.randomToken(), goneToken = Self.randomToken(), slowToken = Self.randomToken()
        // Per token: the terminal event type, status and reason each of its responses must end with.
        let expected: [String: (type: String, status: Int?, reason: String?)] = [
            accessory.pushToken: ("response.delivered", 200, nil),
            slowToken: ("response.delivered", 200, nil),
            badToken: ("response.failed", 400, "BadDeviceToken"),
            expiryToken: ("response.failed", 400, "BadExpirationDate"),
            goneToken: ("response.failed", 410, "Unregistered"),
        ]
        let h = try RelayHarness(mockFaults: ["status=400,reason=BadDeviceToken,token=\(badToken)",
                                              "status=400,reason=BadExpirationDate,token=\(expiryToken)",
                                              "status=410,reason=Unregistered,token=\(goneToken)",
                                              "latency=3000,token=\(slowToken)"], accessory: accessory)
        let secret = "whsec_" + Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        let secretPath = h.dir + "/webhook-secret"
        try (secret + "\n").write(toFile: secretPath, atomically: true, encoding: .utf8)
        chmod(secretPath, 0o600)
        let hookPort = try relayFreePort()
        h.eventsConfig = #""webhooks":[{"name":"backend","url":"http://127.0.0.1:\#(hookPort)/relay","secretFile":"\#(secretPath)","timeoutMs":3000}]"#
        try h.writeConfig()
        try h.startRelay()

        var accepted: [String: String] = [:]   // response id -> push token
        func send(_ token: String) throws {
            let r = try h.post(try Self.body(accessory, token: token))
            if r.status == 202, let id = r.json["id"] as? String { accepted[id] = token; return }
            // A marked token (410 or BadDeviceToken recorded) is refused at ingest: no response, no event.
            guard token != accessory.pushToken, r.status == 410 || r.status == 400 else {
                throw RelayITError("POST for \(token) -> \(r.status) \(r.text)")
            }
        }
        func allTerminal() throws -> Bool {
            try accepted.keys.allSatisfy { ["delivered", "failed"].contains(try h.get($0).json["state"] as? String ?? "") }
        }

        // 1. The receiver is down (connections refused): outcomes commit, their events wait.
        for token in [accessory.pushToken, badToken, accessory.pushToken, expiryToken, goneToken, accessory.pushToken] { try send(token) }
        try relayEventually("batch 1 terminal", seconds: 60) { try allTerminal() }
        try relayEventually("two refused attempts recorded", seconds: 60) {
            Int(try h.sql("SELECT coalesce(sum(attempts), 0) FROM webhook_deliveries")) ?? 0 >= 2
        }
        phase("batch 1 terminal, its events refused twice")

        // 2. The receiver comes up answering 500 to its first request, each answer 1 s late (more
        // failures in a row would only lengthen the sender's probing pauses: 1 s doubling to 30 s).
        let record = h.dir + "/received.jsonl"
        let receiver = try RelayChild(python, [relayRepoRoot.appendingPathComponent("scripts/webhook-receiver.py").path,
                                               "--secret-file", secretPath, "--port", "\(hookPort)", "--record", record, "--fail-first", "1", "--delay-ms", "1000"],
                                      name: "webhook-receiver")
        defer { receiver.signal(SIGKILL); _ = receiver.wait(seconds: 10) }
        for _ in 0..<4 { try send(accessory.pushToken) }
        try send(goneToken)   // refused at ingest once the 410 is recorded (it is by now)
        try send(badToken)    // the same for the BadDeviceToken mark

        // 3. kill -9 with responses in flight (APNs answers slowToken 3 s late) and an event sent but
        // not answered yet (the receiver records a request as it arrives): that delivery is sent
        // again once its lease (2 x timeout + 30 s) ends. Restart on the same database.
        try relayEventually("a request after the 500", seconds: 90) { Self.received(record).count >= 2 }
        for token in [slowToken, accessory.pushToken, expiryToken, slowToken] { try send(token) }
        phase("kill -9")
        h.relay?.signal(SIGKILL)
        #expect(h.relay?.wait(seconds: 20) != nil)
        try h.startRelay()
        for token in [accessory.pushToken, expiryToken, accessory.pushToken] { try send(token) }
        try relayEventually("every response terminal", seconds: 90) { try allTerminal() }
        phase("every response terminal")

        // Every event of the feed reached the receiver with a 2xx (probing and back-off bound the wait).
        var feed: [[String: Any]] = []
        do {
            try relayEventually("every event received", seconds: 150) {
                feed = try Self.feed(h, credential: h.credential)
                let ok = Set(Self.received(record).filter { $0.status == 204 }.map(\.id))
                return !feed.isEmpty && feed.allSatisfy { ok.contains($0["id"] as? String ?? "") }
            }
        } catch {
            Issue.record("\(error); relay: \(h.relay?.stderr.suffix(3000) ?? "")")
        }

        phase("every event received")
        // A delivery sent just before the kill may be recorded only after its lease (2 x timeout + 30 s).
        #expect((try? relayEventually("every webhook delivery recorded", seconds: 90) {
            try h.sql("SELECT count(*) FROM webhook_deliveries WHERE state != 'delivered'") == "0"
        }) != nil, "\((try? h.sql("SELECT seq, state, attempts, last_error FROM webhook_deliveries WHERE state != 'delivered'")) ?? "")")

        phase("every webhook delivery recorded")
        let requests = Self.received(record)
        let repeated = Dictionary(grouping: requests.filter { $0.status == 204 }, by: \.id).filter { $0.value.count > 1 }.count
        print("events end to end: \(feed.count) events, \(requests.count) requests (\(requests.filter { $0.status == 500 }.count) answered 500, \(repeated) events received more than once)")

        // The feed: each accepted response's terminal event exactly once, of the right type and
        // reason; the 410 token's token.unregistered; nothing else.
        let responseEvents = feed.filter { ($0["type"] as? String ?? "").hasPrefix("response.") }
        let byResponse = Dictionary(grouping: responseEvents) { ($0["data"] as? [String: Any])?["id"] as? String ?? "" }
        #expect(Set(byResponse.keys) == Set(accepted.keys), "feed's responses differ from the accepted ones")
        for (id, token) in accepted {
            let events = byResponse[id] ?? []
            #expect(events.count == 1, "response \(id): \(events.count) events in the feed")
            guard let event = events.first, let data = event["data"] as? [String: Any], let want = expected[token] else { continue }
            #expect(event["type"] as? String == want.type, "response \(id): \(event)")
            #expect(data["pushToken"] as? String == token)
            #expect(data["reason"] as? String == want.reason, "response \(id): \(data)")
            if want.type == "response.failed" { #expect(data["status"] as? Int == want.status, "response \(id): \(data)") }
        }
        let tokenEvents = feed.filter { $0["type"] as? String == "token.unregistered" }
        #expect(!tokenEvents.isEmpty, "no token.unregistered event")
        #expect(tokenEvents.allSatisfy { ($0["data"] as? [String: Any])?["pushToken"] as? String == goneToken }, "\(tokenEvents)")
        #expect(feed.count == responseEvents.count + tokenEvents.count)
        #expect(Set(feed.compactMap { $0["id"] as? String }).count == feed.count, "an event id listed twice")

        // The receiver: every request verified by standardwebhooks, only the feed's ids, each
        // body the feed's event (webhook-id = the feed's id), and the 500s seen.
        let feedByID = Dictionary(uniqueKeysWithValues: feed.compactMap { e in (e["id"] as? String).map { ($0, e) } })
        #expect(requests.allSatisfy { $0.verified == [true] }, "bad signatures: \(requests.filter { $0.verified != [true] }.map(\.id))")
        #expect(Set(requests.map(\.id)).isSubset(of: Set(feedByID.keys)), "unknown ids: \(Set(requests.map(\.id)).subtracting(feedByID.keys))")
        #expect(requests.filter { $0.status == 500 }.count == 1)
        for r in requests {
            guard let event = feedByID[r.id],
                  let body = try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any] else { continue }
            #expect(body["type"] as? String == event["type"] as? String && r.type == event["type"] as? String, "\(r.id)")
            #expect(body["timestamp"] as? String == event["timestamp"] as? String, "\(r.id)")
            #expect(NSDictionary(dictionary: body["data"] as? [String: Any] ?? [:]).isEqual(to: event["data"] as? [String: Any] ?? [:]),
                    "\(r.id): received \(r.body), feed \(event)")
        }

        // The store agrees: every terminal row has its event (none lost to the kill).
        #expect(try h.sql("SELECT count(*) FROM responses r WHERE r.state IN ('delivered','failed') AND NOT EXISTS (SELECT 1 FROM events e WHERE e.response_id = r.id)") == "0")

        // Another credential of the same app sees none of these events.
        let other = try h.createCredential(apps: [RelayHarness.bundleID], name: "other")
        try relayEventually("other credential known") { try relayHTTP(h.relayPort, "GET", "/v1/events", headers: [("Authorization", "Bearer \(other)")]).status == 200 }
        #expect(try Self.feed(h, credential: other).isEmpty)
    }
}
