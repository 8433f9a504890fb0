/// Every failure the KeyExchange module reports. Cases name the field and carry lengths, never
/// key material, so they are safe to log and to print in a CLI message.
public enum KeyExchangeError: Error, Equatable, Sendable, CustomStringConvertible {
    /// An input had the wrong length (`field` as the API names it: "seed", "publicKey", ...).
    case invalidLength(field: String, expected: Int, actual: Int)
    /// An ML-KEM encapsulation key whose coefficients are not all below q (FIPS 203 7.2 check).
    case invalidEncapsulationKey
    /// An ML-KEM decapsulation key whose embedded H(ek) does not match (FIPS 203 7.3 check).
    case invalidDecapsulationKey
    /// A public key or encapsulated key that is not a valid point (P-256 off the curve, an X25519
    /// point of small order giving an all-zero secret).
    case invalidPublicKey(field: String)
    /// A private key outside its valid range (P-256: 0 or >= the group order).
    case invalidPrivateKey(field: String)
    /// A public key given with a seed that does not derive it.
    case publicKeyMismatch
    /// An HPKE context has used all 2^96-1 nonces for its key.
    case messageLimitReached
    /// An export longer than 255 * 32 bytes (HKDF-SHA256's limit).
    case invalidExportLength(Int)
    /// HPKE open: the AEAD tag did not verify.
    case authenticationFailed
    /// A ciphersuite, version or reading not known to this module.
    case unknownValue(field: String, value: String)
    /// OpenSSL failed; the text is OpenSSL's own message.
    case openSSL(String)
    /// A state file's field that must be hexadecimal is not.
    case notHexadecimal(field: String)
    /// A state file's stored ratchet roots are not those its key material derives.
    case storedRootsMismatch

    public var description: String {
        switch self {
        case let .invalidLength(field, expected, actual): return "\(field): \(actual) bytes, expected \(expected)"
        case .invalidEncapsulationKey: return "ML-KEM encapsulation key: a coefficient is not below q (3329)"
        case .invalidDecapsulationKey: return "ML-KEM decapsulation key: its hash of the encapsulation key does not match"
        case let .invalidPublicKey(field): return "\(field): not a valid public key"
        case let .invalidPrivateKey(field): return "\(field): not a valid private key"
        case .publicKeyMismatch: return "publicKey: does not match the one the seed derives"
        case .messageLimitReached: return "HPKE: message limit reached"
        case let .invalidExportLength(n): return "export length \(n): must be 1...8160"
        case .authenticationFailed: return "HPKE open: the tag does not verify"
        case let .unknownValue(field, value): return "\(field): unknown value \"\(value)\""
        case let .openSSL(text): return "OpenSSL: \(text)"
        case let .notHexadecimal(field): return "\(field): not hexadecimal"
        case .storedRootsMismatch: return "the stored ratchet roots do not match the key material (file corrupt or edited)"
        }
    }
}

@inline(__always)
func checkLength(_ bytes: [UInt8], _ expected: Int, _ field: String) throws(KeyExchangeError) {
    guard bytes.count == expected else { throw .invalidLength(field: field, expected: expected, actual: bytes.count) }
}
