// The only file of MockAPNs that touches OpenSSL: EC P-256 keys, ES256 verify (and sign, for
// tests and users minting JWTs against the mock), and a throwaway CA + server certificate.
// Keys, ES256 and error text come from OpenSSLSupport; the certificate builder is the mock's own.
internal import COpenSSL
internal import OpenSSLSupport
import Foundation

/// An OpenSSL failure with OpenSSL's own message.
public struct MockCryptoError: Error, CustomStringConvertible, Equatable {
    public let operation: String
    public let message: String
    public var description: String { "\(operation): \(message)" }

    static func openssl(_ operation: String) -> MockCryptoError { MockCryptoError(.drained(operation)) }

    init(operation: String, message: String) {
        self.operation = operation
        self.message = message
    }

    init(_ failure: OpenSSLFailure) { self.init(operation: failure.operation, message: failure.detail ?? "failed") }
}

/// Runs `body`, reporting an OpenSSL failure as the mock's error.
private func mockCrypto<T>(_ body: () throws(OpenSSLFailure) -> T) throws(MockCryptoError) -> T {
    do throws(OpenSSLFailure) { return try body() } catch { throw MockCryptoError(error) }
}

/// An EC P-256 key, public or private.
public final class ECKey: Sendable {
    fileprivate let key: AsymmetricKey

    private init(_ key: AsymmetricKey) throws {
        self.key = key
        guard key.typeName == "EC" else {
            throw MockCryptoError(operation: "load key", message: "not an EC key (ES256 needs P-256)")
        }
        guard let curve = key.curveName else { throw MockCryptoError.openssl("EVP_PKEY_get_group_name") }
        guard key.isP256 else {
            throw MockCryptoError(operation: "load key", message: "EC curve \(curve), ES256 needs P-256")
        }
    }

    /// A fresh P-256 key pair.
    public static func generateP256() throws -> ECKey {
        try ECKey(mockCrypto { () throws(OpenSSLFailure) in try AsymmetricKey.generateP256() })
    }

    /// Loads a PEM private key (an Apple `.p8` is PKCS#8 "BEGIN PRIVATE KEY") or a PEM public key
    /// ("BEGIN PUBLIC KEY").
    public convenience init(pem: String) throws {
        let isPublic = pem.contains("BEGIN PUBLIC KEY")
        try self.init(mockCrypto { () throws(OpenSSLFailure) in
            isPublic ? try AsymmetricKey(publicKeyPEM: pem) : try AsymmetricKey(privateKeyPEM: pem)
        })
    }

    /// PKCS#8 PEM of the private key (the `.p8` format Apple hands out).
    public func privateKeyPEM() throws -> String { try mockCrypto { () throws(OpenSSLFailure) in try key.privateKeyPEM() } }

    /// SubjectPublicKeyInfo PEM of the public key.
    public func publicKeyPEM() throws -> String { try mockCrypto { () throws(OpenSSLFailure) in try key.publicKeyPEM() } }

    /// ES256 verification of a JWS signature given as raw r||s (64 bytes).
    public func verifyES256(signature rs: [UInt8], message: [UInt8]) throws -> Bool {
        try mockCrypto { () throws(OpenSSLFailure) in try key.verifyES256(signature: rs, message: message) }
    }

    /// ES256 signature as raw r||s (64 bytes), the JWS form.
    public func signES256(message: [UInt8]) throws -> [UInt8] {
        try mockCrypto { () throws(OpenSSLFailure) in try key.signES256(message) }
    }
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
        guard X509_set_pubkey(x509, publicKey.key.handle) == 1 else { throw MockCryptoError.openssl("X509_set_pubkey") }
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
        guard X509_sign(x509, key.key.handle, EVP_sha256()) > 0 else { throw MockCryptoError.openssl("X509_sign") }
    }

    func pem() throws -> String {
        try mockCrypto { () throws(OpenSSLFailure) in try withMemoryBIO("PEM_write_bio_X509") { PEM_write_bio_X509($0, x509) } }
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
