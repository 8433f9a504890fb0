// The ingest listener's TLS as an operator runs it, against the real relay-server binary on
// loopback: SIGHUP serves a renewed certificate to new connections while an open connection
// keeps working, a broken renewal keeps the old certificate, and listen.tls.clientCA (mTLS)
// refuses clients without a certificate from that CA but still requires the bearer credential.
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

private let tlsToolsAvailable = FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl")
    && FileManager.default.isExecutableFile(atPath: "/usr/bin/curl")

/// Runs a tool to completion with `input` on its stdin; its stdout, and stderr too unless
/// `stderr` is false.
private func tool(_ exe: String, _ args: [String], in dir: String, stderr: Bool = true, input: String = "") throws -> (status: Int32, output: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: exe)
    p.arguments = args
    p.currentDirectoryURL = URL(fileURLWithPath: dir)
    let out = Pipe()
    p.standardOutput = out
    p.standardError = stderr ? out : FileHandle.nullDevice
    let stdin = Pipe()
    p.standardInput = stdin
    try p.run()
    stdin.fileHandleForWriting.write(Data(input.utf8))
    try stdin.fileHandleForWriting.close()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: data, as: UTF8.self))
}

private func openssl(_ args: [String], in dir: String) throws {
    let r = try tool("/usr/bin/openssl", args, in: dir)
    guard r.status == 0 else { throw RelayITError("openssl \(args.joined(separator: " ")): \(r.output)") }
}

/// A self-signed P-256 certificate `<name>.pem` / `<name>.key` with the given common name.
private func selfSigned(_ name: String, cn: String, in dir: String) throws {
    try openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "\(name).key",
                 "-out", "\(name).pem", "-days", "30", "-subj", "/CN=\(cn)"], in: dir)
}

/// A P-256 client certificate `<name>.pem` / `<name>.key` issued by the CA `<ca>.pem` / `<ca>.key`.
private func issued(_ name: String, cn: String, by ca: String, in dir: String) throws {
    try openssl(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "\(name).key",
                 "-out", "\(name).csr", "-subj", "/CN=\(cn)"], in: dir)
    try openssl(["x509", "-req", "-in", "\(name).csr", "-CA", "\(ca).pem", "-CAkey", "\(ca).key", "-CAcreateserial",
                 "-out", "\(name).pem", "-days", "30"], in: dir)
}

/// One `openssl s_client` connection held open: requests go in through stdin, everything it
/// prints (certificate subject, responses) collects in `output`.
private final class HeldConnection: @unchecked Sendable {
    // @unchecked Sendable: the output buffer is behind its own Mutex; the rest is set in init.
    let process = Process()
    private let input = Pipe()
    private let text = RelayLogBuffer()

    init(port: Int, dir: String) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = ["s_client", "-connect", "127.0.0.1:\(port)", "-ign_eof"]
        process.currentDirectoryURL = URL(fileURLWithPath: dir)
        let out = Pipe()
        process.standardOutput = out
        process.standardError = out
        process.standardInput = input
        let text = self.text
        out.fileHandleForReading.readabilityHandler = { h in
            let d = h.availableData
            if d.isEmpty { h.readabilityHandler = nil; return }
            text.bytes.withLock { $0 += Array(d) }
        }
        try process.run()
    }

    deinit { if process.isRunning { process.terminate() } }

    var output: String { text.bytes.withLock { String(decoding: $0, as: UTF8.self) } }
    var responses: Int { output.components(separatedBy: "HTTP/1.1 ").count - 1 }

    func send(_ request: String) { input.fileHandleForWriting.write(Data(request.utf8)) }
}

@Suite("relay-server TLS: reload and mTLS", .enabled(if: tlsToolsAvailable, "openssl or curl CLI missing"), .serialized)
struct RelayServerTLSTests {
    /// The subject the listener serves to a new connection.
    static func servedSubject(_ port: Int, dir: String) throws -> String {
        let r = try tool("/usr/bin/openssl", ["s_client", "-connect", "127.0.0.1:\(port)"], in: dir)
        return r.output.split(separator: "\n").first { $0.hasPrefix("subject=") }.map(String.init) ?? "(no certificate: \(r.output))"
    }

    @Test func sighupServesTheNewCertificateAndOpenConnectionsKeepWorking() throws {
        let h = try RelayHarness()
        try selfSigned("one", cn: "relay-cert-one", in: h.dir)
        try selfSigned("two", cn: "relay-cert-two", in: h.dir)
        for ext in ["pem", "key"] { try FileManager.default.copyItem(atPath: "\(h.dir)/one.\(ext)", toPath: "\(h.dir)/server.\(ext)") }
        h.listenExtra = #""tls":{"certificate":"server.pem","privateKey":"server.key"}"#
        try h.writeConfig()
        try h.startRelay()
        #expect(try Self.servedSubject(h.relayPort, dir: h.dir).contains("relay-cert-one"))

        // An open connection from before the reload, proven working.
        let held = try HeldConnection(port: h.relayPort, dir: h.dir)
        let request = "GET /v1/responses/none HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer \(h.credential)\r\n\r\n"
        held.send(request)
        try relayEventually("first response on the held connection") { held.responses == 1 }
        #expect(held.output.contains("relay-cert-one"))

        // Renewal: new files at the same paths (rename, as certbot and cert-manager do), then HUP.
        for ext in ["pem", "key"] {
            try FileManager.default.copyItem(atPath: "\(h.dir)/two.\(ext)", toPath: "\(h.dir)/new.\(ext)")
            _ = rename("\(h.dir)/new.\(ext)", "\(h.dir)/server.\(ext)")
        }
        h.relay?.signal(SIGHUP)
        try relayEventually("reload logged") { h.relay?.stderr.contains("TLS certificate reloaded") == true }
        #expect(h.relay?.stderr.contains("relay-cert-two") == true)
        #expect(try Self.servedSubject(h.relayPort, dir: h.dir).contains("relay-cert-two"))
        #expect(h.relay?.isRunning == true)

        // The old connection: same TLS session, still answering.
        held.send(request)
        try relayEventually("second response on the held connection") { held.responses == 2 }
        #expect(held.process.isRunning)

        // A broken renewal (a key that does not match, then garbage): the log says why and
        // new connections still get the last good certificate.
        try FileManager.default.removeItem(atPath: "\(h.dir)/server.key")
        try FileManager.default.copyItem(atPath: "\(h.dir)/one.key", toPath: "\(h.dir)/server.key")
        h.relay?.signal(SIGHUP)
        try relayEventually("failed reload logged") { h.relay?.stderr.contains("TLS reload failed") == true }
        #expect(h.relay?.stderr.contains("private key \(h.dir)/server.key") == true, "\(h.relay?.stderr ?? "")")
        #expect(try Self.servedSubject(h.relayPort, dir: h.dir).contains("relay-cert-two"))
        try "not a certificate\n".write(toFile: "\(h.dir)/server.pem", atomically: true, encoding: .utf8)
        h.relay?.signal(SIGHUP)
        try relayEventually("second failed reload logged") { (h.relay?.stderr.components(separatedBy: "TLS reload failed").count ?? 0) == 3 }
        #expect(try Self.servedSubject(h.relayPort, dir: h.dir).contains("relay-cert-two"))
        let metrics = try relayHTTP(h.adminPort, "GET", "/metrics").text
        #expect(metrics.contains(#"relay_tls_reloads_total{result="ok"} 1"#) && metrics.contains(#"relay_tls_reloads_total{result="failed"} 2"#), "\(metrics)")

        // SIGTERM is still the drain.
        h.relay?.signal(SIGTERM)
        #expect(h.relay?.wait(seconds: 15) == 0)
    }

    @Test func clientCARequiresACertificateAndStillTheBearerCredential() throws {
        let h = try RelayHarness()
        let dir = h.dir
        try selfSigned("server", cn: "relay.example", in: dir)
        // Not "ca": ca.pem is mock-apns' CA, which the relay uses to trust mock-apns.
        try selfSigned("accessory-ca", cn: "accessory-ca", in: dir)
        try selfSigned("other-ca", cn: "someone-else", in: dir)
        try issued("client", cn: "client", by: "accessory-ca", in: dir)
        try issued("stranger", cn: "stranger", by: "other-ca", in: dir)
        h.listenExtra = #""tls":{"certificate":"server.pem","privateKey":"server.key","clientCA":"accessory-ca.pem"}"#
        try h.writeConfig()
        try h.startRelay()

        func post(cert: String?, bearer: Bool) throws -> (status: Int32, code: String) {
            let body = try h.accessory.nextBody().body
            try Data(body).write(to: URL(fileURLWithPath: "\(dir)/body.json"))
            var args = ["-sS", "-k", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "-X", "POST",
                        "-H", "Content-Type: application/json", "--data-binary", "@body.json"]
            if let cert { args += ["--cert", "\(cert).pem", "--key", "\(cert).key"] }
            if bearer { args += ["-H", "Authorization: Bearer \(h.credential)"] }
            let r = try tool("/usr/bin/curl", args + ["https://127.0.0.1:\(h.relayPort)/v1/responses"], in: dir, stderr: false)
            return (r.status, String(r.output.suffix(3)))
        }
        let noCert = try post(cert: nil, bearer: true)
        #expect(noCert.status != 0 && noCert.code == "000", "\(noCert)")  // refused in the handshake
        let stranger = try post(cert: "stranger", bearer: true)
        #expect(stranger.status != 0 && stranger.code == "000", "\(stranger)")
        #expect(try post(cert: "client", bearer: false).code == "401")
        #expect(try post(cert: "client", bearer: true).code == "202")
        // An accessory resuming its session (TLS 1.2 session id, TLS 1.3 ticket) with its
        // certificate: OpenSSL refuses resumption under SSL_VERIFY_PEER without a session id context.
        // A TLS 1.3 ticket comes after the handshake: s_client waits for the answer to a request
        // (-ign_eof) so the ticket is in before it writes the session file.
        let request = "GET /v1/responses/none HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n"
        for version in ["-tls1_2", "-tls1_3"] {
            _ = try tool("/usr/bin/openssl", ["s_client", version, "-ign_eof", "-connect", "127.0.0.1:\(h.relayPort)", "-cert", "client.pem", "-key", "client.key",
                                              "-sess_out", "session\(version)"], in: dir, input: request)
            let again = try tool("/usr/bin/openssl", ["s_client", version, "-connect", "127.0.0.1:\(h.relayPort)", "-cert", "client.pem", "-key", "client.key",
                                                      "-sess_in", "session\(version)"], in: dir)
            #expect(again.output.contains("Reused,") && !again.output.contains("alert"), "\(version): \(again.output)")
        }
        let metrics = try relayHTTP(h.adminPort, "GET", "/metrics").text
        #expect(metrics.contains(#"relay_http_tls_handshake_failures_total{listener="ingest"} 2"#), "\(metrics)")
    }

    /// `relayctl accessory send` (libcurl) against the mTLS listener, the way firmware meets a relay
    /// that asks for a certificate: without one the handshake is refused and the command names the
    /// TLS failure (exit 1, nothing stored); with its certificate and --ca-file the response is
    /// accepted (202) and stored. (ca.pem is mock-apns' CA; the client CA has its own name.)
    @Test func accessorySendPresentsItsClientCertificate() throws {
        let h = try RelayHarness()
        let dir = h.dir
        try openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
                     "-out", "server.pem", "-days", "30", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], in: dir)
        try selfSigned("accessory-ca", cn: "accessory-ca", in: dir)
        try issued("client", cn: "accessory", by: "accessory-ca", in: dir)
        h.listenExtra = #""tls":{"certificate":"server.pem","privateKey":"server.key","clientCA":"accessory-ca.pem"}"#
        try h.writeConfig()
        try h.startRelay()
        let state = dir + "/accessory.json"
        let paired = try Relayctl.run(["accessory", "pair", "--ciphersuite", "p256", "--out", state])
        try #require(paired.status == 0, "\(paired.stderr)")
        let send = ["accessory", "send", "--state", state, "--url", "https://127.0.0.1:\(h.relayPort)", "--credential", h.credential,
                    "--ca-file", dir + "/server.pem", "--json"]

        // No client certificate: the relay refuses the handshake. Not retried (the default is 5
        // retries; before, all 6 attempts repeated the same refused handshake), a clear message,
        // exit 1, and the other responses of the run are not tried.
        let refused = try Relayctl.run(send + ["--count", "3"])
        #expect(refused.status == 1, "\(refused.stdout)\(refused.stderr)")
        #expect(refused.stderr.contains("TLS handshake with the relay failed and was not retried")
                && refused.stderr.contains("--client-cert"), "\(refused.stderr)")
        let refusals = try #require((try Relayctl.json(refused) as? [String: Any])?["responses"] as? [[String: Any]])
        #expect(refusals.count == 1)
        let refusal = refusals.first
        #expect(refusal?["status"] as? Int == 0 && refusal?["attempts"] as? Int == 1)
        let error = refusal?["error"] as? String ?? ""
        #expect(error.contains("SSL") && error.contains("certificate required"), "\(error)")
        #expect(try h.sql("SELECT count(*) FROM responses") == "0")
        // A relay certificate this host does not trust (no --ca-file): the same, from our side.
        let untrusted = try Relayctl.run(send.filter { $0 != "--ca-file" && $0 != dir + "/server.pem" })
        #expect(untrusted.status == 1 && untrusted.stderr.contains("--ca-file"), "\(untrusted.stderr)")
        #expect((try Relayctl.json(untrusted) as? [String: Any]).flatMap { ($0["responses"] as? [[String: Any]])?.first?["attempts"] as? Int } == 1)

        let accepted = try Relayctl.run(send + ["--client-cert", dir + "/client.pem", "--client-key", dir + "/client.key"])
        #expect(accepted.status == 0, "\(accepted.stdout)\(accepted.stderr)")
        let response = try #require((try Relayctl.json(accepted) as? [String: Any])?["responses"] as? [[String: Any]]).first
        #expect(response?["status"] as? Int == 202)
        // The refused attempts used indexes 0 and 1 (persisted before they left); the accepted one is index 2.
        #expect(response?["index"] as? Int == 2)
        let id = try #require(response?["id"] as? String)
        let token = try #require((try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: state))) as? [String: Any])?["pushToken"] as? String)
        #expect(try h.sql("SELECT message_index || ' ' || push_token FROM responses WHERE id = '\(id)'") == "2 \(token)")
    }

    /// The APNs key files reload on SIGHUP too, app by app and only when they changed: a broken
    /// .p8 keeps the previous key signing; a different key takes over (the mock, which knows
    /// only the first, refuses its tokens); the first key back, pushes are delivered again.
    @Test func sighupReloadsChangedAPNsKeysAndKeepsTheOldOnABadFile() throws {
        let h = try RelayHarness()
        try h.startRelay()
        let p8 = h.dir + "/apns.p8"
        let original = try Data(contentsOf: URL(fileURLWithPath: p8))
        func post() throws -> String {
            let r = try h.post(try h.accessory.nextBody().body)
            try #require(r.status == 202, "\(r.text)")
            return try #require(r.json["id"] as? String)
        }
        func delivered(_ id: String) throws {
            try relayEventually("\(id) delivered") { try h.deliveries().contains { ($0["apnsId"] as? String) == id } }
        }
        func log(_ text: String) -> Int { (h.relay?.stderr.components(separatedBy: text).count ?? 1) - 1 }
        func replaceKey(_ data: Data) throws {
            try data.write(to: URL(fileURLWithPath: p8 + ".new"))
            _ = rename(p8 + ".new", p8)
        }
        try delivered(try post())

        // Unchanged key files: the HUP leaves the APNs clients alone.
        h.relay?.signal(SIGHUP)
        try relayEventually("first reload") { log("nothing to reload") == 1 }
        #expect(log("APNs credentials") == 0)

        try replaceKey(Data("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n".utf8))
        h.relay?.signal(SIGHUP)
        try relayEventually("failed APNs reload logged") { log("APNs credentials reload failed") == 1 }
        #expect(h.relay?.stderr.contains(#""app":"\#(RelayHarness.bundleID)""#) == true)
        try delivered(try post())

        try openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "other.p8"], in: h.dir)
        try replaceKey(try Data(contentsOf: URL(fileURLWithPath: h.dir + "/other.p8")))
        h.relay?.signal(SIGHUP)
        try relayEventually("APNs reload logged") { log("APNs credentials reloaded") == 1 }
        let refused = try post()
        try relayEventually("the mock refuses the other key's token") {
            try relayHTTP(h.adminPort, "GET", "/metrics").text.contains(#"relay_pushes_total{status="403",reason="InvalidProviderToken"} "#)
        }
        // The app is paused, not its row failed: /readyz names it, the gauge and one log line say why.
        try relayEventually("paused app named by /readyz") {
            let r = try relayHTTP(h.adminPort, "GET", "/readyz")
            return r.status == 503 && r.text.contains(#""paused":{"\#(RelayHarness.bundleID)":"InvalidProviderToken"}"#)
        }
        #expect(try relayHTTP(h.adminPort, "GET", "/metrics").text
            .contains(#"relay_app_paused{app="\#(RelayHarness.bundleID)",reason="InvalidProviderToken"} 1"#))
        #expect(log("app paused") == 1)

        try replaceKey(original)
        h.relay?.signal(SIGHUP)
        try relayEventually("second APNs reload logged") { log("APNs credentials reloaded") == 2 }
        // The reload resumed the app: the row refused under the other key goes out too.
        try delivered(refused)
        #expect(log("app resumed") == 1)
        #expect(try relayHTTP(h.adminPort, "GET", "/readyz").status == 200)
        try delivered(try post())
        let metrics = try relayHTTP(h.adminPort, "GET", "/metrics").text
        #expect(metrics.contains(#"relay_apns_credential_reloads_total{result="ok"} 2"#)
                && metrics.contains(#"relay_apns_credential_reloads_total{result="failed"} 1"#), "\(metrics)")
        #expect(h.relay?.isRunning == true)
    }

    /// A push certificate renewed in place (the case reload serves): after the HUP the new
    /// files are what APNs sees. mock-apns checks client certificates against its CA, so a
    /// certificate from elsewhere is refused in the handshake (the app pauses: issue 25 item 5),
    /// and the real one back resumes it and delivers the held row.
    @Test func sighupReloadsARenewedPushCertificate() throws {
        let h = try RelayHarness()
        let dir = h.dir
        h.mock = nil  // the token-auth mock; this test needs certificate auth
        h.mockPort = try relayFreePort()
        h.controlPort = try relayFreePort()
        h.mock = try RelayChild(relayBinary("mock-apns"), [
            "--listen", "127.0.0.1:\(h.mockPort)", "--control", "127.0.0.1:\(h.controlPort)", "--generate-tls", "--ca-out", dir + "/ca.pem",
            "--generate-client-cert", "\(RelayHarness.bundleID):\(dir)/push.pem:\(dir)/push.key", "--bundle-id", RelayHarness.bundleID,
            "--root-secret", "\(h.accessory.keyIDBase64):\(h.accessory.rootSecretHex)"], name: "mock-apns")
        try relayEventually("mock-apns control port") { try relayHTTP(h.controlPort, "GET", "/stats").status == 200 }
        try """
            {"listen":{"host":"127.0.0.1","port":\(h.relayPort)},"admin":{"host":"127.0.0.1","port":\(h.adminPort)},
             "store":{"path":"relay.db"},"dispatch":{"backoffBaseMs":50,"backoffCapMs":200},
             "apps":[{"bundleID":"\(RelayHarness.bundleID)","environment":"custom","url":"https://127.0.0.1:\(h.mockPort)","caFile":"ca.pem",
                      "certificate":{"certificatePath":"push.pem","privateKeyPath":"push.key"}}],
             "log":{"format":"json","level":"debug"}}
            """.write(toFile: dir + "/relay.json", atomically: true, encoding: .utf8)
        try h.startRelay()
        func post() throws -> String {
            let r = try h.post(try h.accessory.nextBody().body)
            try #require(r.status == 202, "\(r.text)")
            return try #require(r.json["id"] as? String)
        }
        func delivered(_ id: String) throws {
            try relayEventually("\(id) delivered") { try h.deliveries().contains { ($0["apnsId"] as? String) == id } }
        }
        func swapIn(_ name: String) throws {
            for ext in ["pem", "key"] {
                try FileManager.default.copyItem(atPath: "\(dir)/\(name).\(ext)", toPath: "\(dir)/next.\(ext)")
                _ = rename("\(dir)/next.\(ext)", "\(dir)/push.\(ext)")
            }
        }
        func reloads() -> Int { (h.relay?.stderr.components(separatedBy: "APNs credentials reloaded").count ?? 1) - 1 }
        try delivered(try post())
        for ext in ["pem", "key"] { try FileManager.default.copyItem(atPath: "\(dir)/push.\(ext)", toPath: "\(dir)/good.\(ext)") }

        try selfSigned("stranger", cn: RelayHarness.bundleID, in: dir)
        try swapIn("stranger")
        h.relay?.signal(SIGHUP)
        try relayEventually("reload with the other certificate") { reloads() == 1 }
        let held = try post()
        // Refused in the handshake: not a transient failure. The app pauses as credential_file
        // (/readyz names it, one log line names the file), the row waits without an attempt.
        try relayEventually("the mock refuses the other certificate: app paused") {
            let r = try relayHTTP(h.adminPort, "GET", "/readyz")
            return r.status == 503 && r.text.contains(#""paused":{"\#(RelayHarness.bundleID)":"credential_file"}"#)
        }
        #expect(h.relay?.stderr.components(separatedBy: "app paused").count == 2)
        #expect(h.relay?.stderr.contains("push.pem") == true)
        #expect(try !h.deliveries().contains { ($0["apnsId"] as? String) == held })
        #expect(try h.sql("SELECT attempts FROM responses WHERE id = '\(held)'") == "0")

        try swapIn("good")
        h.relay?.signal(SIGHUP)
        try relayEventually("reload with the real certificate") { reloads() == 2 }
        try delivered(held)
        try delivered(try post())
    }
}
