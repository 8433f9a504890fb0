// `--version` of every binary and relay_build_info on a running relay's /metrics: the same
// version (BuildInfo.version) and the same commit everywhere, in the documented shapes
// (docs/operations.md, "Versions").
import BuildInfo
import Foundation
import Testing

/// `<program> <x.y.z> (commit <12 hex>[-dirty] | unknown)`, one line.
private func versionPattern(_ program: String) -> Regex<AnyRegexOutput> {
    try! Regex("^\(program) [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit ([0-9a-f]{12}(-dirty)?|unknown)\\)\n$")
}

@Suite("--version and relay_build_info")
struct VersionTests {
    @Test(arguments: ["relay-server", "relayctl", "mock-apns"])
    func versionOutputShape(_ program: String) throws {
        let r = try Relayctl.run(["--version"], executable: relayBinary(program))
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stderr.isEmpty)
        #expect(r.stdout.wholeMatch(of: versionPattern(program)) != nil, "\(program) --version printed \(r.stdout)")
        #expect(r.stdout == BuildInfo.versionLine(program) + "\n", "built from another BuildInfo than the tests")
    }

    @Test func relayctlVersionJSON() throws {
        let r = try Relayctl.run(["--version", "--json"])
        #expect(r.status == 0)
        let json = try #require(try Relayctl.json(r) as? [String: Any])
        #expect(Set(json.keys) == ["program", "version", "commit"])
        #expect(json["program"] as? String == "relayctl")
        #expect(json["version"] as? String == BuildInfo.version)
        #expect(json["commit"] as? String == BuildInfo.commit)
        #expect(try Relayctl.run(["--version", "--verbose"]).status == 64)
    }

    @Test func relayServerExposesBuildInfoAndLogsItsVersion() throws {
        let h = try RelayHarness()
        try h.startRelay()
        let metrics = try relayHTTP(h.adminPort, "GET", "/metrics").text
        #expect(metrics.contains("# TYPE relay_build_info gauge\n"))
        let sample = "relay_build_info{version=\"\(BuildInfo.version)\",commit=\"\(BuildInfo.commit)\"} 1\n"
        #expect(metrics.contains(sample), "\(metrics.split(separator: "\n").filter { $0.contains("build_info") })")
        let start = h.relay?.stderr.split(separator: "\n").first { $0.contains("relay-server starting") } ?? ""
        #expect(start.contains("\"version\":\"\(BuildInfo.version)\"") && start.contains("\"commit\":\"\(BuildInfo.commit)\""), "\(start)")
    }
}
