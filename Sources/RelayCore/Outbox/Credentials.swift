// Bearer credential secrets, ids and hashes: the same for both stores.
import Ratchet

/// Bearer credentials: `rk_` + base64url of 32 random bytes; stored as SHA-256 only.
public enum Credentials {
    public static let prefix = "rk_"

    public static func generateSecret() -> String { prefix + RelayCrypto.randomBytes(32).base64URLString }
    public static func generateID() -> String { "cred_" + RelayCrypto.randomBytes(6).hexString }
    public static func hash(secret: String) -> [UInt8] { RelayCrypto.sha256(Array(secret.utf8)) }
}
