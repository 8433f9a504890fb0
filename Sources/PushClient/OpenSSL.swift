// The only file in PushClient that touches OpenSSL: loading the .p8 key and ES256 signing.
internal import COpenSSL

/// Owns one EVP_PKEY (a P-256 private key), freed in deinit.
///
/// `@unchecked Sendable`: the key is written once in init and only read afterwards;
/// OpenSSL 3 documents EVP_PKEY as safe for concurrent read-only use, and every signature uses
/// its own EVP_MD_CTX created inside `sign`.
final class ES256SigningKey: @unchecked Sendable {
    private let pkey: OpaquePointer

    init(pem: String) throws {
        let bytes = Array(pem.utf8)
        let key: OpaquePointer? = bytes.withUnsafeBytes { raw in
            // BIO_new_mem_buf borrows the buffer: the BIO is freed before the buffer goes away.
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let key else { throw PushClientError.invalidKey("not a PEM private key (\(Self.lastError()))") }
        guard EVP_PKEY_get_base_id(key) == EVP_PKEY_EC, EVP_PKEY_get_bits(key) == 256 else {
            EVP_PKEY_free(key)
            throw PushClientError.invalidKey("APNs keys are P-256 EC keys")
        }
        pkey = key
    }

    deinit { EVP_PKEY_free(pkey) }

    /// ECDSA P-256 over SHA-256 of `message`; returns JOSE's raw r||s (64 bytes).
    func sign(_ message: [UInt8]) throws -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { throw PushClientError.crypto(Self.lastError()) }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, pkey) == 1 else {
            throw PushClientError.crypto(Self.lastError())
        }
        var derLength = 0
        guard EVP_DigestSign(ctx, nil, &derLength, message, message.count) == 1 else {
            throw PushClientError.crypto(Self.lastError())
        }
        var der = [UInt8](repeating: 0, count: derLength)
        guard EVP_DigestSign(ctx, &der, &derLength, message, message.count) == 1 else {
            throw PushClientError.crypto(Self.lastError())
        }
        // EVP_DigestSign yields DER ECDSA-Sig-Value; JWS wants r and s as 32-byte big-endian.
        var cursor: UnsafePointer<UInt8>? = nil
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buf in
            cursor = buf.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, derLength)
        }
        guard let sig = parsed else { throw PushClientError.crypto("bad DER signature: \(Self.lastError())") }
        defer { ECDSA_SIG_free(sig) }
        var r: OpaquePointer? = nil
        var s: OpaquePointer? = nil
        ECDSA_SIG_get0(sig, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        let ok = raw.withUnsafeMutableBufferPointer { out -> Bool in
            BN_bn2binpad(r, out.baseAddress, 32) == 32 && BN_bn2binpad(s, out.baseAddress! + 32, 32) == 32
        }
        guard ok else { throw PushClientError.crypto("signature component longer than 32 bytes") }
        return raw
    }

    private static func lastError() -> String {
        let code = ERR_get_error()
        guard code != 0 else { return "unknown OpenSSL error" }
        var buf = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buf, buf.count)
        ERR_clear_error()
        return String(decoding: buf.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
