import Testing
import Ratchet
import TestSupport

@Suite("Wire codecs")
struct CodecTests {
    @Test("internet message: keyID || LE32 index || sealed box")
    func internetMessage() throws {
        let sealed = [UInt8](repeating: 0xAA, count: 28)
        let message = InternetMessage(keyID: [1, 2, 3, 4], messageIndex: 0x0A0B_0C0D, sealed: sealed)
        let bytes = try message.encoded()
        #expect(Array(bytes.prefix(8)) == [1, 2, 3, 4, 0x0D, 0x0C, 0x0B, 0x0A])
        #expect(Array(bytes.dropFirst(8)) == sealed)
        #expect(try InternetMessage(decoding: bytes) == message)
        for n in [0, 4, 8, 35] {
            #expect(throws: RatchetError.messageTooShort(n)) { try InternetMessage(decoding: Array(bytes.prefix(n))) }
        }
        #expect(throws: RatchetError.invalidKeyIDLength(3)) { try InternetMessage(keyID: [1, 2, 3], messageIndex: 0, sealed: sealed).encoded() }
        #expect(throws: RatchetError.sealedBoxTooShort(27)) {
            try InternetMessage(keyID: [1, 2, 3, 4], messageIndex: 0, sealed: Array(sealed.prefix(27))).encoded()
        }
    }

    @Test("response body: 2-byte big-endian length prefixes, optional fourth field")
    func bodyRoundTrip() throws {
        let plain = NotificationResponseBody(notificationIdentifier: "n1", sourceIdentifier: "com.example", actionIdentifier: "dismiss")
        let bytes = try plain.encoded()
        #expect(bytes == [0, 2] + Array("n1".utf8) + [0, 11] + Array("com.example".utf8) + [0, 7] + Array("dismiss".utf8))
        #expect(try NotificationResponseBody(decoding: bytes) == plain)
        var withText = plain
        withText.userText = "Grüße 👋"
        let textBytes = try withText.encoded()
        #expect("Grüße 👋".utf8.count == 12)
        #expect(textBytes == bytes + [0, 12] + Array("Grüße 👋".utf8))
        #expect(try NotificationResponseBody(decoding: textBytes) == withText)
        withText.userText = ""
        let emptyText = try withText.encoded()
        #expect(emptyText == bytes + [0, 0])
        #expect(try NotificationResponseBody(decoding: emptyText).userText == "")
        let long = NotificationResponseBody(notificationIdentifier: String(repeating: "x", count: 300), sourceIdentifier: "s", actionIdentifier: "a")
        #expect(Array(try long.encoded().prefix(2)) == [0x01, 0x2c])
        #expect(try NotificationResponseBody(decoding: long.encoded()) == long)
    }

    @Test("response body rejects truncated, oversized, trailing, empty and non-UTF-8 input")
    func bodyRejections() throws {
        let good = try NotificationResponseBody(notificationIdentifier: "n", sourceIdentifier: "s", actionIdentifier: "a", userText: "t").encoded()
        #expect(throws: RatchetError.truncatedField("notificationIdentifier")) { try NotificationResponseBody(decoding: []) }
        #expect(throws: RatchetError.truncatedField("notificationIdentifier")) { try NotificationResponseBody(decoding: [0]) }
        #expect(throws: RatchetError.truncatedField("notificationIdentifier")) { try NotificationResponseBody(decoding: [0, 5, 65]) }
        #expect(throws: RatchetError.truncatedField("sourceIdentifier")) { try NotificationResponseBody(decoding: Array(good.prefix(3))) }
        #expect(throws: RatchetError.truncatedField("actionIdentifier")) { try NotificationResponseBody(decoding: Array(good.prefix(7))) }
        #expect(throws: RatchetError.truncatedField("userText")) { try NotificationResponseBody(decoding: Array(good.prefix(10))) }
        #expect(throws: RatchetError.truncatedField("userText")) { try NotificationResponseBody(decoding: Array(good.prefix(11))) }
        #expect(throws: RatchetError.trailingBytes(1)) { try NotificationResponseBody(decoding: good + [0]) }
        #expect(throws: RatchetError.trailingBytes(3)) { try NotificationResponseBody(decoding: good + [0, 1, 65]) }
        #expect(throws: RatchetError.invalidUTF8(field: "sourceIdentifier")) {
            try NotificationResponseBody(decoding: [0, 1, 65, 0, 2, 0xC3, 0x28, 0, 1, 65])
        }
        #expect(throws: RatchetError.invalidUTF8(field: "userText")) {
            try NotificationResponseBody(decoding: [0, 1, 65, 0, 1, 65, 0, 1, 65, 0, 1, 0xFF])
        }
        #expect(throws: RatchetError.emptyField("actionIdentifier")) { try NotificationResponseBody(decoding: [0, 1, 65, 0, 1, 65, 0, 0]) }
        let oversized = [UInt8](repeating: 0, count: NotificationResponseBody.maximumEncodedLength + 1)
        #expect(throws: RatchetError.bodyTooLarge(4097)) { try NotificationResponseBody(decoding: oversized) }
        // Encoding refuses what decoding would refuse.
        #expect(throws: RatchetError.emptyField("notificationIdentifier")) {
            try NotificationResponseBody(notificationIdentifier: "", sourceIdentifier: "s", actionIdentifier: "a").encoded()
        }
        #expect(throws: RatchetError.fieldTooLong(field: "userText", length: 70_000)) {
            try NotificationResponseBody(notificationIdentifier: "n", sourceIdentifier: "s", actionIdentifier: "a",
                                         userText: String(repeating: "y", count: 70_000)).encoded()
        }
        #expect(throws: RatchetError.bodyTooLarge(4101)) {
            try NotificationResponseBody(notificationIdentifier: "n", sourceIdentifier: "s", actionIdentifier: "a",
                                         userText: String(repeating: "y", count: 4090)).encoded()
        }
    }
}

@Suite("Decoders on arbitrary bytes")
struct ArbitraryInputTests {
    @Test("response body: random and mutated inputs either round-trip exactly or throw a RatchetError")
    func bodyNeverHalfParses() throws {
        var rng = SeededGenerator(state: 5869)
        let seed = try NotificationResponseBody(notificationIdentifier: "id-1", sourceIdentifier: "com.example.app",
                                                actionIdentifier: "reply", userText: "ok").encoded()
        var accepted = 0
        for round in 0..<5_000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = (0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            } else {
                bytes = seed
                for _ in 0..<Int.random(in: 1...3, using: &rng) {
                    switch Int.random(in: 0..<3, using: &rng) {
                    case 0: bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                    case 1: if !bytes.isEmpty { bytes.remove(at: Int.random(in: 0..<bytes.count, using: &rng)) }
                    default: bytes.insert(UInt8.random(in: 0...255, using: &rng), at: Int.random(in: 0...bytes.count, using: &rng))
                    }
                    if bytes.isEmpty { break }
                }
            }
            do {
                let body = try NotificationResponseBody(decoding: bytes)
                #expect(try body.encoded() == bytes, "accepted input must be canonical")
                accepted += 1
            } catch is RatchetError {
                // typed rejection: fine
            }
        }
        #expect(accepted > 0, "some mutations keep the body valid")
    }

    @Test("receiving ratchet state: mutated states are either restored consistently or rejected")
    func mutatedStates() throws {
        var receiver = ReceivingRatchet(rootSecret: SecretKey(random: 32))
        for i: UInt32 in [6, 2, 9] { _ = try receiver.messageKey(for: i) }
        let good = receiver.serialized()
        var rng = SeededGenerator(state: 99)
        for _ in 0..<3_000 {
            var bytes = good
            let position = Int.random(in: 0..<bytes.count, using: &rng)
            bytes[position] ^= UInt8.random(in: 1...255, using: &rng)
            do {
                let restored = try ReceivingRatchet(serialized: bytes)
                #expect(restored.serialized() == bytes, "a restored state serialises back to its input")
            } catch is RatchetError {}
        }
    }
}
