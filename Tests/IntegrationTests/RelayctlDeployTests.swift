// Deployment checks: the shipped systemd unit passes `systemd-analyze verify` and stays within
// its `systemd-analyze security` exposure budget (deploy/systemd/verify.sh), alone and with the
// low-port drop-in; and the checker itself rejects a broken unit, so a pass means something.
import Foundation
import Testing

private let repoRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

private let systemdAnalyzeAvailable =
    ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].contains { FileManager.default.isExecutableFile(atPath: $0) }

/// Runs a program to completion, capturing stdout+stderr (bounded by the scripts' own work).
private func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws
    -> (status: Int32, output: String)
{
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.currentDirectoryURL = repoRoot
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    try process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}

private var verifyScript: String { repoRoot.appendingPathComponent("deploy/systemd/verify.sh").path }
private var unitPath: String { repoRoot.appendingPathComponent("deploy/systemd/relay-server.service").path }

@Suite("deploy: systemd unit", .enabled(if: systemdAnalyzeAvailable, "systemd-analyze not installed"))
struct RelayctlDeploySystemdTests {
    @Test func shippedUnitVerifiesAndScoresOK() throws {
        let result = try run(verifyScript, [unitPath])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("verify: ok"))
        #expect(result.output.contains("Overall exposure level for relay-server.service"))
    }

    @Test func lowPortDropInVerifies() throws {
        let dropIn = repoRoot.appendingPathComponent("deploy/systemd/privileged-port.conf.example").path
        let result = try run(verifyScript, [unitPath, dropIn])
        #expect(result.status == 0, "\(result.output)")
    }

    @Test func checkerRejectsAMisspelledDirective() throws {
        let unit = try String(contentsOfFile: unitPath, encoding: .utf8)
        #expect(unit.contains("\nNoNewPrivileges=yes\n"))
        let broken = FileManager.default.temporaryDirectory
            .appendingPathComponent("relayctl-deploy-\(UUID().uuidString)").appendingPathExtension("service")
        defer { try? FileManager.default.removeItem(at: broken) }
        try unit.replacingOccurrences(of: "\nNoNewPrivileges=yes\n", with: "\nNoNewPrivilege=yes\n")
            .write(to: broken, atomically: true, encoding: .utf8)
        let result = try run(verifyScript, [broken.path])
        #expect(result.status == 1)
        #expect(result.output.contains("NoNewPrivilege"))
    }

    @Test func checkerRejectsAWeakenedUnit() throws {
        // Without the sandbox the exposure rises far above the 2.0 budget.
        let unit = try String(contentsOfFile: unitPath, encoding: .utf8)
        let weakened = unit.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !($0.hasPrefix("Protect") || $0.hasPrefix("Private") || $0.hasPrefix("SystemCall")
                || $0.hasPrefix("CapabilityBoundingSet") || $0.hasPrefix("Restrict")) }
            .joined(separator: "\n")
        let path = FileManager.default.temporaryDirectory
            .appendingPathComponent("relayctl-deploy-\(UUID().uuidString)").appendingPathExtension("service")
        defer { try? FileManager.default.removeItem(at: path) }
        try weakened.write(to: path, atomically: true, encoding: .utf8)
        let result = try run(verifyScript, [path.path])
        #expect(result.status == 1)
        #expect(result.output.contains("exposure above"))
    }
}

private let promtoolPath = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first { FileManager.default.isExecutableFile(atPath: $0) }

@Suite("deploy: monitoring examples")
struct RelayctlDeployMonitoringTests {
    @Test(.enabled(if: promtoolPath != nil, "promtool not installed"))
    func alertRulesAreValidAndFireAsDescribed() throws {
        let check = try run(promtoolPath!, ["check", "rules", "deploy/prometheus/alerts.yml"])
        #expect(check.status == 0, "\(check.output)")
        // alerts_test.yml feeds synthetic series and states which alerts must (not) fire.
        let unitTests = try run(promtoolPath!, ["test", "rules", "deploy/prometheus/alerts_test.yml"])
        #expect(unitTests.status == 0, "\(unitTests.output)")
        #expect(unitTests.output.contains("SUCCESS"))
    }

    @Test func everyAlertHasARunbookSection() throws {
        let rules = try String(contentsOf: repoRoot.appendingPathComponent("deploy/prometheus/alerts.yml"), encoding: .utf8)
        let runbook = try String(contentsOf: repoRoot.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        let alerts = rules.split(separator: "\n").compactMap { line -> String? in
            let t = line.trimmingCharacters(in: .whitespaces)
            return t.hasPrefix("- alert: ") ? String(t.dropFirst("- alert: ".count)) : nil
        }
        #expect(alerts.count >= 10)
        for alert in alerts {
            #expect(runbook.contains("\n### \(alert)\n"), "docs/operations.md has no runbook section for \(alert)")
            #expect(rules.contains("docs/operations.md#\(alert.lowercased())"), "\(alert) does not link its runbook")
        }
    }

    @Test func dashboardIsValidJSONWithQueriesOnEveryPanel() throws {
        let data = try Data(contentsOf: repoRoot.appendingPathComponent("deploy/grafana/relay-dashboard.json"))
        let dashboard = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let panels = try #require(dashboard["panels"] as? [[String: Any]])
        #expect(panels.count >= 10)
        var ids = Set<Int>()
        for panel in panels {
            let id = try #require(panel["id"] as? Int)
            #expect(ids.insert(id).inserted, "duplicate panel id \(id)")
            let targets = try #require(panel["targets"] as? [[String: Any]])
            #expect(!targets.isEmpty)
            for target in targets {
                let expr = try #require(target["expr"] as? String)
                #expect(expr.contains("relay_") || expr.contains("probe_success"), "\(expr)")
            }
        }
    }
}
