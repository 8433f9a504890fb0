import Foundation
import Ratchet
import Testing
@testable import MockAPNs

/// Runs an external program (curl, nghttp, openssl, mock-apns) with a hard time limit.
struct ToolResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

func runTool(_ path: String, _ arguments: [String], timeout: TimeInterval = 20) throws -> ToolResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    let finished = DispatchSemaphore(value: 0)
    process.terminationHandler = { _ in finished.signal() }
    try process.run()
    // Drain both pipes on their own threads (a chatty tool must not block on a full pipe, and a
    // hung one must not block the test past `timeout`).
    let outData = LockedBox(Data()), errData = LockedBox(Data())
    let drained = DispatchGroup()
    for (pipe, box) in [(out, outData), (err, errData)] {
        drained.enter()
        DispatchQueue.global().async {
            box.set(pipe.fileHandleForReading.readDataToEndOfFile())
            drained.leave()
        }
    }
    if finished.wait(timeout: .now() + timeout) == .timedOut {
        process.terminate()
        finished.wait()
    }
    drained.wait()
    return ToolResult(status: process.terminationStatus, stdout: String(decoding: outData.get(), as: UTF8.self),
                      stderr: String(decoding: errData.get(), as: UTF8.self))
}

/// A mock on ephemeral loopback ports with one token key, one bundle ID and one root secret.
final class MockHarness {
    let directory: URL
    let server: MockAPNsServer
    let sender = AccessorySender()
    let caPath: String

    init(configure: (inout MockAPNsConfiguration) -> Void = { _ in }) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        caPath = directory.appendingPathComponent("ca.pem").path
        var c = MockAPNsConfiguration()
        c.tls = .generate(caOutputPath: caPath)
        c.tokenKeys = [MockTokenKey(keyID: Fixture.keyID, teamID: Fixture.teamID, key: Fixture.key)]
        c.allowedBundleIDs = [Fixture.bundleID]
        c.rootSecrets = [sender.mockRootSecret]
        c.deliveriesLogPath = directory.appendingPathComponent("deliveries.jsonl").path
        configure(&c)
        server = try MockAPNsServer(configuration: c)
        try server.start()
    }

    deinit {
        server.stop()
        try? FileManager.default.removeItem(at: directory)
    }

    var url: String { "https://127.0.0.1:\(server.port)" }
    var control: String { "http://127.0.0.1:\(server.controlPort)" }

    /// A token minted now (the mock's clock is the system clock here).
    static func freshToken(ageSeconds: Int64 = 5) -> String {
        Fixture.token(iat: Int64(Date().timeIntervalSince1970) - ageSeconds)
    }

    func file(_ name: String, _ bytes: [UInt8]) throws -> String {
        let path = directory.appendingPathComponent(name).path
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// One curl --http2 request; returns status, lowercased response headers and body.
    /// `clientCertificate`: (certificate PEM path, key PEM path) presented for certificate auth.
    func curl(path: String = "/3/device/" + Fixture.deviceToken, method: String = "POST", headers: [(String, String)],
              body: [UInt8]?, timeout: Int = 10,
              clientCertificate: (String, String)? = nil) throws -> (status: Int, headers: [String: String], body: String, exit: Int32) {
        var args = ["-sS", "--http2", "--cacert", caPath, "-m", "\(timeout)", "-X", method, "-D", "-", "-o",
                    directory.appendingPathComponent("body-\(UUID().uuidString)").path, "-w", "\n%{http_code}"]
        if let (cert, key) = clientCertificate { args += ["--cert", cert, "--key", key] }
        for (name, value) in headers { args += ["-H", "\(name): \(value)"] }
        let bodyPath = try body.map { try file("req-\(UUID().uuidString)", $0) }
        if let bodyPath { args += ["--data-binary", "@" + bodyPath] }
        args.append(url + path)
        let result = try runTool("/usr/bin/curl", args, timeout: TimeInterval(timeout + 10))
        let lines = result.stdout.components(separatedBy: "\r\n").flatMap { $0.components(separatedBy: "\n") }
        var responseHeaders: [String: String] = [:]
        for line in lines {
            if let colon = line.firstIndex(of: ":"), !line.hasPrefix("HTTP/") {
                responseHeaders[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
        }
        let status = Int(lines.last ?? "") ?? 0
        let bodyFile = args[args.firstIndex(of: "-o")! + 1]
        let responseBody = (try? String(contentsOfFile: bodyFile, encoding: .utf8)) ?? ""
        return (status, responseHeaders, responseBody, result.status)
    }

    /// Control port request via curl (HTTP/1.1).
    func controlRequest(_ method: String, _ path: String, body: String? = nil) throws -> (status: Int, json: Any?) {
        var args = ["-sS", "--http1.1", "-m", "10", "-X", method, "-w", "\n%{http_code}"]
        if let body { args += ["--data-binary", body, "-H", "content-type: application/json"] }
        args.append(control + path)
        let result = try runTool("/usr/bin/curl", args)
        var lines = result.stdout.components(separatedBy: "\n")
        let status = Int(lines.removeLast()) ?? 0
        let text = lines.joined(separator: "\n")
        return (status, try? JSONSerialization.jsonObject(with: Data(text.utf8)))
    }

    func accessoryHeaders(token: String? = MockHarness.freshToken(), extra: [(String, String)] = []) -> [(String, String)] {
        Fixture.headers(token: token, extra: extra)
    }
}
