import Testing
@testable import OpenSSLSupport

@Suite struct OpenSSLSupportTests {
    @Test("SHA-256: FIPS 180-2 vectors, from a buffer and from a non-contiguous collection")
    func sha256() {
        let hex: ([UInt8]) -> String = { $0.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }
        #expect(hex(SHA256.hash(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hex(SHA256.hash(repeatElement(UInt8(ascii: "a"), count: 1_000_000)))
                == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
        #expect(hex(SHA256.hash([UInt8]())) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    @Test("HMAC-SHA256: RFC 4231 test cases 1, 2 and 6 (a key longer than the block), and an empty key and message")
    func hmacSHA256() {
        let hex: ([UInt8]) -> String = { $0.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }
        #expect(hex(HMACSHA256.mac(key: [UInt8](repeating: 0x0b, count: 20), message: Array("Hi There".utf8)))
                == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        #expect(hex(HMACSHA256.mac(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)))
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(hex(HMACSHA256.mac(key: [UInt8](repeating: 0xaa, count: 131), message: Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8)))
                == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        #expect(hex(HMACSHA256.mac(key: [], message: []))
                == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
    }

    @Test func anHMACKeyGivesTheOneShotMACForEveryMessage() {
        let hex: ([UInt8]) -> String = { $0.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }
        let keyBytes = [UInt8](repeating: 0xaa, count: 131)   // longer than a block: hashed first
        let key = HMACSHA256.Key(keyBytes)
        for n in [0, 1, 55, 56, 64, 119, 600] {
            let message = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            #expect(key.mac(message) == HMACSHA256.mac(key: keyBytes, message: message))
            #expect(key.mac(message) == key.mac(message), "the saved state must not move")
        }
        #expect(hex(HMACSHA256.Key(Array("Jefe".utf8)).mac(Array("what do ya want for nothing?".utf8)))
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    @Test func constantTimeEqualAndWipe() {
        #expect(constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2, 4]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2]))
        #expect(constantTimeEqual([], []))
        var secret: [UInt8] = [9, 9, 9]
        wipe(&secret)
        #expect(secret == [0, 0, 0])
    }

    @Test func randomBytesDiffer() {
        let a = SecureRandom.bytes(32), b = SecureRandom.bytes(32)
        #expect(a.count == 32 && a != b)
        #expect(SecureRandom.bytes(0).isEmpty)
    }

    @Test("ES256: raw r||s signatures verify, a flipped bit or another key does not, PEM round-trips")
    func es256() throws {
        let key = try AsymmetricKey.generateP256()
        #expect(key.isP256 && key.typeName == "EC" && key.bits == 256)
        let message = Array("header.claims".utf8)
        let signature = try key.signES256(message)
        #expect(signature.count == 64)
        #expect(try key.verifyES256(signature: signature, message: message))
        var flipped = signature
        flipped[10] ^= 1
        #expect(try !key.verifyES256(signature: flipped, message: message))
        #expect(try !key.verifyES256(signature: Array(signature.prefix(63)), message: message))
        #expect(try !AsymmetricKey.generateP256().verifyES256(signature: signature, message: message))
        let publicOnly = try AsymmetricKey(publicKeyPEM: key.publicKeyPEM())
        #expect(try publicOnly.verifyES256(signature: signature, message: message))
        let reloaded = try AsymmetricKey(privateKeyPEM: key.privateKeyPEM())
        #expect(try key.verifyES256(signature: reloaded.signES256(message), message: message))
        // DER and raw forms convert both ways.
        let der = try ES256Signature.der(fromRaw: signature)
        #expect(try ES256Signature.raw(fromDER: der, count: der.count) == signature)
    }

    @Test("A failure carries OpenSSL's own words, and leaves the error queue empty")
    func failuresDrainTheQueue() {
        #expect(throws: OpenSSLFailure.self) { try AsymmetricKey(privateKeyPEM: "not a key") }
        do {
            _ = try AsymmetricKey(privateKeyPEM: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
            Issue.record("a garbage key loaded")
        } catch {
            #expect(error.operation == "PEM_read_bio_PrivateKey")
            #expect(error.detail?.isEmpty == false)
            #expect(error.description.hasPrefix("PEM_read_bio_PrivateKey: error:"))
        }
        #expect(OpenSSLErrors.drain(ifNone: "empty") == "empty")
        #expect(OpenSSLFailure(operation: "X", detail: nil).description == "X failed")
        #expect(throws: OpenSSLFailure.self) { try X509Certificate(pemFile: "/nonexistent/cert.pem") }
        #expect(OpenSSLErrors.drain() == "")
    }

    @Test func pkcs12PathsAndTheP256Group() {
        #expect(PKCS12File.isPKCS12Path("a/b.P12") && PKCS12File.isPKCS12Path("x.pfx"))
        #expect(!PKCS12File.isPKCS12Path("x.pem") && !PKCS12File.isPKCS12Path("p12"))
        #expect(P256Group.shared != nil)
        #expect(P256Group.shared === P256Group.shared)
        if case .cannotOpen? = { () -> PKCS12File.Failure? in
            do throws(PKCS12File.Failure) { _ = try PKCS12File.read(path: "/nonexistent.p12", passphrase: nil); return nil } catch { return error }
        }() {} else { Issue.record("a missing .p12 is not .cannotOpen") }
    }
}
