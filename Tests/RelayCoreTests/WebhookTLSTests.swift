// The webhook sender over TLS against the relay's own HTTPServer (ALPN h2): HTTP/2 on one reused
// connection, the certificate checked against `caFile`, and refused when another CA signed it.
import Foundation
import HTTPServer
import Synchronization
import Testing
@testable import RelayCore

@Suite(.serialized) struct WebhookTLSTests {
    /// A CA, a server certificate for 127.0.0.1 it signed, and an unrelated CA (openssl CLI).
    static func certificates(in dir: String) -> Bool {
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try? "subjectAltName=IP:127.0.0.1,DNS:localhost\n".write(toFile: dir + "/san.cnf", atomically: true, encoding: .utf8)
        let steps: [[String]] = [
            ["req", "-x509"] + ec + ["-keyout", dir + "/ca.key", "-out", dir + "/ca.pem", "-days", "2", "-subj", "/CN=Webhook Test CA"],
            ["req", "-x509"] + ec + ["-keyout", dir + "/other.key", "-out", dir + "/other.pem", "-days", "2", "-subj", "/CN=Other CA"],
            ["req"] + ec + ["-keyout", dir + "/server.key", "-out", dir + "/server.csr", "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", dir + "/server.csr", "-CA", dir + "/ca.pem", "-CAkey", dir + "/ca.key", "-CAcreateserial",
             "-out", dir + "/server.pem", "-days", "2", "-extfile", dir + "/san.cnf"],
        ]
        for arguments in steps {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            p.arguments = arguments
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            guard (try? p.run()) != nil else { return false }
            p.waitUntilExit()
            guard p.terminationStatus == 0 else { return false }
        }
        return true
    }

    struct Seen: Sendable { var version: HTTPVersion; var connection: UInt64; var id: String; var verified: Bool }

    @Test func http2OverOneVerifiedConnectionAndAWrongCARefused() throws {
        let dir = TempDir()
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), Self.certificates(in: dir.path) else {
            print("webhook TLS test: skipped (no openssl CLI)")
            return
        }
        let secret = try WebhookSecret(parsing: makeWebhookSecretText(5))
        let seen = Mutex<[Seen]>([])
        var configuration = HTTPServerConfiguration()
        configuration.tls = TLSConfiguration(certificatePath: dir.path + "/server.pem", privateKeyPath: dir.path + "/server.key")
        let server = try HTTPServer(configuration: configuration) { req, res in
            let ok = WebhookSigning.verify(id: req.headers["webhook-id"] ?? "", timestamp: req.headers["webhook-timestamp"] ?? "",
                                           signatures: req.headers["webhook-signature"] ?? "", body: req.body, secret: secret,
                                           nowSeconds: Int64(Date().timeIntervalSince1970))
            seen.withLock { $0.append(Seen(version: req.version, connection: req.connectionID, id: req.headers["webhook-id"] ?? "", verified: ok)) }
            res.respond(HTTPReply(status: ok ? 204 : 400))
        }
        try server.start()
        defer { server.stop(grace: .milliseconds(500)) }
        let url = "https://127.0.0.1:\(server.localPort)/hook"
        let retry = WebhookRetryPolicy(baseMillis: 20, capMillis: 200, retryForMillis: 60_000, pauseCapMillis: 100)
        let logger = RelayLogger(minimum: .error, capture: true)

        let outbox = InMemoryWebhookOutbox(webhooks: ["hook"])
        let events = (0..<24).map { _ in outbox.add() }
        let sender = WebhookSender(endpoints: [.init(name: "hook", url: url, secrets: [secret], caFile: dir.path + "/ca.pem", maxConcurrent: 8, retry: retry)],
                                   outbox: outbox, metrics: WebhookMetrics(), logger: logger, idlePollMillis: 50)
        try sender.start()
        #expect(eventually(30) { outbox.snapshot("hook").allSatisfy { $0.state == .delivered } })
        sender.stop(grace: .seconds(1))
        let requests = seen.withLock { $0 }
        #expect(Set(requests.map(\.id)) == Set(events.map(\.id)))
        #expect(requests.allSatisfy { $0.verified && $0.version == .http2 }, "\(requests.map { ($0.version, $0.verified) })")
        #expect(Set(requests.map(\.connection)).count == 1, "HTTP/2: one connection for every request")

        // The same server, trusted through another CA: every attempt fails the certificate check.
        let refused = InMemoryWebhookOutbox(webhooks: ["hook"])
        refused.add()
        let before = seen.withLock { $0.count }
        let wrongCA = WebhookSender(endpoints: [.init(name: "hook", url: url, secrets: [secret], caFile: dir.path + "/other.pem", retry: retry)],
                                    outbox: refused, metrics: WebhookMetrics(), logger: logger, idlePollMillis: 50)
        try wrongCA.start()
        defer { wrongCA.stop(grace: .seconds(1)) }
        #expect(eventually(30) { refused.snapshot("hook").first.map { $0.attempts >= 2 } ?? false })
        let row = try #require(refused.snapshot("hook").first)
        #expect(row.state == .pending && row.lastError?.lowercased().contains("certificate") == true, "\(row.lastError ?? "-")")
        #expect(seen.withLock { $0.count } == before, "no request reached the server")
    }
}
