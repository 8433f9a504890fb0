// Bearer credential secrets, ids, hashes and the stored apps list: the same for both stores.
import Basics

/// Bearer credentials: `rk_` + base64url of 32 random bytes; stored as SHA-256 only.
public enum Credentials {
    public static let prefix = "rk_"

    public static func generateSecret() -> String { prefix + RelayCrypto.randomBytes(32).base64URLString }
    public static func generateID() -> String { "cred_" + Hex.encode(RelayCrypto.randomBytes(6)) }
    public static func hash(secret: String) -> [UInt8] { RelayCrypto.sha256(Array(secret.utf8)) }

    /// A new credential (checked by StoreRules.checkNewCredential): the record with its secret,
    /// shown once, and the hash the store keeps instead of it.
    static func mint(name: String, apps: [String], now: Int64) throws -> (created: CreatedCredential, hash: [UInt8]) {
        try StoreRules.checkNewCredential(name: name, apps: apps)
        let secret = generateSecret()
        let record = CredentialRecord(id: generateID(), name: name, apps: apps, createdAt: now, lastUsedAt: nil, revokedAt: nil)
        return (CreatedCredential(record: record, secret: secret), hash(secret: secret))
    }

    /// The credentials.apps column: bundle IDs joined by commas (StoreRules.checkNewCredential
    /// refuses a comma inside one).
    static func joinApps(_ apps: [String]) -> String { apps.joined(separator: ",") }
    /// Split on the byte, not the Character: the SQLite writer reads the column once per
    /// credential and batch, and a grapheme walk cost more than the row's own admission.
    static func splitApps(_ s: String) -> [String] {
        s.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: true).compactMap { String($0) }
    }
}
