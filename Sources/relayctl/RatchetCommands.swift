// `relayctl ratchet ...`: compute and check Symmetric Key Ratchet values by hand, for firmware
// developers comparing their C implementation and for operators debugging a stuck accessory.
import Foundation
import Ratchet

extension RelayCtl {
    static var ratchet: Command {
        .group("ratchet", "Compute and check Apple Symmetric Key Ratchet values (docs/ratchet.md).", [
            ratchetStep, ratchetChain, ratchetKeyID, ratchetSeal, ratchetOpen, ratchetBody,
        ])
    }

    static let maximumChainCount = 100_000

    static var ratchetStep: Command {
        .leaf("step", "One ratchet step: the message key and the next chain key.",
              discussion: "HKDF-SHA256 expand only, PRK = chain key, info = \"AccessoryTransportSecurity-RatchetKeys-\" || index (4 bytes little-endian), 64 bytes out.",
              options: [.value("chain-key", "64 hex", "The chain key for this index (32 bytes)."),
                        .value("index", "n", "The message index, 0...4294967295.")]) { args, console in
            let chainKey = SecretKey(bytes: try args.hex("chain-key", length: 32))
            let index = try args.uint32("index")
            let (messageKey, next) = Ratchet.ratchetStep(chainKey: chainKey, messageIndex: index)
            let m = messageKey.exportedBytes.hexString, n = next.exportedBytes.hexString
            if args.flag("json") {
                console.out(JSON.object([("index", .number(Int64(index))), ("messageKey", .string(m)), ("nextChainKey", .string(n))]).rendered)
            } else {
                console.out("messageKey:   \(m)\nnextChainKey: \(n)")
            }
        }
    }

    static var ratchetChain: Command {
        .leaf("chain", "The first n steps from a root secret (chain key 0).",
              options: [.value("root-key", "64 hex", "The 32-byte root secret exported from HPKE."),
                        .value("count", "n", "How many steps, 1...\(maximumChainCount).")]) { args, console in
            var chainKey = SecretKey(bytes: try args.hex("root-key", length: 32))
            let count = try args.int("count", in: 1...maximumChainCount)
            var steps: [JSON] = []
            var lines: [String] = []
            for i in 0..<count {
                let index = UInt32(i)
                let (messageKey, next) = Ratchet.ratchetStep(chainKey: chainKey, messageIndex: index)
                let c = chainKey.exportedBytes.hexString, m = messageKey.exportedBytes.hexString, n = next.exportedBytes.hexString
                if args.flag("json") {
                    steps.append(.object([("index", .number(Int64(i))), ("chainKey", .string(c)),
                                          ("messageKey", .string(m)), ("nextChainKey", .string(n))]))
                } else {
                    lines.append("\(i) chainKey=\(c) messageKey=\(m) nextChainKey=\(n)")
                }
                chainKey = next
            }
            console.out(args.flag("json") ? JSON.object([("steps", .array(steps))]).rendered : lines.joined(separator: "\n"))
        }
    }

    static var ratchetKeyID: Command {
        .leaf("keyid", "The ratchet keyID: first 4 bytes of SHA-384 of the accessory public key.",
              options: [.value("public-key", "hex", "The public key's raw representation (X-Wing 1216 bytes, P-256 64 bytes).")]) { args, console in
            let id = keyID(publicKey: try args.hex("public-key", allowEmpty: false))
            let b64 = Data(id).base64EncodedString()
            if args.flag("json") {
                console.out(JSON.object([("keyID", .string(b64)), ("keyIDHex", .string(id.hexString))]).rendered)
            } else {
                console.out("keyID:    \(b64)\nkeyIDHex: \(id.hexString)")
            }
        }
    }

    static var ratchetSeal: Command {
        .leaf("seal", "AES-256-GCM seal; prints the combined box nonce || ciphertext || tag as base64.",
              discussion: "Without --nonce a random 12-byte nonce is used. A fixed nonce is for reproducing test vectors only: never seal two messages with one key and one nonce.",
              options: [.value("key", "64 hex", "The 32-byte message key."),
                        .value("plaintext", "hex", "The bytes to seal (may be empty)."),
                        .value("nonce", "24 hex", "A fixed 12-byte nonce.", required: false),
                        .value("aad", "hex", "Additional authenticated data (Apple's sample uses none).", required: false)]) { args, console in
            let key = SecretKey(bytes: try args.hex("key", length: 32))
            let plaintext = try args.hex("plaintext")
            let nonce = try args.optionalHex("nonce", length: 12)
            let aad = try args.optionalHex("aad") ?? []
            let sealed: [UInt8]
            do {
                sealed = try AESGCM.seal(plaintext, key: key, nonce: nonce, aad: aad)
            } catch {
                throw RuntimeFailure("seal failed: \(error)")
            }
            let b64 = Data(sealed).base64EncodedString()
            if args.flag("json") {
                console.out(JSON.object([("sealed", .string(b64)), ("sealedHex", .string(sealed.hexString))]).rendered)
            } else {
                console.out("sealed: \(b64)")
            }
        }
    }

    static var ratchetOpen: Command {
        .leaf("open", "AES-256-GCM open of a combined box; exit 1 if it does not authenticate.",
              options: [.value("key", "64 hex", "The 32-byte message key."),
                        .value("sealed", "base64", "nonce || ciphertext || tag, base64 (as in encryptedData)."),
                        .value("aad", "hex", "Additional authenticated data.", required: false)]) { args, console in
            let key = SecretKey(bytes: try args.hex("key", length: 32))
            let sealed = try args.base64("sealed")
            guard sealed.count >= AESGCM.overhead else {
                throw UsageError("--sealed: \(sealed.count) bytes is shorter than nonce (12) + tag (16)")
            }
            let aad = try args.optionalHex("aad") ?? []
            let plaintext: [UInt8]
            do {
                plaintext = try AESGCM.open(sealed, key: key, aad: aad)
            } catch RatchetError.authenticationFailed {
                throw RuntimeFailure("open failed: the tag does not verify (wrong key, wrong AAD or modified data)")
            } catch {
                throw RuntimeFailure("open failed: \(error)")
            }
            if args.flag("json") {
                console.out(JSON.object([("plaintext", .string(plaintext.hexString))]).rendered)
            } else {
                console.out("plaintext: \(plaintext.hexString)")
            }
        }
    }

    static var ratchetBody: Command {
        .group("body", "Encode or check a response body (the plaintext inside the sealed box).",
               discussion: "Format (ours; Apple leaves it open): 2-byte big-endian length + UTF-8 for notification identifier, source identifier, action identifier and optional user text.",
               [ratchetBodyEncode, ratchetBodyDecode])
    }

    static var ratchetBodyEncode: Command {
        .leaf("encode", "Encode a response body; prints it as hex.",
              options: [.value("notification-id", "text", "The notification identifier (non-empty)."),
                        .value("source-id", "text", "The source app's bundle identifier (non-empty)."),
                        .value("action-id", "text", "The action identifier (non-empty)."),
                        .value("user-text", "text", "Text the person typed (text-input actions only).", required: false)]) { args, console in
            let body = NotificationResponseBody(notificationIdentifier: try args.string("notification-id"),
                                                sourceIdentifier: try args.string("source-id"),
                                                actionIdentifier: try args.string("action-id"),
                                                userText: args.optionalString("user-text"))
            let bytes: [UInt8]
            do {
                bytes = try body.encoded()
            } catch let error as RatchetError {
                throw UsageError("cannot encode: \(error)")
            }
            if args.flag("json") {
                console.out(JSON.object([("body", .string(bytes.hexString))]).rendered)
            } else {
                console.out("body: \(bytes.hexString)")
            }
        }
    }

    static var ratchetBodyDecode: Command {
        .leaf("decode", "Decode and strictly check a response body given as hex; exit 1 if it is malformed.",
              options: [.value("body", "hex", "The body bytes (e.g. the plaintext printed by 'ratchet open').")]) { args, console in
            let bytes = try args.hex("body")
            let body: NotificationResponseBody
            do {
                body = try NotificationResponseBody(decoding: bytes)
            } catch {
                throw RuntimeFailure("malformed body: \(error)")
            }
            if args.flag("json") {
                console.out(JSON.object([("notificationIdentifier", .string(body.notificationIdentifier)),
                                         ("sourceIdentifier", .string(body.sourceIdentifier)),
                                         ("actionIdentifier", .string(body.actionIdentifier)),
                                         ("userText", body.userText.map(JSON.string) ?? .null)]).rendered)
            } else {
                var lines = ["notificationIdentifier: \(body.notificationIdentifier)",
                             "sourceIdentifier:       \(body.sourceIdentifier)",
                             "actionIdentifier:       \(body.actionIdentifier)"]
                if let text = body.userText { lines.append("userText:               \(text)") }
                console.out(lines.joined(separator: "\n"))
            }
        }
    }
}
