// `relayctl accessory derive`: every intermediate value of the accessory's derivation from given
// key material (for firmware teams checking their implementation; docs/key-exchange.md).
import Basics
import Foundation
import KeyExchange
import Ratchet
import RelayCore

extension AccessoryCommand {
    static func derive(_ args: ParsedArguments, _ console: Console) throws {
        let derived = try derivedAccessory(args)
        let schedule = derived.session.recipient.schedule
        let hpke = derived.suite.hpke
        let hpkeName = hpke == .xWingSHA256AES256GCM ? "XWingMLKEM768X25519_SHA256_AES_GCM_256" : "P256_SHA256_AES_GCM_256"
        let keyID = derived.session.keyID
        let steps = try keyScheduleSteps(derived)
        let h2aContext = String(decoding: AccessorySession.internetContext(.hostToAccessory, bluetoothIdentifier: derived.bluetooth), as: UTF8.self)
        let a2hContext = String(decoding: AccessorySession.internetContext(.accessoryToHost, bluetoothIdentifier: derived.bluetooth), as: UTF8.self)
        let (m0, _) = Ratchet.ratchetStep(chainKey: derived.accessoryToHostRoot, messageIndex: 0)
        let bluetoothKey = try bluetoothResponseKey(args, derived)

        if args.flag("json") {
            // docs/relayctl-json.md: bytes as lowercase hex strings, IDs as numbers, text as text.
            console.out(JSON.object([
                ("ciphersuite", .string(derived.suite.rawValue)),
                ("hpkeSuite", .object([("name", .string(hpkeName)), ("kemID", .number(Int64(hpke.kem.rawValue))),
                                       ("kdfID", .number(Int64(hpke.kdf.rawValue))), ("aeadID", .number(Int64(hpke.aead.rawValue)))])),
                ("protocolInfo", .object([("text", .string(derived.info.text)), ("hex", .string(derived.info.bytes.hexString))])),
                ("bluetoothUUID", .string(derived.bluetooth)),
                ("privateKey", .string(derived.key.privateKeyBytes.exportedBytes.hexString)),
                ("publicKey", .string(derived.key.publicKeyRaw.hexString)),
                ("keyID", .object([("hex", .string(keyID.hexString)), ("base64", .string(Base64.encode(keyID)))])),
                ("encapsulatedKey", .string(derived.encapsulatedKey.hexString)),
                ("steps", .array(steps.map { .object([("name", .string($0.name)), ("value", .string($0.value.hexString))]) })),
                ("contexts", .object([("hostToAccessory", .string(h2aContext)), ("accessoryToHost", .string(a2hContext))])),
                ("hostToAccessoryRoot", .string(derived.hostToAccessoryRoot.exportedBytes.hexString)),
                ("accessoryToHostRoot", .string(derived.accessoryToHostRoot.exportedBytes.hexString)),
                ("accessoryToHostMessageKey0", .string(m0.exportedBytes.hexString)),
                ("bluetooth", bluetoothKey.map { b in
                    .object([("featureID", .string(b.feature)), ("reading", .string(b.reading.rawValue)),
                             ("context", .string(b.context)), ("responseKey", .string(b.key.hexString))])
                } ?? .null),
            ]).rendered)
            return
        }
        var fields: [(String, String)] = [
            ("ciphersuite", "\(hpkeName) (KEM 0x\(hex16(hpke.kem.rawValue)), KDF 0x\(hex16(hpke.kdf.rawValue)), AEAD 0x\(hex16(hpke.aead.rawValue)))"),
            ("privateKey", derived.key.privateKeyBytes.exportedBytes.hexString),
            ("publicKey (raw representation)", derived.key.publicKeyRaw.hexString),
            ("keyID = SHA-384(publicKey)[0:4]", keyID.hexString + " (base64 " + Base64.encode(keyID) + ")"),
            ("encapsulatedKey", derived.encapsulatedKey.hexString),
        ]
        let kemSteps = steps.count - 9
        fields += steps[..<kemSteps].map { ($0.label, $0.value.hexString) }
        fields.append(("shared_secret", schedule.sharedSecret.exportedBytes.hexString))
        fields += [("protocolInfo (info)", derived.info.text), ("protocolInfo hex", derived.info.bytes.hexString)]
        fields += steps[(kemSteps + 1)...].map { ($0.label, $0.value.hexString) }
        fields += [
            ("context HostToAccessory", h2aContext),
            ("root HostToAccessory = Export(context, 32)", derived.hostToAccessoryRoot.exportedBytes.hexString),
            ("context AccessoryToHost", a2hContext),
            ("root AccessoryToHost = Export(context, 32)", derived.accessoryToHostRoot.exportedBytes.hexString),
            ("AccessoryToHost messageKey[0]", m0.exportedBytes.hexString),
        ]
        if let b = bluetoothKey {
            fields.append(("bluetooth context (\(b.reading.rawValue))", b.context))
            fields.append(("bluetooth response key = Export(context, 32)", b.key.hexString))
        }
        console.out(fields.map { "\($0.0): \($0.1)" }.joined(separator: "\n"))
    }

    /// The accessory to derive: from `--state`, or from the key material given as options.
    static func derivedAccessory(_ args: ParsedArguments) throws -> DerivedAccessory {
        var derived: DerivedAccessory
        if let path = args.optionalString("state") {
            for name in ["ciphersuite", "private-key", "public-key", "encapsulated-key", "device-uuid", "bluetooth-uuid"] where args.optionalString(name) != nil {
                throw UsageError("--\(name): not with --state (the state file holds the key material)")
            }
            let upper = try uppercaseUUIDs(args)
            let (stored, state) = try DerivedAccessory.load(statePath: path)
            derived = stored
            // protocolInfo and UUID spelling options re-derive the state's key material another way.
            if ["suite-name", "version", "identifier", "uuid-case"].contains(where: { args.optionalString($0) != nil }) {
                let info = ProtocolInfo(ciphersuite: args.optionalString("suite-name") ?? state.protocolInfo.ciphersuite,
                                        version: args.optionalString("version") ?? state.protocolInfo.version,
                                        identifier: args.optionalString("identifier") ?? state.protocolInfo.identifier)
                derived = try build(suite: stored.suite, privateKey: stored.key.privateKeyBytes.exportedBytes, publicKey: nil,
                                    encapsulatedKey: stored.encapsulatedKey, info: info,
                                    bluetooth: upper ? state.bluetoothUUID.uppercased() : state.bluetoothUUID.lowercased(),
                                    names: stateFieldNames(path))
            }
        } else {
            let suite = try ciphersuite(args)
            let upper = try uppercaseUUIDs(args)
            let device = try uuid(args, "device-uuid", upper: upper, random: false)
            let bluetooth = try uuid(args, "bluetooth-uuid", upper: upper, random: false)
            derived = try build(suite: suite, privateKey: try args.hex("private-key"), publicKey: try args.optionalHex("public-key"),
                                encapsulatedKey: try args.hex("encapsulated-key"),
                                info: protocolInfo(args, suite: suite, device: device), bluetooth: bluetooth)
        }
        return derived
    }

    /// Decapsulation, then RFC 9180's key schedule, each under a stable name (the draft's or
    /// the RFC's) for --json and under its formula for people; the key schedule's nine last.
    static func keyScheduleSteps(_ derived: DerivedAccessory) throws -> [(name: String, label: String, value: [UInt8])] {
        let schedule = derived.session.recipient.schedule
        let hpke = derived.suite.hpke
        var steps: [(name: String, label: String, value: [UInt8])] = []
        if case let .xWing(k) = derived.key {
            for (label, value) in try XWing.trace(privateKey: k, ciphertext: derived.encapsulatedKey) {
                steps.append((stepName(label), label, value))
            }
        } else if case let .p256(k) = derived.key {
            for (label, value) in try k.dhkemTrace(encapsulatedKey: derived.encapsulatedKey) {
                steps.append((stepName(label), label, value))
            }
        }
        steps += [
            ("shared_secret", "shared_secret", schedule.sharedSecret.exportedBytes),
            ("suite_id", "suite_id", hpke.suiteID),
            ("psk_id_hash", "psk_id_hash", schedule.pskIDHash),
            ("info_hash", "info_hash", schedule.infoHash),
            ("key_schedule_context", "key_schedule_context", schedule.keyScheduleContext),
            ("secret", "secret", schedule.secret.exportedBytes),
            ("key", "key", schedule.key.exportedBytes),
            ("base_nonce", "base_nonce", schedule.baseNonce),
            ("exporter_secret", "exporter_secret", schedule.exporterSecret.exportedBytes),
        ]
        return steps
    }

    /// `--feature-id`: the Bluetooth response key of that feature, with its context.
    static func bluetoothResponseKey(_ args: ParsedArguments, _ derived: DerivedAccessory) throws
        -> (reading: BluetoothContextReading, feature: String, context: String, key: [UInt8])? {
        if let feature = args.optionalString("feature-id") {
            let reading: BluetoothContextReading
            switch args.optionalString("bluetooth-reading") ?? "text" {
            case "text": reading = .text
            case "data-description": reading = .dataDescription
            case let other: throw UsageError("--bluetooth-reading: expected text or data-description, got '\(other)'")
            }
            let context = AccessorySession.bluetoothContext(protocolInfo: derived.info, featureID: feature, reading: reading)
            return (reading, feature, String(decoding: context, as: UTF8.self),
                    derived.session.bluetoothResponseSecret(featureID: feature, reading: reading).exportedBytes)
        }
        return nil
    }

    /// A KEM trace label ("ss_M = ML-KEM-768.Decaps(sk_M, ct_M)", "ML-KEM d = expanded[0:32]")
    /// -> its stable --json name ("ss_M", "d"): the draft's or RFC 9180's own name for the value.
    /// The DHKEM's output is "kem_shared_secret": "shared_secret" is the key schedule's input.
    static func stepName(_ label: String) -> String {
        var name = label.components(separatedBy: " = ")[0]
        if name.hasPrefix("ML-KEM ") { name.removeFirst("ML-KEM ".count) }
        if name.hasPrefix("shared_secret") || name == "ss" { return "kem_shared_secret" }
        if name.hasPrefix("eae_prk") { return "eae_prk" }
        return name
    }

    static func hex16(_ n: UInt16) -> String { [UInt8(n >> 8), UInt8(n & 0xff)].hexString }
}
