import Testing
import Ratchet

@Suite("HKDF-SHA256 (RFC 5869)")
struct HKDFTests {
    @Test("RFC 5869 test cases 1-3: extract and expand")
    func rfc5869() throws {
        let file = try VectorFile.load("rfc5869-sha256.json", as: RFC5869File.self)
        #expect(file.cases.count == 3)
        for c in file.cases {
            let ikm = try #require(hex(c.ikm)), salt = try #require(hex(c.salt)), info = try #require(hex(c.info))
            let prk = HKDF.extract(salt: salt, ikm: ikm)
            #expect(prk.hexString == c.prk, "\(c.name) PRK")
            let okm = try HKDF.expand(prk: prk, info: info, length: c.length)
            #expect(okm.hexString == c.okm, "\(c.name) OKM")
        }
    }

    @Test("empty inputs: extract of empty IKM, expand with an empty PRK or info")
    func emptyInputs() throws {
        // HMAC-SHA256 with a 32-byte zero key over the empty message (pyca/cryptography).
        #expect(HKDF.extract(salt: [], ikm: []).hexString == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
        #expect(HKDF.extract(salt: [UInt8](repeating: 0, count: 32), ikm: []) == HKDF.extract(salt: [], ikm: []))
        // T(1) = HMAC-SHA256(key "", 0x01) (Python's hmac module).
        #expect(try HKDF.expand(prk: [], info: [], length: 32).hexString == "3d7afb663124ecbf2c953f863d4fc8796eeb2d372b64aad58697ec5264649cdb")
        #expect(try HKDF.expand(prk: [1], info: [], length: 32) != HKDF.expand(prk: [1], info: [0], length: 32))
    }

    @Test("expand rejects lengths outside 1...8160")
    func expandLengths() throws {
        let prk = [UInt8](repeating: 7, count: 32)
        #expect(throws: RatchetError.invalidOutputLength(0)) { try HKDF.expand(prk: prk, info: [], length: 0) }
        #expect(throws: RatchetError.invalidOutputLength(8161)) { try HKDF.expand(prk: prk, info: [], length: 8161) }
        #expect(try HKDF.expand(prk: prk, info: [], length: 8160).count == 8160)
        // A longer output starts with the shorter one (HKDF's T(1) || T(2) || ... construction).
        let short = try HKDF.expand(prk: prk, info: [1, 2, 3], length: 32)
        let long = try HKDF.expand(prk: prk, info: [1, 2, 3], length: 64)
        #expect(Array(long.prefix(32)) == short)
    }
}

@Suite("AES-256-GCM")
struct AESGCMTests {
    @Test("NIST / GCM-spec known answers: seal gives ct||tag, open gives pt")
    func knownAnswers() throws {
        let file = try VectorFile.load("aes256gcm.json", as: AESGCMFile.self)
        #expect(file.valid.count >= 8)
        for v in file.valid {
            let key = SecretKey(bytes: try #require(hex(v.key)))
            let iv = try #require(hex(v.iv)), aad = try #require(hex(v.aad)), pt = try #require(hex(v.pt))
            let sealed = try AESGCM.seal(pt, key: key, nonce: iv, aad: aad)
            #expect(sealed.hexString == v.iv + v.ct + v.tag, "\(v.name)")
            #expect(try AESGCM.open(sealed, key: key, aad: aad) == pt, "\(v.name)")
        }
    }

    @Test("tag mismatches are rejected with .authenticationFailed")
    func tagMismatch() throws {
        let file = try VectorFile.load("aes256gcm.json", as: AESGCMFile.self)
        #expect(file.invalid.count >= 5)
        for v in file.invalid {
            let key = SecretKey(bytes: try #require(hex(v.key)))
            let combined = try #require(hex(v.iv + v.ct + v.tag))
            #expect(throws: RatchetError.authenticationFailed, "\(v.name)") {
                try AESGCM.open(combined, key: key, aad: try #require(hex(v.aad)))
            }
        }
    }

    @Test("every single-bit flip of a sealed box is rejected")
    func bitFlips() throws {
        let key = SecretKey(random: 32)
        let sealed = try AESGCM.seal(Array("hello accessory".utf8), key: key, aad: [9, 9])
        for byte in sealed.indices {
            for bit in 0..<8 {
                var tampered = sealed
                tampered[byte] ^= UInt8(1 << bit)
                #expect(throws: RatchetError.authenticationFailed) { try AESGCM.open(tampered, key: key, aad: [9, 9]) }
            }
        }
    }

    @Test("truncated input below nonce+tag is rejected before decryption")
    func truncated() throws {
        let key = SecretKey(random: 32)
        let sealed = try AESGCM.seal([1, 2, 3], key: key)
        for n in 0..<AESGCM.overhead {
            #expect(throws: RatchetError.sealedBoxTooShort(n)) { try AESGCM.open(Array(sealed.prefix(n)), key: key) }
        }
        // Cutting into the ciphertext/tag (still >= 28 bytes) is an authentication failure.
        #expect(throws: RatchetError.authenticationFailed) { try AESGCM.open(Array(sealed.dropLast()), key: key) }
    }

    @Test("empty plaintext, AAD binding, random nonces, key and nonce lengths")
    func shapes() throws {
        let key = SecretKey(random: 32)
        let empty = try AESGCM.seal([], key: key, aad: [1])
        #expect(empty.count == AESGCM.overhead)
        #expect(try AESGCM.open(empty, key: key, aad: [1]) == [])
        #expect(throws: RatchetError.authenticationFailed) { try AESGCM.open(empty, key: key, aad: [2]) }
        let a = try AESGCM.seal([0, 1, 2], key: key), b = try AESGCM.seal([0, 1, 2], key: key)
        #expect(a.prefix(12) != b.prefix(12), "nonces come from the RNG")
        #expect(throws: RatchetError.invalidKeyLength(expected: 32, actual: 16)) { try AESGCM.seal([], key: SecretKey(random: 16)) }
        #expect(throws: RatchetError.invalidKeyLength(expected: 32, actual: 16)) { try AESGCM.open(a, key: SecretKey(random: 16)) }
        #expect(throws: RatchetError.invalidNonceLength(8)) { try AESGCM.seal([], key: key, nonce: [UInt8](repeating: 0, count: 8)) }
        #expect(throws: RatchetError.authenticationFailed) { try AESGCM.open(a, key: SecretKey(random: 32)) }
        let big = [UInt8](repeating: 0xAB, count: 70_000)
        #expect(try AESGCM.open(try AESGCM.seal(big, key: key), key: key) == big)
    }
}

@Suite("SecretKey and hex")
struct SecretKeyTests {
    @Test("equality compares bytes and lengths; description hides the bytes")
    func equality() {
        let a = SecretKey(bytes: [1, 2, 3, 4]), b = SecretKey(bytes: [1, 2, 3, 4])
        #expect(a == b)
        #expect(a != SecretKey(bytes: [1, 2, 3, 5]))
        #expect(a != SecretKey(bytes: [1, 2, 3]))
        #expect(SecretKey(bytes: []) == SecretKey(bytes: []))
        #expect(a.count == 4)
        #expect(a.description == "SecretKey(4 bytes)")
        #expect(a.withUnsafeBytes { Array($0) } == [1, 2, 3, 4])
        let r1 = SecretKey(), r2 = SecretKey()
        #expect(r1.count == 32 && r1 != r2)
    }

    @Test("hex parses both cases, rejects odd lengths and non-digits, prints lowercase")
    func hexHelpers() {
        #expect([UInt8](hex: "00ff10Ab") == [0x00, 0xff, 0x10, 0xab])
        #expect([UInt8](hex: "") == [])
        #expect([UInt8](hex: "abc") == nil)
        #expect([UInt8](hex: "zz") == nil)
        #expect([UInt8](hex: "0x00") == nil)
        #expect([UInt8](hex: "00 11") == nil)
        #expect([0xde, 0xad, 0xBE, 0xef].hexString == "deadbeef")
        let all = (0...255).map { UInt8($0) }
        #expect([UInt8](hex: all.hexString) == all)
    }
}
