// What `check-config` reads from certificates and private keys (validity dates, key type,
// key/certificate match), through OpenSSLSupport: relayctl calls no OpenSSL function itself.
import Foundation
internal import OpenSSLSupport

/// An OpenSSL failure carrying OpenSSL's own message.
struct KeyMaterialError: Error, CustomStringConvertible {
    var description: String

    /// "what: OpenSSL's words", or just "what" when OpenSSL said nothing.
    init(_ failure: OpenSSLFailure) { description = failure.detail.map { "\(failure.operation): \($0)" } ?? failure.operation }
    init(description: String) { self.description = description }
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

enum KeyMaterial {
    /// A .p12/.pfx file's certificate and key (PKCS#12, as Keychain Access exports them).
    private static func pkcs12(atPath path: String, passphrase: String?) throws -> (X509Certificate, AsymmetricKey) {
        do throws(PKCS12File.Failure) { return try PKCS12File.read(path: path, passphrase: passphrase) } catch {
            switch error {
            case .cannotOpen: throw KeyMaterialError(description: "\(path): cannot open the file")
            case .unreadable(let f):
                throw KeyMaterialError(OpenSSLFailure(operation: "\(path): not a PKCS#12 file with a certificate and key, or wrong passphrase",
                                                      detail: f.detail))
            }
        }
    }

    private static func pemCertificate(_ path: String) throws -> X509Certificate {
        do throws(OpenSSLFailure) { return try X509Certificate(pemFile: path) } catch { throw KeyMaterialError(error) }
    }

    private static func pemKey(_ path: String, _ passphrase: String?) throws -> AsymmetricKey {
        do throws(OpenSSLFailure) { return try AsymmetricKey(privateKeyPEMFile: path, passphrase: passphrase) } catch { throw KeyMaterialError(error) }
    }

    /// Summary of a PEM certificate, or of the certificate inside a .p12/.pfx file.
    static func certificate(atPath path: String, passphrase: String? = nil) throws -> CertificateSummary {
        let cert = PKCS12File.isPKCS12Path(path) ? try pkcs12(atPath: path, passphrase: passphrase).0 : try pemCertificate(path)
        guard let subject = cert.subject else { throw KeyMaterialError(.drained("\(path): cannot read the subject")) }
        guard var notBefore = cert.notBefore, var notAfter = cert.notAfter else {
            throw KeyMaterialError(.drained("\(path): unreadable certificate validity dates"))
        }
        return CertificateSummary(subject: subject, notBefore: Date(timeIntervalSince1970: TimeInterval(timegm(&notBefore))),
                                  notAfter: Date(timeIntervalSince1970: TimeInterval(timegm(&notAfter))))
    }

    static func privateKey(atPath path: String, passphrase: String? = nil) throws -> PrivateKeySummary {
        let key = try pemKey(path, passphrase)
        var curve: String?
        if key.typeName == "EC" {
            guard let name = key.curveName else { throw KeyMaterialError(description: "\(path): EC key without a named curve") }
            curve = name
        }
        return PrivateKeySummary(type: key.typeName, curve: curve, bits: key.bits)
    }

    /// True when the private key is the certificate's.
    /// For a .p12/.pfx `certificatePath` the key is the one inside it (`keyPath` is ignored).
    static func keyMatchesCertificate(certificatePath: String, keyPath: String, passphrase: String? = nil) throws -> Bool {
        let (cert, key) = PKCS12File.isPKCS12Path(certificatePath)
            ? try pkcs12(atPath: certificatePath, passphrase: passphrase)
            : (try pemCertificate(certificatePath), try pemKey(keyPath, passphrase))
        return cert.matches(key)
    }
}
