// The CI-sized slice of `make reliability` (docs/reliability.md): scripts/reliability.py drives
// the real relay-server, mock-apns and relayctl binaries of this build on loopback, on ports it
// picks, with temp files. Three kill -9 rounds of relay-server under concurrent ingest (one of
// them also kills mock-apns mid-stream), then two rows of the fault matrix. The script books
// every 202 the relay answered and compares the ids with mock-apns' deliveries log; these tests
// assert on its JSON verdict, field by field, so a failure names what was lost or stuck.
import Foundation
import Testing

enum Reliability {
    static let repoRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The directory holding this build's executables (beside the test bundle, or .build/debug).
    static let binDirectory: URL = {
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for candidate in [bundle, bundle.deletingLastPathComponent(), repoRoot.appendingPathComponent(".build/debug")]
        where FileManager.default.isExecutableFile(atPath: candidate.appendingPathComponent("relay-server").path) {
            return candidate
        }
        return repoRoot.appendingPathComponent(".build/debug")
    }()

    /// relay-server answers --help once its executable is more than the placeholder.
    static let relayServerBuilt: Bool = {
        let p = Process()
        p.executableURL = binDirectory.appendingPathComponent("relay-server")
        p.arguments = ["--help"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        do { try p.run() } catch { return false }
        p.waitUntilExit()
        return p.terminationStatus == 0
    }()

    struct RunError: Error, CustomStringConvertible { var description: String }

    /// Runs the harness with a hard time limit; returns its JSON results.
    static func run(_ arguments: [String], limit: Duration) throws -> [String: Any] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("reliability-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let json = dir.appendingPathComponent("results.json")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["python3", repoRoot.appendingPathComponent("scripts/reliability.py").path,
                       "--bin", binDirectory.path, "--work", dir.appendingPathComponent("work").path,
                       "--json-out", json.path, "--quick"] + arguments
        let log = dir.appendingPathComponent("harness.log")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)  // a failure surfaces as FileHandle(forWritingTo:) throwing below
        let handle = try FileHandle(forWritingTo: log)
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        let deadline = ContinuousClock.now + limit
        while p.isRunning && ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.2) }
        if p.isRunning {
            p.interrupt()  // SIGINT: the harness kills its children by pid and exits
            Thread.sleep(forTimeInterval: 3)
            if p.isRunning { kill(p.processIdentifier, SIGKILL) }
            p.waitUntilExit()
            throw RunError(description: "harness ran past \(limit): \(tail(log))")
        }
        p.waitUntilExit()
        try? handle.close()
        guard let data = try? Data(contentsOf: json),
              var object = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw RunError(description: "no results (exit \(p.terminationStatus)): \(tail(log))")
        }
        if object["pass"] as? Bool != true { object["harnessLogTail"] = tail(log) }  // shown by a failed expectation
        return object
    }

    static func tail(_ url: URL) -> String {
        let text = (try? String(contentsOf: url, encoding: .utf8)) ?? ""
        return String(text.suffix(3000))
    }
}

@Suite(.serialized, .enabled(if: Reliability.relayServerBuilt, "relay-server is not built yet"))
struct ReliabilityTests {
    @Test func killNineRoundsLoseNothingAcknowledged() throws {
        let results = try Reliability.run(["--sections", "crash", "--rounds", "3", "--threads", "6"], limit: .seconds(150))
        let crash = try #require(results["crash"] as? [String: Any], "no crash section: \(results)")
        #expect(crash["rounds"] as? Int == 3)
        #expect(crash["mockKills"] as? Int == 1)
        let acked = crash["acked"] as? Int ?? 0
        #expect(acked > 100, "too little load to prove anything: \(acked) acknowledged")
        #expect(crash["lost"] as? Int == 0, "acknowledged but never delivered: \(crash["lostIds"] ?? [])")
        #expect(crash["drained"] as? Bool == true, "outbox not drained: \(crash["finalStates"] ?? "")")
        let states = crash["finalStates"] as? [String: Int] ?? [:]
        #expect(states["queued"] == 0 && states["inflight"] == 0 && states["retry"] == 0, "stuck rows: \(states)")
        #expect(states["failed"] == 0, "failed rows without any APNs fault: \(states)")
        let extra = crash["extraDeliveries"] as? Int ?? .max
        let bound = crash["duplicateBound"] as? Int ?? 0
        #expect(extra <= bound, "\(extra) duplicate deliveries exceed what was inflight at the kills (\(bound))")
        // Delivery events (docs/events.md): after every kill and at the end, each terminal
        // response has exactly its one event and no other response has any.
        #expect(crash["eventMismatches"] as? Int == 0, "events disagree with their responses: \(crash["roundLog"] ?? "")")
        #expect(crash["deliveredEvents"] as? Int == states["delivered"], "one response.delivered event per delivered response")
    }

    @Test func faultRowsRecoverWithoutLoss() throws {
        let results = try Reliability.run(["--sections", "faults", "--rows", "5xx,goaway", "--rate", "150", "--threads", "4"],
                                          limit: .seconds(150))
        let rows = try #require(results["faults"] as? [[String: Any]], "no fault rows: \(results)")
        #expect(rows.map { $0["row"] as? String } == ["5xx", "goaway"])
        for row in rows {
            let name = row["row"] as? String ?? "?"
            #expect((row["acked"] as? Int ?? 0) > 50, "\(name): too little load")
            #expect(row["lost"] as? Int == 0, "\(name): lost \(row["lost"] ?? "?")")
            #expect(row["recovered"] as? Bool == true, "\(name): did not recover: \(row)")
        }
        let fiveXX = try #require(rows.first)
        #expect((fiveXX["retries"] as? Int ?? 0) > 0, "a 500 burst must show up as retries in /metrics: \(fiveXX)")
    }
}
