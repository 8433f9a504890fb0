// The only file of relayctl that touches OpenSSL: reads PEM certificates and private keys for
// `check-config` (validity dates, key type, key/certificate match). OpenSSL types never leave
// this file; each C handle has one owner class that frees it.
internal import COpenSSL
import Foundation

/// An OpenSSL failure carrying OpenSSL's own message.
struct KeyMaterialError: Error, CustomStringConvertible {
    var description: String

    static func openssl(_ what: String) -> KeyMaterialError {
        var buffer = [CChar](repeating: 0, count: 1024)
        guard cossl_drain_errors(&buffer, buffer.count) > 0 else { return KeyMaterialError(description: what) }
        return KeyMaterialError(description: "\(what): \(string(buffer))")
    }
}

struct CertificateSummary {
    var subject: String
    var notBefore: Date
    var notAfter: Date
}

struct PrivateKeySummary {
    /// "EC", "RSA", "ED25519", ...
    var type: String
    /// EC curve ("prime256v1"), nil for other types.
    var curve: String?
    var bits: Int
}

private final class BIOHandle {
    let bio: OpaquePointer
    init(readingFile path: String) throws {
        guard let bio = BIO_new_file(path, "r") else { throw KeyMaterialError.openssl("cannot open \(path)") }
        self.bio = bio
    }
    deinit { BIO_free(bio) }
}

private final class X509Handle {
    let x509: OpaquePointer
    init(owning x509: OpaquePointer) { self.x509 = x509 }
    init(pemFile path: String) throws {
        let file = try BIOHandle(readingFile: path)
        guard let x = PEM_read_bio_X509(file.bio, nil, nil, nil) else {
            throw KeyMaterialError.openssl("\(path) holds no PEM certificate")
        }
        x509 = x
    }
    deinit { X509_free(x509) }
}

private final class PKeyHandle {
    let pkey: OpaquePointer
    init(owning pkey: OpaquePointer) { self.pkey = pkey }
    init(pemFile path: String, passphrase: String?) throws {
        let file = try BIOHandle(readingFile: path)
        // With no callback, OpenSSL takes `u` as a NUL-terminated passphrase. An empty one keeps
        // it from prompting on a terminal when the key is encrypted and no passphrase was given.
        let key: OpaquePointer? = (passphrase ?? "").withCString { pass in
            PEM_read_bio_PrivateKey(file.bio, nil, nil, UnsafeMutableRawPointer(mutating: pass))
        }
        guard let key else { throw KeyMaterialError.openssl("\(path) holds no readable PEM private key") }
        pkey = key
    }
    deinit { EVP_PKEY_free(pkey) }
}

enum KeyMaterial {
    /// A .p12/.pfx file's certificate and key (PKCS#12, as Keychain Access exports them).
    private static func pkcs12(atPath path: String, passphrase: String?) throws -> (X509Handle, PKeyHandle) {
        var cert: OpaquePointer?, key: OpaquePointer?
        switch cossl_pkcs12_read(path, passphrase, &cert, &key, nil) {
        case 1: return (X509Handle(owning: cert!), PKeyHandle(owning: key!))
        case -1: throw KeyMaterialError(description: "\(path): cannot open the file")
        default: throw KeyMaterialError.openssl("\(path): not a PKCS#12 file with a certificate and key, or wrong passphrase")
        }
    }

    /// Summary of a PEM certificate, or of the certificate inside a .p12/.pfx file.
    static func certificate(atPath path: String, passphrase: String? = nil) throws -> CertificateSummary {
        let cert = isPKCS12Path(path) ? try pkcs12(atPath: path, passphrase: passphrase).0 : try X509Handle(pemFile: path)
        guard let nameLine = X509_NAME_oneline(X509_get_subject_name(cert.x509), nil, 0) else {
            throw KeyMaterialError.openssl("\(path): cannot read the subject")
        }
        defer { cossl_free(nameLine) }
        guard let notBefore = X509_get0_notBefore(cert.x509), let notAfter = X509_get0_notAfter(cert.x509) else {
            throw KeyMaterialError(description: "\(path): certificate has no validity dates")
        }
        return CertificateSummary(subject: String(validatingCString: nameLine) ?? "?", notBefore: try date(notBefore, path), notAfter: try date(notAfter, path))
    }

    static func privateKey(atPath path: String, passphrase: String? = nil) throws -> PrivateKeySummary {
        let key = try PKeyHandle(pemFile: path, passphrase: passphrase)
        let type: String
        switch EVP_PKEY_get_base_id(key.pkey) {
        case EVP_PKEY_EC: type = "EC"
        case EVP_PKEY_RSA: type = "RSA"
        case EVP_PKEY_ED25519: type = "ED25519"
        default: type = "type \(EVP_PKEY_get_base_id(key.pkey))"
        }
        var curve: String?
        if type == "EC" {
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            guard EVP_PKEY_get_group_name(key.pkey, &name, name.count, &length) == 1 else {
                throw KeyMaterialError.openssl("\(path): EC key without a named curve")
            }
            curve = string(name)
        }
        return PrivateKeySummary(type: type, curve: curve, bits: Int(EVP_PKEY_get_bits(key.pkey)))
    }

    /// True when the private key is the certificate's.
    /// For a .p12/.pfx `certificatePath` the key is the one inside it (`keyPath` is ignored).
    static func keyMatchesCertificate(certificatePath: String, keyPath: String, passphrase: String? = nil) throws -> Bool {
        let (cert, key) = isPKCS12Path(certificatePath)
            ? try pkcs12(atPath: certificatePath, passphrase: passphrase)
            : (try X509Handle(pemFile: certificatePath), try PKeyHandle(pemFile: keyPath, passphrase: passphrase))
        let matches = X509_check_private_key(cert.x509, key.pkey) == 1
        ERR_clear_error()
        return matches
    }

    private static func date(_ time: UnsafePointer<ASN1_TIME>, _ path: String) throws -> Date {
        var parts = tm()
        guard ASN1_TIME_to_tm(time, &parts) == 1 else { throw KeyMaterialError.openssl("\(path): unreadable certificate date") }
        return Date(timeIntervalSince1970: TimeInterval(timegm(&parts)))
    }
}

/// A NUL-terminated C buffer as a String.
private func string(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// `.p12` / `.pfx` (any case), read as PKCS#12 like PushClient does.
func isPKCS12Path(_ path: String) -> Bool {
    let lower = path.lowercased()
    return lower.hasSuffix(".p12") || lower.hasSuffix(".pfx")
}
