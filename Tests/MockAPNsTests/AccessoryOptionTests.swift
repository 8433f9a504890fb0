import Foundation
import Testing
import KeyExchange
import MockAPNs
import Ratchet

/// mock-apns --accessory: the receiving root comes from the state file's key material, and a
/// state whose stored roots do not match its key material is refused.
@Suite struct AccessoryOptionTests {
    private func pairedState(_ suite: AccessoryCiphersuite) throws -> (AccessoryStateFile, SecretKey, [UInt8]) {
        let key = AccessoryPrivateKey.generate(suite)
        let info = ProtocolInfo(ciphersuite: suite.defaultName, identifier: "6BA7B810-9DAD-11D1-80B4-00C04FD430C8")
        let bluetooth = "0000FE2C-0000-1000-8000-00805F9B34FB"
        let (enc, host) = try AccessorySession.hostEncapsulate(ciphersuite: suite, accessoryPublicKey: key.publicKeyRaw, protocolInfo: info)
        let a2h = try host.exportSecret(context: AccessorySession.internetContext(.accessoryToHost, bluetoothIdentifier: bluetooth), outputByteCount: 32)
        let h2a = try host.exportSecret(context: AccessorySession.internetContext(.hostToAccessory, bluetoothIdentifier: bluetooth), outputByteCount: 32)
        let keyID = Ratchet.keyID(publicKey: key.publicKeyRaw)
        let state = AccessoryStateFile(ciphersuite: suite, protocolInfo: info, deviceUUID: info.identifier, bluetoothUUID: bluetooth, uuidCase: "upper",
                                       privateKey: key.privateKeyBytes.exportedBytes, publicKey: key.publicKeyRaw, encapsulatedKey: enc,
                                       keyID: Data(keyID).base64EncodedString(), hostToAccessoryRoot: h2a.exportedBytes,
                                       accessoryToHostRoot: a2h.exportedBytes, pushToken: "00", sessionIdentifier: UUID().uuidString,
                                       sending: SendingRatchet(rootSecret: a2h).state)
        return (state, a2h, keyID)
    }

    private func write(_ state: AccessoryStateFile) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("mock-accessory-\(UUID().uuidString).json").path
        try JSONEncoder().encode(state).write(to: URL(fileURLWithPath: path))
        return path
    }

    @Test("--accessory (repeatable) derives each accessory's root and keyID", arguments: AccessoryCiphersuite.allCases)
    func derivesRoots(suite: AccessoryCiphersuite) throws {
        let (state, root, keyID) = try pairedState(suite)
        let (other, otherRoot, otherKeyID) = try pairedState(suite)
        let paths = [try write(state), try write(other)]
        defer { for p in paths { try? FileManager.default.removeItem(atPath: p) } }
        guard case .run(let c) = try MockAPNsCommandLine.parse(["--h2c", "--accessory", paths[0], "--accessory", paths[1]]) else {
            Issue.record("expected run"); return
        }
        #expect(c.rootSecrets.map(\.keyID) == [keyID, otherKeyID])
        #expect(c.rootSecrets.map(\.rootSecret) == [root, otherRoot])
    }

    @Test("a missing, malformed or edited state file is a usage error naming --accessory")
    func badFiles() throws {
        var (state, _, _) = try pairedState(.xWing)
        state.accessoryToHostRoot = String(repeating: "00", count: 32)
        let edited = try write(state)
        let junk = FileManager.default.temporaryDirectory.appendingPathComponent("junk-\(UUID().uuidString).json").path
        try Data("{\"format\":1}".utf8).write(to: URL(fileURLWithPath: junk))
        defer { try? FileManager.default.removeItem(atPath: edited); try? FileManager.default.removeItem(atPath: junk) }
        for (path, fragment) in [(edited, "the stored ratchet roots do not match the key material"), (junk, "not an accessory state file"), ("/does/not/exist.json", "cannot read")] {
            do {
                _ = try MockAPNsCommandLine.parse(["--h2c", "--accessory", path])
                Issue.record("\(path) accepted")
            } catch {
                #expect("\(error)".contains("--accessory") && "\(error)".contains(fragment), "\(error)")
            }
        }
    }
}
