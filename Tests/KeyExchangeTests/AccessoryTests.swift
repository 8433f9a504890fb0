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
