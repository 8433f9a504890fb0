// ES256 provider tokens for APNs token auth.
import Basics
import FoundationEssentials

public enum ProviderToken {
    /// `base64url(header).base64url(claims).base64url(r||s)` with header
    /// {"alg":"ES256","kid":keyID} and claims {"iss":teamID,"iat":seconds}.
    public static func make(key: TokenKey, issuedAt: Date) throws -> String {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        // keyID/teamID are alphanumeric (checked by TokenKey), so no JSON escaping is needed.
        let header = "{\"alg\":\"ES256\",\"kid\":\"\(key.keyID)\"}"
        let claims = "{\"iss\":\"\(key.teamID)\",\"iat\":\(iat)}"
        let signingInput = base64URL(Array(header.utf8)) + "." + base64URL(Array(claims.utf8))
        let signature = try key.signingKey.sign(Array(signingInput.utf8))
        return signingInput + "." + base64URL(signature)
    }

    /// Unpadded base64url (RFC 7515 JWS compact form).
    public static func base64URL(_ bytes: [UInt8]) -> String {
        Base64.encode(bytes, alphabet: .url, padding: false)
    }
}
