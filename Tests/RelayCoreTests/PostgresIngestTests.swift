// The PostgreSQL ingest path below the contract: binary array parameters, the plans of the
// batch statements, and how a batch fails. The contract shared with SQLite is in StoreTests.swift.
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import RelayCore

@Suite(.enabled(if: PGTest.url != nil, Comment(rawValue: PGTest.skipMessage)))
struct PostgresIngestTests {
    let f: StoreFixture
    init() throws { f = try StoreFixture(.postgres) }

    @Test func binaryArrayParametersRoundTripEveryElement() throws {
        let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
        let texts: [String?] = ["plain", "", nil, "quote \" backslash \\ comma , braces {} NULL", "ünïcødé ✓", String(repeating: "x", count: 5000)]
        let got = try c.query("SELECT x FROM unnest($1::text[]) WITH ORDINALITY AS u(x, n) ORDER BY n", [.textArray(texts)]).map { $0[0] }
        #expect(got == texts.map { $0.map(PGValue.text) ?? .null })
        let blobs: [[UInt8]] = [[], [0], [0, 0x5c, 0x22, 0xff], Array(0...255)]
        #expect(try c.query("SELECT x FROM unnest($1::bytea[]) WITH ORDINALITY AS u(x, n) ORDER BY n", [.bytesArray(blobs)]).map { $0[0] }
                == blobs.map(PGValue.bytes))
        let ints: [Int64?] = [0, -1, nil, .min, .max, 1_800_000_000_000]
        #expect(try c.query("SELECT x FROM unnest($1::bigint[]) WITH ORDINALITY AS u(x, n) ORDER BY n", [.intArray(ints)]).map { $0[0] }
                == ints.map { $0.map(PGValue.int) ?? .null })
        // Empty arrays are zero-dimensional, as PostgreSQL itself sends them.
        let empty = try c.query("SELECT cardinality($1::text[]), cardinality($2::bytea[]), cardinality($3::bigint[])",
                                [.textArray([]), .bytesArray([]), .intArray([])])
        #expect(empty == [[.int(0), .int(0), .int(0)]])
    }

    /// The plan PostgreSQL caches for a prepared statement once it stops planning per call.
    func genericPlan(_ sql: String, types: String, args: String) throws -> String {
        let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-admin")
        try c.execute("SET plan_cache_mode = force_generic_plan")
        try c.execute("PREPARE p(\(types)) AS \(sql)")
        return try c.query("EXPLAIN EXECUTE p(\(args))").compactMap { $0.first?.string }.joined(separator: "\n")
    }

    @Test func theDedupeLookupProbesTheUniqueKeyEvenPlannedOnAnEmptyTable() throws {
        let s = try f.openPostgres(nodeID: "a")
        defer { s.close() }
        // A join planned on the empty table of a fresh database hashed the batch's keys and read
        // every row of responses on each batch from then on.
        let plan = try genericPlan(PostgresOutboxStore.existingSQL, types: "text[], text[], bytea[], bigint[]", args: "NULL, NULL, NULL, NULL")
        #expect(plan.contains("Index Scan using responses_push_token_session_id_key_id_message_index_key"), "\(plan)")
        #expect(!plan.contains("Seq Scan on responses"), "\(plan)")
    }
}
