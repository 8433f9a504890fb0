// kex-tool: the KeyExchange module driven by scripts, not people.
//   kex-tool crosscheck < cases.json > answers.json   (scripts/kex-crosscheck.py)
//   kex-tool bench [seconds]                           (scripts/bench-kex.sh)
import Foundation
import KeyExchange
import Ratchet

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("kex-tool: \(message)\n".utf8))
    exit(64)
}

func bytes(_ o: [String: Any], _ key: String) -> [UInt8] {
    guard let s = o[key] as? String, let b = [UInt8](hex: s) else { fail("case field \(key): missing or not hex") }
    return b
}

/// For each case: the accessory's public key from its private key, Python's HPKE message opened
/// as the accessory, the internet roots and keyID, and a message of our own as the iPhone (enc,
/// sealed plaintext, the iPhone-side roots) for Python to check.
func crosscheck() {
    let input = FileHandle.standardInput.readDataToEndOfFile()
    guard let cases = (try? JSONSerialization.jsonObject(with: input)) as? [[String: Any]] else { fail("stdin: not a JSON list of objects") }
    var answers: [[String: Any]] = []
    for c in cases {
        guard let suiteName = c["suite"] as? String, let suite = AccessoryCiphersuite(rawValue: suiteName) else { fail("case field suite") }
        let info = ProtocolInfo(ciphersuite: suite.defaultName, identifier: c["device"] as? String ?? "")
        let bluetooth = c["bluetooth"] as? String ?? ""
        var answer: [String: Any] = [:]
        do {
            let key = try AccessoryPrivateKey(suite, privateKey: bytes(c, "private"))
            answer["public"] = key.publicKeyRaw.hexString
            answer["keyID"] = key.publicKeyRaw.isEmpty ? "" : Ratchet.keyID(publicKey: key.publicKeyRaw).hexString
            // Python's single-shot HPKE message: enc || AES-256-GCM(seq 0, aad "").
            let message = bytes(c, "pythonMessage")
            let encLength = suite.hpke.kem.encapsulatedKeyLength
            var session = try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: Array(message[0..<encLength]))
            answer["pythonPlaintext"] = (try? session.recipient.open(Array(message[encLength...])))?.hexString ?? "open failed"
            answer["rootAccessoryToHost"] = session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth).exportedBytes.hexString
            answer["rootHostToAccessory"] = session.internetRoot(.hostToAccessory, bluetoothIdentifier: bluetooth).exportedBytes.hexString
            // Our message to the same key, as the iPhone.
            let (enc, sender) = try AccessorySession.hostEncapsulate(ciphersuite: suite, accessoryPublicKey: key.publicKeyRaw, protocolInfo: info)
            answer["swiftMessage"] = (enc + (try sender.seal(bytes(c, "plaintext")))).hexString
            answer["swiftRootAccessoryToHost"] = try sender.exportSecret(context: AccessorySession.internetContext(.accessoryToHost, bluetoothIdentifier: bluetooth), outputByteCount: 32).exportedBytes.hexString
            answer["swiftRootHostToAccessory"] = try sender.exportSecret(context: AccessorySession.internetContext(.hostToAccessory, bluetoothIdentifier: bluetooth), outputByteCount: 32).exportedBytes.hexString
            session = try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: enc)
            answer["swiftRootsAgree"] = session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetooth).exportedBytes.hexString == answer["swiftRootAccessoryToHost"] as? String
        } catch {
            answer["error"] = "\(error)"
        }
        answers.append(answer)
    }
    let out = try! JSONSerialization.data(withJSONObject: answers, options: [.sortedKeys])
    FileHandle.standardOutput.write(out)
}

/// Operations per second for `seconds` each: X-Wing keygen (from a seed), encaps, decaps, and
/// HPKE export (one 32-byte export from an established context). One line of JSON.
func bench(seconds: Double) {
    func rate(_ body: () throws -> Void) -> Double {
        var n = 0
        let start = Date()
        var elapsed = 0.0
        repeat {
            for _ in 0..<10 { try! body() }
            n += 10
            elapsed = Date().timeIntervalSince(start)
        } while elapsed < seconds
        return Double(n) / elapsed
    }
    let seed = [UInt8](repeating: 0x42, count: 32)
    let key = try! XWing.PrivateKey(seed: seed)
    let (_, ct) = try! XWing.encapsulate(publicKey: key.publicKey)
    let (_, context) = try! HPKE.setupBaseSender(suite: .xWingSHA256AES256GCM, recipientPublicKey: key.publicKey, info: Array("XWing-v1-x".utf8))
    let ctx = Array("AccessoryInternetKey-AccessoryToHost-x".utf8)
    let results: [(String, Double)] = [
        ("xwingKeygen", rate { _ = try XWing.PrivateKey(seed: seed) }),
        ("xwingEncaps", rate { _ = try XWing.encapsulate(publicKey: key.publicKey) }),
        ("xwingDecaps", rate { _ = try XWing.decapsulate(privateKey: key, ciphertext: ct) }),
        ("hpkeExport", rate { _ = try context.exportSecret(context: ctx, outputByteCount: 32) }),
    ]
    print("{" + results.map { "\"\($0.0)\": \(Int($0.1))" }.joined(separator: ", ") + "}")
}

/// `count` runs of one operation, nothing else: for callgrind instruction counts.
func runOne(_ op: String, _ count: Int) {
    let key = try! XWing.PrivateKey(seed: [UInt8](repeating: 0x42, count: 32))
    let (_, ct) = try! XWing.encapsulate(publicKey: key.publicKey)
    for _ in 0..<count {
        switch op {
        case "keygen": _ = try! XWing.PrivateKey(seed: [UInt8](repeating: 0x42, count: 32))
        case "encaps": _ = try! XWing.encapsulate(publicKey: key.publicKey)
        case "decaps": _ = try! XWing.decapsulate(privateKey: key, ciphertext: ct)
        default: fail("run: keygen|encaps|decaps")
        }
    }
}

let args = CommandLine.arguments.dropFirst()
switch args.first {
case "crosscheck": crosscheck()
case "run": runOne(args.dropFirst().first ?? "", args.dropFirst(2).first.flatMap(Int.init) ?? 100)
case "bench": bench(seconds: args.dropFirst().first.flatMap(Double.init) ?? 2)
default: fail("usage: kex-tool crosscheck < cases.json | kex-tool bench [seconds] | kex-tool run keygen|encaps|decaps [count]")
}
