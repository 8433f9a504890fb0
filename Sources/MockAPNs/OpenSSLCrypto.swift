// The only file of MockAPNs that touches OpenSSL: EC P-256 keys, ES256 verify (and sign, for
// tests and users minting JWTs against the mock), and a throwaway CA + server certificate.
// OpenSSL types never leave this file; each C handle has one owner class that frees it.
internal import COpenSSL
import Foundation

/// An OpenSSL failure with OpenSSL's own message.
public struct MockCryptoError: Error, CustomStringConvertible, Equatable {
    public let operation: String
    public let message: String
    public var description: String { "\(operation): \(message)" }

    static func openssl(_ operation: String) -> MockCryptoError {
        var buffer = [CChar](repeating: 0, count: 1024)
        guard cossl_drain_errors(&buffer, buffer.count) > 0 else { return MockCryptoError(operation: operation, message: "failed") }
        let text = buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        return MockCryptoError(operation: operation, message: text)
    }
}

/// Owns one `EVP_PKEY` (EC P-256, public or private).
///
/// `@unchecked Sendable`: the handle is never mutated after init; OpenSSL 3 documents
/// EVP_PKEY as safe for concurrent read-only use (verify/sign each make their own EVP_MD_CTX).
public final class ECKey: @unchecked Sendable {
    fileprivate let pkey: OpaquePointer

    private init(owning pkey: OpaquePointer) throws {
        self.pkey = pkey
        guard EVP_PKEY_get_base_id(pkey) == EVP_PKEY_EC else {
            throw MockCryptoError(operation: "load key", message: "not an EC key (ES256 needs P-256)")
        }
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        guard EVP_PKEY_get_group_name(pkey, &name, name.count, &length) == 1 else {
            throw MockCryptoError.openssl("EVP_PKEY_get_group_name")
        }
        let group = name.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        guard group == "prime256v1" || group == "P-256" else {
            throw MockCryptoError(operation: "load key", message: "EC curve \(group), ES256 needs P-256")
        }
    }

    deinit { EVP_PKEY_free(pkey) }

    /// A fresh P-256 key pair.
    public static func generateP256() throws -> ECKey {
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else {
            throw MockCryptoError.openssl("EVP_PKEY_CTX_new_from_name")
        }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_keygen_init(ctx) == 1 else { throw MockCryptoError.openssl("EVP_PKEY_keygen_init") }
        guard EVP_PKEY_CTX_set_group_name(ctx, "P-256") == 1 else {
            throw MockCryptoError.openssl("EVP_PKEY_CTX_set_group_name")
        }
        var pkey: OpaquePointer? = nil
        guard EVP_PKEY_generate(ctx, &pkey) == 1, let pkey else { throw MockCryptoError.openssl("EVP_PKEY_generate") }
        return try ECKey(owning: pkey)
    }

    /// Loads a PEM private key (an Apple `.p8` is PKCS#8 "BEGIN PRIVATE KEY") or a PEM public key
    /// ("BEGIN PUBLIC KEY").
    public convenience init(pem: String) throws {
        let bytes = Array(pem.utf8)
        let isPublic = pem.contains("BEGIN PUBLIC KEY")
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { raw -> OpaquePointer? in
            // BIO_new_mem_buf does not copy: the BIO lives only inside this closure.
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return isPublic ? PEM_read_bio_PUBKEY(bio, nil, nil, nil) : PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let loaded else {
            throw MockCryptoError.openssl(isPublic ? "PEM_read_bio_PUBKEY" : "PEM_read_bio_PrivateKey")
        }
        try self.init(owning: loaded)
    }

    /// PKCS#8 PEM of the private key (the `.p8` format Apple hands out).
    public func privateKeyPEM() throws -> String {
        try withMemoryBIO("PEM_write_bio_PrivateKey") { PEM_write_bio_PrivateKey($0, pkey, nil, nil, 0, nil, nil) }
    }

    /// SubjectPublicKeyInfo PEM of the public key.
    public func publicKeyPEM() throws -> String {
        try withMemoryBIO("PEM_write_bio_PUBKEY") { PEM_write_bio_PUBKEY($0, pkey) }
    }

    /// ES256 verification of a JWS signature given as raw r||s (64 bytes).
    public func verifyES256(signature rs: [UInt8], message: [UInt8]) throws -> Bool {
        guard rs.count == 64 else { return false }
        guard let sig = ECDSA_SIG_new() else { throw MockCryptoError.openssl("ECDSA_SIG_new") }
        defer { ECDSA_SIG_free(sig) }
        let r = rs[0..<32].withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = rs[32..<64].withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        guard let r, let s else {
            BN_free(r); BN_free(s)
            throw MockCryptoError.openssl("BN_bin2bn")
        }
        guard ECDSA_SIG_set0(sig, r, s) == 1 else {  // takes ownership of r and s only on success
            BN_free(r); BN_free(s)
            throw MockCryptoError.openssl("ECDSA_SIG_set0")
        }
        var der: UnsafeMutablePointer<UInt8>? = nil
        let derLength = i2d_ECDSA_SIG(sig, &der)
        guard derLength > 0, let der else { throw MockCryptoError.openssl("i2d_ECDSA_SIG") }
        defer { cossl_free(der) }

        guard let ctx = EVP_MD_CTX_new() else { throw MockCryptoError.openssl("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, pkey) == 1 else {
            throw MockCryptoError.openssl("EVP_DigestVerifyInit")
        }
        let result = message.withUnsafeBufferPointer {
            EVP_DigestVerify(ctx, der, Int(derLength), $0.baseAddress, $0.count)
        }
        // 1 = valid, 0 = bad signature; anything else is an error (for example malformed DER).
        ERR_clear_error()
        return result == 1
    }

    /// ES256 signature as raw r||s (64 bytes), the JWS form.
    public func signES256(message: [UInt8]) throws -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { throw MockCryptoError.openssl("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, pkey) == 1 else {
            throw MockCryptoError.openssl("EVP_DigestSignInit")
        }
        var length = 0
        guard message.withUnsafeBufferPointer({ EVP_DigestSign(ctx, nil, &length, $0.baseAddress, $0.count) }) == 1 else {
            throw MockCryptoError.openssl("EVP_DigestSign")
        }
        var der = [UInt8](repeating: 0, count: length)
        guard message.withUnsafeBufferPointer({ EVP_DigestSign(ctx, &der, &length, $0.baseAddress, $0.count) }) == 1 else {
            throw MockCryptoError.openssl("EVP_DigestSign")
        }
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, length)
        }
        guard let parsed else { throw MockCryptoError.openssl("d2i_ECDSA_SIG") }
        defer { ECDSA_SIG_free(parsed) }
        var out = [UInt8](repeating: 0, count: 64)
        guard BN_bn2binpad(ECDSA_SIG_get0_r(parsed), &out, 32) == 32 else { throw MockCryptoError.openssl("BN_bn2binpad") }
        let sWritten = out.withUnsafeMutableBufferPointer { BN_bn2binpad(ECDSA_SIG_get0_s(parsed), $0.baseAddress! + 32, 32) }
        guard sWritten == 32 else { throw MockCryptoError.openssl("BN_bn2binpad") }
        return out
    }
}

/// Runs `write` against a fresh memory BIO and returns what was written as a string.
private func withMemoryBIO(_ operation: String, _ write: (OpaquePointer) -> Int32) throws -> String {
    guard let bio = BIO_new(BIO_s_mem()) else { throw MockCryptoError.openssl("BIO_new") }
    defer { BIO_free(bio) }
    guard write(bio) == 1 else { throw MockCryptoError.openssl(operation) }
    let pending = Int(BIO_ctrl_pending(bio))
    var bytes = [UInt8](repeating: 0, count: pending)
    let read = BIO_read(bio, &bytes, Int32(pending))
    guard read == Int32(pending) else { throw MockCryptoError.openssl("BIO_read") }
    return String(decoding: bytes, as: UTF8.self)
}

/// Owns one `X509` being built.
private final class Certificate {
    let x509: OpaquePointer

    /// Valid from `notBefore` to `notAfter` seconds relative to now.
    /// `uid` goes into the subject as UID (OID 0.9.2342.19200300.100.1.1), where Apple's push
    /// certificates carry their bundle ID.
    init(subjectCN: String, uid: String? = nil, publicKey: ECKey, notBefore: Int = -3600, notAfter: Int) throws {
        guard let x509 = X509_new() else { throw MockCryptoError.openssl("X509_new") }
        self.x509 = x509
        guard X509_set_version(x509, 2) == 1 else { throw MockCryptoError.openssl("X509_set_version") }
        // Random positive 63-bit serial: clients reject duplicate (issuer, serial) pairs across runs.
        guard ASN1_INTEGER_set_int64(X509_get_serialNumber(x509), Int64.random(in: 1...Int64.max)) == 1 else {
            throw MockCryptoError.openssl("ASN1_INTEGER_set_int64")
        }
        guard X509_gmtime_adj(X509_getm_notBefore(x509), notBefore) != nil,
              X509_gmtime_adj(X509_getm_notAfter(x509), notAfter) != nil else {
            throw MockCryptoError.openssl("X509_gmtime_adj")
        }
        guard X509_set_pubkey(x509, publicKey.pkey) == 1 else { throw MockCryptoError.openssl("X509_set_pubkey") }
        guard let name = X509_get_subject_name(x509),
              uid.map({ X509_NAME_add_entry_by_txt(name, "UID", MBSTRING_ASC, $0, -1, -1, 0) }) ?? 1 == 1,
              X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, "mock-apns", -1, -1, 0) == 1,
              X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, subjectCN, -1, -1, 0) == 1 else {
            throw MockCryptoError.openssl("X509_NAME_add_entry_by_txt")
        }
    }

    deinit { X509_free(x509) }

    func addExtension(_ nid: Int32, _ value: String, issuer: Certificate) throws {
        var ctx = X509V3_CTX()
        X509V3_set_ctx(&ctx, issuer.x509, x509, nil, nil, 0)
        guard let ext = X509V3_EXT_conf_nid(nil, &ctx, nid, value) else {
            throw MockCryptoError.openssl("X509V3_EXT_conf_nid(\(value))")
        }
        defer { X509_EXTENSION_free(ext) }
        guard X509_add_ext(x509, ext, -1) == 1 else { throw MockCryptoError.openssl("X509_add_ext") }
    }

    func sign(issuer: Certificate, key: ECKey) throws {
        guard X509_set_issuer_name(x509, X509_get_subject_name(issuer.x509)) == 1 else {
            throw MockCryptoError.openssl("X509_set_issuer_name")
        }
        guard X509_sign(x509, key.pkey, EVP_sha256()) > 0 else { throw MockCryptoError.openssl("X509_sign") }
    }

    func pem() throws -> String {
        try withMemoryBIO("PEM_write_bio_X509") { PEM_write_bio_X509($0, x509) }
    }
}

/// Ways the generated server certificate can be wrong on purpose, so clients' TLS checks can be
/// tested: each makes a verifying client fail the handshake with the CA it was given.
public enum TLSCertificateFault: String, Sendable, CaseIterable {
    /// Validity ended yesterday.
    case expired
    /// SAN names only `wrong-host.invalid`, not 127.0.0.1/::1/localhost.
    case wrongHost = "wrong-host"
    /// Signed by a second CA; the CA handed to clients is not its issuer.
    case untrusted
}

/// A throwaway CA and a server certificate it signed (and optionally a client certificate), all PEM.
public struct GeneratedTLSMaterial: Sendable {
    public let caCertificatePEM: String
    public let serverCertificatePEM: String
    public let serverPrivateKeyPEM: String
    /// With `clientBundleID`: a clientAuth leaf with subject UID=<bundle ID>, signed by the CA.
    public var clientCertificatePEM: String?
    public var clientPrivateKeyPEM: String?

    /// EC P-256 CA (CA:TRUE, keyCertSign) and a server leaf (serverAuth) whose SAN covers
    /// 127.0.0.1, ::1 and localhost, so curl, nghttp and libcurl verify it with `--cacert`.
    public static func generate(validDays: Int = 30, fault: TLSCertificateFault? = nil,
                                clientBundleID: String? = nil) throws -> GeneratedTLSMaterial {
        func makeCA() throws -> (Certificate, ECKey) {
            let caKey = try ECKey.generateP256()
            let ca = try Certificate(subjectCN: "mock-apns test CA", publicKey: caKey, notAfter: validDays * 86_400)
            try ca.addExtension(NID_basic_constraints, "critical,CA:TRUE", issuer: ca)
            try ca.addExtension(NID_key_usage, "critical,keyCertSign,cRLSign", issuer: ca)
            try ca.addExtension(NID_subject_key_identifier, "hash", issuer: ca)
            try ca.sign(issuer: ca, key: caKey)
            return (ca, caKey)
        }
        let (ca, caKey) = try makeCA()
        // For `.untrusted` the leaf's issuer is a second CA that clients never see.
        let (issuer, issuerKey) = fault == .untrusted ? try makeCA() : (ca, caKey)

        let serverKey = try ECKey.generateP256()
        let server = fault == .expired
            ? try Certificate(subjectCN: "localhost", publicKey: serverKey, notBefore: -2 * 86_400, notAfter: -86_400)
            : try Certificate(subjectCN: "localhost", publicKey: serverKey, notAfter: validDays * 86_400)
        try server.addExtension(NID_basic_constraints, "critical,CA:FALSE", issuer: issuer)
        try server.addExtension(NID_key_usage, "critical,digitalSignature", issuer: issuer)
        try server.addExtension(NID_ext_key_usage, "serverAuth", issuer: issuer)
        try server.addExtension(NID_subject_alt_name,
                                fault == .wrongHost ? "DNS:wrong-host.invalid" : "IP:127.0.0.1,IP:::1,DNS:localhost", issuer: issuer)
        try server.addExtension(NID_subject_key_identifier, "hash", issuer: issuer)
        try server.addExtension(NID_authority_key_identifier, "keyid:always", issuer: issuer)
        try server.sign(issuer: issuer, key: issuerKey)

        var material = GeneratedTLSMaterial(caCertificatePEM: try ca.pem(),
                                            serverCertificatePEM: try server.pem(),
                                            serverPrivateKeyPEM: try serverKey.privateKeyPEM())
        if let bundle = clientBundleID {
            let clientKey = try ECKey.generateP256()
            let client = try Certificate(subjectCN: "Apple Push Services: \(bundle) (mock-apns)", uid: bundle,
                                         publicKey: clientKey, notAfter: validDays * 86_400)
            try client.addExtension(NID_basic_constraints, "critical,CA:FALSE", issuer: ca)
            try client.addExtension(NID_key_usage, "critical,digitalSignature", issuer: ca)
            try client.addExtension(NID_ext_key_usage, "clientAuth", issuer: ca)
            try client.addExtension(NID_authority_key_identifier, "keyid:always", issuer: ca)
            try client.sign(issuer: ca, key: caKey)
            material.clientCertificatePEM = try client.pem()
            material.clientPrivateKeyPEM = try clientKey.privateKeyPEM()
        }
        return material
    }
}
