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
        for i in 0..<5 {
            recorder.record(delivery(i))
            // Written when record returns (before the 200 goes out), no flush needed: a mock
            // killed with -9 right after answering still has the line.
            #expect(try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").count == i + 1)
        }
        let lines = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 5)
        let last = try JSONSerialization.jsonObject(with: Data(lines[4].utf8)) as? [String: Any]
        #expect(last?["apnsId"] as? String == "id-4")
        #expect(last?["verified"] is NSNull)
        #expect(last?["receivedAt"] as? String == "1970-01-01T00:00:00.000Z")
        #expect(throws: MockConfigurationError.self) { _ = try DeliveryRecorder(logPath: "/nonexistent-dir/x.jsonl") }
    }
}

@Suite struct DeliveryLogLineTests {
    private func delivery(accessory: Bool, claims: Bool, optionals: Bool, verification: DeliveryVerification,
                          payload: [UInt8], at seconds: Double) -> MockDelivery {
        let fields = AccessoryFields(encryptedData: Array(repeating: 7, count: 60), sessionIdentifier: UUID(),
                                     keyID: [1, 2, 3, 4], messageIndex: 4_294_967_295)
        return MockDelivery(
            push: AcceptedPush(apnsID: lowercaseString(UUID()), deviceToken: String(repeating: "ab", count: 32),
                               topic: "com.example.app.push-type.accessory", pushType: accessory ? "accessory" : "alert",
                               priority: optionals ? 10 : nil, expiration: optionals ? 1_900_000_000 : nil,
                               collapseID: optionals ? "c\"1\\ \u{1}é" : nil, payload: payload,
                               accessory: accessory ? fields : nil,
                               claims: claims ? ProviderTokenClaims(keyID: "KEY1234567", teamID: "TEAM123456", issuedAt: 1_764_500_000) : nil),
            verification: verification, receivedAt: Date(timeIntervalSince1970: seconds), connectionID: 42, streamID: 7)
    }

    /// The hand-encoded line and JSONSerialization's encoding of jsonObject() parse to the same
    /// object, and the keys come out in the same (sorted) order.
    @Test func logLineEqualsTheJSONObjectEncoding() throws {
        var verified = DeliveryVerification(verified: true)
        verified.notificationIdentifier = "n-1"
        verified.sourceIdentifier = "com.example.source"
        verified.actionIdentifier = "reply"
        verified.userText = "line\nbreak \"quoted\" \\ tab\t ünï 😀 \u{7}"
        var verifiedNoText = verified
        verifiedNoText.userText = nil
        verifiedNoText.sourceIdentifier = nil
        let verifications = [DeliveryVerification.notApplicable, verified, verifiedNoText,
                             DeliveryVerification(verified: false, error: "tag mismatch \"x\"")]
        let payloads: [[UInt8]] = [
            Array(#"{"aps":{"encryptedData":"AAEC","sessionIdentifier":"X","keyID":"AQIDBA==","messageIndex":"5"}}"#.utf8),
            Array("{\n  \"aps\" : {\"alert\":\"tab\\there\"}\r\n}".utf8),   // newlines as whitespace: re-encoded
            Array(#"{"aps":{"alert":"ünï \u00e9 \"q\""},"x":[1,2.5,null,true]}"#.utf8),
        ]
        var checked = 0
        for accessory in [false, true] {
            for claims in [false, true] {
                for optionals in [false, true] {
                    for v in verifications {
                        for payload in payloads {
                            let d = delivery(accessory: accessory, claims: claims, optionals: optionals, verification: v,
                                             payload: payload, at: 1_764_500_000.999_9)
                            let line = d.logLine()
                            #expect(line.last == 0x0A)
                            #expect(!line.dropLast().contains(0x0A))   // one line
                            let reference = try JSONSerialization.data(withJSONObject: d.jsonObject(), options: [.sortedKeys])
                            let a = try JSONSerialization.jsonObject(with: Data(line.dropLast())) as? NSDictionary
                            let b = try JSONSerialization.jsonObject(with: reference) as? NSDictionary
                            #expect(a != nil && a == b, "line \(String(decoding: line, as: UTF8.self))")
                            #expect(topLevelKeys(Array(line.dropLast())) == topLevelKeys(Array(reference)))
                            checked += 1
                        }
                    }
                }
            }
        }
        #expect(checked == 96)
    }

    /// The top-level keys of a JSON object, in order, read from the text.
    private func topLevelKeys(_ json: [UInt8]) -> [String] {
        var keys: [String] = []
        var depth = 0, i = 0, inString = false, start = 0
        while i < json.count {
            let c = json[i]
            if inString {
                if c == 0x5C { i += 2; continue }
                if c == 0x22 {
                    inString = false
                    var j = i + 1
                    while j < json.count, json[j] == 0x20 { j += 1 }
                    if depth == 1, j < json.count, json[j] == 0x3A { keys.append(String(decoding: json[start..<i], as: UTF8.self)) }
                }
            } else if c == 0x22 { inString = true; start = i + 1 }
            else if c == 0x7B || c == 0x5B { depth += 1 }
            else if c == 0x7D || c == 0x5D { depth -= 1 }
            i += 1
        }
        return keys
    }

    @Test func receivedAtMatchesISO8601DateFormatter() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        for seconds in [0, 0.001, 0.0004, 0.0006, 0.5, 59.999, 59.9996, 951_782_400.25, 1_764_500_000.999, 1_764_500_000.9999,
                        4_102_444_799.123] {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(iso8601Millis(date) == formatter.string(from: date), "\(seconds)")
        }
    }
}
