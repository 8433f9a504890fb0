import Testing
import Ratchet
@testable import KeyExchange

@Suite("Apple accessory derivations")
struct AccessoryTests {
    let device = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
    let bluetooth = "0000FE2C-0000-1000-8000-00805F9B34FB"

    @Test("protocolInfo and the export contexts, byte for byte")
    func strings() {
        let info = ProtocolInfo(ciphersuite: AccessoryCiphersuite.xWing.defaultName, identifier: device)
        #expect(info.text == "XWing-v1-6BA7B810-9DAD-11D1-80B4-00C04FD430C8")
        #expect(info.bytes.count == 45)
        #expect(ProtocolInfo(ciphersuite: AccessoryCiphersuite.p256.defaultName, version: "version1", identifier: "x").text == "P256-version1-x")
        #expect(AccessorySession.internetContext(.hostToAccessory, bluetoothIdentifier: bluetooth)
                == Array("AccessoryInternetKey-HostToAccessory-0000FE2C-0000-1000-8000-00805F9B34FB".utf8))
        #expect(AccessorySession.internetContext(.accessoryToHost, bluetoothIdentifier: bluetooth)
                == Array("AccessoryInternetKey-AccessoryToHost-0000FE2C-0000-1000-8000-00805F9B34FB".utf8))
        #expect(AccessorySession.bluetoothContext(protocolInfo: info, featureID: "F1")
                == Array("XWing-v1-6BA7B810-9DAD-11D1-80B4-00C04FD430C8-AccessoryToHost-F1".utf8))
        #expect(AccessorySession.bluetoothContext(protocolInfo: info, featureID: "F1", reading: .dataDescription)
                == Array("45 bytes-AccessoryToHost-F1".utf8))
    }

    @Test("a simulated pairing: the iPhone's exports equal the accessory's, for both ciphersuites",
          arguments: AccessoryCiphersuite.allCases)
    func pairing(suite: AccessoryCiphersuite) throws {
        let key = AccessoryPrivateKey.generate(suite)
        let info = ProtocolInfo(ciphersuite: suite.defaultName, identifier: device)
        let (enc, sender) = try AccessorySession.hostEncapsulate(ciphersuite: suite, accessoryPublicKey: key.publicKeyRaw, protocolInfo: info)
        #expect(enc.count == (suite == .xWing ? 1120 : 65))
        #expect(key.publicKeyRaw.count == (suite == .xWing ? 1216 : 64))
        // The accessory restores its key from the stored bytes, as firmware would after a reboot.
        let restored = try AccessoryPrivateKey(suite, privateKey: key.privateKeyBytes.exportedBytes, publicKey: key.publicKeyRaw)
        let session = try AccessorySession(privateKey: restored, protocolInfo: info, encapsulatedKey: enc)
        for direction in [AccessorySession.Direction.hostToAccessory, .accessoryToHost] {
            let hostRoot = try sender.exportSecret(context: AccessorySession.internetContext(direction, bluetoothIdentifier: bluetooth), outputByteCount: 32)
            #expect(session.internetRoot(direction, bluetoothIdentifier: bluetooth) == hostRoot)
        }
        #expect(session.internetRoot(.hostToAccessory, bluetoothIdentifier: bluetooth) != session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth))
        let bt = try sender.exportSecret(context: AccessorySession.bluetoothContext(protocolInfo: info, featureID: "42"), outputByteCount: 32)
        #expect(session.bluetoothResponseSecret(featureID: "42") == bt)
        #expect(session.bluetoothResponseSecret(featureID: "42", reading: .dataDescription) != bt)
        #expect(session.keyID == Ratchet.keyID(publicKey: key.publicKeyRaw))
        // Another protocolInfo (here the version spelling) gives other roots.
        let other = try AccessorySession(privateKey: restored, protocolInfo: ProtocolInfo(ciphersuite: suite.defaultName, version: "Version1", identifier: device), encapsulatedKey: enc)
        #expect(other.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth) != session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth))
    }

    @Test("a corrupted X-Wing encapsulatedKey gives other roots (implicit rejection), never an error or a crash")
    func corruptedEncapsulatedKey() throws {
        let key = AccessoryPrivateKey.generate(.xWing)
        let info = ProtocolInfo(ciphersuite: "XWing", identifier: device)
        let (enc, host) = try AccessorySession.hostEncapsulate(ciphersuite: .xWing, accessoryPublicKey: key.publicKeyRaw, protocolInfo: info)
        let hostRoot = try host.exportSecret(context: AccessorySession.internetContext(.accessoryToHost, bluetoothIdentifier: bluetooth), outputByteCount: 32)
        var state: UInt64 = 12345
        for _ in 0..<20 {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            var bad = enc
            bad[Int(state >> 33) % 1088] ^= UInt8(truncatingIfNeeded: state >> 8) | 1  // inside ct_M
            let session = try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: bad)
            #expect(session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth) != hostRoot)
        }
        #expect(try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: enc)
                    .internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth) == hostRoot)
    }

    @Test("stored key material that does not fit is a typed error naming the field")
    func badKeyMaterial() throws {
        #expect(throws: KeyExchangeError.invalidLength(field: "seed", expected: 32, actual: 31)) {
            try AccessoryPrivateKey(.xWing, privateKey: [UInt8](repeating: 1, count: 31))
        }
        #expect(throws: KeyExchangeError.invalidLength(field: "privateKey", expected: 32, actual: 33)) {
            try AccessoryPrivateKey(.p256, privateKey: [UInt8](repeating: 1, count: 33))
        }
        let p = P256PrivateKey.generate()
        #expect(throws: KeyExchangeError.publicKeyMismatch) {
            try AccessoryPrivateKey(.p256, privateKey: [UInt8](repeating: 1, count: 32), publicKey: p.publicKeyRaw)
        }
        let key = AccessoryPrivateKey.generate(.xWing)
        let info = ProtocolInfo(ciphersuite: "XWing", identifier: device)
        #expect(throws: KeyExchangeError.invalidLength(field: "encapsulatedKey", expected: 1120, actual: 65)) {
            try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: [UInt8](repeating: 4, count: 65))
        }
    }
}

/// docs/key-exchange.md's two worked examples, computed here from their inputs: every value the
/// code produces must appear in the document (so the document cannot drift from the code), and
/// the KEM shared secrets are the published ones the inputs were taken from.
@Suite("docs/key-exchange.md worked examples")
struct WorkedExampleTests {
    let device = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
    let bluetooth = "0000FE2C-0000-1000-8000-00805F9B34FB"
    let feature = "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0"

    func document() throws -> String {
        try String(contentsOf: KexVectors.packageRoot.appendingPathComponent("docs/key-exchange.md"), encoding: .utf8)
            .replacingOccurrences(of: "\n  ", with: "")  // long hex is wrapped at 64 digits, indented
    }

    func check(_ suite: AccessoryCiphersuite, privateKey: String, ephemeral: HPKE.EphemeralInput, publishedSharedSecret: String) throws {
        let doc = try document()
        let key = try AccessoryPrivateKey(suite, privateKey: try hex(privateKey))
        let info = ProtocolInfo(ciphersuite: suite.defaultName, identifier: device)
        let (enc, _) = try AccessorySession.hostEncapsulate(ciphersuite: suite, accessoryPublicKey: key.publicKeyRaw, protocolInfo: info, ephemeral: ephemeral)
        let session = try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: enc)
        let s = session.recipient.schedule
        #expect(s.sharedSecret.exportedBytes.hexString == publishedSharedSecret)
        var values = [key.publicKeyRaw.hexString, enc.hexString, session.keyID.hexString, s.sharedSecret.exportedBytes.hexString,
                      s.infoHash.hexString, s.keyScheduleContext.hexString, s.secret.exportedBytes.hexString, s.key.exportedBytes.hexString,
                      s.baseNonce.hexString, s.exporterSecret.exportedBytes.hexString,
                      session.internetRoot(.hostToAccessory, bluetoothIdentifier: bluetooth).exportedBytes.hexString,
                      session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth).exportedBytes.hexString]
        if suite == .xWing {
            values.append(session.bluetoothResponseSecret(featureID: feature).exportedBytes.hexString)
            values.append(session.bluetoothResponseSecret(featureID: feature, reading: .dataDescription).exportedBytes.hexString)
        }
        for v in values { #expect(doc.contains(v), "docs/key-exchange.md lacks \(v.prefix(16))...") }
    }

    @Test("X-Wing: the draft's first vector as seed and eseed")
    func xWing() throws {
        try check(.xWing, privateKey: "7f9c2ba4e88f827d616045507605853ed73b8093f6efbc88eb1a6eacfa66ef26",
                  ephemeral: .xWingSeed(try hex("3cb1eea988004b93103cfb0aeefd2a686e01fa4a58e8a3639ca8a1e3f9ae57e235b8cc873c23dc62b8d260169afa2f75ab916a58d974918835d25e6a435085b2")),
                  publishedSharedSecret: "d2df0522128f09dd8e2c92b1e905c793d8f57a54c3da25861f10bf4ca613e384")
    }

    @Test("P-256: RFC 9180 A.3's skRm and skEm")
    func p256() throws {
        try check(.p256, privateKey: "f3ce7fdae57e1a310d87f1ebbde6f328be0a99cdbcadf4d6589cf29de4b8ffd2",
                  ephemeral: .p256(try P256PrivateKey(rawRepresentation: try hex("4995788ef4b9d6132b249ce59a77281493eb39af373d236a1fe415cb0c2d7beb"))),
                  publishedSharedSecret: "c0d26aeab536609a572b07695d933b589dcf363ff9d93c93adea537aeabb8cb8")
    }
}
