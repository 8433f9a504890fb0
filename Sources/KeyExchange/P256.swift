import Ratchet
internal import OpenSSLSupport

/// A P-256 key-agreement private key in CryptoKit's representations: rawRepresentation is the
/// 32-byte scalar; the public key's rawRepresentation is x || y (64 bytes) and its
/// x963Representation 04 || x || y (65 bytes, what HPKE serialises).
public final class P256PrivateKey: Sendable {
    public let rawRepresentation: SecretKey
    public let publicKeyX963: [UInt8]
    public var publicKeyRaw: [UInt8] { Array(publicKeyX963[1...]) }

    /// A 32-byte big-endian scalar in 1...n-1.
    public init(rawRepresentation raw: [UInt8]) throws(KeyExchangeError) {
        try checkLength(raw, P256Curve.scalarLength, "privateKey")
        publicKeyX963 = try P256Curve.publicKey(scalar: raw)
        rawRepresentation = SecretKey(bytes: raw)
    }

    public static func generate() -> P256PrivateKey {
        while true {
            var raw = SecureRandom.bytes(32)
            defer { wipe(&raw) }
            if let key = try? P256PrivateKey(rawRepresentation: raw) { return key }
        }
    }

    /// RFC 9180 7.1.3 DeriveKeyPair for DHKEM(P-256, HKDF-SHA256).
    public static func derive(ikm: [UInt8]) throws(KeyExchangeError) -> P256PrivateKey {
        let suite = HPKE.kemSuiteID(.p256HKDFSHA256)
        var prk = HPKE.labeledExtract(suite, salt: [], label: "dkp_prk", ikm: ikm)
        defer { wipe(&prk) }
        for counter in 0..<256 {
            var candidate = try HPKE.labeledExpand(suite, prk: prk, label: "candidate", info: [UInt8(counter)], length: 32)
            defer { wipe(&candidate) }
            if P256Curve.isValidScalar(candidate) { return try P256PrivateKey(rawRepresentation: candidate) }
        }
        throw .openSSL("DeriveKeyPair: no valid candidate")  // probability ~2^-8000
    }

    func sharedSecret(peer: [UInt8], peerField: String) throws(KeyExchangeError) -> [UInt8] {
        var raw = rawRepresentation.exportedBytes
        defer { wipe(&raw) }
        return try P256Curve.sharedSecret(scalar: raw, peer: peer, peerField: peerField)
    }
}

extension P256PrivateKey {
    /// DHKEM(P-256, HKDF-SHA256) Decap's intermediate values (RFC 9180 4.1), for `relayctl
    /// accessory derive` and docs/key-exchange.md. Secret values: diagnostics only.
    public func dhkemTrace(encapsulatedKey enc: [UInt8]) throws(KeyExchangeError) -> [(name: String, value: [UInt8])] {
        let dh = try sharedSecret(peer: enc, peerField: "encapsulatedKey")
        let kemContext = enc + publicKeyX963
        let suite = HPKE.kemSuiteID(.p256HKDFSHA256)
        let prk = HPKE.labeledExtract(suite, salt: [], label: "eae_prk", ikm: dh)
        return [
            ("pkRm = 04 || x || y", publicKeyX963),
            ("dh = x(skR * enc)", dh),
            ("kem_context = enc || pkRm", kemContext),
            ("eae_prk = LabeledExtract(\"\", \"eae_prk\", dh) with suite_id \"KEM\" 00 10", prk),
            ("shared_secret = LabeledExpand(eae_prk, \"shared_secret\", kem_context, 32)",
             try HPKE.labeledExpand(suite, prk: prk, label: "shared_secret", info: kemContext, length: 32)),
        ]
    }
}
