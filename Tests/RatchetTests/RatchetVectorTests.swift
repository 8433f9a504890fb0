import Foundation
import Testing
import Ratchet
import TestSupport

@Suite("Ratchet step, keyID and the frozen vectors")
struct RatchetVectorTests {
    @Test("frozen chains: every step's message key and next chain key")
    func chains() throws {
        let file = try VectorFile.load("ratchet-vectors.json", as: RatchetVectorFile.self)
        #expect(file.chains.count == 2)
        for chain in file.chains {
            var chainKey = SecretKey(bytes: try #require(hex(chain.rootKey)))
            for step in chain.steps {
                #expect(chainKey.exportedBytes.hexString == step.chainKey)
                #expect(ratchetInfo(messageIndex: step.index).hexString == step.info)
                let (messageKey, next) = ratchetStep(chainKey: chainKey, messageIndex: step.index)
                #expect(messageKey.exportedBytes.hexString == step.messageKey, "\(chain.name) step \(step.index)")
                #expect(next.exportedBytes.hexString == step.nextChainKey, "\(chain.name) step \(step.index)")
                chainKey = next
            }
        }
    }

    @Test("frozen single steps, including index byte order and UInt32.max")
    func singleSteps() throws {
        let file = try VectorFile.load("ratchet-vectors.json", as: RatchetVectorFile.self)
        #expect(file.singleSteps.contains { $0.index == UInt32.max })
        for step in file.singleSteps {
            let (messageKey, next) = ratchetStep(chainKey: SecretKey(bytes: try #require(hex(step.chainKey))), messageIndex: step.index)
            #expect(messageKey.exportedBytes.hexString == step.messageKey, "index \(step.index)")
            #expect(next.exportedBytes.hexString == step.nextChainKey, "index \(step.index)")
        }
        // The index is little-endian: 0x01020304 puts 04 03 02 01 after the prefix.
        #expect(Array(ratchetInfo(messageIndex: 0x0102_0304).suffix(4)) == [4, 3, 2, 1])
        #expect(ratchetInfo(messageIndex: 0).count == ratchetInfoPrefix.count + 4)
        #expect(String(decoding: ratchetInfoPrefix, as: UTF8.self) == "AccessoryTransportSecurity-RatchetKeys-")
    }

    @Test("a ratchet step is HKDF-Expand with L = 64, split 32/32")
    func stepIsExpand() throws {
        let chainKey = SecretKey(random: 32)
        let okm = try HKDF.expand(prk: chainKey.exportedBytes, info: ratchetInfo(messageIndex: 77), length: 64)
        let (m, n) = ratchetStep(chainKey: chainKey, messageIndex: 77)
        #expect(m.exportedBytes == Array(okm[0..<32]))
        #expect(n.exportedBytes == Array(okm[32..<64]))
    }

    @Test("keyID is the SHA-384 prefix of the public key")
    func keyIDs() throws {
        let file = try VectorFile.load("ratchet-vectors.json", as: RatchetVectorFile.self)
        for c in file.keyIDs {
            let id = keyID(publicKey: try #require(hex(c.publicKey)))
            #expect(id.count == 4)
            #expect(id.hexString == c.keyID)
            #expect(c.sha384.hasPrefix(c.keyID))
        }
        // SHA-384("") = 38b060a7...; an empty key is not useful, but must not crash.
        #expect(keyID(publicKey: []).hexString == "38b060a7")
        #expect(ratchetStep(chainKey: SecretKey(bytes: []), messageIndex: 0).messageKey.count == 32)
    }

    @Test("worked response vector: body, seal with message key 2, internet message")
    func workedResponse() throws {
        let r = try VectorFile.load("ratchet-vectors.json", as: RatchetVectorFile.self).response
        let body = NotificationResponseBody(notificationIdentifier: r.notificationIdentifier, sourceIdentifier: r.sourceIdentifier,
                                            actionIdentifier: r.actionIdentifier, userText: r.userText)
        #expect(try body.encoded().hexString == r.body)
        var receiver = ReceivingRatchet(rootSecret: SecretKey(bytes: try #require(hex(r.rootKey))))
        let message = try InternetMessage(decoding: try #require(hex(r.internetMessage)))
        #expect(message.keyID.hexString == r.keyID)
        #expect(message.keyID == keyID(publicKey: try #require(hex(r.publicKey))))
        #expect(message.messageIndex == r.messageIndex)
        #expect(message.sealed.hexString == r.sealed)
        let plaintext = try receiver.open(message.sealed, index: message.messageIndex)
        #expect(try NotificationResponseBody(decoding: plaintext) == body)
        // Sealing again with the frozen nonce reproduces the frozen box.
        let key = SecretKey(bytes: try #require(hex(r.messageKey)))
        let nonce = try #require(hex(r.nonce))
        #expect(try AESGCM.seal(try body.encoded(), key: key, nonce: nonce).hexString == r.sealed)
        #expect(receiver.skippedIndices == [0, 1])
    }

    @Test("ratchet steps agree with the `openssl kdf` command line (independent implementation)")
    func crossCheckOpenSSLCommandLine() throws {
        var rng = SeededGenerator(state: 2026)
        for _ in 0..<3 {
            let chainKey = (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let index = UInt32.random(in: 0...UInt32.max, using: &rng)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            process.arguments = ["kdf", "-keylen", "64", "-kdfopt", "digest:SHA256", "-kdfopt", "mode:EXPAND_ONLY",
                                 "-kdfopt", "hexkey:" + chainKey.hexString,
                                 "-kdfopt", "hexinfo:" + ratchetInfo(messageIndex: index).hexString, "HKDF"]
            let pipe = Pipe()
            process.standardOutput = pipe
            try process.run()
            let output = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
            let text = String(decoding: output, as: UTF8.self).filter { $0.isHexDigit }.lowercased()
            let (m, n) = ratchetStep(chainKey: SecretKey(bytes: chainKey), messageIndex: index)
            #expect(text == m.exportedBytes.hexString + n.exportedBytes.hexString, "index \(index)")
        }
    }

    @Test("docs/ratchet.md shows the same frozen vectors")
    func docsMatchVectors() throws {
        let file = try VectorFile.load("ratchet-vectors.json", as: RatchetVectorFile.self)
        let docsURL = VectorFile.directory.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/ratchet.md")
        let docs = try String(contentsOf: docsURL, encoding: .utf8)
        var expected: [String] = [file.chains[0].rootKey, file.chains[0].steps[0].info]
        for step in file.chains[0].steps.prefix(5) { expected += [step.messageKey, step.nextChainKey] }
        for step in file.singleSteps where [0, 1, 256, 0x0102_0304, UInt32.max].contains(step.index) {
            expected += [step.messageKey, step.nextChainKey]
        }
        expected += [file.keyIDs[0].keyID, file.response.rootKey, file.response.messageKey, file.response.sealed]
        for value in expected {
            #expect(docs.contains(value), "docs/ratchet.md lacks \(value)")
        }
    }
}
