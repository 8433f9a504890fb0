import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// GET /v1/events through IngestService (no sockets): paging, the long poll, isolation between
/// credentials, and a 400 naming each bad parameter.
@Suite struct EventFeedTests {
    let dir = TempDir()
    let clock = TestClock()

    typealias Harness = IngestServiceTests.Harness

    /// Starts the request; the answer arrives later (the service never blocks the caller).
    func start(_ h: Harness, _ query: String, secret: String?) -> (DispatchSemaphore, ResultBox<APIReply>) {
        let slot = ResultBox<APIReply>()
        let done = DispatchSemaphore(value: 0)
        h.service.handle(APIRequest(method: "GET", path: "/v1/events", authorization: secret.map { "Bearer \($0)" }, contentType: nil, body: [],
                                    requestID: "r1", remoteAddress: "192.0.2.1:40000", query: query)) {
            slot.value = $0.reply
            done.signal()
        }
        return (done, slot)
    }

    func get(_ h: Harness, _ query: String = "", secret: String?) -> APIReply {
        let (done, slot) = start(h, query, secret: secret)
        done.wait()
        return slot.value!
    }

    func json(_ r: APIReply) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any]) ?? [:]
    }

    func events(_ r: APIReply) -> [[String: Any]] { json(r)["events"] as? [[String: Any]] ?? [] }

    /// Accepts `n` responses for `secret` and delivers them.
    func deliver(_ h: Harness, _ n: Int, from: Int = 1, secret: String) throws -> [String] {
        var ids: [String] = []
        for i in from..<(from + n) {
            let r = h.call(secret: secret, body: IngestServiceTests.body(index: i))
            ids.append(try #require(json(r)["id"] as? String))
        }
        let rows = try h.store.claimDue(limit: n)
        try h.store.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        return ids
    }

    /// A store of `backend` and a feed over it with its own worker pool, both closed after `body`.
    func withFeed(_ backend: StoreBackend, threads: Int, pollMillis: Int64?, _ body: (any OutboxStore, EventFeed) throws -> Void) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        let workers = WorkerPool(name: "feed-test", threads: threads)
        defer {
            workers.close()
            s.close()
        }
        try body(s, EventFeed(store: s, workers: workers, pollMillis: pollMillis))
    }

    @Test func pagesInCommitOrderWithAnOpaqueCursor() throws {
        let h = try Harness(dir: dir, clock: clock)
        let ids = Set(try deliver(h, 3, secret: h.secret))
        let first = get(h, "limit=2", secret: h.secret)
        #expect(first.status == 200)
        #expect(first.header("content-type") == "application/json")
        let page1 = events(first)
        #expect(page1.count == 2)
        #expect(page1.allSatisfy { ($0["type"] as? String) == "response.delivered" && ($0["id"] as? String).map(UUIDText.isCanonical) == true })
        let next = try #require(json(first)["next"] as? String)
        let second = get(h, "after=\(next)&limit=2", secret: h.secret)
        let page2 = events(second)
        #expect(page2.count == 1)
        let all = page1 + page2
        #expect(Set(all.compactMap { ($0["data"] as? [String: Any])?["id"] as? String }) == ids)
        #expect(Set(all.compactMap { $0["id"] as? String }).count == 3)
        // Past the end: empty, and the cursor stays where it was.
        let last = try #require(json(second)["next"] as? String)
        let end = get(h, "after=\(last)", secret: h.secret)
        #expect(events(end).isEmpty && json(end)["next"] as? String == last)
        // The entries are the stored events' bodies with their ids.
        let stored = try h.store.events(credentialID: try #require(h.store.credentials().first { $0.name == "a" }).id, after: 0, limit: 10)
        #expect(stored.map(\.id) == all.compactMap { $0["id"] as? String })
    }

    @Test func anotherCredentialSeesNothingOfThese() throws {
        let h = try Harness(dir: dir, clock: clock)
        _ = try deliver(h, 2, secret: h.secret)
        let other = get(h, secret: h.otherSecret)
        #expect(other.status == 200 && events(other).isEmpty)
        #expect(events(get(h, secret: h.secret)).count == 2)
    }

    @Test func badParametersAre400sNamingTheField() throws {
        let h = try Harness(dir: dir, clock: clock)
        for (query, field) in [("after=xyz", "after"), ("after=", "after"), ("after=AAAAAAAAAAA%3D", "after"), ("limit=0", "limit"),
                               ("limit=1001", "limit"), ("limit=-1", "limit"), ("limit=abc", "limit"), ("wait=31", "wait"),
                               ("wait=1.5", "wait"), ("limit=1&limit=2", "limit"), ("since=1", "since")] {
            let r = get(h, query, secret: h.secret)
            #expect(r.status == 400, "\(query)")
            #expect(json(r)["field"] as? String == field, "\(query): \(r.body)")
        }
        // Authentication comes first.
        #expect(get(h, "limit=0", secret: nil).status == 401)
        #expect(get(h, "limit=0", secret: "rk_unknown").status == 401)
        let next = try #require(json(get(h, "limit=1", secret: h.secret))["next"] as? String)
        #expect(get(h, "limit=1000&wait=0&after=\(next)", secret: h.secret).status == 200)
        // Another credential's cursor, or one changed by a character, is not a cursor of this feed.
        let tampered = String(next.dropLast()) + (next.hasSuffix("A") ? "B" : "A")
        for (query, secret) in [("after=\(next)", h.otherSecret), ("after=\(tampered)", h.secret), ("after=AAAAAAAAAAA", h.secret)] {
            let r = get(h, query, secret: secret)
            #expect(r.status == 400 && json(r)["field"] as? String == "after" && json(r)["error"] as? String == "invalid_cursor", "\(query)")
        }
        let post = h.call("POST", "/v1/events", secret: h.secret, body: "{}")
        #expect(post.status == 405 && post.header("allow") == "GET, HEAD")
    }

    @Test func aLongPollIsAnsweredWhenAnEventCommits() throws {
        let h = try Harness(dir: dir, clock: clock)
        let (done, slot) = start(h, "wait=30", secret: h.secret)
        // Parked (not holding a worker), then woken by the commit.
        waitUntil("the poll is waiting") { h.service.feed.waitingCount == 1 }
        #expect(done.wait(timeout: .now()) == .timedOut)
        let ids = try deliver(h, 1, secret: h.secret)
        // Generous: the answer follows the commit, far inside the 30 s wait.
        #expect(done.wait(timeout: .now() + 20) == .success)
        let r = try #require(slot.value)
        #expect(r.status == 200)
        #expect(events(r).compactMap { ($0["data"] as? [String: Any])?["id"] as? String } == ids)
    }

    /// The store tells the feed of its commits (OutboxStore.addCommitObserver): with the fallback
    /// poll ten minutes away, only that wakes the waiting read.
    @Test(arguments: StoreBackend.available)
    func aCommitWakesAWaitingReadWithoutThePoll(_ backend: StoreBackend) throws {
        try withFeed(backend, threads: 1, pollMillis: 600_000) { s, feed in
            s.addCommitObserver(feed)
            let c = try s.createCredential(name: "c", apps: ["com.example.app"])
            _ = try s.ingestNow(sample(), secret: c.secret)
            let row = try s.claimDue(limit: 1)[0]
            let done = DispatchSemaphore(value: 0)
            let slot = ResultBox<Result<EventPage, StoreError>?>()
            feed.serve(credentialID: c.record.id, query: EventFeedQuery(after: 0, limit: 10, waitSeconds: 600),
                       deadlineMicros: monotonicMicros() + 600_000_000) {
                slot.value = $0
                done.signal()
            }
            waitUntil("the read is waiting") { feed.waitingCount == 1 }
            try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)])
            #expect(done.wait(timeout: .now() + 20) == .success)
            guard case .success(let page)?? = slot.value else { Issue.record("no page: \(String(describing: slot.value))"); return }
            #expect(page.events.count == 1 && page.events[0].type == .responseDelivered)
        }
    }

    /// Polls of eight credentials wait; an event of one of them reads that one's poll only
    /// (one store read), whether this process's commit names the credential (`notified`) or
    /// the poll for other processes' events finds it; the others are answered empty at their
    /// deadline without another read.
    @Test(arguments: StoreBackend.available, [true, false])
    func aCommitReadsOnlyItsCredentialsPolls(_ backend: StoreBackend, notified: Bool) throws {
        try withFeed(backend, threads: 2, pollMillis: notified ? 600_000 : 100) { s, feed in
            if notified { s.addCommitObserver(feed) }
            feed.prepare()
            let credentials = try (0..<8).map { try s.createCredential(name: "c\($0)", apps: ["com.example.app"]) }
            _ = try s.ingestNow(sample(), secret: credentials[0].secret)
            let row = try s.claimDue(limit: 1)[0]
            var waits: [(DispatchSemaphore, ResultBox<Result<EventPage, StoreError>?>)] = []
            for (i, c) in credentials.enumerated() {
                let done = DispatchSemaphore(value: 0)
                let slot = ResultBox<Result<EventPage, StoreError>?>()
                // The others' deadline: far enough for the commit below, near enough for the test.
                let wait: Int64 = i == 0 ? 600_000_000 : 6_000_000
                feed.serve(credentialID: c.record.id, query: EventFeedQuery(after: 0, limit: 10, waitSeconds: 600),
                           deadlineMicros: monotonicMicros() + wait) {
                    slot.value = $0
                    done.signal()
                }
                waits.append((done, slot))
            }
            waitUntil("every poll is waiting") { feed.parkedCount == 8 && feed.readsUnderWay == 0 }
            let before = feed.storeReads.load(ordering: .relaxed)
            try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)])
            #expect(waits[0].0.wait(timeout: .now() + 20) == .success)
            guard case .success(let page)?? = waits[0].1.value else { Issue.record("no page: \(String(describing: waits[0].1.value))"); return }
            #expect(page.events.count == 1 && page.events[0].type == .responseDelivered)
            #expect(feed.storeReads.load(ordering: .relaxed) - before == 1)
            for (done, slot) in waits.dropFirst() {
                #expect(done.wait(timeout: .now() + 30) == .success)
                guard case .success(let empty)?? = slot.value else { Issue.record("no page: \(String(describing: slot.value))"); continue }
                #expect(empty.events.isEmpty)
            }
            #expect(feed.storeReads.load(ordering: .relaxed) - before == 1)
            waitUntil("nothing waits") { feed.waitingCount == 0 }
        }
    }

    /// A wake of many credentials at once reads their polls at most EventFeed.maxRereads at a
    /// time, not all at once into the reader pool's queue.
    @Test func wokenPollsAreReadAFewAtATime() throws {
        try withFeed(.sqlite, threads: 2, pollMillis: nil) { s, feed in
            let ids = (0..<40).map { "cred_\($0)" }
            let answered = Counter()
            for id in ids {
                feed.serve(credentialID: id, query: EventFeedQuery(after: 0, limit: 10, waitSeconds: 30),
                           deadlineMicros: monotonicMicros() + 30_000_000) { _ in answered.add() }
            }
            waitUntil("every poll is waiting") { feed.parkedCount == 40 && feed.readsUnderWay == 0 }
            let before = feed.storeReads.load(ordering: .relaxed)
            feed.eventsCommitted(credentials: Set(ids))
            waitUntil("every poll was read again") { feed.storeReads.load(ordering: .relaxed) - before == 40 && feed.parkedCount == 40 && feed.readsUnderWay == 0 }
            #expect(feed.peakRereads >= 1 && feed.peakRereads <= EventFeed.maxRereads)
            #expect(answered.value == 0)
        }
    }

    /// One credential's polls take at most maxWaitingPerCredential places: its extra polls are
    /// answered at once, and another credential's poll still waits (the waiting room is shared).
    @Test func oneCredentialsPollsDoNotFillTheWaitingRoom() throws {
        try withFeed(.sqlite, threads: 2, pollMillis: nil) { s, feed in
            let answered = Counter()
            let query = EventFeedQuery(after: 0, limit: 10, waitSeconds: 30)
            for _ in 0..<(EventFeed.maxWaitingPerCredential + 10) {
                feed.serve(credentialID: "cred_greedy", query: query, deadlineMicros: monotonicMicros() + 30_000_000) { _ in answered.add() }
            }
            waitUntil("the greedy credential's extra polls are answered") {
                answered.value == 10 && feed.parkedCount == EventFeed.maxWaitingPerCredential && feed.readsUnderWay == 0
            }
            feed.serve(credentialID: "cred_other", query: query, deadlineMicros: monotonicMicros() + 30_000_000) { _ in answered.add() }
            waitUntil("the other credential's poll waits") { feed.parkedCount == EventFeed.maxWaitingPerCredential + 1 && feed.readsUnderWay == 0 }
            #expect(answered.value == 10)
        }
    }

    @Test func aLongPollWithNothingToSayEndsEmptyAtItsDeadline() throws {
        let h = try Harness(dir: dir, clock: clock)
        // Another credential's event does not answer this one's poll.
        let (done, slot) = start(h, "wait=1", secret: h.otherSecret)
        _ = try deliver(h, 1, secret: h.secret)
        #expect(done.wait(timeout: .now() + 20) == .success)
        let r = try #require(slot.value)
        #expect(r.status == 200 && events(r).isEmpty)
    }

    /// The cursor is sealed with the database's key: a receiver resumes with its last `next`
    /// after the relay restarts, and finds the events committed meanwhile.
    @Test func aCursorResumesAfterARestart() throws {
        var h: Harness? = try Harness(dir: dir, clock: clock)
        _ = try deliver(h!, 2, secret: h!.secret)
        let first = get(h!, secret: h!.secret)
        #expect(events(first).count == 2)
        let next = try #require(json(first)["next"] as? String)
        let secrets = (secret: h!.secret, otherSecret: h!.otherSecret)
        h = nil
        let reopened = try Harness(dir: dir, clock: clock, reopening: secrets)
        let secret = secrets.secret
        let later = try deliver(reopened, 1, from: 3, secret: secret)
        let r = get(reopened, "after=\(next)", secret: secret)
        #expect(r.status == 200)
        #expect(events(r).compactMap { ($0["data"] as? [String: Any])?["id"] as? String } == later)
    }
}
