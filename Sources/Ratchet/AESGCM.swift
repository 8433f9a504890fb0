internal import OpenSSLSupport

/// AES-256-GCM with CryptoKit's "combined" sealed-box layout: nonce(12) || ciphertext || tag(16).
public enum AESGCM {
    public static let nonceLength = 12
    public static let tagLength = 16
    public static let keyLength = 32
    /// Bytes a sealed box adds to its plaintext.
    public static let overhead = nonceLength + tagLength

    /// Encrypts and authenticates `plaintext` (and `aad`, which is authenticated but not sent).
    /// Without `nonce`, 12 fresh bytes come from OpenSSL's RNG, which is what callers want:
    /// a fixed nonce is only for known-answer tests.
    public static func seal(_ plaintext: [UInt8], key: SecretKey, nonce: [UInt8]? = nil, aad: [UInt8] = []) throws -> [UInt8] {
        guard key.count == keyLength else { throw RatchetError.invalidKeyLength(expected: keyLength, actual: key.count) }
        if let nonce, nonce.count != nonceLength { throw RatchetError.invalidNonceLength(nonce.count) }
        var combined = [UInt8](repeating: 0, count: overhead + plaintext.count)
        try combined.withUnsafeMutableBytes { out in
            let nonceOut = UnsafeMutableRawBufferPointer(rebasing: out[0..<nonceLength])
            if let nonce {
                nonceOut.copyBytes(from: nonce)
            } else {
                do throws(OpenSSLFailure) { try SecureRandom.fillChecked(nonceOut) } catch { throw RatchetError.openSSL(error.description) }
            }
            try key.withUnsafeBytes { k in
                try plaintext.withUnsafeBytes { p in
                    try aad.withUnsafeBytes { a in
                        try LibCrypto.aesGCMSeal(key: k, nonce: UnsafeRawBufferPointer(nonceOut), aad: a, plaintext: p,
                                                 output: UnsafeMutableRawBufferPointer(rebasing: out[nonceLength...]))
                    }
                }
            }
        }
        return combined
    }

    /// Verifies and decrypts a combined sealed box. Throws `.sealedBoxTooShort` for fewer than
    /// 28 bytes and `.authenticationFailed` when the tag does not match; no plaintext is ever
    /// returned from a box that failed to authenticate.
    public static func open(_ combined: [UInt8], key: SecretKey, aad: [UInt8] = []) throws -> [UInt8] {
        guard key.count == keyLength else { throw RatchetError.invalidKeyLength(expected: keyLength, actual: key.count) }
        guard combined.count >= overhead else { throw RatchetError.sealedBoxTooShort(combined.count) }
        let textLength = combined.count - overhead
        var plaintext = [UInt8](repeating: 0, count: textLength)
        let ok = try combined.withUnsafeBytes { box in
            try key.withUnsafeBytes { k in
                try aad.withUnsafeBytes { a in
                    try plaintext.withUnsafeMutableBytes { out in
                        try LibCrypto.aesGCMOpen(key: k,
                                                 nonce: UnsafeRawBufferPointer(rebasing: box[0..<nonceLength]),
                                                 aad: a,
                                                 ciphertext: UnsafeRawBufferPointer(rebasing: box[nonceLength..<(nonceLength + textLength)]),
                                                 tag: UnsafeRawBufferPointer(rebasing: box[(nonceLength + textLength)...]),
                                                 output: out)
                    }
                }
            }
        }
        guard ok else {
            plaintext.withUnsafeMutableBytes { wipe($0) }
            throw RatchetError.authenticationFailed
        }
        return plaintext
    }
}
