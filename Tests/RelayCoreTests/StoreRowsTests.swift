import Testing
@testable import RelayCore

/// The one decoder of each stored row (StoreRows.swift) over the three column sources: a
/// [SQLValue] row, a [PGValue] row and a stepped SQLite statement.
@Suite struct StoreRowsTests {
    let expected = OutboxRow(id: "0190a3e4-0000-7000-8000-000000000001", app: "com.example.app", pushToken: "ab12", sessionIdentifier: "s1",
                             keyID: [1, 2], messageIndex: 7, encryptedData: [9, 8, 7], credentialID: "cred_1", state: .retry,
                             attempts: 2, nextAttemptAt: 100, createdAt: 50, expiresAt: 900, lastStatus: nil, lastReason: nil, updatedAt: 60)

    func sqlValues(_ r: OutboxRow) -> [SQLValue] {
        [.text(r.id), .text(r.app), .text(r.pushToken), .text(r.sessionIdentifier), .blob(r.keyID), .integer(Int64(r.messageIndex)),
         .blob(r.encryptedData), .text(r.credentialID), .text(r.state.rawValue), .integer(Int64(r.attempts)), .integer(r.nextAttemptAt),
         .integer(r.createdAt), .integer(r.expiresAt), r.lastStatus.map { .integer(Int64($0)) } ?? .null,
         r.lastReason.map { .text($0) } ?? .null, .integer(r.updatedAt)]
    }

    func pgValues(_ r: OutboxRow) -> [PGValue] {
        [.text(r.id), .text(r.app), .text(r.pushToken), .text(r.sessionIdentifier), .bytes(r.keyID), .int(Int64(r.messageIndex)),
         .bytes(r.encryptedData), .text(r.credentialID), .text(r.state.rawValue), .int(Int64(r.attempts)), .int(r.nextAttemptAt),
         .int(r.createdAt), .int(r.expiresAt), r.lastStatus.map { .int(Int64($0)) } ?? .null,
         r.lastReason.map { .text($0) } ?? .null, .int(r.updatedAt)]
    }

    @Test func theThreeColumnSourcesDecodeTheSameRow() throws {
        var withStatus = expected
        withStatus.lastStatus = 429
        withStatus.lastReason = "TooManyRequests"
        for row in [expected, withStatus] {
            #expect(try OutboxRow(columns: sqlValues(row)) == row)
            #expect(try OutboxRow(columns: pgValues(row)) == row)
            let dir = TempDir()
            let db = try SQLiteDatabase(path: dir.db)
            let st = try db.statement("SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, 42")
            for (i, v) in sqlValues(row).enumerated() {
                switch v {
                case .text(let s): try st.bind(Int32(i + 1), s)
                case .blob(let b): try st.bind(Int32(i + 1), b)
                case .integer(let n): try st.bind(Int32(i + 1), n)
                default: try st.bindNull(Int32(i + 1))
                }
            }
            #expect(try st.next())
            // A claim appends the rowid after the 16 columns.
            #expect(try OutboxRow(columns: st) == row)
            st.reset()
        }
    }

    @Test func aMalformedRowIsAnErrorNotADefault() {
        var noID = sqlValues(expected)
        noID[0] = .null
        var badState = sqlValues(expected)
        badState[8] = .text("sent")
        let short = Array(sqlValues(expected).prefix(15))
        for bad in [noID, badState, short] {
            #expect(throws: StoreError.self) { try OutboxRow(columns: bad) }
        }
        var badPG = pgValues(expected)
        badPG[8] = .null
        #expect(throws: StoreError.self) { try OutboxRow(columns: badPG) }
    }

    @Test func credentialColumnsAndTheAppsList() {
        let c: [SQLValue] = [.text("cred_1"), .text("ops"), .text("a,b,,c"), .integer(5), .null, .integer(9)]
        #expect(CredentialRecord(columns: c) == CredentialRecord(id: "cred_1", name: "ops", apps: ["a", "b", "c"], createdAt: 5, lastUsedAt: nil, revokedAt: 9))
        #expect(CredentialKey(columns: [PGValue.text("cred_2"), .bytes([1]), .null, .text("x.y,z")]) == CredentialKey(id: "cred_2", hash: [1], revoked: false, apps: ["x.y", "z"]))
        #expect(Credentials.splitApps(Credentials.joinApps(["x.y", "z"])) == ["x.y", "z"])
        #expect(Credentials.splitApps(",a,,b.\u{e9},") == ["a", "b.\u{e9}"])
        #expect(Credentials.splitApps("") == [])
        #expect(Credentials.splitApps(",,") == [])
    }

    @Test func aNewCredentialNeedsANameAndCommaFreeApps() throws {
        try StoreRules.checkNewCredential(name: "ops", apps: ["a", "b"])
        #expect(throws: StoreError.self) { try StoreRules.checkNewCredential(name: "", apps: ["a"]) }
        #expect(throws: StoreError.self) { try StoreRules.checkNewCredential(name: "ops", apps: []) }
        #expect(throws: StoreError.self) { try StoreRules.checkNewCredential(name: "ops", apps: ["a,b"]) }
        #expect(throws: StoreError.self) { try StoreRules.checkNewCredential(name: "ops", apps: ["a", ""]) }
    }

    @Test func mintingKeepsOnlyTheHashOfTheShownSecret() throws {
        let (created, hash) = try Credentials.mint(name: "ops", apps: ["a"], now: 42)
        #expect(created.secret.hasPrefix(Credentials.prefix))
        #expect(hash == Credentials.hash(secret: created.secret))
        #expect(created.record == CredentialRecord(id: created.record.id, name: "ops", apps: ["a"], createdAt: 42, lastUsedAt: nil, revokedAt: nil))
        #expect(created.record.id.hasPrefix("cred_"))
        #expect(throws: StoreError.self) { try Credentials.mint(name: "ops", apps: ["a,b"], now: 42) }
    }
}

