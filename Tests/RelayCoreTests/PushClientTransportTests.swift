import Foundation
import MockAPNs
import PushClient
import Synchronization
import Testing
@testable import RelayCore

@Suite struct PushClientTransportTests {
    /// Which transport failures pause the app as "credential_file" (texts as PushClient and
    /// OpenSSL 3 give them): our key could not sign, or APNs refused our client certificate.
    @Test func credentialTransportFailuresPauseOthersDoNot() {
        let paused = [
            "cannot sign provider token: OpenSSL: EVP_DigestSign failed",
            "TLS handshake with api.push.apple.com failed: SSL error:0A00045C:SSL routines::tlsv13 alert certificate required",
            "TLS handshake with 127.0.0.1 failed: SSL error:0A000415:SSL routines::sslv3 alert certificate expired",
            "TLS handshake with 127.0.0.1 failed: SSL error:0A000418:SSL routines::tlsv1 alert unknown ca",
        ]
        let transient = [
            "TLS handshake with 127.0.0.1 failed: SSL error:0A000086:SSL routines::certificate verify failed",
            "TLS handshake with 127.0.0.1 failed: SSL connection closed during handshake (Connection reset by peer)",
            "connect 127.0.0.1:2197: Connection refused", "timeout: no response within requestTimeout (stream 1)", "shutdown",
        ]
        for what in paused {
            let a = PushClientTransport.answer(.transportFailure(what), credentialFiles: "/etc/relay/push.pem")
            #expect(PauseRule.reason(status: a.status, reason: a.reason) == "credential_file", "\(what)")
            #expect(a.reason?.contains("/etc/relay/push.pem") == true)
        }
        for what in transient {
            let a = PushClientTransport.answer(.transportFailure(what), credentialFiles: "/etc/relay/push.pem")
            #expect(PauseRule.reason(status: a.status, reason: a.reason) == nil, "\(what)")
            #expect(a.reason == what)
        }
    }

    /// Two apps of one team configured with the same .p8 sign with one JWT (PushClientTransport
    /// .make hands both clients the registry's provider); the mock verifies every token. With
    /// a registry per app (the behaviour before) it was two.
    @Test func twoAppsOfOneTeamShareOneProviderToken() throws {
        let rig = try TransportRig(checkTokens: true)
        let apps = ["com.example.app", "com.example.other"]
        var mock = MockAPNsConfiguration()
        mock.tls = .cleartextH2
        mock.controlPort = nil
        mock.allowedBundleIDs = apps
        mock.tokenKeys = [try MockTokenKey(keyID: "ABC123DEFG", teamID: "DEF123GHIJ", pemPath: rig.dir.path + "/AuthKey.p8")]
        let server = try MockAPNsServer(configuration: mock)
        try server.start()
        defer { server.stop() }
        let appsJSON = apps.map { #"{"bundleID":"\#($0)","environment":"custom","url":"http://127.0.0.1:\#(server.port)","token":{"p8Path":"AuthKey.p8","keyID":"ABC123DEFG","teamID":"DEF123GHIJ"}}"# }
        let config = try RelayConfig.parse(Array(#"{"apps":[\#(appsJSON.joined(separator: ","))]}"#.utf8), baseDirectory: rig.dir.path)
        let registry = TokenRegistry()
        let transports = try config.apps.map { try PushClientTransport.make(app: $0, config: config, tokens: registry) }
        defer { for t in transports { t.shutdown() } }
        for (i, t) in transports.enumerated() {
            var row = transportRow(id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5\(i)", session: "6F9619FF-8B86-D011-B42D-00C04FC964FF")
            row.app = apps[i]
            let box = Mutex<PushAnswer?>(nil)
            let done = DispatchSemaphore(value: 0)
            t.send(row) { a in box.withLock { $0 = a }; done.signal() }
            _ = done.wait(timeout: .now() + 10)
            #expect(box.withLock { $0 } == PushAnswer(status: 200, reason: nil, classification: .done))
        }
        #expect(registry.mintedByTeam() == ["DEF123GHIJ": 1])
        #expect(Set(server.deliveries.compactMap { $0.push.claims?.issuedAt }).count == 1)
        #expect(Set(server.deliveries.map(\.push.topic)).count == 2)
    }

    @Test func answersMapStatusReasonTimestampAndClassification() {
        let ok = PushClientTransport.answer(.delivered(apnsID: "x", uniqueID: nil))
        #expect(ok == PushAnswer(status: 200, reason: nil, classification: .done))
        let gone = PushClientTransport.answer(.rejected(status: 410, reason: APNsReason(rawValue: "Unregistered"), timestamp: Date(timeIntervalSince1970: 1_700_000_000.123)))
        #expect(gone.status == 410 && gone.reason == "Unregistered" && gone.apnsTimestamp == 1_700_000_000_123)
        #expect(gone.classification == .terminal("Unregistered"))
        let busy = PushClientTransport.answer(.rejected(status: 429, reason: APNsReason(rawValue: "TooManyRequests"), timestamp: nil))
        #expect(busy.classification == .retryAfterDelay && busy.reason == "TooManyRequests")
        let expired = PushClientTransport.answer(.rejected(status: 403, reason: APNsReason(rawValue: "ExpiredProviderToken"), timestamp: nil))
        #expect(expired.classification == .refreshTokenAndReconnect)
        let down = PushClientTransport.answer(.rejected(status: 503, reason: APNsReason(rawValue: "ServiceUnavailable"), timestamp: nil))
        #expect(down.classification == .backOff)
        let reset = PushClientTransport.answer(.transportFailure("connection reset"))
        #expect(reset.status == nil && reset.reason == "connection reset" && reset.classification == .backOff)
    }

    /// A row's id and session identifier go to PushClient as text: a row whose text is not a
    /// UUID is answered terminal corrupt_row at once and nothing reaches APNs; the others go out.
    @Test func corruptRowsAreTerminalAndSendNothing() throws {
        let rig = try TransportRig()
        let session = "6F9619FF-8B86-D011-B42D-00C04FC964FF", id = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
        let corrupt = PushAnswer(status: nil, reason: "corrupt_row", classification: .terminal("corrupt_row"))
        for (badID, badSession) in [("not-a-uuid", session), ("", session), ("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5g", session),
                                    (id, "6F9619FF8B86D011B42D00C04FC964FF"), (id, "{6F9619FF-8B86-D011-B42D-00C04FC964F}"),
                                    (id, ""), ("x", "y")] {
            #expect(try rig.send(transportRow(id: badID, session: badSession)) == corrupt, "\(badID) \(badSession)")
        }
        #expect(try rig.send(transportRow(id: id, session: session)) == PushAnswer(status: 200, reason: nil, classification: .done))
        #expect(rig.mock.deliveries.map(\.apnsID) == [id])
    }

    /// The row's text, in whatever case it was stored, puts the bytes on the wire that the UUID
    /// path (UUIDs parsed from the same text) would: apns-id lowercase, the body byte for byte.
    @Test func rowTextReachesTheWireAsTheUUIDPathWouldSendIt() throws {
        let rig = try TransportRig()
        let rows = [transportRow(id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", session: "6F9619FF-8B86-D011-B42D-00C04FC964FF", index: 1),
                    transportRow(id: "0193A1B2-c3d4-7E5F-8a9B-0C1D2E3F4A5C", session: "6f9619ff-8B86-d011-B42D-00c04fc964ff", index: 2)]
        for row in rows {
            #expect(try rig.send(row) == PushAnswer(status: 200, reason: nil, classification: .done))
        }
        let deliveries = rig.mock.deliveries
        #expect(deliveries.count == rows.count)
        for row in rows {
            let viaUUID = AccessoryPayload(encryptedData: row.encryptedData, sessionIdentifier: UUID(uuidString: row.sessionIdentifier)!,
                                           keyID: row.keyID, messageIndex: row.messageIndex)
            let d = try #require(deliveries.first { $0.apnsID == row.id.lowercased() }, "\(row.id)")
            #expect(d.push.payload == viaUUID.jsonBody())
            #expect(d.push.expiration == row.expiresAt / 1000)
        }
    }
}

func transportRow(id: String, session: String, index: UInt32 = 3) -> OutboxRow {
    OutboxRow(id: id, app: "com.example.app", pushToken: "a1b2c3d4e5f6", sessionIdentifier: session, keyID: [1, 2, 3, 4],
              messageIndex: index, encryptedData: [UInt8](repeating: 0x5a, count: 41), credentialID: "c", state: .inflight,
              attempts: 0, nextAttemptAt: 0, createdAt: 0, expiresAt: 1_900_000_000_123, lastStatus: nil, lastReason: nil, updatedAt: 0)
}

struct RigError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// A PushClientTransport over a real PushClient to an in-process mock-apns on loopback
/// (cleartext HTTP/2; token auth off in the mock, so a throwaway key will do).
final class TransportRig {
    let dir = TempDir()
    let mock: MockAPNsServer
    let transport: PushClientTransport
    let client: PushClient

    /// `checkTokens`: the mock verifies the provider tokens (and can then call them expired).
    init(faults: [MockAPNs.FaultRule] = [], checkTokens: Bool = false, configure: (inout PushClientConfiguration) -> Void = { _ in }) throws {
        let p8 = dir.path + "/AuthKey.p8"
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        openssl.arguments = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", p8]
        try openssl.run()
        openssl.waitUntilExit()
        guard openssl.terminationStatus == 0 else { throw RigError(message: "openssl genpkey exited \(openssl.terminationStatus)") }
        var c = MockAPNsConfiguration()
        c.tls = .cleartextH2
        c.controlPort = nil
        c.allowedBundleIDs = ["com.example.app"]
        c.faults = MockAPNs.FaultPlan(rules: faults)
        if checkTokens { c.tokenKeys = [try MockTokenKey(keyID: "ABC123DEFG", teamID: "DEF123GHIJ", pemPath: p8)] }
        mock = try MockAPNsServer(configuration: c)
        try mock.start()
        let key = try TokenKey(p8Path: p8, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        var configuration = PushClientConfiguration(environment: .custom(url: "http://127.0.0.1:\(mock.port)"), credentials: .token(key))
        configure(&configuration)
        client = try PushClient(configuration: configuration)
        transport = PushClientTransport(client: client, bundleID: "com.example.app")
    }

    /// Sends one row and waits (at most 10 s) for its answer.
    func send(_ row: OutboxRow) throws -> PushAnswer {
        let box = Mutex<PushAnswer?>(nil)
        let done = DispatchSemaphore(value: 0)
        transport.send(row) { answer in
            box.withLock { $0 = answer }
            done.signal()
        }
        _ = done.wait(timeout: .now() + 10)
        return try #require(box.withLock { $0 })
    }

    deinit {
        transport.shutdown()
        mock.stop()
    }
}
