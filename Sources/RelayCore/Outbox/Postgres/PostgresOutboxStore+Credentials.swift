// PostgresOutboxStore: the credentials table (create, list, revoke, authenticate).
import FoundationEssentials
import Glibc
import Synchronization

extension PostgresOutboxStore {
    public func createCredential(name: String, apps: [String]) throws -> CreatedCredential {
        guard !name.isEmpty else { throw StoreError.invalid("credential name must not be empty") }
        guard !apps.isEmpty, apps.allSatisfy({ !$0.isEmpty && !$0.contains(",") }) else {
            throw StoreError.invalid("credential needs at least one app (bundle ID without commas)")
        }
        let secret = Credentials.generateSecret()
        let hash = Credentials.hash(secret: secret)
        let id = Credentials.generateID()
        let now = clock.nowMillis()
        _ = try write { c in
            try c.query("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ($1, $2, $3, $4, $5)",
                        [.text(id), .text(name), .bytes(hash), .text(apps.joined(separator: ",")), .int(now)])
        }
        return CreatedCredential(record: CredentialRecord(id: id, name: name, apps: apps, createdAt: now, lastUsedAt: nil, revokedAt: nil), secret: secret)
    }

    static func decodeCredential(_ r: PGRow) -> CredentialRecord {
        CredentialRecord(id: r[0].string ?? "", name: r[1].string ?? "", apps: SQLiteOutboxStore.splitApps(r[2].string ?? ""),
                         createdAt: r[3].int ?? 0, lastUsedAt: r[4].int, revokedAt: r[5].int)
    }

    public func credentials() throws -> [CredentialRecord] {
        try read { c in
            try c.query("SELECT id, name, apps, created_at, last_used_at, revoked_at FROM credentials ORDER BY created_at, id").map(Self.decodeCredential)
        }
    }

    public func revokeCredential(id: String) throws -> Bool {
        let now = clock.nowMillis()
        return try write { c in
            try c.run("UPDATE credentials SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL", [.int(now), .text(id)]).affected > 0
        }
    }

    public func authenticate(secret: String) throws -> CredentialRecord? {
        let hash = Credentials.hash(secret: secret)
        return try read { c in
            guard let r = try c.query("SELECT id, name, apps, created_at, last_used_at, revoked_at, hash FROM credentials WHERE hash = $1",
                                      [.bytes(hash)]).first,
                  let stored = r[6].bytes, RelayCrypto.constantTimeEqual(stored, hash)
            else { return nil }
            let record = Self.decodeCredential(r)
            return record.isRevoked ? nil : record
        }
    }

    public func credentialKeys(unlessAt known: CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?) {
        try read { c in
            let g = try c.query("SELECT count(*), count(revoked_at), coalesce(max(created_at), 0) FROM credentials")[0]
            let generation = CredentialGeneration(count: Int(g[0].int ?? 0), revoked: Int(g[1].int ?? 0), newestCreatedAt: g[2].int ?? 0)
            guard generation != known else { return (generation, nil) }
            let keys = try c.query("SELECT id, hash, revoked_at FROM credentials").map {
                CredentialKey(id: $0[0].string ?? "", hash: $0[1].bytes ?? [], revoked: $0[2].int != nil)
            }
            return (generation, keys)
        }
    }
}
