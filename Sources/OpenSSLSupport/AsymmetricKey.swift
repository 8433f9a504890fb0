// EVP_PKEY: PEM load and export, P-256 generation, ES256 (JOSE's raw r||s signatures).
internal import COpenSSL

/// Owns one EVP_PKEY (public, or private with its public half), freed in deinit.
///
/// `@unchecked Sendable`: the key is never modified after init; OpenSSL 3 documents EVP_PKEY as
/// safe for concurrent read-only use, and every signature or verification makes its own
/// EVP_MD_CTX.
package final class AsymmetricKey: @unchecked Sendable {
    /// For modules that hand the key to other OpenSSL calls (certificates, key checks).
    package let handle: OpaquePointer

    package init(owning handle: OpaquePointer) { self.handle = handle }

    deinit { EVP_PKEY_free(handle) }  // cleanses private key material

    /// A PEM private key (PKCS#8 "BEGIN PRIVATE KEY", as in Apple's .p8, or a traditional one).
    package convenience init(privateKeyPEM pem: String) throws(OpenSSLFailure) {
        self.init(owning: try Self.read(pem, "PEM_read_bio_PrivateKey") { PEM_read_bio_PrivateKey($0, nil, nil, nil) })
    }

    /// A PEM SubjectPublicKeyInfo ("BEGIN PUBLIC KEY").
    package convenience init(publicKeyPEM pem: String) throws(OpenSSLFailure) {
        self.init(owning: try Self.read(pem, "PEM_read_bio_PUBKEY") { PEM_read_bio_PUBKEY($0, nil, nil, nil) })
    }

    /// A PEM private key file; `passphrase` decrypts an encrypted one. Without a passphrase an
    /// empty one is passed, so OpenSSL never prompts on a terminal.
    package convenience init(privateKeyPEMFile path: String, passphrase: String?) throws(OpenSSLFailure) {
        guard let bio = BIO_new_file(path, "r") else { throw .drained("cannot open \(path)") }
        defer { BIO_free(bio) }
        // With no callback, OpenSSL takes `u` as a NUL-terminated passphrase.
        let key: OpaquePointer? = (passphrase ?? "").withCString { pass in
            PEM_read_bio_PrivateKey(bio, nil, nil, UnsafeMutableRawPointer(mutating: pass))
        }
        guard let key else { throw .drained("\(path) holds no readable PEM private key") }
        self.init(owning: key)
    }

    private static func read(_ pem: String, _ operation: String, _ body: (OpaquePointer) -> OpaquePointer?) throws(OpenSSLFailure) -> OpaquePointer {
        let bytes = Array(pem.utf8)
        let key: OpaquePointer? = bytes.withUnsafeBytes { raw in
            // BIO_new_mem_buf borrows the buffer: the BIO is freed before the buffer goes away.
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return body(bio)
        }
        guard let key else { throw .drained(operation) }
        return key
    }

    /// A fresh P-256 key pair.
    package static func generateP256() throws(OpenSSLFailure) -> AsymmetricKey {
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else { throw .drained("EVP_PKEY_CTX_new_from_name") }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_keygen_init(ctx) == 1 else { throw .drained("EVP_PKEY_keygen_init") }
        guard EVP_PKEY_CTX_set_group_name(ctx, "P-256") == 1 else { throw .drained("EVP_PKEY_CTX_set_group_name") }
        var pkey: OpaquePointer? = nil
        guard EVP_PKEY_generate(ctx, &pkey) == 1, let pkey else { throw .drained("EVP_PKEY_generate") }
        return AsymmetricKey(owning: pkey)
    }

    // MARK: What kind of key

    /// "EC", "RSA", "ED25519", or "type <id>".
    package var typeName: String {
        switch EVP_PKEY_get_base_id(handle) {
        case EVP_PKEY_EC: "EC"
        case EVP_PKEY_RSA: "RSA"
        case EVP_PKEY_ED25519: "ED25519"
        case let id: "type \(id)"
        }
    }

    /// The EC curve's name ("prime256v1"); nil for other key types.
    package var curveName: String? {
        guard EVP_PKEY_get_base_id(handle) == EVP_PKEY_EC else { return nil }
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        guard EVP_PKEY_get_group_name(handle, &name, name.count, &length) == 1 else {
            OpenSSLErrors.clear()
            return nil
        }
        return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    package var bits: Int { Int(EVP_PKEY_get_bits(handle)) }

    /// An EC key on P-256 (secp256r1), the only curve ES256 allows.
    package var isP256: Bool {
        let curve = curveName
        return curve == "prime256v1" || curve == "P-256"
    }

    // MARK: PEM export

    /// PKCS#8 PEM of the private key (the `.p8` format Apple hands out).
    package func privateKeyPEM() throws(OpenSSLFailure) -> String {
        try withMemoryBIO("PEM_write_bio_PrivateKey") { PEM_write_bio_PrivateKey($0, handle, nil, nil, 0, nil, nil) }
    }

    /// SubjectPublicKeyInfo PEM of the public key.
    package func publicKeyPEM() throws(OpenSSLFailure) -> String {
        try withMemoryBIO("PEM_write_bio_PUBKEY") { PEM_write_bio_PUBKEY($0, handle) }
    }

    // MARK: ES256 (ECDSA P-256 over SHA-256, signatures as JOSE's raw r||s)

    /// Signs `message`; returns the 64-byte r||s (RFC 7518 3.4) JWS needs.
    package func signES256(_ message: [UInt8]) throws(OpenSSLFailure) -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { throw .drained("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, handle) == 1 else { throw .drained("EVP_DigestSignInit") }
        var length = 0
        guard EVP_DigestSign(ctx, nil, &length, message, message.count) == 1 else { throw .drained("EVP_DigestSign") }
        var der = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(ctx, &der, &length, message, message.count) == 1 else { throw .drained("EVP_DigestSign") }
        return try ES256Signature.raw(fromDER: der, count: length)
    }

    /// Verifies a 64-byte r||s signature over `message`. False for a wrong signature or a
    /// malformed one; throws only when OpenSSL itself fails.
    package func verifyES256(signature rs: [UInt8], message: [UInt8]) throws(OpenSSLFailure) -> Bool {
        guard rs.count == ES256Signature.rawLength else { return false }
        let der = try ES256Signature.der(fromRaw: rs)
        guard let ctx = EVP_MD_CTX_new() else { throw .drained("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, handle) == 1 else { throw .drained("EVP_DigestVerifyInit") }
        let result = EVP_DigestVerify(ctx, der, der.count, message, message.count)
        // 1 = valid, 0 = bad signature; anything else is an error (for example a key that is not EC).
        OpenSSLErrors.clear()
        return result == 1
    }
}

/// ECDSA signatures: OpenSSL speaks DER (ECDSA-Sig-Value), JOSE the two 32-byte big-endian halves.
package enum ES256Signature {
    package static let rawLength = 64

    package static func raw(fromDER der: [UInt8], count: Int) throws(OpenSSLFailure) -> [UInt8] {
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, min(count, buffer.count))
        }
        guard let parsed else { throw .drained("d2i_ECDSA_SIG") }
        defer { ECDSA_SIG_free(parsed) }
        var out = [UInt8](repeating: 0, count: rawLength)
        let ok = out.withUnsafeMutableBufferPointer { o in
            BN_bn2binpad(ECDSA_SIG_get0_r(parsed), o.baseAddress, 32) == 32
                && BN_bn2binpad(ECDSA_SIG_get0_s(parsed), o.baseAddress! + 32, 32) == 32
        }
        guard ok else { throw OpenSSLFailure(operation: "BN_bn2binpad", detail: "signature component longer than 32 bytes") }
        return out
    }

    package static func der(fromRaw rs: [UInt8]) throws(OpenSSLFailure) -> [UInt8] {
        precondition(rs.count == rawLength)
        guard let sig = ECDSA_SIG_new() else { throw .drained("ECDSA_SIG_new") }
        defer { ECDSA_SIG_free(sig) }
        let r = rs.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = rs.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        guard let r, let s else {
            BN_free(r); BN_free(s)
            throw .drained("BN_bin2bn")
        }
        guard ECDSA_SIG_set0(sig, r, s) == 1 else {  // takes ownership of r and s only on success
            BN_free(r); BN_free(s)
            throw .drained("ECDSA_SIG_set0")
        }
        var der: UnsafeMutablePointer<UInt8>? = nil
        let length = i2d_ECDSA_SIG(sig, &der)
        guard length > 0, let der else { throw .drained("i2d_ECDSA_SIG") }
        defer { cossl_free(der) }
        return Array(UnsafeBufferPointer(start: der, count: Int(length)))
    }
}

/// Runs `write` against a fresh memory BIO and returns what it wrote.
package func withMemoryBIO(_ operation: String, _ write: (OpaquePointer) -> Int32) throws(OpenSSLFailure) -> String {
    guard let bio = BIO_new(BIO_s_mem()) else { throw .drained("BIO_new") }
    defer { BIO_free(bio) }
    guard write(bio) == 1 else { throw .drained(operation) }
    let pending = Int(BIO_ctrl_pending(bio))
    var bytes = [UInt8](repeating: 0, count: pending)
    guard BIO_read(bio, &bytes, Int32(pending)) == Int32(pending) else { throw .drained("BIO_read") }
    return String(decoding: bytes, as: UTF8.self)
}
