import Basics
import Foundation
import Testing
@testable import MockAPNs

@Suite struct ProviderTokenTests {
    @Test func validTokenVerifies() throws {
        let claims = try Fixture.verifier.verify(token: Fixture.token(), now: Fixture.now).get()
        #expect(claims == ProviderTokenClaims(keyID: Fixture.keyID, teamID: Fixture.teamID, issuedAt: Fixture.now - 10))
    }

    @Test func publicKeyPEMVerifiesTooAndP8RoundTrips() throws {
        let publicOnly = try ECKey(pem: Fixture.key.publicKeyPEM())
        let p8 = try ECKey(pem: Fixture.key.privateKeyPEM())
        #expect(try Fixture.key.privateKeyPEM().hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let token = try ProviderTokenMinter.mint(key: p8, keyID: "K", teamID: "T", issuedAt: Fixture.now)
        let verifier = ProviderTokenVerifier(keys: [MockTokenKey(keyID: "K", teamID: "T", key: publicOnly)])
        #expect((try? verifier.verify(token: token, now: Fixture.now).get()) != nil)
    }

    @Test func badSignatureIsInvalid() {
        var chars = Array(Fixture.token())
        // Flip one character in the middle of the signature (keep the base64url alphabet).
        let i = chars.count - 20
        chars[i] = chars[i] == "A" ? "B" : "A"
        let token = String(chars)
        #expect(Fixture.verifier.verify(token: token, now: Fixture.now) == .failure(.invalid("bad signature")))
        let otherKeySigned = Fixture.token(key: Fixture.otherKey)
        // The last character carries 4 unused bits: a non-canonical spelling is refused too.
        var loose = Array(Fixture.token())
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        let value = alphabet.firstIndex(of: loose[loose.count - 1])!
        loose[loose.count - 1] = alphabet[value ^ 1]
        #expect(Fixture.verifier.verify(token: String(loose), now: Fixture.now) == .failure(.invalid("signature is not 64 bytes base64url (raw r||s)")))
        #expect(Fixture.verifier.verify(token: otherKeySigned, now: Fixture.now) == .failure(.invalid("bad signature")))
    }

    @Test func wrongKidOrIss() {
        #expect(Fixture.verifier.verify(token: Fixture.token(keyID: "NOPE000000"), now: Fixture.now) == .failure(.invalid("unknown kid")))
        #expect(Fixture.verifier.verify(token: Fixture.token(teamID: "WRONGTEAM1"), now: Fixture.now)
                == .failure(.invalid("iss does not match the key's team")))
    }

    @Test func timeChecks() {
        #expect(Fixture.verifier.verify(token: Fixture.token(iat: Fixture.now - 3600), now: Fixture.now).map(\.issuedAt) == .success(Fixture.now - 3600))
        #expect(Fixture.verifier.verify(token: Fixture.token(iat: Fixture.now - 3601), now: Fixture.now) == .failure(.expired))
        #expect(Fixture.verifier.verify(token: Fixture.token(iat: Fixture.now + 60), now: Fixture.now).map(\.issuedAt) == .success(Fixture.now + 60))
        #expect(Fixture.verifier.verify(token: Fixture.token(iat: Fixture.now + 61), now: Fixture.now) == .failure(.invalid("iat is in the future")))
    }

    @Test func malformedTokens() throws {
        let v = Fixture.verifier
        #expect(v.verify(authorization: nil, now: Fixture.now) == .failure(.missing))
        #expect(v.verify(authorization: "Basic abc", now: Fixture.now) == .failure(.invalid("authorization is not 'bearer <token>'")))
        #expect(v.verify(token: "a.b", now: Fixture.now) == .failure(.invalid("token is not three dot-separated parts")))
        func forge(header: String, claims: String) throws -> String {
            let input = jwsSegment(Array(header.utf8)) + "." + jwsSegment(Array(claims.utf8))
            return input + "." + jwsSegment(try Fixture.key.signES256(message: Array(input.utf8)))
        }
        #expect(v.verify(token: try forge(header: #"{"alg":"HS256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"TEAM123456","iat":1800000000}"#), now: Fixture.now)
                == .failure(.invalid("alg is not ES256")))
        #expect(v.verify(token: try forge(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"TEAM123456","iat":"1800000000"}"#), now: Fixture.now)
                == .failure(.invalid("iat missing or not a number")))
        #expect(v.verify(token: try forge(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"TEAM123456","iat":true}"#), now: Fixture.now)
                == .failure(.invalid("iat missing or not a number")))
        #expect(v.verify(token: try forge(header: #"{"alg":"ES256","kid":"ABC123DEFG"}"#, claims: #"{"iss":"TEAM123456","iat":1800000000}"#), now: Fixture.now)
                .map(\.issuedAt) == .success(1_800_000_000))
        // Standard base64 padding is not JWS.
        #expect(v.verify(token: Fixture.token() + "=", now: Fixture.now) == .failure(.invalid("signature is not 64 bytes base64url (raw r||s)")))
    }

    @Test func verifiesATokenSignedByTheOpenSSLCommandLine() throws {
        // An independent signer: `openssl dgst -sha256 -sign` gives DER; convert to r||s here.
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mockapns-jwt-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let keyPath = dir.appendingPathComponent("key.p8").path
        try Fixture.key.privateKeyPEM().write(toFile: keyPath, atomically: true, encoding: .utf8)
        let input = jwsSegment(Array(#"{"alg":"ES256","kid":"ABC123DEFG"}"#.utf8)) + "." + jwsSegment(Array(#"{"iss":"TEAM123456","iat":1800000000}"#.utf8))
        let inputPath = dir.appendingPathComponent("input").path
        try input.write(toFile: inputPath, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = ["dgst", "-sha256", "-sign", keyPath, inputPath]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let der = Array(pipe.fileHandleForReading.readDataToEndOfFile())
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        let token = input + "." + jwsSegment(try rawSignature(fromDER: der))
        #expect(Fixture.verifier.verify(token: token, now: Fixture.now).map(\.teamID) == .success("TEAM123456"))
    }

    /// Minimal DER SEQUENCE { INTEGER r, INTEGER s } -> r||s (each left-padded to 32 bytes).
    private func rawSignature(fromDER der: [UInt8]) throws -> [UInt8] {
        struct Bad: Error {}
        guard der.count > 8, der[0] == 0x30 else { throw Bad() }
        var i = der[1] & 0x80 != 0 ? 3 : 2
        var out: [UInt8] = []
        for _ in 0..<2 {
            guard der[i] == 0x02 else { throw Bad() }
            let length = Int(der[i + 1])
            var integer = Array(der[(i + 2)..<(i + 2 + length)])
            while integer.count > 32, integer.first == 0 { integer.removeFirst() }
            out += Array(repeating: 0, count: 32 - integer.count) + integer
            i += 2 + length
        }
        return out
    }
}

/// Unpadded base64url, the JWS compact form's segments (strict and canonical: one token, one spelling).
private func jwsSegment(_ bytes: [UInt8]) -> String { Base64.encode(bytes, alphabet: .url, padding: false) }
