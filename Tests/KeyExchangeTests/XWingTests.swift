import Foundation
import Testing
import Ratchet
@testable import KeyExchange

@Suite("X-Wing (draft-connolly-cfrg-xwing-kem)")
struct XWingTests {
    @Test("the draft's vectors (and swift-crypto's copy): seed -> pk, eseed -> ct and ss, decapsulation",
          .enabled(if: KexVectors.exists("xwing-test-vectors.json"), KexVectors.skipMessage("xwing-test-vectors.json")),
          arguments: ["xwing-test-vectors.json", "swift-crypto-xwing-test-vectors.json"])
    func vectors(file: String) throws {
        guard KexVectors.exists(file) else { return }
        let cases = try KexVectors.objects(file)
        #expect(cases.count == 3)
        for (n, c) in cases.enumerated() {
            let key = try XWing.PrivateKey(seed: try hexField(c, "seed"))
            #expect(key.seed.exportedBytes == (try hexField(c, "sk")), "\(file) \(n) sk")
            #expect(key.publicKey == (try hexField(c, "pk")), "\(file) \(n) pk")
            let (ss, ct) = try XWing.encapsulate(publicKey: key.publicKey, encapsulationSeed: try hexField(c, "eseed"))
            #expect(ct == (try hexField(c, "ct")), "\(file) \(n) ct")
            #expect(ss.exportedBytes == (try hexField(c, "ss")), "\(file) \(n) ss")
            #expect(try XWing.decapsulate(privateKey: key, ciphertext: ct) == ss, "\(file) \(n) decapsulation")
        }
    }

    @Test("the label is the 6 ASCII bytes \\.//^\\")
    func label() {
        #expect(XWing.label == Array(#"\.//^\"#.utf8))
        #expect(XWing.label.hexString == "5c2e2f2f5e5c")
    }

    @Test("bad input: wrong lengths, a public key that is not the seed's, corrupted ciphertexts")
    func badInput() throws {
        #expect(throws: KeyExchangeError.invalidLength(field: "seed", expected: 32, actual: 33)) {
            try XWing.PrivateKey(seed: [UInt8](repeating: 7, count: 33))
        }
        let key = try XWing.PrivateKey(seed: [UInt8](repeating: 7, count: 32))
        let other = try XWing.PrivateKey(seed: [UInt8](repeating: 8, count: 32))
        #expect(throws: KeyExchangeError.publicKeyMismatch) { try XWing.PrivateKey(seed: [UInt8](repeating: 7, count: 32), publicKey: other.publicKey) }
        #expect(throws: KeyExchangeError.invalidLength(field: "publicKey", expected: 1216, actual: 1215)) {
            try XWing.encapsulate(publicKey: Array(key.publicKey.dropLast()))
        }
        #expect(throws: KeyExchangeError.invalidLength(field: "encapsulatedKey", expected: 1120, actual: 1119)) {
            try XWing.decapsulate(privateKey: key, ciphertext: [UInt8](repeating: 0, count: 1119))
        }
        let (ss, ct) = try XWing.encapsulate(publicKey: key.publicKey)
        // Corrupt the ML-KEM part and the X25519 part: a different secret each time, no error.
        for position in [0, 1087, 1088, 1119] {
            var bad = ct
            bad[position] ^= 0x40
            #expect(try XWing.decapsulate(privateKey: key, ciphertext: bad) != ss, "flip at \(position)")
        }
        // ct_X = 0 (small order): OpenSSL's X25519 refuses the all-zero result.
        var zero = ct
        for i in 1088..<1120 { zero[i] = 0 }
        #expect(throws: KeyExchangeError.invalidPublicKey(field: "encapsulatedKey")) { try XWing.decapsulate(privateKey: key, ciphertext: zero) }
        #expect(try XWing.decapsulate(privateKey: key, ciphertext: ct) == ss)
        // The wrong recipient gets a different secret.
        #expect(try XWing.decapsulate(privateKey: other, ciphertext: ct) != ss)
    }
}
