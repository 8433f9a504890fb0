// relay-server end to end with the real binaries: relay-server + mock-apns on ephemeral
// loopback ports, temp SQLite files, HTTP as an accessory would speak it.
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct RelayServerTests {
    @Test func endToEndDeliveryWithExactAPNsRequestAndVerifiedDecryption() throws {
        let h = try RelayHarness()
        try h.startRelay()
        let (body, index) = try h.accessory.nextBody(action: "accept", userText: "see you at 6")
        let r = try h.post(body)
        #expect(r.status == 202, "\(r.text)")
        let id = try #require(r.json["id"] as? String)
        #expect(r.json["state"] as? String == "queued")
        #expect(r.headers["x-request-id"] != nil)
        var delivery: [String: Any] = [:]
        try relayEventually("mock-apns received the push") {
            guard let d = try h.deliveries().first(where: { ($0["apnsId"] as? String) == id }) else { return false }
            delivery = d
            return true
        }
        #expect(delivery["deviceToken"] as? String == h.accessory.pushToken)
        #expect(delivery["topic"] as? String == RelayHarness.bundleID + ".push-type.accessory")
        #expect(delivery["pushType"] as? String == "accessory")
        #expect(delivery["keyId"] as? String == RelayHarness.apnsKeyID)
        #expect(delivery["teamId"] as? String == RelayHarness.teamID)
        let aps = try #require((delivery["payload"] as? [String: Any])?["aps"] as? [String: Any])
        #expect(Set(aps.keys) == ["encryptedData", "sessionIdentifier", "keyID", "messageIndex"])
        #expect(aps["messageIndex"] as? String == String(index))
        #expect(aps["keyID"] as? String == h.accessory.keyIDBase64)
        #expect((aps["sessionIdentifier"] as? String)?.uppercased() == h.accessory.session.uuidString)
        let sent = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any]
        #expect(aps["encryptedData"] as? String == sent?["encryptedData"] as? String)
        #expect(delivery["verified"] as? Bool == true, "\(delivery)")
        let response = delivery["response"] as? [String: Any]
        #expect(response?["actionIdentifier"] as? String == "accept")
        #expect(response?["userText"] as? String == "see you at 6")
        try relayEventually("GET shows delivered") { try h.get(id).json["state"] as? String == "delivered" }
        let g = try h.get(id).json
        #expect(g["attempts"] as? Int == 1)
        #expect(g["lastStatus"] as? Int == 200)
        // Metrics show the delivery.
        let metrics = try relayHTTP(h.adminPort, "GET", "/metrics").text
        #expect(metrics.contains("relay_ingest_requests_total{status=\"202\"} 1"))
        #expect(metrics.contains("relay_pushes_total{status=\"200\",reason=\"\"} 1"))
        #expect(metrics.contains("relay_outbox_responses{state=\"delivered\"} 1"))
        #expect(metrics.contains("relay_http_connections_total{listener=\"ingest\"}"))
        // Logs never carry the credential, the full push token or the ciphertext.
        let logs = h.relay?.stderr ?? ""
        #expect(!logs.contains(h.credential))
        #expect(!logs.contains(h.accessory.pushToken))
        #expect(!logs.contains((sent?["encryptedData"] as? String) ?? "never"))
    }

    @Test func validationAndAuthErrorsOverHTTP() throws {
        let h = try RelayHarness()
        try h.startRelay()
        let (good, _) = try h.accessory.nextBody()
        func expectError(_ r: RelayHTTPReply, _ status: Int, _ code: String, field: String? = nil, sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(r.status == status, "\(r.text)", sourceLocation: sourceLocation)
            #expect(r.json["error"] as? String == code, "\(r.text)", sourceLocation: sourceLocation)
            if let field { #expect(r.json["field"] as? String == field, sourceLocation: sourceLocation) }
        }
        expectError(try h.post(good, credential: ""), 401, "unauthorized")
        expectError(try relayHTTP(h.relayPort, "POST", "/v1/responses", headers: [("Content-Type", "application/json")], body: good), 401, "unauthorized")
        expectError(try h.post(good, credential: "rk_unknownunknownunknown"), 401, "unauthorized")
        expectError(try h.post(good, contentType: "text/plain"), 415, "unsupported_media_type", field: "content-type")
        expectError(try h.post([UInt8](repeating: 0x20, count: 20_000)), 413, "body_too_large", field: "body")
        expectError(try h.post(Array("{\"pushToken\":".utf8)), 400, "invalid_json", field: "body")
        expectError(try h.post(Array(#"{"pushToken":"a"#.utf8) + [0xFF] + Array(#""}"#.utf8)), 400, "invalid_json", field: "body")
        let fields: [(String, String, String)] = [
            ("pushToken", "\"abc\"", "invalid_push_token"),
            ("sessionIdentifier", "\"nope\"", "invalid_session_identifier"),
            ("keyID", "\"AAAA\"", "invalid_key_id"),
            ("messageIndex", "4294967296", "invalid_message_index"),
            ("encryptedData", "\"AAAA\"", "invalid_encrypted_data"),
            ("app", "\"com.unknown\"", "unknown_app"),
        ]
        let base = try JSONSerialization.jsonObject(with: Data(good)) as! [String: Any]
        for (field, value, code) in fields {
            var parts: [String] = []
            for (k, v) in base where k != field { parts.append("\"\(k)\":" + (v is String ? "\"\(v)\"" : "\(v)")) }
            parts.append("\"\(field)\":\(value)")
            expectError(try h.post(Array("{\(parts.joined(separator: ","))}".utf8)), 400, code, field: field)
        }
        // 403: a credential scoped to another app names this relay's app.
        let other = try h.createCredential(apps: ["com.example.someone-else"])
        var scoped = base
        scoped["app"] = RelayHarness.bundleID
        let scopedBody = try JSONSerialization.data(withJSONObject: scoped)
        expectError(try h.post(Array(scopedBody), credential: other), 403, "forbidden", field: "app")
        // Accepted; then another credential cannot read it; a revocation is refused within a
        // second (CredentialRevocationTests holds the bound).
        let ok = try h.post(good)
        #expect(ok.status == 202)
        let id = try #require(ok.json["id"] as? String)
        #expect(try h.get(id, credential: other).status == 404)
        #expect(try h.get(id).status == 200)
        _ = try h.sql("UPDATE credentials SET revoked_at = 1 WHERE hash = X'\(relaySHA256Hex(h.credential))'")
        try relayEventually("revocation read") { try h.get(id).status == 401 }
        expectError(try h.post(try h.accessory.nextBody().body), 401, "unauthorized")
        #expect(try h.get(id).status == 401)
        #expect(try relayHTTP(h.relayPort, "GET", "/nope").status == 404)
        #expect(try relayHTTP(h.adminPort, "GET", "/healthz").status == 200)
    }

    @Test func duplicatesAnswer200WithTheSameIdAndPushOnce() throws {
        let h = try RelayHarness()
        try h.startRelay()
        let (body, _) = try h.accessory.nextBody()
        let first = try h.post(body)
        #expect(first.status == 202)
        let id = try #require(first.json["id"] as? String)
        try relayEventually("delivered") { try h.get(id).json["state"] as? String == "delivered" }
        let second = try h.post(body)
        #expect(second.status == 200)
        #expect(second.json["id"] as? String == id)
        #expect(second.json["state"] as? String == "delivered")
        usleep(200_000)
        #expect(try h.deliveries().filter { ($0["apnsId"] as? String) == id }.count == 1)
    }

    @Test func unregisteredTokenFailsTheRowAndRefusesNewIngest() throws {
        let accessory = TestAccessory()
        let h = try RelayHarness(mockFaults: ["status=410,reason=Unregistered,token=\(accessory.pushToken)"], accessory: accessory)
        try h.startRelay()
        let r = try h.post(try accessory.nextBody().body)
        let id = try #require(r.json["id"] as? String)
        try relayEventually("failed") { try h.get(id).json["state"] as? String == "failed" }
        let g = try h.get(id).json
        #expect(g["lastStatus"] as? Int == 410)
        #expect(g["lastReason"] as? String == "Unregistered")
        let again = try h.post(try accessory.nextBody().body)
        #expect(again.status == 410)
        #expect(again.json["error"] as? String == "push_token_unregistered")
        #expect(try h.sql("SELECT count(*) FROM unregistered_tokens WHERE token = '\(accessory.pushToken)'") == "1")
    }

    /// Issue 31: BadDeviceToken marks the token end to end (config -> DeliveryPolicy -> store ->
    /// ingest): 400 bad_device_token naming pushToken during the hold, then one probe; once APNs
    /// takes the token (the fault cleared), the probe's 200 lifts the mark.
    @Test func badDeviceTokenMarksTheTokenUntilAProbeIsDelivered() throws {
        let accessory = TestAccessory()
        let h = try RelayHarness(dispatch: #""badDeviceTokenHoldSeconds":1"#,
                                 mockFaults: ["status=400,reason=BadDeviceToken,token=\(accessory.pushToken)"], accessory: accessory)
        try h.startRelay()
        let id = try #require(try h.post(try accessory.nextBody().body).json["id"] as? String)
        try relayEventually("failed") { try h.get(id).json["state"] as? String == "failed" }
        #expect(try h.get(id).json["lastReason"] as? String == "BadDeviceToken")
        let refused = try h.post(try accessory.nextBody().body)
        #expect(refused.status == 400 && refused.json["error"] as? String == "bad_device_token" && refused.json["field"] as? String == "pushToken")
        #expect((refused.json["message"] as? String ?? "").contains("sandbox"))
        try h.clearFaults()
        usleep(1_100_000)
        let probe = try #require(try h.post(try accessory.nextBody().body).json["id"] as? String)
        try relayEventually("probe delivered") { try h.get(probe).json["state"] as? String == "delivered" }
        #expect(try h.sql("SELECT count(*) FROM unregistered_tokens") == "0")
        #expect(try h.post(try accessory.nextBody().body).status == 202)
    }

    @Test func tooManyRequestsPacesTheTokenThenDelivers() throws {
        let accessory = TestAccessory()
        let h = try RelayHarness(dispatch: #""tooManyRequestsDelayMs":1500"#,
                                 mockFaults: ["status=429,reason=TooManyRequests,token=\(accessory.pushToken)"], accessory: accessory)
        try h.startRelay()
        let id = try #require(try h.post(try accessory.nextBody().body).json["id"] as? String)
        try relayEventually("retry scheduled") { try h.get(id).json["state"] as? String == "retry" }
        #expect(try h.get(id).json["lastReason"] as? String == "TooManyRequests")
        // A second response for the paced token waits too.
        let id2 = try #require(try h.post(try accessory.nextBody().body).json["id"] as? String)
        let paced = try h.sql("SELECT paced_until - (SELECT next_attempt_at FROM responses WHERE id = '\(id2)') FROM token_pacing")
        #expect(Int(paced) ?? -1 <= 0, "second row due before the pacing ends: \(paced)")
        try h.clearFaults()
        try relayEventually("both delivered") {
            try h.get(id).json["state"] as? String == "delivered" && h.get(id2).json["state"] as? String == "delivered"
        }
        // Ingest-side limit per push token: burst 20 at 10/s by default; a tight config answers 429.
    }

    @Test func ingestRateLimitPerPushToken() throws {
        let h = try RelayHarness(ingest: #""rateLimits":{"perPushToken":{"perSecond":0.2,"burst":2}}"#)
        try h.startRelay()
        #expect(try h.post(try h.accessory.nextBody().body).status == 202)
        #expect(try h.post(try h.accessory.nextBody().body).status == 202)
        let limited = try h.post(try h.accessory.nextBody().body)
        #expect(limited.status == 429)
        #expect(limited.json["error"] as? String == "rate_limited")
        #expect(Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
    }

    @Test func serverErrorsBackOffAndRetryWithTheSameApnsID() throws {
        let h = try RelayHarness(dispatch: #""backoffBaseMs":100,"backoffCapMs":300"#, mockFaults: ["status=503,reason=ServiceUnavailable"])
        try h.startRelay()
        let id = try #require(try h.post(try h.accessory.nextBody().body).json["id"] as? String)
        try relayEventually("two failed attempts") { (try h.get(id).json["history"] as? [Any])?.count ?? 0 >= 2 }
        try h.clearFaults()
        try relayEventually("delivered") { try h.get(id).json["state"] as? String == "delivered" }
        let history = try #require(try h.get(id).json["history"] as? [[String: Any]])
        #expect(history.dropLast().allSatisfy { $0["status"] as? Int == 503 })
        #expect(history.last?["status"] as? Int == 200)
        #expect(try h.deliveries().filter { ($0["apnsId"] as? String) == id }.count == 1)
    }

    /// The issue's scenario end to end, scaled: 10 responses while mock-apns answers
    /// InvalidProviderToken for 3 s (probes 100 ms doubling to 400 ms): none fails, the app is
    /// paused meanwhile (/readyz 503 naming it), and every one is delivered once after, with
    /// one attempt in its history (the refused sends were not attempts).
    @Test func invalidProviderTokenPausesTheAppAndFailsNothing() throws {
        let h = try RelayHarness(dispatch: #""pauseProbeBaseMs":100,"pauseProbeCapMs":400"#,
                                 mockFaults: ["status=403,reason=InvalidProviderToken"])
        try h.startRelay()
        var ids: [String] = []
        for _ in 0..<10 { ids.append(try #require(try h.post(try h.accessory.nextBody().body).json["id"] as? String)) }
        try relayEventually("paused app named by /readyz") {
            let r = try relayHTTP(h.adminPort, "GET", "/readyz")
            return r.status == 503 && r.text.contains(#""paused":{"\#(RelayHarness.bundleID)":"InvalidProviderToken"}"#)
        }
        Thread.sleep(forTimeInterval: 3)
        #expect(try h.sql("SELECT count(*) FROM responses WHERE state = 'failed'") == "0")
        #expect(try h.sql("SELECT count(*) FROM attempts") == "0")
        try h.clearFaults()
        try relayEventually("all delivered") { try h.sql("SELECT count(*) FROM responses WHERE state = 'delivered'") == "10" }
        for id in ids {
            let history = try #require(try h.get(id).json["history"] as? [[String: Any]])
            #expect(history.map { $0["status"] as? Int } == [200])
            #expect(try h.deliveries().filter { ($0["apnsId"] as? String) == id }.count == 1)
        }
        #expect(try relayHTTP(h.adminPort, "GET", "/readyz").status == 200)
        let log = h.relay?.stderr ?? ""
        #expect(log.components(separatedBy: "app paused").count == 2 && log.components(separatedBy: "app resumed").count == 2)
    }

    @Test func ttlExpiryFailsTheRow() throws {
        let h = try RelayHarness(dispatch: #""backoffBaseMs":200,"backoffCapMs":400"#, ingest: #""ttlSeconds":1"#,
                                 mockFaults: ["status=500,reason=InternalServerError"])
        try h.startRelay()
        let id = try #require(try h.post(try h.accessory.nextBody().body).json["id"] as? String)
        try relayEventually("expired") { try h.get(id).json["state"] as? String == "failed" }
        #expect(try h.get(id).json["lastReason"] as? String == "expired")
    }

    @Test func restartRequeuesInflightRowsWithTheSameApnsID() throws {
        let h = try RelayHarness(mockFaults: ["stall"])
        try h.startRelay()
        var ids: [String] = []
        for _ in 0..<3 { ids.append(try #require(try h.post(try h.accessory.nextBody().body).json["id"] as? String)) }
        try relayEventually("all inflight") { try h.sql("SELECT count(*) FROM responses WHERE state = 'inflight'") == "3" }
        h.relay?.signal(SIGKILL)
        _ = h.relay?.wait(seconds: 10)
        try h.clearFaults()
        try h.startRelay()
        try relayEventually("all delivered after restart") {
            let delivered = Set(try h.deliveries().compactMap { $0["apnsId"] as? String })
            return Set(ids).isSubset(of: delivered)
        }
        for id in ids { try relayEventually("GET delivered") { try h.get(id).json["state"] as? String == "delivered" } }
    }

    @Test func sigtermDrainsWithNothingLost() throws {
        let h = try RelayHarness(dispatch: #""shutdownGraceMs":3000"#, mockFaults: ["latency=300"])
        try h.startRelay()
        var ids: [String] = []
        for _ in 0..<10 { ids.append(try #require(try h.post(try h.accessory.nextBody().body).json["id"] as? String)) }
        h.relay?.signal(SIGTERM)
        let status = h.relay?.wait(seconds: 15)
        #expect(status == 0, "\(h.relay?.stderr ?? "")")
        #expect(try h.sql("SELECT count(*) FROM responses WHERE state = 'inflight'") == "0")
        #expect(try h.sql("SELECT count(*) FROM responses WHERE state IN ('queued','delivered','retry')") == "10")
        #expect(h.relay?.stderr.contains("draining") == true)
        try h.clearFaults()
        try h.startRelay()
        try relayEventually("all delivered") {
            try h.sql("SELECT count(*) FROM responses WHERE state = 'delivered'") == "10"
        }
        let delivered = Set(try h.deliveries().compactMap { $0["apnsId"] as? String })
        #expect(Set(ids).isSubset(of: delivered))
    }

    /// At the open-file limit accept() fails on every listener: ingest connections used to take
    /// the admin listener (health checks, metrics) down with them, and nothing was logged. Now
    /// ingest stops below the limit, says so at start, and /healthz keeps answering.
    @Test func ingestStopsBelowTheOpenFileLimitSoAdminKeepsServing() throws {
        let h = try RelayHarness()
        // Soft and hard limit 256: ingest keeps 256 - (64 admin + 64 + 4 per loop thread + 2 per
        // APNs connection) = 120 of its default 10,000.
        h.relay = try RelayChild("/bin/sh", ["-c", #"ulimit -n 256 && exec "$0" --config "$1""#, relayBinary("relay-server"), h.dir + "/relay.json"],
                                 name: "relay-server")
        try h.relay!.waitReady(adminPort: h.adminPort)
        // The log is read from a pipe by another thread: being ready does not mean it has the line yet.
        try relayEventually("the open-file warning logged") {
            let log = h.relay?.stderr ?? ""
            return log.contains("open-file limit below ingest.maxConnections") && log.contains(#""accepting":120"#)
        }
        var fds: [Int32] = []
        defer { for fd in fds { close(fd) } }
        for _ in 0..<300 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_addr.s_addr = inet_addr("127.0.0.1")
            addr.sin_port = UInt16(h.relayPort).bigEndian
            let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            try #require(fd >= 0 && rc == 0)
            fds.append(fd)
        }
        try relayEventually("180 connections over the cap refused") {
            try relayHTTP(h.adminPort, "GET", "/metrics", timeout: 2).text.contains(#"relay_http_connections_refused_total{listener="ingest"} 180"#)
        }
        #expect(try relayHTTP(h.adminPort, "GET", "/healthz").status == 200)
        #expect(try relayHTTP(h.adminPort, "GET", "/metrics").text.contains(#"relay_http_connections_open{listener="ingest"} 120"#))
    }

    /// Start-up failures used to name a path or a port but not the key: a missing .p8 came out
    /// as a CocoaError dump, a taken port as "libuv bind ...: Address already in use" (which
    /// listener?), and --check-config passed a config whose key file did not exist.
    /// SIGHUP used to drain and exit 0, which Restart=on-failure does not restart: a
    /// `systemctl reload` (ExecReload=kill -HUP) left the relay down. It reloads the certificate
    /// now (RelayServerTLSTests); without TLS there is nothing to reload and the relay keeps
    /// serving. SIGTERM is still the drain.
    @Test func sighupKeepsServingAndSigtermDrains() throws {
        let h = try RelayHarness()
        try h.startRelay()
        #expect(try h.post(try h.accessory.nextBody().body).status == 202)
        h.relay?.signal(SIGHUP)
        try relayEventually("reload logged") { h.relay?.stderr.contains("nothing to reload") == true }
        #expect(h.relay?.isRunning == true)
        #expect(try h.post(try h.accessory.nextBody().body).status == 202)
        h.relay?.signal(SIGTERM)
        #expect(h.relay?.wait(seconds: 15) == 0, "\(h.relay?.stderr ?? "")")
        let log = h.relay?.stderr ?? ""
        #expect(log.contains(#""signal":"SIGHUP""#) && log.contains(#""signal":"SIGTERM""#) && log.contains("draining") && log.contains(#""msg":"stopped""#), "\(log)")
        #expect(log.components(separatedBy: "draining").count == 2, "\(log)")
    }

    @Test func startupFailuresNameTheKey() throws {
        let h = try RelayHarness()
        func start(_ extra: [String] = []) throws -> (status: Int32?, stderr: String) {
            let p = try RelayChild(relayBinary("relay-server"), ["--config", h.dir + "/relay.json"] + extra, name: "relay-server")
            let status = p.wait(seconds: 60)   // a start-up that fails takes well under 1 s unloaded
            return (status, p.stderr)
        }
        let good = try String(contentsOfFile: h.dir + "/relay.json", encoding: .utf8)
        try FileManager.default.createDirectory(atPath: h.dir + "/keys", withIntermediateDirectories: true)
        for (p8, reason) in [("missing.p8", "No such file or directory"), ("keys", "is a directory")] {
            try good.replacingOccurrences(of: #""p8Path":"apns.p8""#, with: #""p8Path":"\#(p8)""#)
                .write(toFile: h.dir + "/relay.json", atomically: true, encoding: .utf8)
            for extra in [["--check-config"], []] {
                let r = try start(extra)
                #expect(r.status == 1, "\(extra): \(r.stderr)")
                #expect(r.stderr.contains("apps[0].token.p8Path: "), "\(extra): \(r.stderr)")
                #expect(r.stderr.contains(reason) && r.stderr.contains(h.dir + "/" + p8), "\(extra): \(r.stderr)")
                #expect(!r.stderr.contains("CocoaError"))
            }
        }
        // The admin listener on the ingest port: the bind error says which listener.
        h.adminPort = h.relayPort
        try h.writeConfig()
        let busy = try start()
        #expect(busy.status == 1)
        #expect(busy.stderr.contains("startup failed: admin: ") && busy.stderr.contains("Address already in use"), "\(busy.stderr)")
    }

    @Test func startupRefusesAnInvalidConfigNamingTheKey() throws {
        let dir = NSTemporaryDirectory() + "relay-cfg-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try #"{"apps":[],"dispatch":{"maxInflight":0}}"#.write(toFile: dir + "/r.json", atomically: true, encoding: .utf8)
        let p = try RelayChild(relayBinary("relay-server"), ["--config", dir + "/r.json"], name: "relay-server")
        #expect(p.wait(seconds: 10) == 1)
        #expect(p.stderr.contains("dispatch.maxInflight"))
        let usage = try RelayChild(relayBinary("relay-server"), ["--bogus"], name: "relay-server")
        #expect(usage.wait(seconds: 10) == 64)
    }
}

/// kill -9 during a burst of concurrent POSTs, restart: every 202 is delivered.
/// CI-sized here; `make soak` sets RELAY_SOAK_ROUNDS for a longer loop.
@Suite(.serialized) struct RelayCrashTests {
    @Test func killDuringBurstLosesNothingAcknowledged() throws {
        let rounds = Int(ProcessInfo.processInfo.environment["RELAY_SOAK_ROUNDS"] ?? "") ?? 2
        let h = try RelayHarness(ingest: #""rateLimits":{"perPushToken":{"perSecond":0,"burst":1},"perCredential":{"perSecond":0,"burst":1}}"#)
        try h.startRelay()
        var acknowledged = Set<String>()
        for round in 0..<rounds {
            let accepted = RelayIDList()
            let clients = 8
            let group = DispatchGroup()
            for c in 0..<clients {
                group.enter()
                let port = h.relayPort, credential = h.credential
                Thread.detachNewThread {
                    defer { group.leave() }
                    let acc = TestAccessory()
                    for _ in 0..<200 {
                        guard let (body, _) = try? acc.nextBody(),
                              let r = try? relayHTTP(port, "POST", "/v1/responses", headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(credential)")], body: body)
                        else { return }  // the server died: this client stops
                        guard r.status == 202, let id = r.json["id"] as? String else { return }
                        accepted.append(id)
                    }
                    _ = c
                }
            }
            // Kill once a good share of the burst has been acknowledged.
            try relayEventually("burst under way") { accepted.count >= 100 + round }
            h.relay?.signal(SIGKILL)
            _ = h.relay?.wait(seconds: 10)
            group.wait()
            acknowledged.formUnion(accepted.items)
            try h.startRelay()
        }
        #expect(acknowledged.count >= 100 * rounds)
        try relayEventually("every acknowledged response delivered", seconds: 60) {
            let delivered = Set(try h.deliveries().compactMap { $0["apnsId"] as? String })
            return acknowledged.isSubset(of: delivered)
        }
        // mock-apns records a push before the relay commits its 'delivered' state, so the
        // database catches up a moment later: wait for it rather than racing it.
        try relayEventually("every acknowledged response marked delivered", seconds: 30) {
            let ids = acknowledged.map { "'\($0)'" }.joined(separator: ",")
            let inDB = Int(try h.sql("SELECT count(*) FROM responses WHERE state = 'delivered' AND id IN (\(ids))")) ?? 0
            return inDB == acknowledged.count
        }
    }
}

/// Schema v6 keeps the newest dedupe keys in relay-server's memory: after a kill -9 the next
/// start rebuilds them from the table, and a second relay-server on the same database file
/// must stop instead of ingesting with a tail of its own.
@Suite(.serialized) struct RelayDedupeProcessTests {
    @Test func retriesAfterAKill9GetTheirIDsAndASecondServerIsRefused() throws {
        let h = try RelayHarness(ingest: #""rateLimits":{"perPushToken":{"perSecond":0,"burst":1},"perCredential":{"perSecond":0,"burst":1}}"#)
        try h.startRelay()
        let headers = [("Content-Type", "application/json"), ("Authorization", "Bearer \(h.credential)")]
        var sent: [(body: [UInt8], id: String)] = []
        for _ in 0..<20 {
            let (body, _) = try h.accessory.nextBody()
            let r = try relayHTTP(h.relayPort, "POST", "/v1/responses", headers: headers, body: body)
            guard r.status == 202, let id = r.json["id"] as? String else { Issue.record("POST answered \(r.status)"); return }
            sent.append((body, id))
        }
        // The second server: same database, its own ports.
        let config = try String(contentsOfFile: h.dir + "/relay.json", encoding: .utf8)
            .replacingOccurrences(of: "\"port\":\(h.relayPort)", with: "\"port\":\(try relayFreePort())")
            .replacingOccurrences(of: "\"port\":\(h.adminPort)", with: "\"port\":\(try relayFreePort())")
        try config.write(toFile: h.dir + "/relay2.json", atomically: true, encoding: .utf8)
        let second = try RelayChild(relayBinary("relay-server"), ["--config", h.dir + "/relay2.json"], name: "relay-server-2")
        let status = second.wait(seconds: 30)
        #expect(status != nil && status != 0, "the second relay-server exits")
        #expect(second.stderr.contains("another relay-server ingests into") && second.stderr.contains("relay.db-ingest"), "\(second.stderr)")
        h.relay?.signal(SIGKILL)
        _ = h.relay?.wait(seconds: 10)
        try h.startRelay()
        for (body, id) in sent {
            let r = try relayHTTP(h.relayPort, "POST", "/v1/responses", headers: headers, body: body)
            #expect(r.status == 200 && r.json["id"] as? String == id, "retry after kill -9: \(r.status) \(r.json)")
        }
    }
}

/// sd_notify protocol: a unix datagram socket standing in for systemd.
@Suite struct RelaySystemdTests {
    @Test func notifiesReadyWatchdogAndStopping() throws {
        let h = try RelayHarness()
        let path = h.dir + "/notify.sock"
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        #expect(fd >= 0)
        defer { close(fd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { buf in
            let bytes = Array(path.utf8)
            for (i, b) in bytes.enumerated() where i < buf.count - 1 { buf[i] = b }
        }
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        #expect(rc == 0)
        var tv = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        func receive(until marker: String, seconds: Int = 20) -> [String] {
            var got: [String] = []
            let deadline = Date().addingTimeInterval(Double(seconds))
            var buf = [UInt8](repeating: 0, count: 4096)
            while Date() < deadline {
                let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n > 0 {
                    let msg = String(decoding: buf[0..<n], as: UTF8.self)
                    got.append(msg)
                    if msg.contains(marker) { break }
                }
            }
            return got
        }
        h.relay = try RelayChild(relayBinary("relay-server"), ["--config", h.dir + "/relay.json"], name: "relay-server",
                                   environment: ["NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"])
        let ready = receive(until: "READY=1")
        #expect(ready.contains { $0.contains("READY=1") }, "\(ready) \(h.relay?.stderr ?? "")")
        #expect(try relayHTTP(h.adminPort, "GET", "/readyz").status == 200)
        let pings = receive(until: "WATCHDOG=1")
        #expect(pings.contains { $0.contains("WATCHDOG=1") })
        // `systemctl reload` (SIGHUP): RELOADING=1 (with the monotonic time systemd 253 wants),
        // then READY=1 again; the relay keeps running.
        h.relay?.signal(SIGHUP)
        let reload = receive(until: "READY=1")
        #expect(reload.contains { $0.contains("RELOADING=1") && $0.contains("MONOTONIC_USEC=") }, "\(reload)")
        #expect(reload.last?.contains("READY=1") == true && h.relay?.isRunning == true, "\(reload)")
        h.relay?.signal(SIGTERM)
        let stopping = receive(until: "STOPPING=1")
        #expect(stopping.contains { $0.contains("STOPPING=1") })
        #expect(h.relay?.wait(seconds: 15) == 0)
    }
}

/// The harness's child process: what it wrote to stderr is all there once `wait` returns.
@Suite struct RelayChildTests {
    /// Start-up failures are judged by their stderr line right after exit, so `wait` must not
    /// return before the reader has everything: 200 children that write one line and exit at
    /// once. (Without the wait for the reader's EOF, 47 of 200 lines were missing.)
    @Test func stderrIsCompleteWhenWaitReturns() throws {
        var missing = 0
        for i in 0..<200 {
            let p = try RelayChild("/bin/sh", ["-c", "echo line-\(i) >&2; exit 3"], name: "sh")
            #expect(p.wait(seconds: 60) == 3)
            if !p.stderr.contains("line-\(i)\n") { missing += 1 }
        }
        #expect(missing == 0, "\(missing) of 200 stderr lines missing when wait returned")
    }
}
