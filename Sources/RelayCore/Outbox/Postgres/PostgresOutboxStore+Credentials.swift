// PostgresOutboxStore: the credentials table (create, list, revoke, authenticate).
import FoundationEssentials
import Glibc
import Synchronization

extension PostgresOutboxStore {
    /// Idempotent by (id, hash): when the INSERT's answer is lost with its connection (it may
    /// have committed), it runs once more on a new connection, which stores the row once either
    /// way; only if that fails too is the caller told the outcome is unknown, never "failed"
    /// for a credential that exists.
    public func createCredential(name: String, apps: [String]) throws -> CreatedCredential {
        let (created, hash) = try Credentials.mint(name: name, apps: apps, now: clock.nowMillis())
        let r = created.record
        let insert: (PostgresConnection) throws -> Void = { c in
            try c.query("INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                        [.text(r.id), .text(r.name), .bytes(hash), .text(Credentials.joinApps(r.apps)), .int(r.createdAt)])
        }
        do {
            try write(insert)
        } catch StoreError.unavailable(let why) {
            do {
                try write(insert)
            } catch {
                throw StoreError.unavailable("\(why); again: \(error); credential \(r.id) may have been created: check `relayctl credentials list` and revoke it if it is there")
            }
        }
        // The row under this id is ours (same hash), whichever attempt stored it.
        guard try read({ c in try c.query("SELECT hash FROM credentials WHERE id = $1", [.text(r.id)]).first?.first?.bytes }) == hash else {
            throw StoreError.invalid("credential id \(r.id) is taken by another credential")
        }
        return created
    }

    public func credentials() throws -> [CredentialRecord] {
        try read { c in
            try c.query(StoreStatements.credentials).map(CredentialRecord.init(columns:))
        }
    }

    public func revokeCredential(id: String) throws -> Bool {
        let now = clock.nowMillis()
        return try write { c in
            try c.run(StoreStatements.revokeCredential(id: id, now: now)).affected > 0
        }
    }

    public func authenticate(secret: String) throws -> CredentialRecord? {
        let hash = Credentials.hash(secret: secret)
        return try read { c in
            guard let r = try c.query(StoreStatements.authenticate(hash: hash)).first,
                  let stored = r[6].bytes, RelayCrypto.constantTimeEqual(stored, hash)
            else { return nil }
            let record = CredentialRecord(columns: r)
            return record.isRevoked ? nil : record
        }
    }

    public func credentialKeys(unlessAt known: CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?) {
        try read { c in
            // The generation before the rows (two autocommit reads): a change between them is
            // seen as a newer generation at the next read, never hidden under an older one.
            let generation = CredentialGeneration(try c.query(StoreStatements.credentialGeneration).first?.first?.int ?? 0)
            guard generation != known else { return (generation, nil) }
            let keys = try c.query(StoreStatements.credentialKeys).map(CredentialKey.init(columns:))
            return (generation, keys)
        }
    }
}
