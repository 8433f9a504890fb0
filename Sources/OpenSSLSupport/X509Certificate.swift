// Certificates as relayctl check-config and HTTPServer's reload logs read them, PKCS#12 files,
// and the small TLS facts both TLS sides report.
internal import COpenSSL
#if canImport(Glibc)
import Glibc
#endif

/// Owns one X509, freed in deinit.
package final class X509Certificate {
    package let handle: OpaquePointer

    package init(owning handle: OpaquePointer) { self.handle = handle }

    /// Shares a certificate someone else owns (SSL_CTX_get0_certificate), taking a reference.
    package convenience init(retaining handle: OpaquePointer) {
        X509_up_ref(handle)
        self.init(owning: handle)
    }

    /// The first PEM certificate in a file.
    package convenience init(pemFile path: String) throws(OpenSSLFailure) {
        guard let bio = BIO_new_file(path, "r") else { throw .drained("cannot open \(path)") }
        defer { BIO_free(bio) }
        guard let x509 = PEM_read_bio_X509(bio, nil, nil, nil) else { throw .drained("\(path) holds no PEM certificate") }
        self.init(owning: x509)
    }

    deinit { X509_free(handle) }

    /// "/O=.../CN=..." (X509_NAME_oneline); nil if OpenSSL cannot print it.
    package var subject: String? { subjectLine(of: handle) }

    /// Validity bounds as UTC broken-down time; nil when the field is missing or unreadable.
    package var notBefore: Glibc.tm? { Self.brokenDown(X509_get0_notBefore(handle)) }
    package var notAfter: Glibc.tm? { Self.brokenDown(X509_get0_notAfter(handle)) }

    private static func brokenDown(_ time: UnsafePointer<ASN1_TIME>?) -> Glibc.tm? {
        var parts = Glibc.tm()
        guard let time, ASN1_TIME_to_tm(time, &parts) == 1 else { return nil }
        return parts
    }

    /// Does `key` belong to this certificate's public key?
    package func matches(_ key: AsymmetricKey) -> Bool {
        let ok = X509_check_private_key(handle, key.handle) == 1
        OpenSSLErrors.clear()
        return ok
    }
}

/// A .p12/.pfx file's certificate and private key.
package enum PKCS12File {
    package enum Failure: Error {
        case cannotOpen
        /// Not PKCS#12, no certificate or key in it, or a wrong passphrase (OpenSSL's words).
        case unreadable(OpenSSLFailure)
    }

    package static func read(path: String, passphrase: String?) throws(Failure) -> (X509Certificate, AsymmetricKey) {
        var cert: OpaquePointer?, key: OpaquePointer?
        switch cossl_pkcs12_read(path, passphrase, &cert, &key, nil) {
        case 1: return (X509Certificate(owning: cert!), AsymmetricKey(owning: key!))
        case -1:
            OpenSSLErrors.clear()
            throw .cannotOpen
        default: throw .unreadable(.drained("PKCS12_parse"))
        }
    }

    /// `.p12` / `.pfx` (any case): read as PKCS#12 rather than PEM (PushClient, relayctl).
    package static func isPKCS12Path(_ path: String) -> Bool {
        let lower = path.lowercased()
        return lower.hasSuffix(".p12") || lower.hasSuffix(".pfx")
    }
}

/// The subject of a certificate someone else owns (a peer's, an SSL_CTX's), or nil.
package func subjectLine(of x509: OpaquePointer) -> String? {
    guard let name = X509_get_subject_name(x509), let line = X509_NAME_oneline(name, nil, 0) else { return nil }
    defer { cossl_free(line) }
    return String(cString: line)
}

/// The protocol ALPN settled on for an SSL connection; nil when none was.
package func selectedALPN(_ ssl: OpaquePointer) -> String? {
    var data: UnsafePointer<UInt8>?
    var length: UInt32 = 0
    SSL_get0_alpn_selected(ssl, &data, &length)
    guard let data, length > 0 else { return nil }
    return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
}
