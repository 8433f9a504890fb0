import Foundation
import Ratchet
import Testing
@testable import MockAPNs

/// mock-apns against independent HTTP/2 clients (curl, nghttp) over TLS on loopback.
@Suite(.serialized) struct MockServerTests {
    @Test func curlRequestsItMustAcceptAndReject() throws {
        let mock = try MockHarness()
        let push = try mock.sender.next(action: "reply", userText: "on my way")
        let id = "0A1B2C3D-4E5F-4A6B-8C7D-9E0F1A2B3C4D"
        let ok = try mock.curl(headers: mock.accessoryHeaders(extra: [("apns-id", id), ("apns-priority", "10")]), body: push.jsonBody)
        #expect(ok.status == 200)
        #expect(ok.headers["apns-id"] == id.lowercased())
        #expect(ok.headers["apns-unique-id"].map(isCanonicalUUID) == true)

        let stale = Fixture.token(iat: Int64(Date().timeIntervalSince1970) - 7200)
        var forged = Array(MockHarness.freshToken())
        forged[forged.count - 20] = forged[forged.count - 20] == "A" ? "B" : "A"
        let rejections: [(String, String, [(String, String)], [UInt8]?, Int, String)] = [
            ("GET", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(), nil, 405, "MethodNotAllowed"),
            ("POST", "/3/push/abcd", mock.accessoryHeaders(), push.jsonBody, 404, "BadPath"),
            ("POST", "/3/device/xyz1", mock.accessoryHeaders(), push.jsonBody, 400, "BadDeviceToken"),
            ("POST", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(token: nil), push.jsonBody, 403, "MissingProviderToken"),
            ("POST", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(token: String(forged)), push.jsonBody, 403, "InvalidProviderToken"),
            ("POST", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(token: stale), push.jsonBody, 403, "ExpiredProviderToken"),
            ("POST", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(extra: [("apns-topic", Fixture.topic)]), push.jsonBody, 400, "DuplicateHeaders"),
            ("POST", "/3/device/" + Fixture.deviceToken, Fixture.headers(token: MockHarness.freshToken(), topic: "com.evil.app.push-type.accessory"), push.jsonBody, 400, "TopicDisallowed"),
            ("POST", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(), Array(repeating: 0x20, count: 5000), 413, "PayloadTooLarge"),
            ("POST", "/3/device/" + Fixture.deviceToken, mock.accessoryHeaders(), Array(#"{"aps":{"alert":"hi"}}"#.utf8), 400, "BadPayload"),
        ]
        for (method, path, headers, body, status, reason) in rejections {
            let r = try mock.curl(path: path, method: method, headers: headers, body: body)
            #expect(r.status == status, "\(reason)")
            let json = try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any]
            #expect(json?["reason"] as? String == reason, "\(reason): \(r.body)")
            #expect(r.headers["apns-id"].map(isCanonicalUUID) == true)
            #expect(r.headers["apns-unique-id"] == nil)
        }

        // Only the first push was recorded, verified by decrypting it as the iPhone would.
        let deliveries = mock.server.deliveries
        #expect(deliveries.count == 1)
        #expect(deliveries.first?.apnsID == id.lowercased())
        #expect(deliveries.first?.verified == true)
        #expect(deliveries.first?.verification.userText == "on my way")
        let (status, json) = try mock.controlRequest("GET", "/deliveries")
        #expect(status == 200)
        let list = json as? [[String: Any]]
        #expect(list?.count == 1)
        let first = list?.first
        #expect(first?["apnsId"] as? String == id.lowercased())
        #expect(first?["deviceToken"] as? String == Fixture.deviceToken)
        #expect(first?["topic"] as? String == Fixture.topic)
        #expect(first?["pushType"] as? String == "accessory")
        #expect(first?["verified"] as? Bool == true)
        #expect(first?["messageIndex"] as? Int == Int(push.messageIndex))
        #expect(((first?["payload"] as? [String: Any])?["aps"] as? [String: Any])?["messageIndex"] as? String == "\(push.messageIndex)")
        #expect((first?["response"] as? [String: Any])?["actionIdentifier"] as? String == "reply")
        #expect((first?["receivedAt"] as? String)?.hasSuffix("Z") == true)

        let (_, statsJSON) = try mock.controlRequest("GET", "/stats")
        let stats = statsJSON as? [String: Any]
        #expect(stats?["accepted"] as? Int == 1)
        #expect(stats?["requests"] as? Int == 1 + rejections.count)
        #expect((stats?["byStatusReason"] as? [String: Int])?["403 ExpiredProviderToken"] == 1)
        #expect(stats?["verified"] as? Int == 1)

        // The JSON-lines log has the same delivery.
        mock.server.stop()
        let log = try String(contentsOfFile: mock.directory.appendingPathComponent("deliveries.jsonl").path, encoding: .utf8)
        let lines = log.split(separator: "\n")
        #expect(lines.count == 1)
        #expect(lines.first?.contains(#""apnsId":"\#(id.lowercased())""#) == true)
    }

    @Test func nghttpSeesOneStreamUntilATokenSucceeds() throws {
        let mock = try MockHarness()
        let body = try mock.file("body.json", try mock.sender.next().jsonBody)
        var args = ["-v", "--no-verify-peer", "-t", "10", "-d", body]
        for (name, value) in mock.accessoryHeaders() { args += ["-H", "\(name): \(value)"] }
        let accepted = try runTool("/usr/bin/nghttp", args + [mock.url + "/3/device/" + Fixture.deviceToken])
        #expect(accepted.status == 0, "\(accepted.stderr)")
        let out = accepted.stdout
        #expect(out.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1]"))
        #expect(out.contains(":status: 200"))
        #expect(out.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1000]"))
        // The raise is a reaction to the request (nghttp2 may put the SETTINGS frame ahead of
        // the response HEADERS in the same write), not part of the initial SETTINGS.
        if let raised = out.range(of: "(0x03):1000]"), let sent = out.range(of: "send DATA frame") {
            #expect(sent.lowerBound < raised.lowerBound)
        }

        // A refused token never unlocks more streams.
        var rejectArgs = ["-v", "--no-verify-peer", "-t", "10", "-d", body]
        for (name, value) in mock.accessoryHeaders(token: "not.a.jwt") { rejectArgs += ["-H", "\(name): \(value)"] }
        let rejected = try runTool("/usr/bin/nghttp", rejectArgs + [mock.url + "/3/device/" + Fixture.deviceToken])
        #expect(rejected.stdout.contains(":status: 403"))
        #expect(rejected.stdout.contains("InvalidProviderToken"))
        #expect(!rejected.stdout.contains("(0x03):1000]"))
    }

    @Test func goAwayAfterNStreamsSeenByCurlAndNghttp() throws {
        let mock = try MockHarness()
        let set = try mock.controlRequest("POST", "/faults", body: #"{"rules":[{"goAwayAfter":2}]}"#)
        #expect(set.status == 200)
        let body = try mock.file("body.json", Fixture.accessoryBody())
        // Three sequential requests in one curl run: the 3rd must open a new connection.
        var args = ["-sS", "--http2", "--cacert", mock.caPath, "-m", "10"]
        for (name, value) in mock.accessoryHeaders() { args += ["-H", "\(name): \(value)"] }
        let target = mock.url + "/3/device/" + Fixture.deviceToken
        // (Options apply to every URL; -o is per URL.)
        args += ["--data-binary", "@" + body, "-w", "%{http_code} %{num_connects}\\n"]
        for _ in 0..<3 { args += ["-o", "/dev/null", target] }
        let result = try runTool("/usr/bin/curl", args)
        #expect(result.status == 0, "\(result.stderr)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines == ["200 1", "200 0", "200 1"], "\(result.stdout)")
        let stats = try mock.controlRequest("GET", "/stats").json as? [String: Any]
        #expect(stats?["goAwaysSent"] as? Int == 1)
        #expect(stats?["connections"] as? Int == 2)

        // (nghttp is no witness here: it hangs up as soon as its last response is complete,
        // before a GOAWAY sent after that response can arrive.)
    }

    /// Connection-start faults as curl sees them: no response at all, counted in /stats, and
    /// gone once the plan is cleared.
    @Test(arguments: [("refuseConnections", "connectionsRefused"), ("stallHandshake", "handshakesStalled"),
                      ("goAwayBeforeFirstStream", "goAwaysBeforeFirstStream")])
    func connectionStartFaultsSeenByCurl(field: String, counter: String) throws {
        let mock = try MockHarness()
        #expect(try mock.controlRequest("POST", "/faults", body: #"{"\#(field)":true}"#).status == 200)
        let failed = try mock.curl(headers: mock.accessoryHeaders(), body: Fixture.accessoryBody(), timeout: 2)
        #expect(failed.exit != 0 && failed.status == 0, "curl exit \(failed.exit), status \(failed.status)")
        let stats = try mock.controlRequest("GET", "/stats").json as? [String: Any]
        #expect((stats?[counter] as? Int ?? 0) >= 1, "\(String(describing: stats))")
        #expect(mock.server.deliveries.isEmpty)
        #expect(try mock.controlRequest("DELETE", "/faults").status == 200)
        let ok = try mock.curl(headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(ok.status == 200)
    }

    @Test func stalledStreamTimesOutInCurlWhileOthersAreAnswered() throws {
        let mock = try MockHarness()
        let set = try mock.controlRequest("POST", "/faults", body: #"[{"stall":true,"deviceToken":"dead"}]"#)
        #expect(set.status == 200)
        let stalled = try mock.curl(path: "/3/device/dead", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody(), timeout: 2)
        #expect(stalled.exit == 28)  // curl: operation timed out
        #expect(stalled.status == 0)
        let other = try mock.curl(path: "/3/device/beef", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(other.status == 200)
        #expect(mock.server.stats.stalled == 1)
        #expect(mock.server.deliveries.map(\.deviceToken) == ["beef"])
    }

    @Test func tooManyErrorsEndTheConnection() throws {
        let mock = try MockHarness { $0.faults = FaultPlan(rules: [FaultRule(goAwayAfterErrors: 2)]) }
        let good = try mock.file("good.json", Fixture.accessoryBody())
        let bad = try mock.file("bad.json", Array(#"{"aps":{}}"#.utf8))
        let headers = mock.accessoryHeaders()  // one token for the whole run: a new one per request would be a token update
        let target = mock.url + "/3/device/" + Fixture.deviceToken
        // good, bad, bad (2nd error: GOAWAY), good on a new connection; `--next` keeps one connection.
        var args: [String] = []
        for (i, body) in [good, bad, bad, good].enumerated() {
            if i > 0 { args.append("--next") }
            args += ["-sS", "--http2", "--cacert", mock.caPath, "-m", "10", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\\n"]
            for (name, value) in headers { args += ["-H", "\(name): \(value)"] }
            args += ["--data-binary", "@" + body, target]
        }
        let result = try runTool("/usr/bin/curl", args)
        #expect(result.stdout.split(separator: "\n") == ["200 1", "400 0", "400 0", "200 1"], "\(result.stdout) \(result.stderr)")
        #expect(mock.server.stats.goAwaysSent == 1)
    }

    @Test func abortDropsTheConnectionWithoutAnAnswer() throws {
        let mock = try MockHarness { $0.faults = FaultPlan(rules: [FaultRule(deviceToken: "dead", abort: true)]) }
        let dropped = try mock.curl(path: "/3/device/dead", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(dropped.exit != 0 && dropped.exit != 28)  // a transport error, not a timeout
        #expect(dropped.status == 0)
        #expect(try mock.curl(path: "/3/device/beef", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody()).status == 200)
        #expect(mock.server.stats.aborted == 1)
        #expect(mock.server.deliveries.map(\.deviceToken) == ["beef"])
    }

    @Test func closeAfterNStreamsForcesANewConnection() throws {
        let mock = try MockHarness { $0.faults = FaultPlan(rules: [FaultRule(closeAfter: 1)]) }
        let body = try mock.file("body.json", Fixture.accessoryBody())
        var args = ["-sS", "--http2", "--cacert", mock.caPath, "-m", "10"]
        for (name, value) in mock.accessoryHeaders() { args += ["-H", "\(name): \(value)"] }
        let target = mock.url + "/3/device/" + Fixture.deviceToken
        args += ["--data-binary", "@" + body, "-w", "%{http_code} %{num_connects}\\n"]
        for _ in 0..<2 { args += ["-o", "/dev/null", target] }
        let result = try runTool("/usr/bin/curl", args)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        // The close is abrupt (deliberately no lingering close): if the client's own frames
        // (SETTINGS ACK, WINDOW_UPDATE) are still unread when the socket closes, the kernel sends
        // RST and curl may lose that response ("000"), as with a real dropped connection — for
        // either request, since each connection is closed after its one stream. What the fault
        // guarantees is seen from the mock: each request was answered on a connection of its own,
        // and each of those connections was closed by the fault.
        #expect(lines.count == 2, "\(result.stdout) \(result.stderr)")
        for line in lines {
            #expect(line.hasPrefix("200 ") || line.hasPrefix("000 "), "\(result.stdout) \(result.stderr)")
        }
        #expect(mock.server.stats.connectionsClosed == 2)
        #expect(mock.server.stats.connectionsSeen == 2)
        let connections = mock.server.deliveries.map(\.connectionID)
        #expect(connections.count == 2 && Set(connections).count == 2, "\(connections)")
    }

    @Test func injectedStatusesLatencyAndTokenExpiry() throws {
        let now = Int64(Date().timeIntervalSince1970)
        let mock = try MockHarness()
        let plan = #"{"rules":[{"status":410,"reason":"Unregistered","deviceToken":"0bad","timestampMs":1700000000000},{"status":503,"deviceToken":"0503"},{"status":429,"deviceToken":"0429"},{"latencyMs":300,"deviceToken":"5105"}]}"#
        #expect(try mock.controlRequest("POST", "/faults", body: plan).status == 200)
        let gone = try mock.curl(path: "/3/device/0bad", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(gone.status == 410)
        let goneJSON = try JSONSerialization.jsonObject(with: Data(gone.body.utf8)) as? [String: Any]
        #expect(goneJSON?["reason"] as? String == "Unregistered")
        #expect((goneJSON?["timestamp"] as? NSNumber)?.int64Value == 1_700_000_000_000)
        let unavailable = try mock.curl(path: "/3/device/0503", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(unavailable.status == 503 && unavailable.body.contains("ServiceUnavailable"))
        let tooMany = try mock.curl(path: "/3/device/0429", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(tooMany.status == 429 && tooMany.body.contains("TooManyRequests"))

        // Latency: the answer cannot arrive before the injected delay (a lower bound, not a timing race).
        let started = Date()
        let slow = try mock.curl(path: "/3/device/5105", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(slow.status == 200)
        #expect(Date().timeIntervalSince(started) >= 0.3)

        // ExpiredProviderToken injection for tokens issued before a cut-off.
        #expect(try mock.controlRequest("POST", "/faults", body: #"{"expireTokensIssuedBefore":\#(now)}"#).status == 200)
        let expired = try mock.curl(headers: mock.accessoryHeaders(token: Fixture.token(iat: now - 30)), body: Fixture.accessoryBody())
        #expect(expired.status == 403 && expired.body.contains("ExpiredProviderToken"))
        let fresh = try mock.curl(headers: mock.accessoryHeaders(token: Fixture.token(iat: now + 1)), body: Fixture.accessoryBody())
        #expect(fresh.status == 200)
        #expect(mock.server.deliveries.count == 2)
    }

    @Test func controlEndpoint() throws {
        let mock = try MockHarness()
        #expect(try mock.curl(headers: mock.accessoryHeaders(), body: Fixture.accessoryBody()).status == 200)
        #expect((try mock.controlRequest("GET", "/deliveries").json as? [Any])?.count == 1)
        #expect((try mock.controlRequest("GET", "/deliveries?deviceToken=ffff").json as? [Any])?.count == 0)
        #expect(try mock.curl(path: "/3/device/beef", headers: mock.accessoryHeaders(), body: Fixture.accessoryBody()).status == 200)
        let newest = try mock.controlRequest("GET", "/deliveries?limit=1").json as? [[String: Any]]
        #expect(newest?.count == 1 && newest?.first?["deviceToken"] as? String == "beef")
        #expect(try mock.controlRequest("GET", "/deliveries?limit=-1").status == 400)
        // Fault JSON errors name the field.
        let bad = try mock.controlRequest("POST", "/faults", body: #"{"rules":[{"status":410},{"stauts":500}]}"#)
        #expect(bad.status == 400)
        #expect((bad.json as? [String: Any])?["error"] as? String == "faults: rules[1].stauts is not a fault field")
        let range = try mock.controlRequest("POST", "/faults", body: #"{"fraction":1.5,"status":500}"#)
        #expect(range.status == 400 && ((range.json as? [String: Any])?["error"] as? String)?.contains("fraction") == true)
        #expect(try mock.controlRequest("POST", "/faults", body: "nope").status == 400)
        // Set, read back, clear.
        #expect(try mock.controlRequest("POST", "/faults", body: #"{"status":500}"#).status == 200)
        let current = try mock.controlRequest("GET", "/faults").json as? [String: Any]
        #expect((current?["rules"] as? [[String: Any]])?.first?["status"] as? Int == 500)
        #expect(try mock.curl(headers: mock.accessoryHeaders(), body: Fixture.accessoryBody()).status == 500)
        #expect(try mock.controlRequest("DELETE", "/faults").status == 200)
        #expect(mock.server.faults.rules.isEmpty)
        // Reset clears deliveries and counters.
        #expect(try mock.controlRequest("POST", "/reset").status == 200)
        #expect((try mock.controlRequest("GET", "/deliveries").json as? [Any])?.count == 0)
        #expect((try mock.controlRequest("GET", "/stats").json as? [String: Any])?["requests"] as? Int == 0)
        #expect(try mock.controlRequest("GET", "/nothing").status == 404)
        #expect(try mock.controlRequest("PUT", "/stats").status == 405)
    }

    @Test(arguments: TLSCertificateFault.allCases)
    func tlsFaultsAreRefusedByAVerifyingClient(_ fault: TLSCertificateFault) throws {
        let mock = try MockHarness { $0.tlsFault = fault }
        let r = try mock.curl(headers: mock.accessoryHeaders(), body: Fixture.accessoryBody())
        #expect(r.exit == 60, "curl exit \(r.exit)")  // CURLE_PEER_FAILED_VERIFICATION
        #expect(mock.server.deliveries.isEmpty)
        // The server itself is fine: a client that skips verification gets through.
        var args = ["-sS", "--http2", "-k", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}"]
        for (name, value) in mock.accessoryHeaders() { args += ["-H", "\(name): \(value)"] }
        args += ["--data-binary", String(decoding: Fixture.accessoryBody(), as: UTF8.self), mock.url + "/3/device/abcd"]
        #expect(try runTool("/usr/bin/curl", args).stdout == "200")
    }

    /// Certificate auth as APNs does it: a client certificate signed by the trusted CA replaces
    /// the provider token, and its UID is the only bundle ID it may push to.
    @Test func clientCertificateAuthReplacesTheTokenForItsOwnBundleOnly() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-cert-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let cert = dir.appendingPathComponent("client.pem").path, key = dir.appendingPathComponent("client.key").path
        let mock = try MockHarness {
            $0.generatedClientCertificate = GeneratedClientCertificate(bundleID: Fixture.bundleID, certificatePath: cert, privateKeyPath: key)
            $0.allowedBundleIDs = [Fixture.bundleID, "com.example.other"]
        }
        let subject = try runTool("/usr/bin/openssl", ["x509", "-in", cert, "-noout", "-subject"]).stdout
        #expect(subject.contains("UID = \(Fixture.bundleID)"), "\(subject)")
        #expect(try runTool("/usr/bin/openssl", ["verify", "-CAfile", mock.caPath, "-purpose", "sslclient", cert]).status == 0)

        let ok = try mock.curl(headers: mock.accessoryHeaders(token: nil), body: Fixture.accessoryBody(), clientCertificate: (cert, key))
        #expect(ok.status == 200, "\(ok.body)")
        let other = try mock.curl(headers: Fixture.headers(token: nil, topic: "com.example.other.push-type.accessory"),
                                  body: Fixture.accessoryBody(), clientCertificate: (cert, key))
        #expect(other.status == 400 && other.body.contains("TopicDisallowed"), "\(other.body)")
        // Without a certificate the same mock still wants a token.
        let none = try mock.curl(headers: mock.accessoryHeaders(token: nil), body: Fixture.accessoryBody())
        #expect(none.status == 403 && none.body.contains("MissingProviderToken"), "\(none.body)")
        #expect(try mock.curl(headers: mock.accessoryHeaders(), body: Fixture.accessoryBody()).status == 200)
        // A certificate from a CA the mock does not trust fails the handshake.
        let stranger = try GeneratedTLSMaterial.generate(clientBundleID: Fixture.bundleID)
        let strangerCert = dir.appendingPathComponent("stranger.pem").path, strangerKey = dir.appendingPathComponent("stranger.key").path
        try stranger.clientCertificatePEM!.write(toFile: strangerCert, atomically: true, encoding: .utf8)
        try stranger.clientPrivateKeyPEM!.write(toFile: strangerKey, atomically: true, encoding: .utf8)
        let refused = try mock.curl(headers: mock.accessoryHeaders(token: nil), body: Fixture.accessoryBody(), clientCertificate: (strangerCert, strangerKey))
        #expect(refused.status == 0 && refused.exit != 0, "curl exit \(refused.exit)")
        #expect(mock.server.deliveries.count == 2)
        #expect(RequestValidator.uid(inSubject: "/UID=com.a.b/O=x/CN=y") == "com.a.b")
        #expect(RequestValidator.uid(inSubject: "/O=x/CN=y") == nil)
    }

    @Test func servesGivenCertificateFiles() throws {
        let material = try GeneratedTLSMaterial.generate()
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-files-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let cert = dir.appendingPathComponent("cert.pem").path, key = dir.appendingPathComponent("key.pem").path
        let ca = dir.appendingPathComponent("ca.pem").path
        try material.serverCertificatePEM.write(toFile: cert, atomically: true, encoding: .utf8)
        try material.serverPrivateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
        try material.caCertificatePEM.write(toFile: ca, atomically: true, encoding: .utf8)
        let mock = try MockHarness { $0.tls = .files(cert: cert, key: key) }
        #expect(mock.server.caCertificatePath == nil)
        var args = ["-sS", "--http2", "--cacert", ca, "-m", "10", "-o", "/dev/null", "-w", "%{http_code} %{http_version}"]
        for (name, value) in mock.accessoryHeaders() { args += ["-H", "\(name): \(value)"] }
        args += ["--data-binary", String(decoding: Fixture.accessoryBody(), as: UTF8.self), mock.url + "/3/device/abcd"]
        #expect(try runTool("/usr/bin/curl", args).stdout == "200 2")
    }

    @Test func http1IsRefused() throws {
        let mock = try MockHarness()
        let result = try runTool("/usr/bin/curl", ["-sS", "--http1.1", "--cacert", mock.caPath, "-m", "10", "-w", "\n%{http_code} %{http_version}",
                                                   "-H", "apns-topic: \(Fixture.topic)", "-H", "apns-push-type: accessory",
                                                   "--data-binary", String(decoding: Fixture.accessoryBody(), as: UTF8.self),
                                                   mock.url + "/3/device/abcd"])
        #expect(result.stdout.hasSuffix("505 1.1"), "\(result.stdout) \(result.stderr)")
        #expect(result.stdout.contains("HTTPVersionNotSupported"))
        #expect(mock.server.deliveries.isEmpty)
    }

    @Test func cleartextH2WithoutAuthAcceptsAnyBundle() throws {
        let mock = try MockHarness {
            $0.tls = .cleartextH2
            $0.tokenKeys = []
            $0.allowedBundleIDs = []
            $0.sandbox = false
        }
        let body = try mock.file("body.json", Fixture.accessoryBody())
        let result = try runTool("/usr/bin/curl", ["-sS", "--http2-prior-knowledge", "-m", "10", "-D", "-", "-o", "/dev/null",
                                                   "-H", "apns-topic: org.any.push-type.accessory", "-H", "apns-push-type: accessory",
                                                   "--data-binary", "@" + body, "http://127.0.0.1:\(mock.server.port)/3/device/00"])
        #expect(result.stdout.hasPrefix("HTTP/2 200"), "\(result.stdout) \(result.stderr)")
        #expect(!result.stdout.contains("apns-unique-id"))  // production mode
    }
}
