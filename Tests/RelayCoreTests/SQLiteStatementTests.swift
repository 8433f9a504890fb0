import Foundation
import Testing
@testable import RelayCore

/// The typed binders copy text and blobs into the statement's arena and bind them SQLITE_STATIC;
/// values that do not fit go TRANSIENT. Either way SQLite must store exactly what was bound,
/// also when the arena is reused by the next execution.
@Suite struct SQLiteStatementTests {
    @Test func typedBindsStoreExactlyWhatWasBoundAcrossArenaReuseAndOverflow() throws {
        let dir = TempDir()
        let db = try SQLiteDatabase(path: dir.db)
        try db.execute("CREATE TABLE t (a TEXT, b BLOB, c TEXT)")
        let insert = try db.statement("INSERT INTO t VALUES (?, ?, ?)")
        let rows: [(String, [UInt8], String)] = [
            ("", [], "x"),                                                           // empty values
            ("héllo", [1, 2, 3], String(repeating: "z", count: 3000)),               // all in the arena
            (String(repeating: "q", count: 100), [UInt8](repeating: 7, count: 5000), "é"),  // blob over the arena
            (String(repeating: "a", count: 3000), [UInt8](repeating: 9, count: 2000), String(repeating: "c", count: 500)),  // overflow mid-row
            ("short", [4], "again"),                                                 // arena reused from its start
        ]
        for (a, b, c) in rows {
            try insert.bind(1, a)
            try insert.bind(2, b)
            try insert.bind(3, c)
            try insert.stepOnce()
        }
        let read = try db.statement("SELECT a, b, c, typeof(b) FROM t ORDER BY rowid")
        var got: [(String, [UInt8], String, String)] = []
        while try read.next() { got.append((read.text(0), read.blob(1), read.text(2), read.text(3))) }
        read.reset()
        #expect(got.count == rows.count)
        for (g, r) in zip(got, rows) {
            #expect(g.0 == r.0)
            #expect(g.1 == r.1)
            #expect(g.2 == r.2)
            #expect(g.3 == "blob")   // an empty blob is bound as a blob, not NULL
        }
        // The same statement runs again after its reads: reset rewinds, bindings stay usable.
        let count = try db.statement("SELECT count(*) FROM t WHERE a = ?")
        for (a, _, _) in rows {
            try count.bind(1, a)
            #expect(try count.next())
            #expect(count.int64(0) == 1)
            #expect(!count.isNull(0))
            count.reset()
        }
    }

    /// The arena is rewound after each step and overwritten by the next binds: a text parameter
    /// that is not bound again must read NULL, not the bytes of whatever was bound after it.
    @Test func aParameterNotBoundAgainReadsNullNotStaleArenaBytes() throws {
        let dir = TempDir()
        let db = try SQLiteDatabase(path: dir.db)
        try db.execute("CREATE TABLE t (a TEXT, b TEXT)")
        let insert = try db.statement("INSERT INTO t VALUES (?, ?)")
        try insert.bind(1, "first-a")
        try insert.bind(2, "first-b")
        try insert.stepOnce()
        try insert.bind(2, "second-b")   // parameter 1 not bound again
        try insert.stepOnce()
        let read = try db.statement("SELECT a, b FROM t ORDER BY rowid")
        var got: [(String?, String)] = []
        while try read.next() { got.append((read.isNull(0) ? nil : read.text(0), read.text(1))) }
        read.reset()
        #expect(got.count == 2)
        #expect(got.first?.0 == "first-a" && got.first?.1 == "first-b")
        #expect(got.last?.0 == nil && got.last?.1 == "second-b")
    }
}
