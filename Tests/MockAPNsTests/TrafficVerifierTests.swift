import Foundation
import Ratchet
import Testing
@testable import MockAPNs

/// Builds accessory traffic the way the accessory does: sending ratchet + response body.
struct AccessorySender {
    let rootSecret: [UInt8]
    let keyID: [UInt8]
    let ratchet: SendingRatchet

    init(rootSecret: [UInt8] = (0..<32).map { UInt8($0) &* 7 &+ 3 }, keyID: [UInt8] = [0xde, 0xad, 0xbe, 0xef]) {
        self.rootSecret = rootSecret
        self.keyID = keyID
        ratchet = SendingRatchet(rootSecret: SecretKey(bytes: rootSecret))
    }

    var mockRootSecret: MockRootSecret { MockRootSecret(keyID: keyID, rootSecret: SecretKey(bytes: rootSecret)) }

    func next(action: String = "accept", userText: String? = nil) throws -> AccessoryFields {
        let body = NotificationResponseBody(notificationIdentifier: "n-\(UUID().uuidString.prefix(8))", sourceIdentifier: "com.example.app",
                                            actionIdentifier: action, userText: userText)
        let (index, sealed) = try ratchet.seal(try body.encoded(), persist: { _ in })
        return AccessoryFields(encryptedData: sealed, sessionIdentifier: Fixture.sessionID, keyID: keyID, messageIndex: index)
    }
}

@Suite struct TrafficVerifierTests {
    @Test func decryptsInOrderAndOutOfOrderButNotReplays() throws {
        let sender = AccessorySender()
        let verifier = TrafficVerifier(rootSecrets: [sender.mockRootSecret])
        let messages = try (0..<6).map { try sender.next(action: "a\($0)", userText: $0 == 2 ? "typed" : nil) }
        // 0, then 3, 1, 5, 2, 4: skipped keys are kept and used once.
        for i in [0, 3, 1, 5, 2, 4] {
            let v = verifier.verify(messages[i])
            #expect(v.verified == true, "index \(i): \(v.error ?? "")")
            #expect(v.actionIdentifier == "a\(i)")
            #expect(v.sourceIdentifier == "com.example.app")
            #expect(v.userText == (i == 2 ? "typed" : nil))
        }
        let replay = verifier.verify(messages[3])
        #expect(replay.verified == false)
        #expect(replay.error?.contains("replay") == true)
    }

    @Test func unknownKeyIDIsNotApplicable() throws {
        let sender = AccessorySender()
        let verifier = TrafficVerifier(rootSecrets: [MockRootSecret(keyID: [9, 9, 9, 9], rootSecret: SecretKey(bytes: sender.rootSecret))])
        #expect(verifier.verify(try sender.next()).verified == nil)
    }

    @Test func forgeryFailsWithoutBurningTheIndex() throws {
        let sender = AccessorySender()
        let verifier = TrafficVerifier(rootSecrets: [sender.mockRootSecret])
        let genuine = try sender.next()
        var forged = genuine
        forged.encryptedData[20] ^= 0x01
        let v = verifier.verify(forged)
        #expect(v.verified == false && v.error?.contains("authentication failed") == true)
        #expect(verifier.verify(genuine).verified == true)
        // Wrong root secret: same shape, fails.
        let stranger = AccessorySender(rootSecret: Array(repeating: 1, count: 32))
        #expect(verifier.verify(try stranger.next()).verified == false)
    }

    @Test func beyondTheSkipWindowFails() throws {
        let sender = AccessorySender()
        let verifier = TrafficVerifier(rootSecrets: [sender.mockRootSecret])
        var far = try sender.next()
        far.messageIndex = 50_001
        let v = verifier.verify(far)
        #expect(v.verified == false && v.error?.contains("50,000") == true)
    }

    @Test func decryptedGarbageIsReported() throws {
        let sender = AccessorySender()
        let verifier = TrafficVerifier(rootSecrets: [sender.mockRootSecret])
        let (index, sealed) = try sender.ratchet.seal([0xff, 0xff, 1], persist: { _ in })
        let v = verifier.verify(AccessoryFields(encryptedData: sealed, sessionIdentifier: Fixture.sessionID, keyID: sender.keyID, messageIndex: index))
        #expect(v.verified == false && v.error?.hasPrefix("decrypted, but not a response body") == true)
    }

    @Test func resetStartsOver() throws {
        let sender = AccessorySender()
        let verifier = TrafficVerifier(rootSecrets: [sender.mockRootSecret])
        let first = try sender.next()
        #expect(verifier.verify(first).verified == true)
        #expect(verifier.verify(first).verified == false)
        verifier.reset()
        #expect(verifier.verify(first).verified == true)
    }
}

extension AccessoryFields {
    /// The APNs body a client would send for these fields.
    var jsonBody: [UInt8] {
        Array(#"{"aps":{"encryptedData":"\#(Data(encryptedData).base64EncodedString())","sessionIdentifier":"\#(sessionIdentifier.uuidString.lowercased())","keyID":"\#(Data(keyID).base64EncodedString())","messageIndex":"\#(messageIndex)"}}"#.utf8)
    }
}

@Suite struct DeliveryRecorderTests {
    private func delivery(_ i: Int) -> MockDelivery {
        MockDelivery(push: AcceptedPush(apnsID: "id-\(i)", deviceToken: "00", topic: "t", pushType: "alert", priority: nil,
                                        expiration: nil, collapseID: nil, payload: Array(#"{"aps":{}}"#.utf8), accessory: nil, claims: nil),
                     verification: .notApplicable, receivedAt: Date(timeIntervalSince1970: 0), connectionID: 1, streamID: 1)
    }

    @Test func memoryKeepsAtLeastTheNewestAndCountsDrops() throws {
        let recorder = try DeliveryRecorder(logPath: nil, memoryLimit: 8)
        for i in 0..<100 { recorder.record(delivery(i)) }
        let kept = recorder.deliveries
        #expect(kept.count >= 8 && kept.count <= 10)
        #expect(kept.last?.apnsID == "id-99")
        #expect(kept.map(\.apnsID) == (100 - kept.count..<100).map { "id-\($0)" })
        #expect(recorder.droppedFromMemory == 100 - kept.count)
        recorder.reset()
        #expect(recorder.deliveries.isEmpty && recorder.droppedFromMemory == 0)
    }

    @Test func logFileGetsOneJSONLinePerDelivery() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-log-\(UUID().uuidString).jsonl").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let recorder = try DeliveryRecorder(logPath: path, memoryLimit: 2)
        for i in 0..<5 { recorder.record(delivery(i)) }
        recorder.flush()
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 5)
        let last = try JSONSerialization.jsonObject(with: Data(lines[4].utf8)) as? [String: Any]
        #expect(last?["apnsId"] as? String == "id-4")
        #expect(last?["verified"] is NSNull)
        #expect(last?["receivedAt"] as? String == "1970-01-01T00:00:00.000Z")
        #expect(throws: MockConfigurationError.self) { _ = try DeliveryRecorder(logPath: "/nonexistent-dir/x.jsonl") }
    }
}
