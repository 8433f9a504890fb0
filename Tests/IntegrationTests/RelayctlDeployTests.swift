// Deployment checks: the shipped systemd unit passes `systemd-analyze verify` and stays within
// its `systemd-analyze security` exposure budget (deploy/systemd/verify.sh), alone and with the
// low-port drop-in; and the checker itself rejects a broken unit, so a pass means something.
import Foundation
import RelayCore
import Testing
#if canImport(Glibc)
import Glibc
#endif

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

@Suite("deploy: make install")
struct RelayctlDeployInstallTests {
    @Test func installsEverythingUnderDestdirWithThePrefixInTheUnit() throws {
        let destdir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-install-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: destdir) }
        // BUILT= installs the binaries this test run already built (no swift build from a test).
        let result = try run("/usr/bin/make", ["-s", "install", "DESTDIR=\(destdir.path)", "PREFIX=/usr", "BUILT=\(Relayctl.binDirectory.path)"])
        #expect(result.status == 0, "\(result.output)")
        func mode(_ path: String) throws -> Int {
            try #require(try FileManager.default.attributesOfItem(atPath: destdir.path + path)[.posixPermissions] as? Int)
        }
        #expect(try mode("/usr/bin/relay-server") == 0o755)
        #expect(try mode("/usr/bin/relayctl") == 0o755)
        #expect(try mode("/usr/lib/systemd/system/relay-server.service") == 0o644)
        #expect(try mode("/usr/lib/sysusers.d/accessory-relay.conf") == 0o644)
        #expect(try mode("/var/lib/accessory-relay") == 0o700)
        #expect(try mode("/etc/accessory-relay/relay.example.json") == 0o644)
        #expect(!FileManager.default.fileExists(atPath: destdir.path + "/etc/accessory-relay/relay.json"), "never installs a live config")
        for doc in ["operations.md", "threat_model.md", "examples/alerts.yml", "examples/relay-dashboard.json", "examples/privileged-port.conf.example"] {
            #expect(FileManager.default.fileExists(atPath: destdir.path + "/usr/share/doc/accessory-relay/" + doc), "\(doc)")
        }
        let unit = try String(contentsOfFile: destdir.path + "/usr/lib/systemd/system/relay-server.service", encoding: .utf8)
        #expect(unit.contains("\nExecStart=/usr/bin/relay-server --config /etc/accessory-relay/relay.json\n"))
        #expect(unit.contains("\nDocumentation=file:///usr/share/doc/accessory-relay/operations.md\n"))
        #expect(!unit.contains("/usr/local/"))
        // The installed example parses with the server's loader and keeps its DB where the
        // sandbox allows writes.
        let example = try Data(contentsOf: URL(fileURLWithPath: destdir.path + "/etc/accessory-relay/relay.example.json"))
        let config = try RelayConfig.parse(Array(example), baseDirectory: "/etc/accessory-relay")
        #expect(config.store.path == "/var/lib/accessory-relay/relay.db")
        if systemdAnalyzeAvailable {
            let verify = try run(verifyScript, [destdir.path + "/usr/lib/systemd/system/relay-server.service"])
            #expect(verify.status == 0, "\(verify.output)")
        }
    }

    @Test func refusesWhenTheBinariesAreMissing() throws {
        let destdir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-install-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: destdir) }
        let result = try run("/usr/bin/make", ["-s", "install", "DESTDIR=\(destdir.path)", "BUILT=/nonexistent"])
        #expect(result.status != 0)
        #expect(result.output.contains("not built"))
        #expect(!FileManager.default.fileExists(atPath: destdir.path + "/usr/local/bin/relay-server"))
    }
}

private let canSandbox = getuid() == 0 && ["/usr/bin/strace", "/usr/bin/unshare", "/usr/bin/python3"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }

@Suite("deploy: sandbox trace check", .enabled(if: systemdAnalyzeAvailable, "systemd-analyze not installed"))
struct RelayctlDeploySandboxTests {
    private var checkTrace: String { repoRoot.appendingPathComponent("deploy/systemd/check-trace.sh").path }

    private func traceFile(_ lines: [String]) throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-trace-\(UUID().uuidString)")
        try (lines.joined(separator: "\n") + "\n").write(to: url, atomically: true, encoding: .utf8)
        return url
    }

    @Test func flagsCallsFamiliesAndMappingsTheUnitForbids() throws {
        let bad = try traceFile([
            "100 openat(AT_FDCWD, \"/etc/x\", O_RDONLY) = 3",
            "100 socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE) = 4",
            "101 mmap(NULL, 4096, PROT_READ|PROT_WRITE|PROT_EXEC, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f00",
            "101 ptrace(PTRACE_TRACEME) = -1 EPERM (Operation not permitted)",
            "101 mount(\"none\", \"/mnt\", \"tmpfs\", 0, NULL) = -1 EPERM (Operation not permitted)",
        ])
        defer { try? FileManager.default.removeItem(at: bad) }
        let result = try run(checkTrace, [bad.path])
        #expect(result.status == 1)
        #expect(result.output.contains("ptrace") && result.output.contains("mount"), "\(result.output)")
        #expect(result.output.contains("AF_NETLINK"))
        #expect(result.output.contains("writable+executable"))
        #expect(!result.output.contains("openat ("), "openat is allowed: \(result.output)")
    }

    @Test func acceptsAnOrdinaryServiceTrace() throws {
        let good = try traceFile([
            "100 openat(AT_FDCWD, \"/var/lib/accessory-relay/relay.db\", O_RDWR|O_CREAT|O_CLOEXEC, 0644) = 3",
            "100 socket(AF_INET6, SOCK_STREAM|SOCK_CLOEXEC, IPPROTO_TCP) = 4",
            "100 mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f00",
            "101 epoll_wait(5,  <unfinished ...>",
            "101 <... epoll_wait resumed>[], 1024, 1000) = 0",
            "101 setpriority(PRIO_PROCESS, 0, 5) = 0",
        ])
        defer { try? FileManager.default.removeItem(at: good) }
        let result = try run(checkTrace, [good.path])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("5 distinct system calls, 5 calls"), "\(result.output)")
    }

    @Test(.enabled(if: canSandbox, "needs root, strace, unshare, python3"))
    func sandboxRunRecordsARealSwiftBinary() throws {
        // relayctl is a Swift binary linking Foundation, SQLite and OpenSSL, like relay-server:
        // it must run with no W+X memory and a subset=pid /proc, within the syscall filter.
        let trace = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-trace-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: trace) }
        let sandbox = repoRoot.appendingPathComponent("deploy/systemd/sandbox-run.sh").path
        let ran = try run(sandbox, [trace.path, Relayctl.path, "ratchet", "chain", "--root-key", String(repeating: "11", count: 32), "--count", "3"])
        #expect(ran.status == 0, "\(ran.output)")
        #expect(ran.output.contains("messageKey"))
        let checked = try run(checkTrace, [trace.path])
        #expect(checked.status == 0, "\(checked.output)")
    }
}
