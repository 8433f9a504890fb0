import Ratchet
internal import Synchronization
internal import OpenSSLSupport

/// HPKE (RFC 9180) base mode for the two ciphersuites Apple's accessories use,
/// DHKEM(P-256, HKDF-SHA256) and X-Wing (KEM id 0x647a, as in draft-ietf-hpke-pq and CryptoKit),
/// each with HKDF-SHA256 and AES-256-GCM. AES-128-GCM, ChaCha20-Poly1305 and export-only are
/// here for the published test vectors. HKDF and the AEADs are the Ratchet module's.
public enum HPKE {
    public enum KEM: UInt16, Sendable {
        case p256HKDFSHA256 = 0x0010
        case xWing = 0x647a

        public var encapsulatedKeyLength: Int { self == .xWing ? XWing.ciphertextLength : P256Curve.uncompressedLength }
    }

    public enum KDF: UInt16, Sendable {
        case hkdfSHA256 = 0x0001
    }

    public enum AEAD: UInt16, Sendable {
        case aes128GCM = 0x0001
        case aes256GCM = 0x0002
        case chaCha20Poly1305 = 0x0003
        case exportOnly = 0xffff

        var cipher: AEADCipher? {
            switch self {
            case .aes128GCM: return .aes128GCM
            case .aes256GCM: return .aes256GCM
            case .chaCha20Poly1305: return .chaCha20Poly1305
            case .exportOnly: return nil
            }
        }
        var keyLength: Int { cipher?.keyLength ?? 0 }
        var nonceLength: Int { cipher == nil ? 0 : AEADCipher.nonceLength }
    }

    public struct Ciphersuite: Sendable, Equatable {
        public var kem: KEM
        public var kdf: KDF
        public var aead: AEAD
        public init(kem: KEM, kdf: KDF = .hkdfSHA256, aead: AEAD) {
            self.kem = kem; self.kdf = kdf; self.aead = aead
        }
        /// CryptoKit's .XWingMLKEM768X25519_SHA256_AES_GCM_256.
        public static let xWingSHA256AES256GCM = Ciphersuite(kem: .xWing, aead: .aes256GCM)
        /// CryptoKit's .P256_SHA256_AES_GCM_256.
        public static let p256SHA256AES256GCM = Ciphersuite(kem: .p256HKDFSHA256, aead: .aes256GCM)

        /// "HPKE" || kem_id || kdf_id || aead_id.
        public var suiteID: [UInt8] { Array("HPKE".utf8) + i2osp(kem.rawValue) + i2osp(kdf.rawValue) + i2osp(aead.rawValue) }
    }

    /// A recipient's private key.
    public enum PrivateKey: Sendable {
        case xWing(XWing.PrivateKey)
        case p256(P256PrivateKey)

        public var kem: KEM {
            switch self {
            case .xWing: return .xWing
            case .p256: return .p256HKDFSHA256
            }
        }
        /// The serialised public key HPKE uses (X-Wing 1216 bytes; P-256 65 bytes uncompressed).
        public var serializedPublicKey: [UInt8] {
            switch self {
            case let .xWing(k): return k.publicKey
            case let .p256(k): return k.publicKeyX963
            }
        }
        /// CryptoKit's publicKey.rawRepresentation (X-Wing 1216 bytes; P-256 x || y, 64 bytes).
        public var rawPublicKey: [UInt8] {
            switch self {
            case let .xWing(k): return k.publicKey
            case let .p256(k): return k.publicKeyRaw
            }
        }
    }

    /// Deterministic sender randomness, for test vectors and reproducible examples.
    public enum EphemeralInput: Sendable {
        /// X-Wing: eseed = m || ek_X (64 bytes).
        case xWingSeed([UInt8])
        /// DHKEM(P-256): the ephemeral private key.
        case p256(P256PrivateKey)
    }

    /// Every value of the base-mode key schedule (RFC 9180 5.1), kept so `relayctl accessory
    /// derive` can print them; the context itself needs only key, base_nonce and exporter_secret.
    public struct KeySchedule: Sendable {
        public let sharedSecret: SecretKey
        public let pskIDHash: [UInt8]
        public let infoHash: [UInt8]
        public let keyScheduleContext: [UInt8]
        public let secret: SecretKey
        public let key: SecretKey
        public let baseNonce: [UInt8]
        public let exporterSecret: SecretKey
    }

    /// An HPKE context (sender or recipient). A class, so every holder shares one sequence
    /// number: a copied value could seal twice under one nonce, which RFC 9180 5.2 forbids and
    /// AES-GCM does not survive. seal and open take the number under a lock, so threads sharing
    /// a context never use the same one either; it only moves forward.
    public final class Context: Sendable {
        public let suite: Ciphersuite
        public let schedule: KeySchedule
        private let sequence = Mutex<UInt64>(0)

        init(suite: Ciphersuite, schedule: KeySchedule) {
            self.suite = suite
            self.schedule = schedule
        }

        /// How many messages this context has sealed or opened.
        public var sequenceNumber: UInt64 { sequence.withLock { $0 } }

        /// Export(exporter_context, L) = LabeledExpand(exporter_secret, "sec", context, L).
        public func exportSecret(context: [UInt8], outputByteCount: Int) throws(KeyExchangeError) -> SecretKey {
            guard (1...HKDF.maximumOutputLength).contains(outputByteCount) else { throw .invalidExportLength(outputByteCount) }
            var secret = schedule.exporterSecret.exportedBytes
            defer { wipe(&secret) }
            var out = try labeledExpand(suite.suiteID, prk: secret, label: "sec", info: context, length: outputByteCount)
            defer { wipe(&out) }
            return SecretKey(bytes: out)
        }

        /// The nonce the next seal or open uses: base_nonce XOR I2OSP(seq, Nn).
        public var currentNonce: [UInt8] { nonce(sequenceNumber) }

        private func nonce(_ seq: UInt64) -> [UInt8] {
            var nonce = schedule.baseNonce
            var seq = seq
            var i = nonce.count - 1
            while seq != 0 && i >= 0 {
                nonce[i] ^= UInt8(truncatingIfNeeded: seq)
                seq >>= 8
                i -= 1
            }
            return nonce
        }

        public func seal(_ plaintext: [UInt8], aad: [UInt8] = []) throws(KeyExchangeError) -> [UInt8] {
            guard let cipher = suite.aead.cipher else { throw .unknownValue(field: "aead", value: "export-only") }
            return try sequence.withLock { seq throws(KeyExchangeError) -> [UInt8] in
                guard seq < UInt64.max else { throw .messageLimitReached }
                let ct: [UInt8]
                do { ct = try cipher.seal(plaintext, key: schedule.key, nonce: nonce(seq), aad: aad) } catch { throw .openSSL("\(error)") }
                seq += 1
                return ct
            }
        }

        /// A failed open leaves the sequence number where it was (RFC 9180 5.2).
        public func open(_ ciphertext: [UInt8], aad: [UInt8] = []) throws(KeyExchangeError) -> [UInt8] {
            guard let cipher = suite.aead.cipher else { throw .unknownValue(field: "aead", value: "export-only") }
            return try sequence.withLock { seq throws(KeyExchangeError) -> [UInt8] in
                guard seq < UInt64.max else { throw .messageLimitReached }
                let pt: [UInt8]
                do {
                    pt = try cipher.open(ciphertext, key: schedule.key, nonce: nonce(seq), aad: aad)
                } catch RatchetError.authenticationFailed {
                    throw .authenticationFailed
                } catch RatchetError.sealedBoxTooShort {
                    throw .authenticationFailed
                } catch {
                    throw .openSSL("\(error)")
                }
                seq += 1
                return pt
            }
        }
    }

    // MARK: Setup (RFC 9180 5.1.1, base mode)

    /// SetupBaseS: encapsulates to `recipientPublicKey` (X-Wing 1216 bytes; P-256 65 uncompressed
    /// or 64 raw) and returns enc with the sender's context.
    public static func setupBaseSender(suite: Ciphersuite, recipientPublicKey: [UInt8], info: [UInt8],
                                       ephemeral: EphemeralInput? = nil) throws(KeyExchangeError) -> (encapsulatedKey: [UInt8], context: Context) {
        let shared: SecretKey
        let enc: [UInt8]
        switch suite.kem {
        case .xWing:
            var seed: [UInt8]? = nil
            if case let .xWingSeed(s)? = ephemeral { seed = s }
            (shared, enc) = try XWing.encapsulate(publicKey: recipientPublicKey, encapsulationSeed: seed)
        case .p256HKDFSHA256:
            let pkR = try P256Curve.uncompressed(recipientPublicKey, field: "publicKey")
            var skE = P256PrivateKey.generate()
            if case let .p256(k)? = ephemeral { skE = k }
            var dh = try skE.sharedSecret(peer: pkR, peerField: "publicKey")
            defer { wipe(&dh) }
            enc = skE.publicKeyX963
            shared = try dhkemExtractAndExpand(dh: dh, kemContext: enc + pkR)
        }
        return (enc, try keySchedule(suite: suite, sharedSecret: shared, info: info))
    }

    /// SetupBaseR: decapsulates `encapsulatedKey` with the recipient's private key.
    public static func setupBaseRecipient(suite: Ciphersuite, privateKey: PrivateKey, encapsulatedKey enc: [UInt8],
                                          info: [UInt8]) throws(KeyExchangeError) -> Context {
        guard privateKey.kem == suite.kem else { throw .unknownValue(field: "ciphersuite", value: "\(suite.kem) with a \(privateKey.kem) key") }
        try checkLength(enc, suite.kem.encapsulatedKeyLength, "encapsulatedKey")
        let shared: SecretKey
        switch privateKey {
        case let .xWing(key):
            shared = try XWing.decapsulate(privateKey: key, ciphertext: enc)
        case let .p256(key):
            var dh = try key.sharedSecret(peer: enc, peerField: "encapsulatedKey")
            defer { wipe(&dh) }
            shared = try dhkemExtractAndExpand(dh: dh, kemContext: enc + key.publicKeyX963)
        }
        return try keySchedule(suite: suite, sharedSecret: shared, info: info)
    }

    /// KeySchedule(mode_base, shared_secret, info, psk = "", psk_id = "").
    public static func keySchedule(suite: Ciphersuite, sharedSecret: SecretKey, info: [UInt8]) throws(KeyExchangeError) -> Context {
        let id = suite.suiteID
        let pskIDHash = labeledExtract(id, salt: [], label: "psk_id_hash", ikm: [])
        let infoHash = labeledExtract(id, salt: [], label: "info_hash", ikm: info)
        let ksc = [UInt8(0)] + pskIDHash + infoHash
        var ss = sharedSecret.exportedBytes
        defer { wipe(&ss) }
        var secret = labeledExtract(id, salt: ss, label: "secret", ikm: [])
        defer { wipe(&secret) }
        var key: [UInt8] = suite.aead.keyLength > 0 ? try labeledExpand(id, prk: secret, label: "key", info: ksc, length: suite.aead.keyLength) : []
        defer { wipe(&key) }
        let nonce: [UInt8] = suite.aead.nonceLength > 0 ? try labeledExpand(id, prk: secret, label: "base_nonce", info: ksc, length: suite.aead.nonceLength) : []
        var exporter = try labeledExpand(id, prk: secret, label: "exp", info: ksc, length: 32)
        defer { wipe(&exporter) }
        let schedule = KeySchedule(sharedSecret: sharedSecret, pskIDHash: pskIDHash, infoHash: infoHash, keyScheduleContext: ksc,
                                   secret: SecretKey(bytes: secret), key: SecretKey(bytes: key), baseNonce: nonce,
                                   exporterSecret: SecretKey(bytes: exporter))
        return Context(suite: suite, schedule: schedule)
    }

    // MARK: DHKEM and the labeled KDF (RFC 9180 4 and 4.1)

    static func kemSuiteID(_ kem: KEM) -> [UInt8] { Array("KEM".utf8) + i2osp(kem.rawValue) }

    static func dhkemExtractAndExpand(dh: [UInt8], kemContext: [UInt8]) throws(KeyExchangeError) -> SecretKey {
        let suite = kemSuiteID(.p256HKDFSHA256)
        var prk = labeledExtract(suite, salt: [], label: "eae_prk", ikm: dh)
        defer { wipe(&prk) }
        var ss = try labeledExpand(suite, prk: prk, label: "shared_secret", info: kemContext, length: 32)
        defer { wipe(&ss) }
        return SecretKey(bytes: ss)
    }

    static let versionLabel = Array("HPKE-v1".utf8)

    /// LabeledExtract(salt, label, ikm) = Extract(salt, "HPKE-v1" || suite_id || label || ikm).
    static func labeledExtract(_ suiteID: [UInt8], salt: [UInt8], label: String, ikm: [UInt8]) -> [UInt8] {
        var labeled = versionLabel + suiteID + Array(label.utf8) + ikm
        defer { wipe(&labeled) }
        return HKDF.extract(salt: salt, ikm: labeled)
    }

    /// LabeledExpand(prk, label, info, L) = Expand(prk, I2OSP(L, 2) || "HPKE-v1" || suite_id || label || info, L).
    static func labeledExpand(_ suiteID: [UInt8], prk: [UInt8], label: String, info: [UInt8], length: Int) throws(KeyExchangeError) -> [UInt8] {
        guard (1...HKDF.maximumOutputLength).contains(length) else { throw .invalidExportLength(length) }
        let labeled = i2osp(UInt16(length)) + versionLabel + suiteID + Array(label.utf8) + info
        do { return try HKDF.expand(prk: prk, info: labeled, length: length) } catch { throw .openSSL("\(error)") }
    }
}

func i2osp(_ v: UInt16) -> [UInt8] { [UInt8(v >> 8), UInt8(v & 0xff)] }
