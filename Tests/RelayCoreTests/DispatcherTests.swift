import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// A PushTransport that answers from a script and records what was sent.
final class FakeTransport: PushTransport {
    let sent = Mutex<[OutboxRow]>([])
    let answer: @Sendable (OutboxRow, Int) -> PushAnswer?  // nil = never answer (stalled)
    let shutdowns = Mutex(0)
    let held = Mutex<[@Sendable (PushAnswer) -> Void]>([])

    init(answer: @escaping @Sendable (OutboxRow, Int) -> PushAnswer?) { self.answer = answer }

    func send(_ row: OutboxRow, completion: @escaping @Sendable (PushAnswer) -> Void) {
        let n = sent.withLock { $0.append(row); return $0.count }
        if let a = answer(row, n) { completion(a) } else { held.withLock { $0.append(completion) } }
    }

    func shutdown() {
        shutdowns.withLock { $0 += 1 }
        let pending = held.withLock { h in defer { h.removeAll() }; return h }
        for c in pending { c(PushAnswer(status: nil, reason: "shutdown", classification: .backOff)) }
    }
}

func waitUntil(_ what: String, _ cond: () throws -> Bool) rethrows {
    // Bounded polling for state reached by another thread (not a timing assertion).
    for _ in 0..<2000 {
        if try cond() { return }
        usleep(2000)
    }
    Issue.record("condition never became true: \(what)")
}

@Suite struct DispatcherTests {
    let dir = TempDir()
    let clock = TestClock()

    func setup() throws -> (SQLiteOutboxStore, String) {
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        return (s, c.secret)
    }

    @Test func deliversAndRecordsEveryAnswer() throws {
        let (s, secret) = try setup()
        defer { s.close() }
        var ids: [String] = []
        for i in 0..<20 {
            if case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: secret) { ids.append(id) }
        }
        let t = FakeTransport { row, _ in
            // A push-level refusal (BadTopic would pause the whole app: AppPauseTests).
            row.messageIndex == 3 ? PushAnswer(status: 413, reason: "PayloadTooLarge", classification: .terminal("PayloadTooLarge"))
                : PushAnswer(status: 200, reason: nil, classification: .done)
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], options: DispatcherOptions(maxInflight: 4, claimBatch: 3), clock: clock)
        try d.start()
        try waitUntil("all terminal") { try s.counts().pending == 0 }
        d.stop()
        #expect(t.sent.withLock { $0.count } == 20)
        #expect(Set(t.sent.withLock { $0.map(\.id) }) == Set(ids))
        let c = try s.counts()
        #expect(c.byState[.delivered] == 19 && c.byState[.failed] == 1)
        let failed = try s.list(OutboxFilter(state: .failed))[0]
        #expect(failed.messageIndex == 3 && failed.lastReason == "PayloadTooLarge" && failed.lastStatus == 413)
        #expect(try s.attempts(responseID: failed.id).map(\.reason) == ["PayloadTooLarge"])
        #expect(t.shutdowns.withLock { $0 } == 1)
    }

    @Test func serverErrorsBackOffThenDeliverWithTheSameId() throws {
        let (s, secret) = try setup()
        defer { s.close() }
        guard case .accepted(let id) = try s.ingestNow(sample(), secret: secret) else { Issue.record("no"); return }
        let t = FakeTransport { _, n in
            n < 3 ? PushAnswer(status: 503, reason: "ServiceUnavailable", classification: .backOff)
                : PushAnswer(status: 200, reason: nil, classification: .done)
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": t],
                           options: DispatcherOptions(idlePollMillis: 5, policy: DeliveryPolicy(backoffBaseMillis: 1000, backoffCapMillis: 4000)),
                           clock: clock, random: FixedRandom(value: 0.5))
        try d.start()
        try waitUntil("first retry scheduled") { try s.response(id: id)?.state == .retry }
        let r1 = try #require(try s.response(id: id))
        #expect(r1.nextAttemptAt == clock.nowMillis() + 500)  // attempt 0: ceiling 1000, jitter 0.5
        clock.advance(500)
        d.wake()
        try waitUntil("second retry scheduled") { try s.response(id: id)?.attempts == 2 }
        #expect(try s.response(id: id)?.nextAttemptAt == clock.nowMillis() + 1000)  // ceiling 2000
        clock.advance(1000)
        d.wake()
        try waitUntil("delivered") { try s.response(id: id)?.state == .delivered }
        d.stop()
        #expect(t.sent.withLock { $0.map(\.id) } == [id, id, id])
        #expect(try s.attempts(responseID: id).map(\.status) == [503, 503, 200])
    }

    /// A retry due at once (refreshTokenAndReconnect) is sent again without waiting for the idle
    /// poll, although its outcome is written while the thread goes on (the write's completion
    /// wakes it). No reason: an ExpiredProviderToken reaching the dispatcher pauses the app
    /// instead (AppPauseTests), the class alone is what this is about.
    @Test func aRetryDueAtOnceIsSentAgainWithoutWaitingForThePoll() throws {
        let (s, secret) = try setup()
        defer { s.close() }
        guard case .accepted(let id) = try s.ingestNow(sample(), secret: secret) else { Issue.record("no"); return }
        let t = FakeTransport { _, n in
            n == 1 ? PushAnswer(status: 403, reason: nil, classification: .refreshTokenAndReconnect)
                : PushAnswer(status: 200, reason: nil, classification: .done)
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], options: DispatcherOptions(idlePollMillis: 600_000), clock: clock)
        try d.start()
        try waitUntil("delivered") { try s.response(id: id)?.state == .delivered }
        d.stop()
        #expect(try s.attempts(responseID: id).map(\.status) == [403, 200])
    }

    @Test func unregisteredTokenIsRecorded() throws {
        let (s, secret) = try setup()
        defer { s.close() }
        _ = try s.ingestNow(sample(), secret: secret)
        let apnsTimestamp = clock.nowMillis() - 60_000
        let t = FakeTransport { _, _ in PushAnswer(status: 410, reason: "Unregistered", apnsTimestamp: apnsTimestamp, classification: .terminal("Unregistered")) }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], clock: clock)
        try d.start()
        try waitUntil("token recorded") { try !s.unregisteredTokens().isEmpty }
        d.stop()
        #expect(try s.unregisteredTokens()[0].apnsTimestamp == apnsTimestamp)
        #expect(try s.ingestNow(sample(index: 2), secret: secret) == .unregistered)
    }

    @Test func stopReturnsUnansweredPushesToQueued() throws {
        let (s, secret) = try setup()
        defer { s.close() }
        for i in 0..<5 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: secret) }
        let t = FakeTransport { _, _ in nil }  // APNs never answers
        let d = Dispatcher(store: s, transports: ["com.example.app": t], clock: clock)
        try d.start()
        waitUntil("all sent") { t.sent.withLock { $0.count } == 5 }
        #expect(try s.counts().byState[.inflight] == 5)
        d.stop(grace: .milliseconds(50))
        let c = try s.counts()
        #expect(c.byState[.queued] == 5 && c.byState[.inflight] == 0)
        #expect(try s.list(OutboxFilter()).allSatisfy { $0.attempts == 0 })
    }

    @Test func rowsForAnUnconfiguredAppFail() throws {
        let (s, secret) = try setup()
        defer { s.close() }
        _ = try s.ingestNow(sample(), secret: secret)
        let d = Dispatcher(store: s, transports: [:], clock: clock)
        try d.start()
        try waitUntil("failed") { try s.counts().byState[.failed] == 1 }
        d.stop()
        #expect(try s.list(OutboxFilter())[0].lastReason == "app_not_configured")
    }
}

@Suite struct HandoffTests {
    let dir = TempDir()
    let clock = TestClock()

    @Test func rowsAcceptedWhileTheDispatcherHasRoomAreSentWithoutAClaim() throws {
        let ch = DispatchChannel()
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        s.addCommitObserver(ch)
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        let t = FakeTransport { _, _ in PushAnswer(status: 200, reason: nil, classification: .done) }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], options: DispatcherOptions(idlePollMillis: 60_000), channel: ch, clock: clock)
        try d.start()
        let batchesBefore = s.writerStats.batches
        var ids: [String] = []
        for i in 0..<10 {
            guard case .accepted(let id) = try s.ingestNow(sample(index: UInt32(i)), secret: secret) else { Issue.record("no"); return }
            ids.append(id)
        }
        // A duplicate takes no room.
        if case .duplicate(let id, _) = try s.ingestNow(sample(index: 0), secret: secret) {
            #expect(id == ids[0])
        } else { Issue.record("not answered as a duplicate") }
        try waitUntil("delivered") { try s.counts().byState[.delivered] == 10 }
        #expect(Set(t.sent.withLock { $0.map(\.id) }) == Set(ids))
        #expect(d.inflightCount == 0)
        // No claim ran: the dispatcher slept (idle poll 60 s) and rows came by hand-off.
        #expect(s.writerStats.batches - batchesBefore < 40)
        #expect(ch.roomForDueRows == DispatcherOptions().maxInflight)
        d.stop()
    }

    /// The flow goes one way: the writer commits and posts, the dispatcher thread sends. No push
    /// starts on the writer thread (before the channel, a handed-off row was sent from there).
    @Test func handedOffRowsAreSentFromTheDispatcherThreadNeverTheWriter() throws {
        let ch = DispatchChannel()
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        s.addCommitObserver(ch)
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        let threads = Mutex<[String]>([])
        let t = FakeTransport { _, _ in
            let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "?"
            threads.withLock { $0.append(name.trimmingCharacters(in: .whitespacesAndNewlines)) }
            return PushAnswer(status: 200, reason: nil, classification: .done)
        }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], options: DispatcherOptions(idlePollMillis: 60_000), channel: ch, clock: clock)
        try d.start()
        for i in 0..<5 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: secret) }
        try waitUntil("delivered") { try s.counts().byState[.delivered] == 5 }
        d.stop()
        #expect(threads.withLock { $0 } == Array(repeating: "relay-dispatche", count: 5))   // comm keeps 15 bytes
    }

    /// A rolled-back batch is never announced: the row it inserted `inflight` for the
    /// dispatcher never existed, and the dispatcher's slot stays free.
    @Test func aRolledBackBatchHandsNothingOff() throws {
        let ch = DispatchChannel()
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        s.addCommitObserver(ch)
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        let t = FakeTransport { _, _ in nil }
        let d = Dispatcher(store: s, transports: ["com.example.app": t], options: DispatcherOptions(maxInflight: 1, idlePollMillis: 60_000),
                           channel: ch, clock: clock)
        try d.start()
        let writer = try #require(s.writer)
        let gate = try holdWriter(s)
        let done = DispatchSemaphore(value: 0)
        let result = ResultBox<Result<IngestOutcome, StoreError>>()
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 10_000, maxPending: 100)
        s.submit(IngestRequest(response: sample(), credentialHash: Credentials.hash(secret: secret))) { result.value = $0; done.signal() }
        writer.enqueue({ db in try db.execute("INSERT INTO no_such_table VALUES (1)") }, completion: { _ in })
        gate.signal()
        done.wait()
        guard case .failure = result.value! else { Issue.record("accepted in a failed batch"); d.stop(); return }
        #expect(t.sent.withLock { $0.isEmpty })
        #expect(ch.roomForDueRows == 1 && ch.inflightCount == 0)   // the only slot is still free
        #expect(try s.counts().pending == 0)
        d.stop()
    }
}

@Suite struct SaturatedDispatcherTests {
    let dir = TempDir()
    let clock = TestClock()

    /// With every slot taken, a committed batch of queued rows does not wake the dispatcher
    /// thread (it could not send them); the next finishing push makes it claim them.
    @Test func queuedRowsWaitForAFreeSlotWithoutWakeUps() throws {
        let ch = DispatchChannel()
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        s.addCommitObserver(ch)
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        let t = FakeTransport { _, _ in nil }   // APNs never answers: slots stay taken
        let d = Dispatcher(store: s, transports: ["com.example.app": t],
                           options: DispatcherOptions(maxInflight: 2, idlePollMillis: 60_000), channel: ch, clock: clock)
        try d.start()
        defer { d.stop(grace: .milliseconds(10)) }
        for i in 0..<2 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: secret) }
        waitUntil("both slots sending") { t.sent.withLock { $0.count } == 2 }
        let signalsBefore = ch.queuedWakeSignals
        for i in 2..<5 { _ = try s.ingestNow(sample(index: UInt32(i)), secret: secret) }
        #expect(try s.counts().byState[.queued] == 3)
        #expect(ch.queuedWakeSignals == signalsBefore)   // three queued batches, no wake-up
        // One push finishes: the freed slot takes a queued row at once (not at the 60 s poll).
        let first = t.held.withLock { $0.removeFirst() }
        first(PushAnswer(status: 200, reason: nil, classification: .done))
        waitUntil("a queued row claimed") { t.sent.withLock { $0.count } == 3 }
        #expect(t.sent.withLock { $0.map(\.messageIndex) }.sorted() == [0, 1, 2])
        #expect(try s.counts().byState[.queued] == 2)
    }
}

/// Parks the store's writer thread inside a job until the returned gate is signalled, so that
/// everything submitted meanwhile is committed together in the next batch.
func holdWriter(_ s: SQLiteOutboxStore) throws -> DispatchSemaphore {
    let writer = try #require(s.writer)
    let gate = DispatchSemaphore(value: 0)
    let entered = DispatchSemaphore(value: 0)
    writer.enqueue({ _ in entered.signal(); gate.wait() }, completion: { _ in })
    entered.wait()
    return gate
}

@Suite struct BatchWakeTests {
    let dir = TempDir()
    let clock = TestClock()

    /// Holds the writer, queues `count` ingests behind it so they commit in one batch, releases it.
    func ingestInOneBatch(_ s: SQLiteOutboxStore, secret: String, from first: UInt32, count: Int) throws -> [IngestOutcome] {
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 1000)
        let gate = try holdWriter(s)
        let done = DispatchSemaphore(value: 0)
        let results = Mutex<[IngestOutcome]>([])
        for i in 0..<count {
            s.submit(IngestRequest(response: sample(index: first + UInt32(i)), credentialHash: Credentials.hash(secret: secret))) { r in
                if case .success(let o) = r { results.withLock { $0.append(o) } }
                done.signal()
            }
        }
        let batchesBefore = s.writerStats.batches
        gate.signal()
        for _ in 0..<count { done.wait() }
        // The gate job's batch and the ingests' batch: the ingests did commit together.
        #expect(s.writerStats.batches - batchesBefore <= 2)
        return results.withLock { $0 }
    }

    @Test func aBatchPostsItsHandedOffRowsAndItsQueuedRowsOnce() throws {
        let ch = DispatchChannel()
        ch.open(capacity: 8)
        let s = try SQLiteOutboxStore(path: dir.db, clock: clock)
        s.addCommitObserver(ch)
        defer { s.close() }
        let secret = try s.createCredential(name: "c", apps: ["com.example.app"]).secret
        ch.occupy(5)   // 5 of 8 slots busy elsewhere
        // 3 free slots, 8 rows in one batch: 3 handed off (inflight), 5 queued, one post.
        let first = try ingestInOneBatch(s, secret: secret, from: 0, count: 8)
        #expect(first.count == 8 && first.allSatisfy { if case .accepted = $0 { true } else { false } })
        let inbox = ch.take(waitingMillis: 0)
        #expect(inbox.rows.count == 3 && inbox.rows.allSatisfy { $0.state == .inflight })
        #expect(inbox.mayHaveDue)
        #expect(ch.queuedWakeSignals == 1)
        #expect(ch.inflightCount == 8)   // 5 elsewhere, 3 handed off
        #expect(try s.counts().byState[.queued] == 5)
        #expect(try s.counts().byState[.inflight] == 3)
        #expect(Set(try s.list(OutboxFilter(state: .inflight)).map(\.id)) == Set(inbox.rows.map(\.id)))
        // Slots free again, 4 rows in one batch: all handed off, no queued notice.
        ch.vacate(8)
        _ = try ingestInOneBatch(s, secret: secret, from: 100, count: 4)
        let second = ch.take(waitingMillis: 0)
        #expect(second.rows.count == 4 && !second.mayHaveDue)
        #expect(ch.queuedWakeSignals == 1)
        #expect(ch.take(waitingMillis: 0).isEmpty)   // one post per batch, nothing else
    }
}
