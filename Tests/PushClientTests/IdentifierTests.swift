// APNsID and SessionIdentifier: a push built from the ids as text puts the same bytes on the
// wire as one built from UUIDs, whatever the text's case; anything that is not an 8-4-4-4-12 hex
// UUID is refused with a message naming the field and the first bad byte.
import Foundation
import MockAPNs
import Testing
import TestSupport
@testable import PushClient

@Suite struct IdentifierTests {
    /// The header block and body of a request, as they go into the HTTP/2 stream.
    static func wire(_ r: PushRequest) -> (fields: [String], body: [UInt8]) {
        (ConnectionSlot.head(r, authorization: "bearer x.y.z").fields.map { "\($0.name): \($0.value)" }, r.payload.jsonBody())
    }

    static func request(id: APNsID, session: SessionIdentifier) -> PushRequest {
        PushRequest(deviceToken: "a1b2", bundleID: "com.example.app", apnsID: id,
                    payload: AccessoryPayload(encryptedData: [1, 2, 3, 4, 5], sessionIdentifier: session, keyID: [9, 8, 7, 6], messageIndex: 77),
                    expiration: 1_800_000_000)
    }

    /// `s` with each hex letter's case flipped at random.
    static func mixCase(_ s: String, _ rng: inout SeededGenerator) -> String {
        String(s.map { c in c.isLetter && Bool.random(using: &rng) ? Character(c.isUppercase ? c.lowercased() : c.uppercased()) : c })
    }

    /// Frozen bytes, written out by hand: both paths must produce exactly these.
    @Test func frozenWireBytesFromTextAndFromUUID() throws {
        let expectedFields = ["apns-push-type: accessory", "apns-topic: com.example.app.push-type.accessory",
                              "apns-id: a0b1c2d3-e4f5-4677-8899-aabbccddeeff", "apns-expiration: 1800000000",
                              "apns-priority: 10", "authorization: bearer x.y.z", "content-type: application/json"]
        let expectedBody = #"{"aps":{"encryptedData":"AQIDBAU=","sessionIdentifier":"E621E1F8-C36C-495A-93FC-0C247A3E6E5F","keyID":"CQgHBg==","messageIndex":"77"}}"#
        let fromUUID = Self.request(id: APNsID(UUID(uuidString: "A0B1C2D3-E4F5-4677-8899-AABBCCDDEEFF")!),
                                    session: SessionIdentifier(UUID(uuidString: "e621e1f8-c36c-495a-93fc-0c247a3e6e5f")!))
        let fromMixedText = Self.request(id: try APNsID("A0b1C2d3-E4f5-4677-8899-aAbBcCdDeEfF"),
                                         session: try SessionIdentifier("e621E1f8-c36C-495a-93Fc-0c247A3e6E5f"))
        for r in [fromUUID, fromMixedText] {
            let (fields, body) = Self.wire(r)
            #expect(fields == expectedFields)
            #expect(String(decoding: body, as: UTF8.self) == expectedBody)
            #expect(r.apnsIDString == "a0b1c2d3-e4f5-4677-8899-aabbccddeeff")
        }
        #expect(fromUUID.payload == fromMixedText.payload)
    }

    /// Random UUIDs in lowercase, uppercase and mixed-case text: the same header block and body as
    /// the UUID path, and the same text as Foundation's own formatter.
    @Test func textPathMatchesUUIDPathByteForByte() throws {
        var rng = SeededGenerator(seed: 0x5EED_1D5)
        for _ in 0..<2000 {
            var bytes = [UInt8](repeating: 0, count: 16)
            for i in 0..<16 { bytes[i] = UInt8.random(in: 0...255, using: &rng) }
            let id = bytes.withUnsafeBytes { UUID(uuid: $0.load(as: uuid_t.self)) }
            for i in 0..<16 { bytes[i] = UInt8.random(in: 0...255, using: &rng) }
            let session = bytes.withUnsafeBytes { UUID(uuid: $0.load(as: uuid_t.self)) }
            let viaUUID = Self.wire(Self.request(id: APNsID(id), session: SessionIdentifier(session)))
            #expect(APNsID(id).text == id.uuidString.lowercased())
            #expect(SessionIdentifier(session).text == session.uuidString)
            for (idText, sessionText) in [(id.uuidString.lowercased(), session.uuidString),
                                          (id.uuidString, session.uuidString.lowercased()),
                                          (Self.mixCase(id.uuidString, &rng), Self.mixCase(session.uuidString, &rng))] {
                let viaText = Self.wire(Self.request(id: try APNsID(idText), session: try SessionIdentifier(sessionText)))
                #expect(viaText.fields == viaUUID.fields, "\(idText)")
                #expect(viaText.body == viaUUID.body, "\(sessionText)")
            }
        }
    }

    /// Text already in the wanted case is kept as it is (the relay's rows are), not copied.
    @Test func canonicalTextIsKeptWithoutACopy() throws {
        let lower = UUID().uuidString.lowercased(), upper = UUID().uuidString
        func address(_ s: String) -> UnsafeRawPointer? { s.utf8.withContiguousStorageIfAvailable { UnsafeRawPointer($0.baseAddress) } ?? nil }
        #expect(address(try APNsID(lower).text) == address(lower))
        #expect(address(try SessionIdentifier(upper).text) == address(upper))
        #expect(try APNsID(upper).text == upper.lowercased())
        #expect(try SessionIdentifier(lower).text == lower.uppercased())
    }

    @Test func invalidTextIsRefusedNamingFieldAndByte() {
        let cases: [(String, String)] = [
            ("", "apns-id must be a UUID, 36 characters 8-4-4-4-12 hex; got 0 bytes"),
            ("a0b1c2d3-e4f5-4677-8899-aabbccddeef", "apns-id must be a UUID, 36 characters 8-4-4-4-12 hex; got 35 bytes"),
            ("a0b1c2d3-e4f5-4677-8899-aabbccddeeff0", "apns-id must be a UUID, 36 characters 8-4-4-4-12 hex; got 37 bytes"),
            ("{0b1c2d3-e4f5-4677-8899-aabbccddeef}", "apns-id must be a UUID, 8-4-4-4-12 hex; byte 1 is '{', not a hex digit"),
            ("a0b1c2d3e4f5-4677-8899-aabbccddeeff", "apns-id must be a UUID, 36 characters 8-4-4-4-12 hex; got 35 bytes"),
            ("a0b1c2d3xe4f5-4677-8899-aabbccddeeff", "apns-id must be a UUID, 8-4-4-4-12 hex; byte 9 is 'x', not '-'"),
            ("a0b1c2d3-e4f5-4677-8899-aabbccddeefg", "apns-id must be a UUID, 8-4-4-4-12 hex; byte 36 is 'g', not a hex digit"),
            ("a0b1c2d3-e4f5-4677-8899-aabbccdd eff", "apns-id must be a UUID, 8-4-4-4-12 hex; byte 33 is 0x20, not a hex digit"),
            ("a0b1c2d3-e4f5-4677-8899-aabbccddee\u{0}f", "apns-id must be a UUID, 8-4-4-4-12 hex; byte 35 is 0x00, not a hex digit"),
            ("a0b1c2d3-e4f5-4677-8899-aabbccddeeé", "apns-id must be a UUID, 8-4-4-4-12 hex; byte 35 is 0xC3, not a hex digit"),
        ]
        for (text, message) in cases {
            #expect(throws: PushClientError.invalidIdentifier(message), "\(text)") { try APNsID(text) }
            let forSession = message.replacingOccurrences(of: "apns-id", with: "sessionIdentifier")
            #expect(throws: PushClientError.invalidIdentifier(forSession), "\(text)") { try SessionIdentifier(text) }
        }
        #expect(PushClientError.invalidIdentifier("m").description == "m")
    }

    /// The rule written the slow, obvious way: five groups of 8, 4, 4, 4 and 12 hex digits.
    /// (Foundation's `UUID(uuidString:)` is no oracle here: it scans with sscanf and takes a
    /// leading space, or a '-' where a digit belongs.)
    static func reference(_ s: String, uppercase: Bool) -> String? {
        let groups = s.split(separator: "-", omittingEmptySubsequences: false)
        let hex = Set("0123456789abcdefABCDEF".utf8)
        guard groups.map(\.utf8.count) == [8, 4, 4, 4, 12], groups.allSatisfy({ $0.utf8.allSatisfy(hex.contains) }) else { return nil }
        return uppercase ? s.uppercased() : s.lowercased()
    }

    /// Every byte value at every position of a valid UUID, and seeded random near-UUIDs: accepted
    /// exactly when the reference accepts, as its text in the wanted case, which is also what
    /// Foundation formats from the parsed UUID; refused with the first bad byte named.
    @Test func acceptsExactlyEightFourFourFourTwelveHex() {
        let valid = Array("a0b1c2d3-E4F5-4677-8899-aabbccddeeff".utf8)
        var accepted = 0
        func check(_ bytes: [UInt8]) {
            let text = String(decoding: bytes, as: UTF8.self)
            let lower = Self.reference(text, uppercase: false), upper = Self.reference(text, uppercase: true)
            #expect((try? APNsID(text))?.text == lower, "\(bytes)")
            #expect((try? SessionIdentifier(text))?.text == upper, "\(bytes)")
            if let upper {
                accepted += 1
                #expect(UUID(uuidString: text)?.uuidString == upper, "\(bytes)")
            } else {
                // The refusal names the length or a byte: the slow pass that describes it agrees
                // with the fast pass that refused it.
                do { _ = try APNsID(text) } catch {
                    #expect(error.description.contains(" bytes") || error.description.contains("; byte "), "\(bytes) \(error)")
                }
            }
        }
        for i in 0..<36 {
            for b in UInt8.min...UInt8.max {
                var bytes = valid
                bytes[i] = b
                check(bytes)
            }
        }
        var rng = SeededGenerator(seed: 42)
        let alphabet = Array("0123456789abcdefABCDEF-gG {}".utf8)
        for _ in 0..<5000 {
            let n = [35, 36, 36, 36, 37].randomElement(using: &rng)!
            var bytes: [UInt8] = valid
            if n == 35 { bytes.removeLast() } else if n == 37 { bytes.append(UInt8(ascii: "0")) }
            for _ in 0..<Int.random(in: 0...2, using: &rng) {
                bytes[Int.random(in: 0..<n, using: &rng)] = alphabet.randomElement(using: &rng)!
            }
            check(bytes)
        }
        // Valid texts were among the inputs (every hex digit at every digit position at least).
        #expect(accepted > 32 * 22)
    }

    /// Through a real connection: pushes built from mixed-case text reach mock-apns with the
    /// lowercase apns-id and the same body bytes as the UUID path.
    @Test func textBuiltPushesOnTheWire() async throws {
        let rig = try MockRig(cleartext: true)
        let client = try rig.client()
        defer { client.shutdown() }
        var rng = SeededGenerator(seed: 7)
        var expected: [String: [UInt8]] = [:]
        for index in 0..<5 {
            let id = UUID(), session = UUID()
            let viaUUID = PushRequest(deviceToken: "a1b2c3d4", bundleID: bundle, apnsID: id,
                                      payload: AccessoryPayload(encryptedData: [UInt8](repeating: UInt8(index), count: 40),
                                                                sessionIdentifier: session, keyID: [1, 2, 3, 4], messageIndex: UInt32(index)))
            let viaText = PushRequest(deviceToken: "a1b2c3d4", bundleID: bundle, apnsID: try APNsID(Self.mixCase(id.uuidString, &rng)),
                                      payload: AccessoryPayload(encryptedData: [UInt8](repeating: UInt8(index), count: 40),
                                                                sessionIdentifier: try SessionIdentifier(Self.mixCase(session.uuidString, &rng)),
                                                                keyID: [1, 2, 3, 4], messageIndex: UInt32(index)))
            let result = await client.send(viaText)
            guard case .delivered(let echoed, _) = result else {
                Issue.record("not delivered: \(result)")
                continue
            }
            #expect(echoed == id.uuidString.lowercased())
            expected[id.uuidString.lowercased()] = viaUUID.payload.jsonBody()
        }
        let deliveries = rig.mock.deliveries
        #expect(deliveries.count == 5)
        for d in deliveries {
            #expect(expected[d.apnsID] == d.push.payload, "\(d.apnsID)")
        }
    }
}
