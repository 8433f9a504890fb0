internal import OpenSSLSupport

/// The RFC 5116 AEADs HPKE names (RFC 9180 section 7.3), on the same EVP code as `AESGCM`: the
/// caller gives the nonce and gets ciphertext || tag back (HPKE builds its own nonces).
/// AES-256-GCM is the accessory ciphersuites' AEAD; the other two exist for the published HPKE
/// test vectors.
public enum AEADCipher: Sendable, Equatable {
    case aes128GCM, aes256GCM, chaCha20Poly1305

    public var keyLength: Int { self == .aes128GCM ? 16 : 32 }
    public static let nonceLength = 12
    public static let tagLength = 16

    public func seal(_ plaintext: [UInt8], key: SecretKey, nonce: [UInt8], aad: [UInt8] = []) throws -> [UInt8] {
        guard key.count == keyLength else { throw RatchetError.invalidKeyLength(expected: keyLength, actual: key.count) }
        guard nonce.count == Self.nonceLength else { throw RatchetError.invalidNonceLength(nonce.count) }
        var out = [UInt8](repeating: 0, count: plaintext.count + Self.tagLength)
        try out.withUnsafeMutableBytes { o in
            try key.withUnsafeBytes { k in
                try nonce.withUnsafeBytes { n in
                    try aad.withUnsafeBytes { a in
                        try plaintext.withUnsafeBytes { p in
                            try LibCrypto.aesGCMSeal(key: k, nonce: n, aad: a, plaintext: p, output: o, cipher: self)
                        }
                    }
                }
            }
        }
        return out
    }

    /// Throws `.sealedBoxTooShort` below 16 bytes and `.authenticationFailed` on a bad tag.
    public func open(_ ciphertextAndTag: [UInt8], key: SecretKey, nonce: [UInt8], aad: [UInt8] = []) throws -> [UInt8] {
        guard key.count == keyLength else { throw RatchetError.invalidKeyLength(expected: keyLength, actual: key.count) }
        guard nonce.count == Self.nonceLength else { throw RatchetError.invalidNonceLength(nonce.count) }
        guard ciphertextAndTag.count >= Self.tagLength else { throw RatchetError.sealedBoxTooShort(ciphertextAndTag.count) }
        let textLength = ciphertextAndTag.count - Self.tagLength
        var plaintext = [UInt8](repeating: 0, count: textLength)
        let ok = try ciphertextAndTag.withUnsafeBytes { box in
            try key.withUnsafeBytes { k in
                try nonce.withUnsafeBytes { n in
                    try aad.withUnsafeBytes { a in
                        try plaintext.withUnsafeMutableBytes { out in
                            try LibCrypto.aesGCMOpen(key: k, nonce: n, aad: a,
                                                     ciphertext: UnsafeRawBufferPointer(rebasing: box[0..<textLength]),
                                                     tag: UnsafeRawBufferPointer(rebasing: box[textLength...]),
                                                     output: out, cipher: self)
                        }
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
