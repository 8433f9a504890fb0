import Foundation
import Testing
@testable import RelayCore

/// The seam both stores run shared statements through (StoreStatement.swift): SQL written once
/// with `$N`, rendered `?N` for SQLite.
@Suite struct StoreStatementTests {
    @Test func placeholdersAreRenderedForSQLiteOutsideLiteralsAndWords() {
        let cases: [(String, String)] = [
            ("SELECT $1", "SELECT ?1"),
            ("a = $1 AND b > $1 AND c = $2", "a = ?1 AND b > ?1 AND c = ?2"),   // the same N twice: one value
            ("($10, $1, $2)", "(?10, ?1, ?2)"),                                   // $10 is parameter ten
            ("x = '$1' AND y = $1", "x = '$1' AND y = ?1"),                       // a literal is text
            ("'it''s $2' || $2", "'it''s $2' || ?2"),                             // a doubled quote stays inside
            ("\"col $3\" = $3", "\"col $3\" = ?3"),                               // a quoted identifier too
            ("x$1 = $1", "x$1 = ?1"),                                             // $ inside a word: an identifier
            ("price$ = $ AND $a", "price$ = $ AND $a"),                           // $ without digits
            ("", ""),
        ]
        for (written, sqlite) in cases {
            let sql = StoreSQL(written)
            #expect(sql.sqlite == sqlite, "\(written)")
            #expect(sql.postgres == written)
        }
    }

    @Test func theSharedStatementsRenderEveryPlaceholder() throws {
        let statements = [
            StoreStatements.attempts(responseID: "x"), StoreStatements.credentials, StoreStatements.authenticate(hash: [1]),
            StoreStatements.revokeCredential(id: "x", now: 1), StoreStatements.credentialGeneration, StoreStatements.credentialKeys,
            StoreStatements.unregisteredTokens, StoreStatements.forgetToken("x"), StoreStatements.hastenQueued(app: "a", now: 1),
            try StoreStatements.purgeCount(state: .failed, olderThan: 1),
        ]
        for s in statements {
            #expect(!s.sql.sqlite.contains("$"), "\(s.sql.postgres)")
            // $1 ... $n, each used: the values line up with the placeholders.
            for n in 0..<s.values.count {
                #expect(s.sql.postgres.contains("$\(n + 1)") && s.sql.sqlite.contains("?\(n + 1)"), "\(s.sql.postgres)")
            }
            #expect(!s.sql.postgres.contains("$\(s.values.count + 1)"), "\(s.sql.postgres)")
        }
        #expect(throws: StoreError.self) { try StoreStatements.purgeCount(state: .inflight, olderThan: 1) }
    }

    /// SQLite binds `?N` by number: a value used twice is bound once, and the values of every kind
    /// arrive as they were given.
    @Test func sqliteRunsARenderedStatementWithEachKindOfValue() throws {
        let dir = TempDir()
        let db = try SQLiteDatabase(path: dir.db)
        try db.execute("CREATE TABLE t (a INTEGER, b TEXT, c BLOB, d TEXT)")
        let insert = StoreStatement(StoreSQL("INSERT INTO t VALUES ($1, $2, $3, $4)"), [.int(7), .text("é'$1"), .bytes([0, 1, 255]), .null])
        #expect(try db.run(insert) == 1)
        let read = StoreStatement(StoreSQL("SELECT a + $1, b, c, d IS NULL, '$1' FROM t WHERE a = $1 OR b = $2"), [.int(7), .text("-")])
        #expect(try db.query(read) == [[.integer(14), .text("é'$1"), .blob([0, 1, 255]), .integer(1), .text("$1")]])
    }
}

extension StoreContractTests {
    /// The shared statements' orders and generations, alike on both backends: marks newest
    /// first, ties by token; credential keys re-read only when the generation moved.
    @Test(arguments: StoreBackend.available)
    func marksListNewestFirstThenByTokenAndKeysFollowTheGeneration(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let first = try s.credentialKeys(unlessAt: nil)
        #expect(first.keys?.map(\.id) == [c.record.id])
        #expect(try s.credentialKeys(unlessAt: first.generation).keys == nil)
        #expect(try s.revokeCredential(id: c.record.id))
        let revoked = try s.credentialKeys(unlessAt: first.generation)
        #expect(revoked.generation != first.generation)
        #expect(revoked.keys?.map(\.revoked) == [true])

        let d = try s.createCredential(name: "d", apps: ["com.example.app"])
        func mark(_ token: String, index: UInt32) throws {
            _ = try s.ingestNow(sample(token: token, index: index), secret: d.secret)
            let r = try s.claimDue(limit: 1)[0]
            try s.apply([DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: f.clock.nowMillis()), attempt: nil)])
        }
        let tokens = ["c3", "a1", "b2", "d4"].map { String(repeating: $0, count: 32) }
        for (i, token) in tokens.dropLast().enumerated() { try mark(token, index: UInt32(i)) }   // in one millisecond
        f.clock.advance(10)
        try mark(tokens[3], index: 9)
        #expect(try s.unregisteredTokens().map(\.token) == [tokens[3], tokens[1], tokens[2], tokens[0]])
    }
}
