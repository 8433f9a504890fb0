// The "store" section for PostgreSQL and the backend factory relay-server and relayctl use.
import Foundation
import Testing
@testable import RelayCore

@Suite struct PostgresConfigTests {
    let app = #"{"bundleID":"com.example.app","environment":"sandbox","token":{"p8Path":"/k.p8","keyID":"ABC123DEFG","teamID":"DEF123GHIJ"}}"#

    func parse(store: String, dispatch: String = "") throws -> RelayConfig {
        let extra = dispatch.isEmpty ? "" : #","dispatch":"# + dispatch
        return try RelayConfig.parse(Array(#"{"store":\#(store),"apps":[\#(app)]\#(extra)}"#.utf8), baseDirectory: "/etc/relay")
    }

    func error(store: String, dispatch: String = "") -> ConfigError? {
        do { _ = try parse(store: store, dispatch: dispatch); return nil } catch { return error as? ConfigError }
    }

    @Test func postgresStoreIsParsed() throws {
        let c = try parse(store: #"{"kind":"postgres","url":"postgresql://relay@db:5432/relay","nodeId":"relay-1","leaseSeconds":200,"maxPending":5000,"maxClockOffsetSeconds":3}"#)
        #expect(c.store.kind == "postgres")
        #expect(c.store.maxClockOffsetSeconds == 3)
        #expect(c.store.url == "postgresql://relay@db:5432/relay")
        #expect(c.store.nodeID == "relay-1")
        #expect(c.store.leaseSeconds == 200)
        #expect(c.store.maxPending == 5000)
        let d = try parse(store: #"{"kind":"postgres","url":"postgresql://db/relay"}"#)
        #expect(d.store.nodeID == nil && d.store.leaseSeconds == 180 && d.store.maxClockOffsetSeconds == 10)
    }

    @Test func deadlinesAreParsedWithDefaultsAndLimits() throws {
        let d = try parse(store: #"{"kind":"postgres","url":"postgresql://db/relay"}"#).store.timeouts
        #expect(d == PostgresTimeouts())
        #expect(d.requestMillis == 5_000 && d.statementMillis == 4_000 && d.lockMillis == 2_000)
        #expect(d.idleInTransactionMillis == 10_000 && d.tcpUserMillis == 10_000 && d.readinessMillis == 2_000)
        let c = try parse(store: #"{"kind":"postgres","url":"postgresql://db/relay","requestTimeoutMs":20000,"statementTimeoutMs":15000,"lockTimeoutMs":0,"idleInTransactionTimeoutMs":60000,"tcpUserTimeoutMs":0}"#).store.timeouts
        #expect(c.requestMillis == 20_000 && c.statementMillis == 15_000 && c.lockMillis == 0)
        #expect(c.idleInTransactionMillis == 60_000 && c.tcpUserMillis == 0)
        #expect(c.sessionSQL == "SET statement_timeout = 15000; SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 60000")
        // A short request deadline pulls the server-side ones below it when they are left out.
        let short = try parse(store: #"{"kind":"postgres","url":"postgresql://db/relay","requestTimeoutMs":1000}"#).store.timeouts
        #expect(short.statementMillis == 800 && short.lockMillis == 400 && short.readinessMillis == 1_000)
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","requestTimeoutMs":50}"#)?.key == "store.requestTimeoutMs")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","lockTimeoutMs":-1}"#)?.key == "store.lockTimeoutMs")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","tcpUserTimeoutMs":1.5}"#)?.key == "store.tcpUserTimeoutMs")
        let over = error(store: #"{"kind":"postgres","url":"postgresql://db/relay","requestTimeoutMs":1000,"statementTimeoutMs":2000}"#)
        #expect(over?.key == "store.statementTimeoutMs" && over?.message.contains("requestTimeoutMs") == true)
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","requestTimeoutMs":1000,"lockTimeoutMs":2000}"#)?.key == "store.lockTimeoutMs")
        #expect(error(store: #"{"kind":"sqlite","statementTimeoutMs":1000}"#)?.key == "store.statementTimeoutMs")
    }

    /// config/relay.example.json's "_postgres_example" is a valid store section with every
    /// PostgreSQL key (exampleConfigParses reads the rest of the file).
    @Test func theExamplesPostgresSectionParses() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../config/relay.example.json").standardized.path
        let json = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any])
        var section = try #require((json["store"] as? [String: Any])?["_postgres_example"] as? [String: Any])
        section["_comment"] = nil
        let text = String(decoding: try JSONSerialization.data(withJSONObject: section), as: UTF8.self)
        let c = try parse(store: text)
        #expect(c.store.kind == "postgres" && c.store.url?.contains("target_session_attrs=read-write") == true)
        #expect(c.store.timeouts == PostgresTimeouts())
    }

    @Test func sqliteStaysTheDefault() throws {
        let c = try RelayConfig.parse(Array(#"{"apps":[\#(app)]}"#.utf8), baseDirectory: "/var/lib/relay")
        #expect(c.store.kind == "sqlite" && c.store.path == "/var/lib/relay/relay.db" && c.store.url == nil)
    }

    @Test func invalidStoreSectionsNameTheKey() {
        #expect(error(store: #"{"kind":"postgres"}"#)?.key == "store.url")
        #expect(error(store: #"{"kind":"postgres","url":"mysql://db"}"#)?.key == "store.url")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","path":"x.db"}"#)?.key == "store.path")
        #expect(error(store: #"{"kind":"sqlite","url":"postgresql://db/relay"}"#)?.key == "store.url")
        #expect(error(store: #"{"kind":"sqlite","leaseSeconds":30}"#)?.key == "store.leaseSeconds")
        #expect(error(store: #"{"kind":"sqlite","maxClockOffsetSeconds":5}"#)?.key == "store.maxClockOffsetSeconds")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","maxClockOffsetSeconds":0}"#)?.key == "store.maxClockOffsetSeconds")
        #expect(error(store: #"{"kind":"oracle"}"#)?.key == "store.kind")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","nodeId":""}"#)?.key == "store.nodeId")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","leaseSeconds":1}"#)?.key == "store.leaseSeconds")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","bogus":1}"#)?.key == "store.bogus")
        // A lease must outlive the longest the APNs client holds a push (queued, then waiting
        // for a slow answer), or a live node's push could be sent twice: 30 + 120 + 1 s by default.
        let short = error(store: #"{"kind":"postgres","url":"postgresql://db/relay","leaseSeconds":151}"#)
        #expect(short?.key == "store.leaseSeconds")
        #expect(short?.message.contains("maxAnswerWaitMs") == true && short?.message.contains("maxQueueWaitMs") == true, "\(String(describing: short))")
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","leaseSeconds":152}"#) == nil)
        let tuned = #"{"requestTimeoutMs":1000,"maxAnswerWaitMs":2000,"maxQueueWaitMs":1000}"#
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","leaseSeconds":5}"#, dispatch: tuned) == nil)
        #expect(error(store: #"{"kind":"postgres","url":"postgresql://db/relay","leaseSeconds":4}"#, dispatch: tuned)?.key == "store.leaseSeconds")
        // The answer wait includes the request timeout.
        #expect(error(store: #"{"kind":"sqlite"}"#, dispatch: #"{"requestTimeoutMs":10000,"maxAnswerWaitMs":9000}"#)?.key == "dispatch.maxAnswerWaitMs")
    }

    @Test func databaseURLCanComeFromTheEnvironment() throws {
        var c = try parse(store: #"{"kind":"postgres","url":"postgresql://relay@db/relay"}"#)
        try c.applyEnvironment(["RELAY_DB_URL": "postgresql://relay:secret@db/relay"])
        #expect(c.store.url == "postgresql://relay:secret@db/relay")
        #expect(OutboxStores.describe(c.store) == "user=relay password=*** dbname=relay host=db")  // libpq's reading, password masked
        var s = try parse(store: #"{"kind":"sqlite"}"#)
        #expect(throws: ConfigError.self) { try s.applyEnvironment(["RELAY_DB_URL": "postgresql://db/relay"]) }
    }

    @Test(arguments: StoreBackend.available)
    func theFactoryOpensTheConfiguredBackend(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        var config = RelayConfig.Store()
        switch backend {
        case .sqlite: config.path = f.dir.db
        case .postgres:
            config.kind = "postgres"
            config.url = f.pgURL
            config.nodeID = "factory-node"
        }
        let s = try OutboxStores.open(config, clock: f.clock)
        defer { s.close() }
        #expect(s.checkWritable())
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted = try s.ingestNow(sample(), secret: c.secret) else { Issue.record("not accepted"); return }
        #expect(OutboxStores.writerStats(s)?.jobs ?? 0 >= 1)
        let reader = try OutboxStores.open(config, readOnly: true, clock: f.clock)
        defer { reader.close() }
        #expect(try reader.counts().byState[.queued] == 1)
        #expect(!reader.checkWritable())
        if backend == .postgres { #expect((s as? PostgresOutboxStore)?.nodeID == "factory-node") }
    }
}
