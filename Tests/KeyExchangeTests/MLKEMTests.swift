import Foundation
import Testing
import Ratchet
internal import COpenSSL
@testable import KeyExchange

/// NIST's AES-256 CTR_DRBG from the KAT generator (rng.c), to turn a KAT's rngSeed into d, z, m.
private struct NISTDRBG {
    var key = [UInt8](repeating: 0, count: 32)
    var v = [UInt8](repeating: 0, count: 16)

    init(seed: [UInt8]) { update(seed) }

    private func aes(_ block: [UInt8]) -> [UInt8] {
        let ctx = EVP_CIPHER_CTX_new()!
        defer { EVP_CIPHER_CTX_free(ctx) }
        EVP_EncryptInit_ex(ctx, EVP_aes_256_ecb(), nil, key, nil)
        EVP_CIPHER_CTX_set_padding(ctx, 0)
        var out = [UInt8](repeating: 0, count: 32)
        var n: Int32 = 0
        EVP_EncryptUpdate(ctx, &out, &n, block, 16)
        return Array(out[0..<16])
    }

    private mutating func increment() {
        for i in stride(from: 15, through: 0, by: -1) {
            v[i] &+= 1
            if v[i] != 0 { break }
        }
    }

    private mutating func update(_ provided: [UInt8]?) {
        var temp = [UInt8]()
        for _ in 0..<3 { increment(); temp += aes(v) }
        if let provided { for i in 0..<48 { temp[i] ^= provided[i] } }
        key = Array(temp[0..<32]); v = Array(temp[32..<48])
    }

    mutating func randomBytes(_ count: Int) -> [UInt8] {
        var out = [UInt8]()
        while out.count < count { increment(); out += aes(v).prefix(count - out.count) }
        update(nil)
        return out
    }
}

@Suite("ML-KEM-768 (FIPS 203)")
struct MLKEMTests {
    @Test("BoringSSL KAT: 100 key pairs from (d, z)", .enabled(if: KexVectors.exists("MLKEM768_BSSLKAT.json"), KexVectors.skipMessage("MLKEM768_BSSLKAT.json")))
    func boringSSLKeyGen() throws {
        let cases = try KexVectors.objects("MLKEM768_BSSLKAT.json")
        #expect(cases.count == 100)
        for (n, c) in cases.enumerated() {
            let dz = try hexField(c, "dz")
            let (ek, dk) = try MLKEM768.generateKeyPair(d: Array(dz[0..<32]), z: Array(dz[32..<64]))
            #expect(ek == (try hexField(c, "pk")), "case \(n) pk")
            #expect(dk.exportedBytes == (try hexField(c, "sk")), "case \(n) sk")
        }
    }

    @Test("NIST KAT: 100 key pairs, encapsulations and decapsulations from the DRBG seed", .enabled(if: KexVectors.exists("MLKEM768KAT.json"), KexVectors.skipMessage("MLKEM768KAT.json")))
    func nistKAT() throws {
        let cases = try KexVectors.objects("MLKEM768KAT.json")
        #expect(cases.count == 100)
        for (n, c) in cases.enumerated() {
            var drbg = NISTDRBG(seed: try hexField(c, "rngSeed"))
            let dz = drbg.randomBytes(64)
            let m = drbg.randomBytes(32)
            let (ek, dk) = try MLKEM768.generateKeyPair(d: Array(dz[0..<32]), z: Array(dz[32..<64]))
            #expect(ek == (try hexField(c, "pk")), "case \(n) pk")
            #expect(dk.exportedBytes == (try hexField(c, "sk")), "case \(n) sk")
            let (k, ct) = try MLKEM768.encapsulate(encapsulationKey: ek, m: m)
            #expect(ct == (try hexField(c, "ek")), "case \(n) ciphertext")
            #expect(k.exportedBytes == (try hexField(c, "k")), "case \(n) shared secret")
            let k2 = try MLKEM768.decapsulate(decapsulationKey: dk, ciphertext: ct)
            #expect(k2 == k, "case \(n) decapsulation")
        }
    }

    @Test("a modified ciphertext decapsulates to J(z || c), not an error (implicit rejection)")
    func implicitRejection() throws {
        let (ek, dk) = try MLKEM768.generateKeyPair(d: [UInt8](repeating: 1, count: 32), z: [UInt8](repeating: 2, count: 32))
        let (k, ct) = try MLKEM768.encapsulate(encapsulationKey: ek)
        for position in [0, 500, 959, 960, 1087] {
            var bad = ct
            bad[position] ^= 0x01
            let rejected = try MLKEM768.decapsulate(decapsulationKey: dk, ciphertext: bad)
            #expect(rejected != k, "flip at \(position)")
            let z = Array(dk.exportedBytes[2368...])
            #expect(rejected.exportedBytes == Keccak.shake256(z, bad, count: 32), "flip at \(position): K_bar")
        }
        #expect(try MLKEM768.decapsulate(decapsulationKey: dk, ciphertext: ct) == k)
    }

    @Test("wrong lengths and invalid keys are typed errors")
    func badInput() throws {
        #expect(throws: KeyExchangeError.invalidLength(field: "d", expected: 32, actual: 31)) {
            try MLKEM768.generateKeyPair(d: [UInt8](repeating: 0, count: 31), z: [UInt8](repeating: 0, count: 32))
        }
        let (ek, dk) = try MLKEM768.generateKeyPair(d: [UInt8](repeating: 3, count: 32), z: [UInt8](repeating: 4, count: 32))
        #expect(throws: KeyExchangeError.invalidLength(field: "encapsulationKey", expected: 1184, actual: 1183)) {
            try MLKEM768.encapsulate(encapsulationKey: Array(ek.dropLast()))
        }
        #expect(throws: KeyExchangeError.invalidLength(field: "ciphertext", expected: 1088, actual: 1089)) {
            try MLKEM768.decapsulate(decapsulationKey: dk, ciphertext: [UInt8](repeating: 0, count: 1089))
        }
        // First coefficient = 0xfff >= q: the FIPS 203 modulus check refuses it.
        var badEK = ek
        badEK[0] = 0xff; badEK[1] |= 0x0f
        #expect(throws: KeyExchangeError.invalidEncapsulationKey) { try MLKEM768.encapsulate(encapsulationKey: badEK) }
        // A decapsulation key whose H(ek) does not match.
        var badDK = dk.exportedBytes
        badDK[2336] ^= 1
        #expect(throws: KeyExchangeError.invalidDecapsulationKey) {
            try MLKEM768.decapsulate(decapsulationKey: SecretKey(bytes: badDK), ciphertext: [UInt8](repeating: 0, count: 1088))
        }
    }

    @Test("constant-time arithmetic agrees with plain division on every input it gets")
    func arithmetic() {
        // divq is used on (x << d) + 1664 for x < q and d <= 11: all of those, and more.
        var ok = true
        for y in stride(from: UInt32(0), to: 3329 << 12, by: 1) where MLKEM768.divq(y) != y / 3329 { ok = false; break }
        #expect(ok, "divq")
        for x in UInt32(0)..<3329 {
            for d in [1, 4, 10] {
                var f = [UInt16](repeating: UInt16(x), count: 256)
                MLKEM768.compress(&f, d)
                let expected = UInt16(((Double(x) * Double(1 << d) / 3329).rounded(.toNearestOrAwayFromZero))) & UInt16((1 << d) - 1)
                if f[0] != expected { ok = false }
            }
        }
        #expect(ok, "compress")
        var state: UInt64 = 0x9e3779b97f4a7c15
        for _ in 0..<100_000 {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            let a = UInt32(truncatingIfNeeded: state >> 32)
            if MLKEM768.reduce(a) != a % 3329 { ok = false }
        }
        #expect(ok, "reduce")
    }
}
