// ES256 provider tokens for APNs token auth.
import Basics
import FoundationEssentials
internal import OpenSSLSupport

public enum ProviderToken {
    /// `base64url(header).base64url(claims).base64url(r||s)` with header
    /// {"alg":"ES256","kid":keyID} and claims {"iss":teamID,"iat":seconds}.
    public static func make(key: TokenKey, issuedAt: Date) throws -> String {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        // keyID/teamID are alphanumeric (checked by TokenKey), so no JSON escaping is needed.
        let header = "{\"alg\":\"ES256\",\"kid\":\"\(key.keyID)\"}"
        let claims = "{\"iss\":\"\(key.teamID)\",\"iat\":\(iat)}"
        let signingInput = base64URL(Array(header.utf8)) + "." + base64URL(Array(claims.utf8))
        let signature: [UInt8]
        do throws(OpenSSLFailure) { signature = try key.signingKey.signES256(Array(signingInput.utf8)) } catch { throw PushClientError.crypto(error.description) }
        return signingInput + "." + base64URL(signature)
    }

    /// The .p8's key, refused unless it is a P-256 EC private key (the only curve ES256 allows).
    static func signingKey(pem: String) throws(PushClientError) -> AsymmetricKey {
        let key: AsymmetricKey
        do throws(OpenSSLFailure) { key = try AsymmetricKey(privateKeyPEM: pem) } catch {
            throw .invalidKey("not a PEM private key (\(error.detail ?? "unknown OpenSSL error"))")
        }
        guard key.isP256 else { throw .invalidKey("APNs keys are P-256 EC keys") }
        return key
    }

    /// Unpadded base64url (RFC 7515 JWS compact form).
    public static func base64URL(_ bytes: [UInt8]) -> String {
        Base64.encode(bytes, alphabet: .url, padding: false)
    }
}
