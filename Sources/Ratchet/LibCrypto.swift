// The only file of this module that touches OpenSSL: HKDF and the AEADs. Everything C (EVP_*
// handles, return codes) stays here; the rest of the module sees Swift buffers and `RatchetError`.
// Error text, the CSPRNG, wiping and constant-time comparison come from OpenSSLSupport.
internal import COpenSSL
internal import OpenSSLSupport

/// Thin, checked wrappers over libcrypto. Each function turns a failed return code into
/// `RatchetError.openSSL` carrying OpenSSL's own message.
enum LibCrypto {
    static let sha256Length = 32
    static let gcmNonceLength = 12
    static let gcmTagLength = 16

    // MARK: Errors

    /// Drains this thread's OpenSSL error queue into a failure of `operation`.
    static func error(_ operation: String) -> RatchetError { .openSSL(OpenSSLFailure.drained(operation).description) }

    // MARK: SHA-384

    static func sha384(_ data: UnsafeRawBufferPointer) throws(RatchetError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 48)
        var outLength: UInt32 = 0
        let ok = out.withUnsafeMutableBufferPointer { o in
            EVP_Digest(data.baseAddress, data.count, o.baseAddress, &outLength, EVP_sha384(), nil)
        }
        guard ok == 1, outLength == 48 else { throw error("EVP_Digest(SHA-384)") }
        return out
    }

    // MARK: HKDF-SHA256 (EVP_KDF "HKDF")

    /// Derives into `output`. `mode` is EVP_KDF_HKDF_MODE_EXTRACT_ONLY or _EXPAND_ONLY.
    private static func hkdf(mode: Int32, key: UnsafeRawBufferPointer, salt: UnsafeRawBufferPointer,
                             info: UnsafeRawBufferPointer, output: UnsafeMutableRawBufferPointer) throws(RatchetError) {
        let kdf = try KDFContext(mode: mode)
        // Pass a valid pointer even for an empty key, so OpenSSL sees an empty key rather than none.
        var empty: UInt8 = 0
        let ok = withUnsafeMutablePointer(to: &empty) { emptyPointer -> Int32 in
            let keyPointer = key.count > 0 ? key.baseAddress!.assumingMemoryBound(to: UInt8.self) : UnsafePointer(emptyPointer)
            return cossl_hkdf_derive(kdf.handle,
                                     keyPointer, key.count,
                                     salt.baseAddress?.assumingMemoryBound(to: UInt8.self), salt.count,
                                     info.baseAddress?.assumingMemoryBound(to: UInt8.self), info.count,
                                     output.baseAddress?.assumingMemoryBound(to: UInt8.self), output.count)
        }
        guard ok == 1 else { throw error("EVP_KDF_derive(HKDF)") }
    }

    static func hkdfExtract(salt: UnsafeRawBufferPointer, ikm: UnsafeRawBufferPointer,
                            output: UnsafeMutableRawBufferPointer) throws(RatchetError) {
        try hkdf(mode: EVP_KDF_HKDF_MODE_EXTRACT_ONLY, key: ikm, salt: salt,
                 info: UnsafeRawBufferPointer(start: nil, count: 0), output: output)
    }

    static func hkdfExpand(prk: UnsafeRawBufferPointer, info: UnsafeRawBufferPointer,
                           output: UnsafeMutableRawBufferPointer) throws(RatchetError) {
        try hkdf(mode: EVP_KDF_HKDF_MODE_EXPAND_ONLY, key: prk,
                 salt: UnsafeRawBufferPointer(start: nil, count: 0), info: info, output: output)
    }

    // MARK: AEADs (EVP_CIPHER "AES-256-GCM"; HPKE's AES-128-GCM and ChaCha20-Poly1305 share the code)

    /// Encrypts `plaintext` and writes ciphertext || tag into `output` (plaintext.count + 16 bytes).
    /// The three ciphers take a 12-byte nonce and a 16-byte tag through the same EVP_CTRL_AEAD_* calls.
    static func aesGCMSeal(key: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer,
                           aad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
                           output: UnsafeMutableRawBufferPointer, cipher algorithm: AEADCipher = .aes256GCM) throws(RatchetError) {
        precondition(key.count == algorithm.keyLength && nonce.count == gcmNonceLength && output.count == plaintext.count + gcmTagLength)
        guard plaintext.count <= Int(Int32.max), aad.count <= Int(Int32.max) else { throw .openSSL("AES-GCM: input too large") }
        let ctx = try CipherContext()
        let cipher = try CipherContext.fetched(algorithm)
        let out = output.baseAddress!.assumingMemoryBound(to: UInt8.self)
        guard EVP_EncryptInit_ex2(ctx.handle, cipher, u8(key), u8(nonce), nil) == 1 else {
            throw error("EVP_EncryptInit_ex2(AES-256-GCM)")
        }
        var length: Int32 = 0
        if aad.count > 0 {
            guard EVP_EncryptUpdate(ctx.handle, nil, &length, u8(aad), Int32(aad.count)) == 1 else {
                throw error("EVP_EncryptUpdate(AAD)")
            }
        }
        var written = 0
        if plaintext.count > 0 {
            guard EVP_EncryptUpdate(ctx.handle, out, &length, u8(plaintext), Int32(plaintext.count)) == 1 else {
                throw error("EVP_EncryptUpdate")
            }
            written = Int(length)
        }
        guard EVP_EncryptFinal_ex(ctx.handle, out + written, &length) == 1 else { throw error("EVP_EncryptFinal_ex") }
        written += Int(length)
        guard written == plaintext.count else { throw .openSSL("AES-GCM: unexpected ciphertext length \(written)") }
        guard EVP_CIPHER_CTX_ctrl(ctx.handle, EVP_CTRL_AEAD_GET_TAG, Int32(gcmTagLength), out + written) == 1 else {
            throw error("EVP_CIPHER_CTX_ctrl(GET_TAG)")
        }
    }

    /// Decrypts `ciphertext` into `output` (same length) and checks `tag`; OpenSSL compares the tag
    /// in constant time (CRYPTO_memcmp in EVP_DecryptFinal_ex). Returns false on a mismatch.
    static func aesGCMOpen(key: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer,
                           aad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
                           tag: UnsafeRawBufferPointer, output: UnsafeMutableRawBufferPointer,
                           cipher algorithm: AEADCipher = .aes256GCM) throws(RatchetError) -> Bool {
        precondition(key.count == algorithm.keyLength && nonce.count == gcmNonceLength && tag.count == gcmTagLength && output.count == ciphertext.count)
        guard ciphertext.count <= Int(Int32.max), aad.count <= Int(Int32.max) else { throw .openSSL("AES-GCM: input too large") }
        let ctx = try CipherContext()
        let cipher = try CipherContext.fetched(algorithm)
        guard EVP_DecryptInit_ex2(ctx.handle, cipher, u8(key), u8(nonce), nil) == 1 else {
            throw error("EVP_DecryptInit_ex2(AES-256-GCM)")
        }
        var length: Int32 = 0
        if aad.count > 0 {
            guard EVP_DecryptUpdate(ctx.handle, nil, &length, u8(aad), Int32(aad.count)) == 1 else {
                throw error("EVP_DecryptUpdate(AAD)")
            }
        }
        // GCM's final step writes no bytes; with an empty ciphertext `out` is nil and Update is skipped
        // (a nil output pointer would make OpenSSL treat the input as AAD).
        let out = output.baseAddress?.assumingMemoryBound(to: UInt8.self)
        var written = 0
        if ciphertext.count > 0 {
            guard EVP_DecryptUpdate(ctx.handle, out, &length, u8(ciphertext), Int32(ciphertext.count)) == 1 else {
                throw error("EVP_DecryptUpdate")
            }
            written = Int(length)
        }
        var tagCopy = [UInt8](tag)  // EVP_CIPHER_CTX_ctrl takes a non-const pointer
        let tagOK = tagCopy.withUnsafeMutableBytes { EVP_CIPHER_CTX_ctrl(ctx.handle, EVP_CTRL_AEAD_SET_TAG, Int32(gcmTagLength), $0.baseAddress) }
        guard tagOK == 1 else { throw error("EVP_CIPHER_CTX_ctrl(SET_TAG)") }
        let final = EVP_DecryptFinal_ex(ctx.handle, out.map { $0 + written }, &length)
        guard final > 0 else {
            OpenSSLErrors.clear()  // a tag mismatch is an answer, not a library failure
            return false
        }
        return true
    }

    private static func u8(_ buffer: UnsafeRawBufferPointer) -> UnsafePointer<UInt8>? {
        buffer.baseAddress?.assumingMemoryBound(to: UInt8.self)
    }
}

// MARK: - Handle owners (one class per C handle, freed in deinit)

/// Owns one EVP_KDF_CTX, created per derivation. (OpenSSL 3.0's HKDF cannot duplicate a
/// configured context - EVP_KDF_CTX_dup needs 3.1 - so each call configures a fresh one from
/// the algorithm fetched once.)
private final class KDFContext {
    let handle: OpaquePointer
    init(mode: Int32) throws(RatchetError) {
        guard let kdf = KDFContext.hkdf.handle else { throw LibCrypto.error("EVP_KDF_fetch(HKDF)") }
        guard let ctx = EVP_KDF_CTX_new(kdf) else { throw LibCrypto.error("EVP_KDF_CTX_new(HKDF)") }
        handle = ctx
        guard cossl_hkdf_configure(ctx, mode) == 1 else { throw LibCrypto.error("EVP_KDF_CTX_set_params(HKDF, SHA256)") }
    }
    deinit { EVP_KDF_CTX_free(handle) }

    /// Owns the fetched HKDF implementation.
    /// @unchecked Sendable: immutable after init; OpenSSL documents fetched algorithms as shareable across threads.
    final class Algorithm: @unchecked Sendable {
        let handle: OpaquePointer?
        init() { handle = EVP_KDF_fetch(nil, "HKDF", nil) }
        deinit { EVP_KDF_free(handle) }
    }
    static let hkdf = Algorithm()
}

/// Owns one EVP_CIPHER_CTX.
private final class CipherContext {
    let handle: OpaquePointer
    init() throws(RatchetError) {
        guard let ctx = EVP_CIPHER_CTX_new() else { throw LibCrypto.error("EVP_CIPHER_CTX_new") }
        handle = ctx
    }
    deinit { EVP_CIPHER_CTX_free(handle) }

    /// Owns the fetched AES-256-GCM implementation (fetched once; implicit fetches per call are slow in OpenSSL 3).
    /// @unchecked Sendable: immutable after init; OpenSSL documents fetched algorithms as shareable across threads.
    final class Cipher: @unchecked Sendable {
        let handle: OpaquePointer?
        let name: String
        init(_ name: String) { self.name = name; handle = EVP_CIPHER_fetch(nil, name, nil) }
        deinit { EVP_CIPHER_free(handle) }
        func fetched() throws(RatchetError) -> OpaquePointer {
            guard let handle else { throw LibCrypto.error("EVP_CIPHER_fetch(\(name))") }
            return handle
        }
    }
    static let aes256gcm = Cipher("AES-256-GCM")
    static let aes128gcm = Cipher("AES-128-GCM")
    static let chacha20poly1305 = Cipher("ChaCha20-Poly1305")

    static func fetched(_ algorithm: AEADCipher) throws(RatchetError) -> OpaquePointer {
        switch algorithm {
        case .aes256GCM: return try aes256gcm.fetched()
        case .aes128GCM: return try aes128gcm.fetched()
        case .chaCha20Poly1305: return try chacha20poly1305.fetched()
        }
    }
}
