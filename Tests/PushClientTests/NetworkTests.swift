// PushClient over real sockets on loopback: nghttpd (apt nghttp2-server) as a generic HTTP/2
// server for the happy path and multiplexing, and a silent TCP listener for timeouts.
import Foundation
import Synchronization
import Testing
@testable import PushClient

/// Collects completions from client threads.
final class Results: Sendable {
    private let box = Mutex<[PushResult]>([])
    func add(_ r: PushResult) { box.withLock { $0.append(r) } }
    var all: [PushResult] { box.withLock { $0 } }
    /// Waits (bounded) until `n` results arrived.
    func wait(for n: Int, upTo seconds: Double = 20) -> Bool {
        let end = Date() + seconds
        while Date() < end {
            if box.withLock({ $0.count }) >= n { return true }
            usleep(2000)
        }
        return false
    }
}

func tokenCredentials(_ dir: TempDir) throws -> APNsCredentials {
    let (p8, _) = try makeP8(in: dir)
    return .token(try TokenKey(p8Path: p8, keyID: "ABC123DEFG", teamID: "DEF123GHIJ"))
}

@Suite(.serialized) struct NGHTTPDTests {
    @Test func deliversOverTLSAndReportsUnknownPathAs404() async throws {
        let server = try NGHTTPD(tokens: ["aabbcc"])
        defer { server.stop() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: server.url),
                                                         credentials: try tokenCredentials(dir),
                                                         caFile: server.caFile, connections: 1))
        defer { client.shutdown() }
        let id = UUID()
        let ok = await client.send(PushRequest(deviceToken: "aabbcc", bundleID: "com.example.app", apnsID: id, payload: samplePayload()))
        #expect(ok == .delivered(apnsID: id.uuidString.lowercased(), uniqueID: nil))
        let missing = await client.send(PushRequest(deviceToken: "ddeeff", bundleID: "com.example.app", payload: samplePayload()))
        #expect(missing == .rejected(status: 404, reason: .unknown(""), timestamp: nil))
        #expect(classify(missing) == .terminal(.unknown("")))
    }

    @Test func untrustedServerCertificateIsATransportFailure() async throws {
        let server = try NGHTTPD(tokens: ["aabbcc"])
        defer { server.stop() }
        let dir = try TempDir()
        let other = try makeServerCert(in: dir)   // a CA that did not sign nghttpd's cert
        let client = try PushClient(configuration: .init(environment: .custom(url: server.url),
                                                         credentials: try tokenCredentials(dir), caFile: other.cert))
        defer { client.shutdown() }
        let r = await client.send(PushRequest(deviceToken: "aabbcc", bundleID: "com.example.app", payload: samplePayload()))
        guard case .transportFailure(let m) = r else { Issue.record("expected a TLS failure, got \(r)"); return }
        #expect(m.lowercased().contains("certificate") || m.contains("SSL"), "\(m)")
    }

    @Test(arguments: [1, 4])
    func manyConcurrentPushesAllComplete(connections: Int) throws {
        let server = try NGHTTPD(tokens: ["aabbcc"])
        defer { server.stop() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: server.url),
                                                         credentials: try tokenCredentials(dir),
                                                         caFile: server.caFile, connections: connections))
        defer { client.shutdown() }
        let results = Results()
        let n = 400
        for i in 0..<n {
            client.send(PushRequest(deviceToken: i % 10 == 0 ? "0000" : "aabbcc", bundleID: "com.example.app",
                                    payload: samplePayload(index: UInt32(i))), completion: results.add)
        }
        #expect(results.wait(for: n))
        let all = results.all
        #expect(all.count == n)
        #expect(all.filter { if case .delivered = $0 { true } else { false } }.count == n - n / 10)
        #expect(all.filter { $0 == .rejected(status: 404, reason: .unknown(""), timestamp: nil) }.count == n / 10)
    }

    @Test func cleartextHTTP2WithPriorKnowledge() async throws {
        let server = try NGHTTPD(tokens: ["0123"], tls: false)
        defer { server.stop() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "http://127.0.0.1:\(server.port)"),
                                                         credentials: try tokenCredentials(dir)))
        defer { client.shutdown() }
        let r = await client.send(PushRequest(deviceToken: "0123", bundleID: "com.example.app", payload: samplePayload()))
        guard case .delivered = r else { Issue.record("got \(r)"); return }
    }
}

@Suite struct TimeoutAndLocalTests {
    @Test(arguments: ["https", "http"])
    func silentServerTimesOutInsteadOfHanging(scheme: String) throws {
        let silent = try SilentListener()
        defer { silent.close() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "\(scheme)://127.0.0.1:\(silent.port)"),
                                                         credentials: try tokenCredentials(dir),
                                                         connections: 2, requestTimeout: .milliseconds(300)))
        defer { client.shutdown() }
        let results = Results()
        for _ in 0..<5 {
            client.send(PushRequest(deviceToken: "aa", bundleID: "com.example.app", payload: samplePayload()), completion: results.add)
        }
        // Bounded wait far above the 300 ms budget: a hang fails here instead of blocking the suite.
        #expect(results.wait(for: 5, upTo: 15))
        var timeouts = 0
        for r in results.all {
            // Streams sharing the timed-out stream's never-established connection may instead
            // fail when the connection attempt is abandoned; either way they are reported, never left hanging.
            guard case .transportFailure(let m) = r else { Issue.record("expected timeout, got \(r)"); continue }
            if m.hasPrefix("timeout") { timeouts += 1 }
            #expect(classify(r) == .backOff)
        }
        #expect(timeouts >= 1)
        #expect(silent.acceptedCount >= 1)
    }

    /// connectTimeout covers TCP, TLS and the server's first SETTINGS: a listener that accepts
    /// and never speaks fails the waiting pushes with a message naming the stage, long before
    /// their own 10 s budget.
    @Test(arguments: [("https", "TLS handshake"), ("http", "no SETTINGS from the server")])
    func silentServerFailsTheConnectTimeout(scheme: String, stage: String) async throws {
        let silent = try SilentListener()
        defer { silent.close() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "\(scheme)://127.0.0.1:\(silent.port)"),
                                                         credentials: try tokenCredentials(dir), connections: 1,
                                                         requestTimeout: .seconds(10), connectTimeout: .milliseconds(300)))
        defer { client.shutdown() }
        let r = await client.send(PushRequest(deviceToken: "aa", bundleID: "com.example.app", payload: samplePayload()))
        guard case .transportFailure(let m) = r else { Issue.record("got \(r)"); return }
        #expect(m.hasPrefix("timeout: no HTTP/2 connection") && m.contains(stage), "\(m)")
    }

    @Test func refusedConnectionIsReported() async throws {
        let port = try freePort()
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "https://127.0.0.1:\(port)"),
                                                         credentials: try tokenCredentials(dir)))
        defer { client.shutdown() }
        let r = await client.send(PushRequest(deviceToken: "aa", bundleID: "com.example.app", payload: samplePayload()))
        guard case .transportFailure(let m) = r else { Issue.record("got \(r)"); return }
        #expect(m.contains("connect"), "\(m)")
    }

    @Test func oversizedPayloadIsRefusedWithoutTouchingTheNetwork() async throws {
        let silent = try SilentListener()
        defer { silent.close() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "https://127.0.0.1:\(silent.port)"),
                                                         credentials: try tokenCredentials(dir)))
        defer { client.shutdown() }
        // 3000 bytes of ciphertext = 4000 base64 chars + JSON > 4096.
        let big = PushRequest(deviceToken: "aa", bundleID: "com.example.app", payload: samplePayload(bytes: 3000))
        #expect(big.payload.jsonBody().count > 4096)
        let r = await client.send(big)
        #expect(r == .rejected(status: 413, reason: .payloadTooLarge, timestamp: nil))
        #expect(classify(r) == .terminal(.payloadTooLarge))
        let bad = await client.send(PushRequest(deviceToken: "not-hex", bundleID: "com.example.app", payload: samplePayload()))
        #expect(bad == .rejected(status: 400, reason: .badDeviceToken, timestamp: nil))
        #expect(silent.acceptedCount == 0)
    }

    @Test func shutdownCompletesEverythingInFlight() throws {
        let silent = try SilentListener()
        defer { silent.close() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "http://127.0.0.1:\(silent.port)"),
                                                         credentials: try tokenCredentials(dir),
                                                         requestTimeout: .seconds(60)))
        let results = Results()
        for _ in 0..<20 {
            client.send(PushRequest(deviceToken: "aa", bundleID: "com.example.app", payload: samplePayload()), completion: results.add)
        }
        client.shutdown()
        #expect(results.wait(for: 20, upTo: 30))
        #expect(results.all.allSatisfy { $0 == .transportFailure("shutdown") })
        // After shutdown, sends complete at once.
        client.send(PushRequest(deviceToken: "aa", bundleID: "com.example.app", payload: samplePayload()), completion: results.add)
        #expect(results.all.count == 21)
        client.shutdown()   // idempotent
    }

    @Test func configurationErrorsNameTheField() throws {
        let dir = try TempDir()
        let creds = try tokenCredentials(dir)
        #expect(throws: PushClientError.self) { try PushClient(configuration: .init(environment: .sandbox, credentials: creds, connections: 0)) }
        #expect(throws: PushClientError.self) { try PushClient(configuration: .init(environment: .custom(url: "ftp://x"), credentials: creds)) }
        #expect(throws: PushClientError.self) { try PushClient(configuration: .init(environment: .sandbox, credentials: creds, caFile: dir.file("none.pem"))) }
        #expect(APNsEnvironment.production.baseURL == "https://api.push.apple.com")
        #expect(APNsEnvironment.sandbox.baseURL == "https://api.sandbox.push.apple.com")
        #expect(APNsEnvironment.custom(url: "https://127.0.0.1:2197/").baseURL == "https://127.0.0.1:2197")
    }
}
