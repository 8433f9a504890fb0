import Foundation
import Testing
@testable import MockAPNs
import Ratchet

@Suite struct ConfigurationTests {
    private func tempDir() throws -> URL {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-config-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir
    }

    @Test func parsesTheTypicalCommandLine() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(at: dir) }
        let p8 = dir.appendingPathComponent("AuthKey.p8").path
        try Fixture.key.privateKeyPEM().write(toFile: p8, atomically: true, encoding: .utf8)
        let secret = String(repeating: "0f", count: 32)
        let outcome = try MockAPNsCommandLine.parse([
            "--listen", "127.0.0.1:0", "--generate-tls", "--ca-out", "ca.pem", "--control", "127.0.0.1:0",
            "--token-key", "ABC123DEFG:TEAM123456:\(p8)", "--bundle-id", "com.example.app",
            "--root-secret", "AQIDBA==:\(secret)", "--deliveries-log", "d.jsonl", "--fault", "goaway-after=10",
            "--max-concurrent-streams", "50", "--initial-max-concurrent-streams", "10", "--production",
        ])
        guard case .run(let c) = outcome else { Issue.record("expected run"); return }
        #expect(c.host == "127.0.0.1" && c.port == 0 && c.controlPort == 0)
        guard case .generate(let ca) = c.tls else { Issue.record("expected generated TLS"); return }
        #expect(ca == "ca.pem")
        #expect(c.tokenKeys.map(\.keyID) == ["ABC123DEFG"] && c.tokenKeys.map(\.teamID) == ["TEAM123456"])
        #expect(c.allowedBundleIDs == ["com.example.app"])
        #expect(c.rootSecrets.map(\.keyID) == [[1, 2, 3, 4]] && c.rootSecrets.first?.rootSecret == SecretKey(bytes: Array(repeating: UInt8(0x0f), count: 32)))
        #expect(c.deliveriesLogPath == "d.jsonl")
        #expect(c.faults.rules == [FaultRule(goAwayAfter: 10)])
        #expect(c.maxConcurrentStreams == 50 && c.initialMaxConcurrentStreams == 10 && c.sandbox == false)
    }

    @Test func usageErrorsNameTheProblem() {
        let bad: [([String], String)] = [
            (["--listen", "nope"], "--listen"),
            (["--listen", "127.0.0.1:70000"], "--listen"),
            (["--control", "0.0.0.0:2198"], "loopback"),
            (["--token-key", "ABC:only"], "--token-key"),
            (["--token-key", "ABC:TEAM:/does/not/exist.p8"], "cannot read"),
            (["--root-secret", "AQIDBA==:abcd"], "64 hex"),
            (["--root-secret", "AQID:" + String(repeating: "00", count: 32)], "4 bytes"),
            (["--h2c", "--tls-cert", "a", "--tls-key", "b"], "choose one"),
            (["--tls-cert", "a"], "go together"),
            (["--fault", "status=99"], "status"),
            (["--wat"], "unknown option"),
            (["--tls-fault", "sideways"], "--tls-fault must be one of expired, wrong-host, untrusted"),
            (["--h2c", "--tls-fault", "expired"], "needs --generate-tls"),
            (["--initial-max-concurrent-streams", "2000"], "--initial-max-concurrent-streams"),
            (["--listen"], "needs a value"),
            (["--generate-client-cert", "a.b:c.pem"], "BUNDLEID:CERTPATH:KEYPATH"),
            (["--h2c", "--generate-client-cert", "a.b:c.pem:k.pem"], "needs --generate-tls"),
            (["--h2c", "--client-ca", "/etc/hostname"], "needs TLS"),
            (["--client-ca", "/does/not/exist.pem"], "cannot read"),
        ]
        for (args, fragment) in bad {
            do {
                _ = try MockAPNsCommandLine.parse(args)
                Issue.record("\(args) accepted")
            } catch let error as MockConfigurationError {
                #expect(error.message.contains(fragment), "\(args): \(error.message)")
            } catch {
                Issue.record("\(args): unexpected \(error)")
            }
        }
        #expect(throws: Never.self) { _ = try MockAPNsCommandLine.parse(["--help"]) }
    }

    @Test func configFileThenFlags() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("mock.json").path
        try #"{"listen":"127.0.0.1:1111","h2c":true,"bundleIDs":["a.b"],"faults":[{"status":500,"fraction":0.5}],"control":"off"}"#
            .write(toFile: path, atomically: true, encoding: .utf8)
        guard case .run(let c) = try MockAPNsCommandLine.parse(["--config", path, "--listen", "127.0.0.1:2222", "--bundle-id", "c.d"]) else {
            Issue.record("expected run"); return
        }
        #expect(c.port == 2222 && c.controlPort == nil)
        guard case .cleartextH2 = c.tls else { Issue.record("expected h2c"); return }
        #expect(c.allowedBundleIDs == ["a.b", "c.d"])
        #expect(c.faults.rules == [FaultRule(fraction: 0.5, status: 500)])

        try #"{"listn":"127.0.0.1:1"}"#.write(toFile: path, atomically: true, encoding: .utf8)
        #expect(throws: MockConfigurationError("config \(path): unknown key \"listn\"")) { _ = try MockAPNsCommandLine.parse(["--config", path]) }
    }

    @Test func everyDocumentedConfigKeyLoads() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(at: dir) }
        let p8 = dir.appendingPathComponent("AuthKey.p8").path
        try Fixture.key.privateKeyPEM().write(toFile: p8, atomically: true, encoding: .utf8)
        let path = dir.appendingPathComponent("all.json").path
        let json = """
        {"listen":"127.0.0.1:0","control":"127.0.0.1:0","generateTLS":true,"caOut":"ca.pem","h2c":false,
         "tokenKeys":[{"keyID":"K1","teamID":"T1","path":"\(p8)"}],"bundleIDs":["a.b"],
         "rootSecrets":[{"keyID":"AQIDBA==","secret":"\(String(repeating: "ab", count: 32))"}],"deliveriesLog":"d.jsonl",
         "faults":[{"goAwayAfterErrors":3}],"maxConcurrentStreams":10,"initialMaxConcurrentStreams":2,"production":true,
         "tokenUpdateIntervalSeconds":0,"tlsFault":"expired","threads":2,"readyFile":"r.json","verbose":true,
         "generateClientCert":"a.b:client.pem:client.key","accessories":[]}
        """
        try json.write(toFile: path, atomically: true, encoding: .utf8)
        let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
        #expect(Set(object?.keys.map { $0 } ?? []).union(["tlsCert", "tlsKey", "clientCA"]) == MockAPNsOptions.knownKeys)
        guard case .run(let c) = try MockAPNsCommandLine.parse(["--config", path]) else { Issue.record("expected run"); return }
        #expect(c.tokenKeys.count == 1 && c.rootSecrets.count == 1 && c.tlsFault == .expired && c.loopThreads == 2)
        #expect(c.initialMaxConcurrentStreams == 2 && c.maxConcurrentStreams == 10 && c.tokenUpdateInterval == 0)
        #expect(c.readyFilePath == "r.json" && c.verbose && !c.sandbox && c.faults.rules == [FaultRule(goAwayAfterErrors: 3)])
        #expect(c.generatedClientCertificate == GeneratedClientCertificate(bundleID: "a.b", certificatePath: "client.pem", privateKeyPath: "client.key"))
        // clientCA (the other half of certificate auth) with certificate files:
        let ca = dir.appendingPathComponent("clients.pem").path
        try "x".write(toFile: ca, atomically: true, encoding: .utf8)
        guard case .run(let f) = try MockAPNsCommandLine.parse(["--tls-cert", "c", "--tls-key", "k", "--client-ca", ca]) else { Issue.record("expected run"); return }
        #expect(f.clientCAPath == ca)
    }

    @Test func helpMentionsEveryFlag() {
        for flag in ["--listen", "--control", "--generate-tls", "--ca-out", "--tls-cert", "--tls-key", "--h2c", "--max-concurrent-streams",
                     "--token-key", "--bundle-id", "--token-update-interval", "--production", "--deliveries-log", "--root-secret",
                     "--fault", "--config", "--verbose", "--initial-max-concurrent-streams", "--tls-fault", "--threads", "--ready-file", "--client-ca", "--generate-client-cert", "--help"] {
            #expect(MockAPNsCommandLine.usage.contains(flag), "\(flag)")
        }
    }
}

@Suite struct TLSGenerationTests {
    @Test func generatedChainVerifiesWithOpenSSLAndCoversLoopback() throws {
        let material = try GeneratedTLSMaterial.generate()
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let ca = dir.appendingPathComponent("ca.pem").path, cert = dir.appendingPathComponent("cert.pem").path
        try material.caCertificatePEM.write(toFile: ca, atomically: true, encoding: .utf8)
        try material.serverCertificatePEM.write(toFile: cert, atomically: true, encoding: .utf8)
        for check in [["-verify_ip", "127.0.0.1"], ["-verify_hostname", "localhost"], ["-verify_ip", "::1"]] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            process.arguments = ["verify", "-CAfile", ca, "-purpose", "sslserver"] + check + [cert]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0, "openssl verify \(check)")
        }
        // A wrong IP must not verify (the check above can fail).
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = ["verify", "-CAfile", ca, "-verify_ip", "10.1.2.3", cert]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        #expect(process.terminationStatus != 0)
        #expect(try ECKey(pem: material.serverPrivateKeyPEM).publicKeyPEM().contains("BEGIN PUBLIC KEY"))
    }
}
