import Foundation
import Testing
@testable import RelayCore

/// curl as the HTTP client (in APT deps); returns (status, body).
private func curl(_ args: [String]) throws -> (Int, String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    p.arguments = ["-sS", "-m", "10", "-o", "-", "-w", "\n%{http_code}"] + args
    let out = Pipe()
    p.standardOutput = out
    try p.run()
    let d = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    let text = String(decoding: d, as: UTF8.self)
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
    return (Int(lines.last ?? "") ?? 0, lines.dropLast().joined(separator: "\n"))
}

/// The minimal config with one app (com.example.app), ephemeral loopback ports, the database at
/// `db` and no systemd watchdog: what every in-process RelayService test starts from.
func serviceTestConfig(db: String) throws -> RelayConfig {
    var c = try RelayConfig.parse(Array(ConfigTests.minimal.utf8))
    c.apps[0].bundleID = "com.example.app"
    c.listen.port = 0
    c.admin.port = 0
    c.store.path = db
    c.watchdog = false
    return c
}

@Suite struct RelayServiceTests {
    let dir = TempDir()

    func config() throws -> RelayConfig { try serviceTestConfig(db: dir.db) }

    @Test func postOverHTTPThenDeliveredThroughTheTransportThenDrain() throws {
        let transport = FakeTransport { _, _ in PushAnswer(status: 200, reason: nil, classification: .done) }
        let service = RelayService(config: try config(), logger: RelayLogger(capture: true)) { _, _ in transport }
        try service.start()
        defer { service.stop() }
        let store = try #require(service.store)
        let secret = try store.createCredential(name: "t", apps: ["com.example.app"]).secret
        let body = #"{"pushToken":"abcd","sessionIdentifier":"6F9619FF-8B86-D011-B42D-00C04FC964FF","keyID":"AQIDBA==","messageIndex":"3","encryptedData":"\#(Data(count: 30).base64EncodedString())"}"#
        let (status, text) = try curl(["-X", "POST", "http://127.0.0.1:\(service.ingestPort)/v1/responses",
                                       "-H", "Authorization: Bearer \(secret)", "-H", "Content-Type: application/json", "--data-binary", body])
        #expect(status == 202, "\(text)")
        let id = try #require((try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])?["id"] as? String)
        for _ in 0..<1000 where try store.response(id: id)?.state != .delivered { usleep(5000) }
        let (gs, g) = try curl(["http://127.0.0.1:\(service.ingestPort)/v1/responses/\(id)", "-H", "Authorization: Bearer \(secret)"])
        #expect(gs == 200)
        #expect(g.contains("\"state\":\"delivered\""))
        #expect(transport.sent.withLock { $0.map(\.id) } == [id])
        // h2c prior knowledge works too (curl --http2-prior-knowledge).
        let (h2, _) = try curl(["--http2-prior-knowledge", "http://127.0.0.1:\(service.ingestPort)/v1/responses/\(id)", "-H", "Authorization: Bearer \(secret)"])
        #expect(h2 == 200)
        let (ms, metrics) = try curl(["http://127.0.0.1:\(service.adminPort)/metrics"])
        #expect(ms == 200)
        #expect(metrics.contains("relay_ingest_requests_total{status=\"202\"} 1"))
        #expect(metrics.contains("relay_outbox_responses{state=\"delivered\"} 1"))
        #expect(metrics.contains("relay_http_connections_total{listener=\"ingest\"}"))
        // Both listeners' series of a family sit in its one group (they followed all the
        // HELP/TYPE lines before); promtool is not installed here, so the format is checked here.
        #expect(metrics.contains("relay_http_connections_total{listener=\"admin\"}"))
        #expect(expositionProblems(metrics).isEmpty, "\(expositionProblems(metrics))\n\(metrics)")
        // The POST is timed; the two GETs are not.
        #expect(metrics.contains("relay_ingest_duration_seconds_count 1\n"))
        #expect(metrics.contains("relay_ingest_duration_seconds_bucket{le=\"+Inf\"} 1\n"))
        let transaction = metrics.split(separator: "\n").first { $0.hasPrefix("relay_store_transaction_seconds_total ") }
        #expect((transaction?.split(separator: " ").last).flatMap { Double($0) }.map { $0 > 0 } == true, "\(String(describing: transaction))")
        let (rs, ready) = try curl(["http://127.0.0.1:\(service.adminPort)/readyz"])
        #expect(rs == 200, "\(ready)")
        #expect(try curl(["http://127.0.0.1:\(service.adminPort)/healthz"]).0 == 200)
        service.stop()
        #expect(transport.shutdowns.withLock { $0 } == 1)
        #expect(try curl(["http://127.0.0.1:\(service.adminPort)/healthz"]).0 == 0)  // closed
    }

    /// Requests the HTTP layer refuses before the ingest handler sees them still get the API's
    /// `{"error","field","message"}` shape; HEAD answers carry the GET's Content-Length.
    @Test func serverLevelRefusalsUseTheAPIErrorFormat() throws {
        var c = try config()
        c.ingest.maxBodyBytes = 4096
        let service = RelayService(config: c, logger: RelayLogger(capture: true)) { _, _ in
            FakeTransport { _, _ in PushAnswer(status: 200, reason: nil, classification: .done) }
        }
        try service.start()
        defer { service.stop() }
        let url = "http://127.0.0.1:\(service.ingestPort)/v1/responses"
        func object(_ text: String) -> [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
        }
        // Far over twice the limit: cut off by HTTPServer (HTTP/1.1 and HTTP/2), same body as the API's own 413.
        let huge = String(repeating: "x", count: 3 * 4096)
        for h2 in [false, true] {
            let (status, text) = try curl((h2 ? ["--http2-prior-knowledge"] : []) + ["-X", "POST", url, "-H", "Authorization: Bearer x",
                                           "-H", "Content-Type: application/json", "--data-binary", huge])
            #expect(status == 413, "\(text)")
            let o = object(text)
            #expect(o["error"] as? String == "body_too_large" && o["field"] as? String == "body", "\(text)")
            #expect((o["message"] as? String)?.contains("4096") == true, "\(text)")
        }
        // A header the parser refuses: 400 in the API shape, the parser's kind in the message.
        let (bad, badText) = try curl(["-X", "POST", url, "-H", "Bad Header: x"])
        #expect(bad == 400, "\(badText)")
        #expect(object(badText)["error"] as? String == "malformed_request", "\(badText)")
        #expect(object(badText)["message"] is String, "\(badText)")
        // HEAD: headers only, with the Content-Length a GET gets.
        let health = "http://127.0.0.1:\(service.adminPort)/healthz"
        let (gs, getBody) = try curl([health])
        let (hs, headText) = try curl(["-I", health])
        #expect(gs == 200 && hs == 200)
        #expect(headText.lowercased().contains("content-length: \(getBody.utf8.count)"), "\(headText)")
    }
}
