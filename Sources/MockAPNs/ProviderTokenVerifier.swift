// Provider-token (JWT) checks as APNs does them: structure, ES256 signature against the
// configured key for `kid`, `iss` = that key's team, numeric `iat` not older than one hour and
// not in the future. Pure apart from the signature check (OpenSSLCrypto.swift).
import Basics
import Foundation

/// A signing key APNs knows: key ID (10 characters from Apple), team ID, and its public key.
public struct MockTokenKey: Sendable {
    public let keyID: String
    public let teamID: String
    public let key: ECKey

    public init(keyID: String, teamID: String, key: ECKey) {
        self.keyID = keyID
        self.teamID = teamID
        self.key = key
    }

    /// `pem` is an Apple `.p8` (PKCS#8 private key) or a PEM public key.
    public init(keyID: String, teamID: String, pem: String) throws {
        self.init(keyID: keyID, teamID: teamID, key: try ECKey(pem: pem))
    }

    public init(keyID: String, teamID: String, pemPath: String) throws {
        let pem: String
        do { pem = try String(contentsOfFile: pemPath, encoding: .utf8) } catch {
            throw MockConfigurationError("token key \(keyID): cannot read \(pemPath): \(error.localizedDescription)")
        }
        do { try self.init(keyID: keyID, teamID: teamID, pem: pem) } catch {
            throw MockConfigurationError("token key \(keyID): \(pemPath): \(error)")
        }
    }
}

/// What a verified token says.
public struct ProviderTokenClaims: Sendable, Equatable {
    public let keyID: String
    public let teamID: String
    public let issuedAt: Int64
}

/// Why a token was refused, each mapping to APNs' 403 reason.
public enum ProviderTokenFailure: Error, Sendable, Equatable {
    case missing                 // MissingProviderToken
    case invalid(String)         // InvalidProviderToken (detail says which part)
    case expired                 // ExpiredProviderToken

    public var rejection: Rejection {
        switch self {
        case .missing: return Rejection(403, .missingProviderToken, detail: "authorization header missing")
        case .invalid(let why): return Rejection(403, .invalidProviderToken, detail: why)
        case .expired: return Rejection(403, .expiredProviderToken, detail: "iat older than one hour")
        }
    }
}

/// Checks provider tokens against the configured keys. Results of the signature check are cached
/// per token string (APNs clients reuse one token for up to an hour); time checks run every time.
public struct ProviderTokenVerifier: Sendable {
    public let keys: [String: MockTokenKey]
    /// APNs refuses tokens older than one hour.
    public var maximumAge: Int64 = 3600
    /// Tolerated clock skew for an `iat` in the future.
    public var futureSkew: Int64 = 60

    public init(keys: [MockTokenKey]) {
        var byID: [String: MockTokenKey] = [:]
        for key in keys { byID[key.keyID] = key }
        self.keys = byID
    }

    /// Parses the `authorization` header value and checks the token.
    public func verify(authorization: String?, now: Int64) -> Result<ProviderTokenClaims, ProviderTokenFailure> {
        guard let authorization, !authorization.isEmpty else { return .failure(.missing) }
        let parts = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            return .failure(.invalid("authorization is not 'bearer <token>'"))
        }
        return verify(token: trimmedSpaces(parts[1]), now: now)
    }

    public func verify(token: String, now: Int64) -> Result<ProviderTokenClaims, ProviderTokenFailure> {
        switch verifySignatureAndShape(token: token) {
        case .failure(let failure): return .failure(failure)
        case .success(let claims): return checkTime(claims, now: now)
        }
    }

    public func checkTime(_ claims: ProviderTokenClaims, now: Int64) -> Result<ProviderTokenClaims, ProviderTokenFailure> {
        if claims.issuedAt > now + futureSkew { return .failure(.invalid("iat is in the future")) }
        if now - claims.issuedAt > maximumAge { return .failure(.expired) }
        return .success(claims)
    }

    /// Everything that does not depend on the clock (so it can be cached per token string).
    public func verifySignatureAndShape(token: String) -> Result<ProviderTokenClaims, ProviderTokenFailure> {
        let segments = token.split(separator: ".", omittingEmptySubsequences: false)
        guard segments.count == 3 else { return .failure(.invalid("token is not three dot-separated parts")) }
        guard let headerBytes = Base64.decode(segments[0], alphabet: .url, padding: false),
              let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any] else {
            return .failure(.invalid("header is not base64url JSON"))
        }
        guard header["alg"] as? String == "ES256" else { return .failure(.invalid("alg is not ES256")) }
        guard let kid = header["kid"] as? String, !kid.isEmpty else { return .failure(.invalid("kid missing")) }
        guard let claimBytes = Base64.decode(segments[1], alphabet: .url, padding: false),
              let claims = try? JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any] else {
            return .failure(.invalid("claims are not base64url JSON"))
        }
        guard let iss = claims["iss"] as? String, !iss.isEmpty else { return .failure(.invalid("iss missing")) }
        guard let iat = numericDate(claims["iat"]) else { return .failure(.invalid("iat missing or not a number")) }
        guard let signature = Base64.decode(segments[2], alphabet: .url, padding: false), signature.count == 64 else {
            return .failure(.invalid("signature is not 64 bytes base64url (raw r||s)"))
        }
        guard let key = keys[kid] else { return .failure(.invalid("unknown kid")) }
        guard key.teamID == iss else { return .failure(.invalid("iss does not match the key's team")) }
        let signingInput = Array(token.utf8[..<segments[1].endIndex])
        let valid = (try? key.key.verifyES256(signature: signature, message: signingInput)) ?? false
        guard valid else { return .failure(.invalid("bad signature")) }
        return .success(ProviderTokenClaims(keyID: kid, teamID: iss, issuedAt: iat))
    }

    /// JSON numbers only (not strings, not booleans), integral, as JWT NumericDate.
    private func numericDate(_ value: Any?) -> Int64? {
        guard let number = value as? NSNumber else { return nil }
        // Booleans bridge to NSNumber too; their objCType is "c" (char) on every platform.
        if String(cString: number.objCType) == "c" || value is Bool { return nil }
        let double = number.doubleValue
        guard double.isFinite, double == double.rounded(), abs(double) < 1e15 else { return nil }
        return Int64(double)
    }
}

/// Mints ES256 provider tokens exactly as APNs expects them. Used by the tests and handy for
/// users' own tests against the mock; the relay's production signer lives in PushClient.
public enum ProviderTokenMinter {
    public static func mint(key: ECKey, keyID: String, teamID: String, issuedAt: Int64) throws -> String {
        let header = Base64.encode(Array(#"{"alg":"ES256","kid":"\#(keyID)"}"#.utf8), alphabet: .url, padding: false)
        let claims = Base64.encode(Array(#"{"iss":"\#(teamID)","iat":\#(issuedAt)}"#.utf8), alphabet: .url, padding: false)
        let input = header + "." + claims
        let signature = try key.signES256(message: Array(input.utf8))
        return input + "." + Base64.encode(signature, alphabet: .url, padding: false)
    }
}
