import Foundation
import Testing
@testable import MockAPNs

/// The `mock-apns` executable as users run it: flags, exit codes, ready file, SIGTERM.
@Suite(.serialized) struct ExecutableTests {
    static var binary: String {
        // Tests/MockAPNsTests/<this file> -> package root -> .build/debug/mock-apns
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug/mock-apns").path
    }

    @Test func helpAndUsageErrors() throws {
        let help = try runTool(Self.binary, ["--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("--token-key KEYID:TEAMID:PATH"))
        let bad = try runTool(Self.binary, ["--listen", "nowhere"])
        #expect(bad.status == 64)
        #expect(bad.stderr.contains("--listen"))
        let missingKey = try runTool(Self.binary, ["--token-key", "K:T:/nonexistent/AuthKey.p8"])
        #expect(missingKey.status == 64)
        #expect(missingKey.stderr.contains("/nonexistent/AuthKey.p8"))
    }

    @Test func runsAnswersAndStopsOnSIGTERM() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-exe-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let p8 = dir.appendingPathComponent("AuthKey.p8").path
        try Fixture.key.privateKeyPEM().write(toFile: p8, atomically: true, encoding: .utf8)
        let ready = dir.appendingPathComponent("ready.json").path
        let ca = dir.appendingPathComponent("ca.pem").path
        let log = dir.appendingPathComponent("deliveries.jsonl").path

        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = ["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--generate-tls", "--ca-out", ca,
                             "--token-key", "\(Fixture.keyID):\(Fixture.teamID):\(p8)", "--bundle-id", Fixture.bundleID,
                             "--deliveries-log", log, "--ready-file", ready, "--fault", "status=410,token=0bad"]
        let stderr = Pipe()
        process.standardError = stderr
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        try process.run()
        defer { if process.isRunning { process.terminate() } }

        // Wait (bounded) for the ready file.
        var info: [String: Any]?
        for _ in 0..<100 where info == nil {
            if let data = FileManager.default.contents(atPath: ready) { info = try? JSONSerialization.jsonObject(with: data) as? [String: Any] }
            if info == nil { Thread.sleep(forTimeInterval: 0.05) }
        }
        let port = info?["port"] as? Int ?? 0
        #expect(port > 0)
        #expect(info?["caPath"] as? String == ca)

        var args = ["-sS", "--http2", "--cacert", ca, "-m", "10", "-o", "/dev/null", "-w", "%{http_code}"]
        for (name, value) in Fixture.headers(token: MockHarness.freshToken()) { args += ["-H", "\(name): \(value)"] }
        args += ["--data-binary", String(decoding: Fixture.accessoryBody(), as: UTF8.self)]
        #expect(try runTool("/usr/bin/curl", args + ["https://localhost:\(port)/3/device/abcd"]).stdout == "200")
        #expect(try runTool("/usr/bin/curl", args + ["https://127.0.0.1:\(port)/3/device/0bad"]).stdout == "410")

        process.terminate()  // SIGTERM (SIGINT takes the same path)
        #expect(exited.wait(timeout: .now() + 10) == .success)
        #expect(process.terminationStatus == 0)
        let err = String(decoding: stderr.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(err.contains("SIGTERM, shutting down"))
        let lines = (try String(contentsOfFile: log, encoding: .utf8)).split(separator: "\n")
        #expect(lines.count == 1)
        #expect(lines.first?.contains(#""deviceToken":"abcd""#) == true)
    }
}
