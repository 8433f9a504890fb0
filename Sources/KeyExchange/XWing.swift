import Ratchet
internal import OpenSSLSupport

/// X-Wing (draft-connolly-cfrg-xwing-kem, the version of the vectors in shared/vectors/kex and of
/// CryptoKit's XWingMLKEM768X25519): ML-KEM-768 + X25519 with a SHA3-256 combiner.
///
///     expanded = SHAKE256(seed, 96)
///     (pk_M, sk_M) = ML-KEM-768.KeyGen_internal(expanded[0:32], expanded[32:64])
///     sk_X = expanded[64:96], pk_X = X25519(sk_X, 9)
///     pk = pk_M || pk_X (1216 bytes), ct = ct_M || ct_X (1120 bytes)
///     ss = SHA3-256(ss_M || ss_X || ct_X || pk_X || "\.//^\")
public enum XWing {
    public static let seedLength = 32
    public static let publicKeyLength = 1216
    public static let ciphertextLength = 1120
    public static let sharedSecretLength = 32
    /// Encapsulation randomness: m for ML-KEM (32) || the X25519 ephemeral private key (32).
    public static let encapsulationSeedLength = 64
    /// The combiner's label, the 6 ASCII bytes \.//^\ (5c 2e 2f 2f 5e 5c).
    public static let label: [UInt8] = [0x5c, 0x2e, 0x2f, 0x2f, 0x5e, 0x5c]

    /// An X-Wing private key: the 32-byte seed (CryptoKit's seedRepresentation) and what it expands to.
    public final class PrivateKey: Sendable {
        /// The 32-byte seed: the only thing to persist.
        public let seed: SecretKey
        let mlkem: SecretKey
        let x25519: X25519Key
        /// pk_M || pk_X, CryptoKit's publicKey.rawRepresentation.
        public let publicKey: [UInt8]

        /// Expands a 32-byte seed.
        public init(seed: [UInt8]) throws(KeyExchangeError) {
            try checkLength(seed, seedLength, "seed")
            var expanded = Keccak.shake256(seed, count: 96)
            defer { wipe(&expanded) }
            let (ekM, dkM) = try MLKEM768.generateKeyPair(d: Array(expanded[0..<32]), z: Array(expanded[32..<64]))
            var skX = Array(expanded[64..<96])
            defer { wipe(&skX) }
            let x = try X25519Key(privateKey: skX)
            self.seed = SecretKey(bytes: seed)
            self.mlkem = dkM
            self.x25519 = x
            self.publicKey = ekM + x.publicKey
        }

        /// CryptoKit's init(seedRepresentation:publicKey:): the seed, checked against the public
        /// key stored beside it (a mismatch means the stored pair is corrupt).
        public convenience init(seed: [UInt8], publicKey: [UInt8]) throws(KeyExchangeError) {
            try checkLength(publicKey, publicKeyLength, "publicKey")
            try self.init(seed: seed)
            guard constantTimeEqual(self.publicKey, publicKey) else { throw .publicKeyMismatch }
        }

        /// A fresh key pair from OpenSSL's RNG.
        public static func generate() -> PrivateKey {
            var seed = SecureRandom.bytes(seedLength)
            defer { wipe(&seed) }
            // A 32-byte seed always expands (X25519 accepts every 32-byte scalar).
            return try! PrivateKey(seed: seed)
        }
    }

    /// Encapsulate(pk) with eseed = m || ek_X (EncapsulateDerand; random when nil).
    public static func encapsulate(publicKey pk: [UInt8], encapsulationSeed: [UInt8]? = nil) throws(KeyExchangeError) -> (sharedSecret: SecretKey, ciphertext: [UInt8]) {
        try checkLength(pk, publicKeyLength, "publicKey")
        var eseed = encapsulationSeed ?? SecureRandom.bytes(encapsulationSeedLength)
        defer { wipe(&eseed) }
        try checkLength(eseed, encapsulationSeedLength, "encapsulationSeed")
        let pkM = Array(pk[0..<MLKEM768.encapsulationKeyLength])
        let pkX = Array(pk[MLKEM768.encapsulationKeyLength...])
        var ekX = Array(eseed[32..<64])
        defer { wipe(&ekX) }
        let ephemeral = try X25519Key(privateKey: ekX)
        let ctX = ephemeral.publicKey
        var ssX = try ephemeral.sharedSecret(peer: pkX, peerField: "publicKey")
        defer { wipe(&ssX) }
        let (ssM, ctM) = try MLKEM768.encapsulate(encapsulationKey: pkM, m: Array(eseed[0..<32]))
        return (combine(ssM, ssX, ctX, pkX), ctM + ctX)
    }

    /// Decapsulate(sk, ct). A corrupted ct_M gives a different (pseudo-random) secret through
    /// ML-KEM's implicit rejection; a ct_X of small order is refused by OpenSSL's X25519 and
    /// comes back as `.invalidPublicKey(field: "encapsulatedKey")`.
    public static func decapsulate(privateKey: PrivateKey, ciphertext ct: [UInt8]) throws(KeyExchangeError) -> SecretKey {
        try checkLength(ct, ciphertextLength, "encapsulatedKey")
        let ctM = Array(ct[0..<MLKEM768.ciphertextLength])
        let ctX = Array(ct[MLKEM768.ciphertextLength...])
        let ssM = try MLKEM768.decapsulate(decapsulationKey: privateKey.mlkem, ciphertext: ctM)
        var ssX = try privateKey.x25519.sharedSecret(peer: ctX, peerField: "encapsulatedKey")
        defer { wipe(&ssX) }
        return combine(ssM, ssX, ctX, Array(privateKey.publicKey[MLKEM768.encapsulationKeyLength...]))
    }

    static func combine(_ ssM: SecretKey, _ ssX: [UInt8], _ ctX: [UInt8], _ pkX: [UInt8]) -> SecretKey {
        var m = ssM.exportedBytes
        defer { wipe(&m) }
        var ss = Keccak.sha3_256(m, ssX, ctX, pkX, label)
        defer { wipe(&ss) }
        return SecretKey(bytes: ss)
    }
}

extension XWing {
    /// Every intermediate value of decapsulation, named as the draft names them, for
    /// `relayctl accessory derive` and docs/key-exchange.md. Secret values: diagnostics only.
    public static func trace(privateKey: PrivateKey, ciphertext ct: [UInt8]) throws(KeyExchangeError) -> [(name: String, value: [UInt8])] {
        try checkLength(ct, ciphertextLength, "encapsulatedKey")
        let expanded = Keccak.shake256(privateKey.seed.exportedBytes, count: 96)
        let ctM = Array(ct[0..<MLKEM768.ciphertextLength]), ctX = Array(ct[MLKEM768.ciphertextLength...])
        let pkX = Array(privateKey.publicKey[MLKEM768.encapsulationKeyLength...])
        let ssM = try MLKEM768.decapsulate(decapsulationKey: privateKey.mlkem, ciphertext: ctM).exportedBytes
        let ssX = try privateKey.x25519.sharedSecret(peer: ctX, peerField: "encapsulatedKey")
        return [
            ("expanded = SHAKE256(seed, 96)", expanded),
            ("ML-KEM d = expanded[0:32]", Array(expanded[0..<32])),
            ("ML-KEM z = expanded[32:64]", Array(expanded[32..<64])),
            ("sk_X = expanded[64:96]", Array(expanded[64..<96])),
            ("pk_M = publicKey[0:1184]", Array(privateKey.publicKey[0..<MLKEM768.encapsulationKeyLength])),
            ("pk_X = publicKey[1184:1216]", pkX),
            ("ct_M = encapsulatedKey[0:1088]", ctM),
            ("ct_X = encapsulatedKey[1088:1120]", ctX),
            ("ss_M = ML-KEM-768.Decaps(sk_M, ct_M)", ssM),
            ("ss_X = X25519(sk_X, ct_X)", ssX),
            ("label", label),
            ("ss = SHA3-256(ss_M || ss_X || ct_X || pk_X || label)", Keccak.sha3_256(ssM, ssX, ctX, pkX, label)),
        ]
    }
}
