import Foundation
import Synchronization
import Testing
import Ratchet
@testable import KeyExchange

/// One base-mode block of RFC 9180 Appendix A in draft-irtf-cfrg-hpke.md.
struct RFC9180Case {
    var title: String
    var fields: [String: String] = [:]
    var encryptions: [[String: String]] = []
    var exports: [[String: String]] = []

    /// The "Base Setup Information" block of every section whose title starts with `prefix`.
    static func load(prefix: String) throws -> [RFC9180Case] {
        let lines = try KexVectors.text("draft-irtf-cfrg-hpke.md").components(separatedBy: "\n")
        var result: [RFC9180Case] = []
        var current: RFC9180Case?
        var part = ""  // "setup", "enc", "exp" or "" (outside a base block)
        var entry: [String: String] = [:]
        var lastKey = ""
        func flushEntry() {
            guard !entry.isEmpty else { return }
            if part == "enc" { current?.encryptions.append(entry) } else if part == "exp" { current?.exports.append(entry) }
            entry = [:]
        }
        for raw in lines {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.hasPrefix("## ") {
                flushEntry()
                if let c = current { result.append(c) }
                current = line.dropFirst(3).hasPrefix(prefix) ? RFC9180Case(title: String(line.dropFirst(3))) : nil
                part = ""
                continue
            }
            guard current != nil else { continue }
            if line.hasPrefix("### ") { flushEntry(); part = line == "### Base Setup Information" ? "setup" : ""; continue }
            if line.hasPrefix("#### ") {
                flushEntry()
                if part == "" { continue }
                part = line.contains("Encryptions") ? "enc" : (line.contains("Exported") ? "exp" : part)
                continue
            }
            if part == "" || line == "~~~" { continue }
            if line.isEmpty { flushEntry(); continue }
            if let colon = line.firstIndex(of: ":") {
                let key = String(line[..<colon])
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                lastKey = key
                if part == "setup" { current?.fields[key] = value } else { entry[key] = value }
            } else {
                // A hex value continued on the next line (lines break at any digit).
                if part == "setup" { current?.fields[lastKey]! += line } else { entry[lastKey]! += line }
            }
        }
        flushEntry()
        if let c = current { result.append(c) }
        return result
    }

    func f(_ key: String) throws -> [UInt8] {
        guard let v = fields[key] else { throw VectorError("\(title): missing \(key)") }
        return try hex(v)
    }
}

private func decimal(_ text: String?) -> Int { Int(text ?? "") ?? -1 }
private func bytes(_ e: [String: String], _ key: String) throws -> [UInt8] { try hex(e[key] ?? "") }

/// Moves both contexts to `seq` by sealing and opening empty messages (contexts only go forward).
private func advance(_ sender: HPKE.Context, _ recipient: HPKE.Context, to seq: UInt64) throws {
    while sender.sequenceNumber < seq { _ = try recipient.open(try sender.seal([])) }
    #expect(sender.sequenceNumber == seq && recipient.sequenceNumber == seq)
}

@Suite("HPKE (RFC 9180)")
struct HPKETests {
    @Test("RFC 9180 A.3 and A.5, DHKEM(P-256, HKDF-SHA256) base mode: keys, key schedule, encryptions, exports",
          .enabled(if: KexVectors.exists("draft-irtf-cfrg-hpke.md"), KexVectors.skipMessage("draft-irtf-cfrg-hpke.md")))
    func rfc9180P256() throws {
        let cases = try RFC9180Case.load(prefix: "DHKEM(P-256, HKDF-SHA256), HKDF-SHA256,")
        #expect(cases.count == 2)  // AES-128-GCM and ChaCha20Poly1305 (no P-256 + AES-256-GCM block is published)
        for c in cases {
            let aead: HPKE.AEAD = c.title.hasSuffix("AES-128-GCM") ? .aes128GCM : .chaCha20Poly1305
            let suite = HPKE.Ciphersuite(kem: .p256HKDFSHA256, aead: aead)
            let skR = try P256PrivateKey.derive(ikm: try c.f("ikmR"))
            #expect(skR.rawRepresentation.exportedBytes == (try c.f("skRm")), "\(c.title) skRm")
            #expect(skR.publicKeyX963 == (try c.f("pkRm")), "\(c.title) pkRm")
            let skE = try P256PrivateKey.derive(ikm: try c.f("ikmE"))
            #expect(skE.publicKeyX963 == (try c.f("pkEm")), "\(c.title) pkEm")
            let (enc, sender) = try HPKE.setupBaseSender(suite: suite, recipientPublicKey: try c.f("pkRm"), info: try c.f("info"), ephemeral: .p256(skE))
            #expect(enc == (try c.f("enc")))
            let recipient = try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(skR), encapsulatedKey: enc, info: try c.f("info"))
            for ctx in [sender, recipient] {
                #expect(ctx.schedule.sharedSecret.exportedBytes == (try c.f("shared_secret")), "\(c.title) shared_secret")
                #expect(ctx.schedule.keyScheduleContext == (try c.f("key_schedule_context")), "\(c.title) key_schedule_context")
                #expect(ctx.schedule.secret.exportedBytes == (try c.f("secret")), "\(c.title) secret")
                #expect(ctx.schedule.key.exportedBytes == (try c.f("key")), "\(c.title) key")
                #expect(ctx.schedule.baseNonce == (try c.f("base_nonce")), "\(c.title) base_nonce")
                #expect(ctx.schedule.exporterSecret.exportedBytes == (try c.f("exporter_secret")), "\(c.title) exporter_secret")
            }
            #expect(c.encryptions.count == 6)
            for e in c.encryptions {
                // The listed numbers skip some (0, 1, 2, 4, 255, 256): a context only moves
                // forward, so the gaps are filled with messages of our own.
                let seq = UInt64(decimal(e["sequence number"]))
                try advance(sender, recipient, to: seq)
                #expect(sender.currentNonce == (try bytes(e, "nonce")), "\(c.title) nonce \(seq)")
                let ct = try sender.seal(try bytes(e, "pt"), aad: try bytes(e, "aad"))
                #expect(ct == (try bytes(e, "ct")), "\(c.title) ct \(seq)")
                #expect(try recipient.open(try bytes(e, "ct"), aad: try bytes(e, "aad")) == (try bytes(e, "pt")), "\(c.title) open \(seq)")
            }
            #expect(c.exports.count == 3)
            for x in c.exports {
                let value = try recipient.exportSecret(context: try bytes(x, "exporter_context"), outputByteCount: decimal(x["L"]))
                #expect(value.exportedBytes == (try bytes(x, "exported_value")), "\(c.title) export")
            }
        }
    }

    @Test("hpke-pq: X-Wing (KEM 0x647a) with HKDF-SHA256: keys, encapsulation, key schedule, encryptions, exports",
          .enabled(if: KexVectors.exists("hpke-pq-test-vectors.json"), KexVectors.skipMessage("hpke-pq-test-vectors.json")))
    func hpkePQXWing() throws {
        let cases = try KexVectors.objects("hpke-pq-test-vectors.json").filter { ($0["kem_id"] as? Int) == 0x647a && ($0["kdf_id"] as? Int) == 1 }
        #expect(cases.count == 1)
        for c in cases {
            let aead = try #require(HPKE.AEAD(rawValue: UInt16(c["aead_id"] as! Int)))
            let suite = HPKE.Ciphersuite(kem: .xWing, aead: aead)
            #expect(suite.suiteID == (try hexField(c, "suite_id")))
            // skRm is the X-Wing seed (DeriveKeyPair from ikmR is not implemented: an accessory
            // never derives its key from an ikm). ikmE is the 64-byte encapsulation seed.
            let key = try XWing.PrivateKey(seed: try hexField(c, "skRm"))
            #expect(key.publicKey == (try hexField(c, "pkRm")))
            let info = try hexField(c, "info")
            let (enc, sender) = try HPKE.setupBaseSender(suite: suite, recipientPublicKey: key.publicKey, info: info,
                                                         ephemeral: .xWingSeed(try hexField(c, "ikmE")))
            #expect(enc == (try hexField(c, "enc")))
            let recipient = try HPKE.setupBaseRecipient(suite: suite, privateKey: .xWing(key), encapsulatedKey: try hexField(c, "enc"), info: info)
            for ctx in [sender, recipient] {
                #expect(ctx.schedule.sharedSecret.exportedBytes == (try hexField(c, "shared_secret")))
                #expect(ctx.schedule.key.exportedBytes == (try hexField(c, "key")))
                #expect(ctx.schedule.baseNonce == (try hexField(c, "base_nonce")))
                #expect(ctx.schedule.exporterSecret.exportedBytes == (try hexField(c, "exporter_secret")))
            }
            let encryptions = try #require(c["encryptions"] as? [[String: Any]])
            for e in encryptions {
                let nonce = try hexField(e, "nonce")
                while sender.currentNonce != nonce && sender.sequenceNumber < 1000 { try advance(sender, recipient, to: sender.sequenceNumber + 1) }
                let ct = try sender.seal(try hexField(e, "pt"), aad: try hexField(e, "aad"))
                #expect(ct == (try hexField(e, "ct")))
                #expect(try recipient.open(ct, aad: try hexField(e, "aad")) == (try hexField(e, "pt")))
            }
            let exports = try #require(c["exports"] as? [[String: Any]])
            #expect(exports.count == 5)
            for x in exports {
                let value = try recipient.exportSecret(context: try hexField(x, "exporter_context"), outputByteCount: x["L"] as! Int)
                #expect(value.exportedBytes == (try hexField(x, "exported_value")))
            }
        }
    }

    @Test("open refuses a modified ciphertext, a wrong AAD and a replayed sequence; wrong-suite keys and bad points are typed errors")
    func badInput() throws {
        let key = P256PrivateKey.generate()
        let suite = HPKE.Ciphersuite.p256SHA256AES256GCM
        var (enc, sender) = try HPKE.setupBaseSender(suite: suite, recipientPublicKey: key.publicKeyRaw, info: [1, 2])
        let recipient = try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(key), encapsulatedKey: enc, info: [1, 2])
        let ct = try sender.seal([9, 9, 9], aad: [7])
        var bad = ct
        bad[0] ^= 1
        #expect(throws: KeyExchangeError.authenticationFailed) { try recipient.open(bad, aad: [7]) }
        #expect(throws: KeyExchangeError.authenticationFailed) { try recipient.open(ct, aad: [8]) }
        #expect(throws: KeyExchangeError.authenticationFailed) { try recipient.open([1, 2, 3], aad: [7]) }
        #expect(try recipient.open(ct, aad: [7]) == [9, 9, 9])
        #expect(throws: KeyExchangeError.authenticationFailed) { try recipient.open(ct, aad: [7]) }  // seq moved on
        // Another info gives other keys.
        let other = try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(key), encapsulatedKey: enc, info: [1, 3])
        #expect(try other.exportSecret(context: [], outputByteCount: 32) != (try sender.exportSecret(context: [], outputByteCount: 32)))
        // enc not on the curve, and of the wrong length.
        enc[64] ^= 1
        #expect(throws: KeyExchangeError.invalidPublicKey(field: "encapsulatedKey")) {
            try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(key), encapsulatedKey: enc, info: [])
        }
        #expect(throws: KeyExchangeError.invalidLength(field: "encapsulatedKey", expected: 65, actual: 64)) {
            try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(key), encapsulatedKey: Array(enc.dropFirst()), info: [])
        }
        #expect(throws: KeyExchangeError.self) {
            try HPKE.setupBaseRecipient(suite: .xWingSHA256AES256GCM, privateKey: .p256(key), encapsulatedKey: [UInt8](repeating: 0, count: 1120), info: [])
        }
        #expect(throws: KeyExchangeError.invalidExportLength(8161)) { try sender.exportSecret(context: [], outputByteCount: 8161) }
        // P-256 private keys: 0 and n are refused.
        #expect(throws: KeyExchangeError.invalidPrivateKey(field: "privateKey")) { try P256PrivateKey(rawRepresentation: [UInt8](repeating: 0, count: 32)) }
        #expect(throws: KeyExchangeError.invalidPrivateKey(field: "privateKey")) { try P256PrivateKey(rawRepresentation: P256Curve.order) }
        var below = P256Curve.order
        below[31] -= 1
        #expect(throws: Never.self) { try P256PrivateKey(rawRepresentation: below) }
    }

    @Test("two seals from one context use two nonces, also through a second reference; the recipient opens them only in order")
    func sealsNeverReuseANonce() throws {
        let key = P256PrivateKey.generate()
        let suite = HPKE.Ciphersuite.p256SHA256AES256GCM
        let (enc, sender) = try HPKE.setupBaseSender(suite: suite, recipientPublicKey: key.publicKeyRaw, info: [5])
        let recipient = try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(key), encapsulatedKey: enc, info: [5])
        let plaintext: [UInt8] = Array("the same message".utf8)
        let nonce0 = sender.currentNonce
        let first = try sender.seal(plaintext)
        #expect(sender.currentNonce != nonce0)
        let first2 = try sender.seal(plaintext)
        // A second holder of the context (what a copied struct used to be) continues its count.
        let alias = sender
        let third = try alias.seal(plaintext)
        #expect(sender.sequenceNumber == 3)
        #expect(Set([first, first2, third]).count == 3, "AES-GCM under one key and nonce gives the same bytes for the same plaintext")
        #expect(throws: KeyExchangeError.authenticationFailed) { try recipient.open(first2) }
        #expect(recipient.sequenceNumber == 0, "a failed open does not move the sequence")
        for ct in [first, first2, third] { #expect(try recipient.open(ct) == plaintext) }
        #expect(throws: KeyExchangeError.authenticationFailed) { try recipient.open(first) }
    }

    @Test("threads sealing through one context get distinct sequence numbers: each number opens a different message")
    func concurrentSealsTakeDistinctNumbers() throws {
        let key = P256PrivateKey.generate()
        let suite = HPKE.Ciphersuite.p256SHA256AES256GCM
        let (enc, sender) = try HPKE.setupBaseSender(suite: suite, recipientPublicKey: key.publicKeyRaw, info: [6])
        let sealed = Mutex<[[UInt8]]>([])
        let count = 64
        DispatchQueue.concurrentPerform(iterations: count) { _ in
            if let ct = try? sender.seal([1, 2, 3]) { sealed.withLock { $0.append(ct) } }
        }
        var remaining = sealed.withLock { $0 }
        #expect(remaining.count == count && sender.sequenceNumber == UInt64(count))
        let recipient = try HPKE.setupBaseRecipient(suite: suite, privateKey: .p256(key), encapsulatedKey: enc, info: [6])
        // A failed open leaves the recipient's number alone, so each number is tried on every
        // message left: 64 numbers opening 64 different messages means no number was sealed twice.
        for seq in 0..<count {
            let opened = try #require(remaining.firstIndex { (try? recipient.open($0)) != nil }, "no message opens at sequence number \(seq)")
            remaining.remove(at: opened)
        }
        #expect(remaining.isEmpty && recipient.sequenceNumber == UInt64(count))
    }
}
