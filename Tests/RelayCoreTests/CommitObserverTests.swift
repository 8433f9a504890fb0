// The store's commit announcements (OutboxCommit.swift), one contract on both backends: told
// after COMMIT (what it names is visible to another connection by then), never after a
// rollback, nothing for a transaction that changed nothing an observer acts on.
import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// Records every commit it is told of, with what another connection saw at that moment.
final class CommitRecorder: OutboxCommitObserver, Sendable {
    struct Seen {
        var commit: OutboxCommit
        /// The probe's answer, read while the store was telling us.
        var visible: [[String?]]
    }

    let room: Int
    private let probe: @Sendable () -> [[String?]]
    private let seen = Mutex<[Seen]>([])

    init(room: Int = 0, probe: @escaping @Sendable () -> [[String?]] = { [] }) {
        self.room = room
        self.probe = probe
    }

    var roomForDueRows: Int { room }
    func committed(_ commit: OutboxCommit) {
        let visible = probe()
        seen.withLock { $0.append(Seen(commit: commit, visible: visible)) }
    }

    var commits: [Seen] { seen.withLock { $0 } }
}

@Suite struct CommitObserverTests {
    static let refusedToken = String(repeating: "fe", count: 32)

    /// Makes a transaction that inserted a row of `refusedToken` fail after the INSERT: before
    /// COMMIT on SQLite (the pending counter's write, which follows the batch's jobs), at COMMIT
    /// on PostgreSQL (a deferred constraint trigger). The row was written, then rolled back.
    func refuseToken(_ f: StoreFixture) throws {
        switch f.backend {
        case .sqlite:
            _ = try f.sql("""
                CREATE TRIGGER test_refuse BEFORE UPDATE ON outbox_stats
                WHEN EXISTS (SELECT 1 FROM responses WHERE push_token = '\(Self.refusedToken)')
                BEGIN SELECT RAISE(ABORT, 'refused by the test'); END
                """)
        case .postgres:
            _ = try f.sql("""
                CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF NEW.push_token = '\(Self.refusedToken)' THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NULL; END $$
                """)
            _ = try f.sql("""
                CREATE CONSTRAINT TRIGGER test_refuse AFTER INSERT ON responses DEFERRABLE INITIALLY DEFERRED
                FOR EACH ROW EXECUTE FUNCTION test_refuse()
                """)
        }
    }

    static func counts(_ f: StoreFixture) -> [[String?]] {
        (try? f.sql("SELECT (SELECT count(*) FROM responses), (SELECT count(*) FROM events)")) ?? [["probe failed"]]
    }

    @Test(arguments: StoreBackend.available)
    func aCommitIsAnnouncedAfterItAndARollbackNever(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let recorder = CommitRecorder { [f] in Self.counts(f) }
        s.addCommitObserver(recorder)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        #expect(recorder.commits.isEmpty)   // a credential is nothing an observer acts on

        // A rolled-back ingest: its row was inserted, then rolled back; nothing is announced.
        try refuseToken(f)
        #expect(throws: StoreError.self) { try s.ingestNow(sample(token: Self.refusedToken), secret: c.secret) }
        #expect(recorder.commits.isEmpty)

        // A committed ingest: announced once, its row already visible to another connection.
        guard case .accepted = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("refused"); return }
        var seen = recorder.commits
        #expect(seen.count == 1)
        #expect(seen.first?.commit.queuedDue == true && seen.first?.commit.handedOff.isEmpty == true && seen.first?.commit.events == nil)
        #expect(seen.first?.visible == [["1", "0"]])

        // A duplicate stores nothing: no announcement.
        guard case .duplicate = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("not a duplicate"); return }
        #expect(recorder.commits.count == 1)

        // An outcome with its event: announced with the event, which is visible by then.
        let row = try #require(try s.claimDue(limit: 1).first)
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil, leaseEpoch: row.leaseEpoch)])
        seen = recorder.commits
        let withEvents = seen.filter { $0.commit.events != nil }
        #expect(withEvents.count == 1)
        #expect(withEvents.first?.visible == [["1", "1"]])
    }

    /// Room offered before a transaction: SQLite inserts the due row `inflight` and hands it to
    /// that observer alone (the others hear only what they act on); PostgreSQL, whose claims
    /// take leases, inserts it `queued` whatever the room, and says so.
    @Test(arguments: StoreBackend.available)
    func rowsAreHandedOnlyToTheObserverThatOfferedRoom(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let taker = CommitRecorder(room: 1)
        let other = CommitRecorder()
        s.addCommitObserver(other)
        s.addCommitObserver(taker)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        guard case .accepted(let id) = try s.ingestNow(sample(index: 1), secret: c.secret) else { Issue.record("refused"); return }
        let toTaker = try #require(taker.commits.first?.commit)
        #expect(taker.commits.count == 1)
        switch backend {
        case .sqlite:
            #expect(toTaker.handedOff.map(\.id) == [id] && toTaker.handedOff.first?.state == .inflight && !toTaker.queuedDue)
            #expect(try s.response(id: id)?.state == .inflight)
            #expect(try s.claimDue(limit: 10).isEmpty)   // the taker's row: no claim returns it
            #expect(other.commits.isEmpty)   // nothing the others act on: not told at all
        case .postgres:
            let toOther = try #require(other.commits.first?.commit)
            #expect(toTaker.handedOff.isEmpty && toTaker.queuedDue && toOther.queuedDue && toOther.handedOff.isEmpty)
            #expect(try s.claimDue(limit: 10).map(\.id) == [id])
        }
    }
}
