// SQLiteOutboxStore: the credentials table (create, list, revoke, authenticate).
import FoundationEssentials
import Glibc
import POSIXThreads

extension SQLiteOutboxStore {
    // Not shared: PostgreSQL's INSERT adds ON CONFLICT DO NOTHING, to be run again after a lost answer.
    public func createCredential(name: String, apps: [String]) throws -> CreatedCredential {
        let (created, hash) = try Credentials.mint(name: name, apps: apps, now: clock.nowMillis())
        let r = created.record
        _ = try write { db in
            try db.run(
                "INSERT INTO credentials (id, name, hash, apps, created_at) VALUES (?, ?, ?, ?, ?)",
                [.text(r.id), .text(r.name), .blob(hash), .text(Credentials.joinApps(r.apps)), .integer(r.createdAt)])
        }
        return created
    }

    public func credentials() throws -> [CredentialRecord] {
        try read { db in
            try db.query(StoreStatements.credentials).map(CredentialRecord.init(columns:))
        }
    }

    public func revokeCredential(id: String) throws -> Bool {
        let now = clock.nowMillis()
        return try write { db in
            try db.run(StoreStatements.revokeCredential(id: id, now: now)) > 0
        }
    }

    public func authenticate(secret: String) throws -> CredentialRecord? {
        let hash = Credentials.hash(secret: secret)
        return try read { db in
            guard let c = try db.query(StoreStatements.authenticate(hash: hash)).first,
                  let stored = c[6].bytes, RelayCrypto.constantTimeEqual(stored, hash)
            else { return nil }
            let record = CredentialRecord(columns: c)
            return record.isRevoked ? nil : record
        }
    }

    public func credentialKeys(unlessAt known: CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?) {
        try read { db in
            // The generation before the rows (two autocommit reads): a change between them is
            // seen as a newer generation at the next read, never hidden under an older one.
            let generation = CredentialGeneration(try db.query(StoreStatements.credentialGeneration).first?.first?.int ?? 0)
            guard generation != known else { return (generation, nil) }
            let keys = try db.query(StoreStatements.credentialKeys).map(CredentialKey.init(columns:))
            return (generation, keys)
        }
    }
}
