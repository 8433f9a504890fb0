import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// The per-webhook cursor (docs/events.md "The store's side") on every backend: a failed event
/// does not hold back the ones after it and is retried from its row; a sender that dies between
/// sending and advancing the cursor has its events sent again (same ids); on PostgreSQL two
/// nodes never both get a new event; a v12 (PostgreSQL v9) database keeps its rows.
@Suite struct WebhookCursorTests {
    let app = "com.example.app"

    /// `n` delivered responses' events, in commit order.
    func events(_ s: any OutboxStore, _ n: Int, from index: Int = 0) throws -> [StoredEvent] {
        let c = try s.createCredential(name: "c\(index)", apps: [app])
        for i in 0..<n { _ = try s.ingestNow(sample(index: UInt32(index + i)), secret: c.secret) }
        let rows = try s.claimDue(limit: n)
        try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        return try s.events(credentialID: c.record.id, after: 0, limit: 100)
    }

    @Test(arguments: StoreBackend.available)
    func anEventAfterAFailedOneStillGoesOutAndTheFailedOneIsRetriedFromItsRow(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let e = try events(s, 3)
        let now = f.clock.nowMillis()
        // One at a time (a probing sender): the first fails.
        let one = try s.exchange("w", now: now, limit: 1)
        let hold = try #require(one.cursor)
        #expect(one.claimed.map(\.eventID) == [e[0].id])
        let two = try s.exchange("w", results: [WebhookAttemptRecord(one.claimed[0], .retry(attemptedAt: now, at: now + 10_000, error: "HTTP 500"))],
                                 cursor: WebhookCursorPosition(epoch: hold.epoch, through: hold.claimedThrough), now: now, limit: 1)
        // The next event goes out although the first waits for its retry.
        #expect(two.claimed.map(\.eventID) == [e[1].id] && two.claimed[0].fromCursor)
        let three = try s.exchange("w", results: [WebhookAttemptRecord(two.claimed[0], .delivered(at: now))],
                                   cursor: WebhookCursorPosition(epoch: hold.epoch, through: two.cursor!.claimedThrough), now: now, limit: 1)
        #expect(three.claimed.map(\.eventID) == [e[2].id])
        let idle = try s.exchange("w", results: [WebhookAttemptRecord(three.claimed[0], .delivered(at: now))],
                                  cursor: WebhookCursorPosition(epoch: hold.epoch, through: three.cursor!.claimedThrough), now: now + 9_999)
        #expect(idle.claimed.isEmpty)
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 1])
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "w", state: .delivered)).map(\.event.id) == [e[1].id, e[2].id])
        // Due: from its row, as its first attempt left it.
        let retried = try s.exchange("w", cursor: WebhookCursorPosition(epoch: hold.epoch, through: idle.cursor!.claimedThrough), now: now + 10_000)
        #expect(retried.claimed.map(\.eventID) == [e[0].id])
        #expect(retried.claimed[0].attempts == 1 && retried.claimed[0].firstAttemptAt == now && !retried.claimed[0].fromCursor)
        _ = try s.exchange("w", results: [WebhookAttemptRecord(retried.claimed[0], .delivered(at: now + 10_000))],
                           cursor: WebhookCursorPosition(epoch: hold.epoch, through: retried.cursor!.claimedThrough), now: now + 10_000)
        #expect(try s.webhookDeliveryCounts()["w"] == nil)
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "w", state: .delivered)).map(\.event.id) == e.map(\.id))
    }

    /// The sender sent two events and the relay died before the exchange that would have moved
    /// the cursor past them: the next sender gets them again, same ids and bodies (at once on
    /// SQLite, where one process owns the database; after the lease on PostgreSQL).
    @Test(arguments: StoreBackend.available)
    func aCrashBetweenSendingAndAdvancingSendsThemAgain(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        var s = try f.open()
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let e = try events(s, 2)
        let now = f.clock.nowMillis()
        let sent = try s.exchange("w", now: now, lease: 30_000)
        #expect(sent.claimed.map(\.eventID) == e.map(\.id))
        s.close()
        s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        if backend == .postgres {
            #expect(try s.exchange("w", now: now + 29_999).claimed.isEmpty)   // the dead holder's lease runs
        }
        let again = try s.exchange("w", now: backend == .postgres ? now + 30_000 : now)
        #expect(again.claimed.map(\.eventID) == e.map(\.id))
        #expect(again.claimed.map(\.event.body) == sent.claimed.map(\.event.body))
        #expect(try #require(again.cursor).epoch > sent.cursor!.epoch)
        // The dead sender's late results are stale: they neither write rows nor move the cursor.
        let late = try s.exchange("w", results: sent.claimed.map { WebhookAttemptRecord($0, .dead(attemptedAt: now, error: "late")) },
                                  cursor: WebhookCursorPosition(epoch: sent.cursor!.epoch, through: sent.cursor!.claimedThrough), now: now + 30_000, limit: 0)
        #expect(late.stale == 2)
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 2])
    }

    /// Two nodes' senders exchange for the same webhook in turn: only the cursor's holder gets
    /// new events, and the other takes over only after the holder's lease ended.
    @Test func twoPostgresNodesDoNotBothSendANewEvent() throws {
        guard StoreBackend.available.contains(.postgres) else { return }
        let f = try StoreFixture(.postgres)
        let a = try f.openPostgres(nodeID: "a"), b = try f.openPostgres(nodeID: "b")
        defer { a.close(); b.close() }
        for s in [a, b] { s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")]) }
        let first = try events(a, 2)
        let now = f.clock.nowMillis()
        let ta = try a.exchange("w", now: now, lease: 30_000)
        let holdA = try #require(ta.cursor)
        #expect(ta.claimed.map(\.eventID) == first.map(\.id))
        #expect(try b.exchange("w", now: now).claimed.isEmpty)
        // A later event, committed on b: still a's to send.
        let later = try events(b, 1, from: 10)
        let tb = try b.exchange("w", now: now + 1)
        #expect(tb.claimed.isEmpty && tb.cursor == nil)
        let ta2 = try a.exchange("w", cursor: WebhookCursorPosition(epoch: holdA.epoch, through: holdA.claimedThrough), now: now + 2, lease: 30_000)
        #expect(ta2.claimed.map(\.eventID) == later.map(\.id))
        // Concurrent exchanges from both nodes hand each new event to one of them only.
        let more = try events(a, 20, from: 20)
        let got = Mutex<[String]>([])
        let holdA2 = try #require(ta2.cursor)
        DispatchQueue.concurrentPerform(iterations: 2) { i in
            for k in 0..<10 {
                let r = i == 0
                    ? try? a.exchange("w", cursor: WebhookCursorPosition(epoch: holdA2.epoch, through: 0), now: now + 3 + Int64(k), lease: 30_000, limit: 2)
                    : try? b.exchange("w", now: now + 3 + Int64(k), limit: 2)
                got.withLock { $0 += (r?.claimed ?? []).map(\.eventID) }
            }
        }
        let ids = got.withLock { $0 }
        #expect(Set(ids).count == ids.count && Set(ids) == Set(more.map(\.id)))
        // a stops without releasing (it died): b takes over once the lease ends, from a's cursor.
        // (a's turns came within a quarter of its lease: it was not renewed, WebhookCursorRules.renewedLease)
        #expect(try b.exchange("w", now: now + 29_999).claimed.isEmpty)
        let tb2 = try b.exchange("w", now: now + 30_000)
        #expect(tb2.cursor != nil && tb2.cursor!.epoch > holdA.epoch)
        #expect(tb2.claimed.map(\.eventID) == Array((later + more).map(\.id).prefix(10)))
    }

    /// A database from before the cursor (SQLite v12, PostgreSQL v9): its rows stay as they
    /// are (pending ones are retry rows), the cursor starts at the newest event, and an event
    /// committed after the migration comes from the cursor.
    @Test(arguments: StoreBackend.available)
    func aMigratedDatabaseKeepsItsRowsAndStartsTheCursorAtTheNewestEvent(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        var s = try f.open()
        let e = try events(s, 4)
        let now = f.clock.nowMillis()
        s.close()
        // As the fan-out left them: a row per event for "w", in every state.
        let states = ["delivered", "pending", "dead", "pending"]
        for (i, ev) in e.enumerated() {
            let attempts = i == 3 ? 0 : 1
            _ = try f.sql("""
                INSERT INTO webhook_deliveries (webhook, seq, state, attempts, first_attempt_at, next_attempt_at, last_error, updated_at)
                VALUES ('w', \(ev.sequence), '\(states[i])', \(attempts), \(attempts == 1 ? "\(now - 5)" : "NULL"), \(now - 1), NULL, \(now - 5))
                """)
        }
        _ = try f.sql("DROP TABLE webhook_cursors")
        try f.setSchemaVersion(backend == .sqlite ? 12 : 9)
        s = try f.open()
        defer { s.close() }
        #expect(try f.schemaVersion == (backend == .sqlite ? SQLiteOutboxStore.schemaVersion : PostgresOutboxStore.schemaVersion))
        #expect(try f.sql("SELECT webhook, seq, start_seq FROM webhook_cursors") == [["w", "\(e[3].sequence)", "\(e[3].sequence)"]])
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "w", state: .delivered)).map(\.event.id) == [e[0].id])
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "w", state: .dead)).map(\.event.id) == [e[2].id])
        let after = try events(s, 1, from: 10)
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "w", state: .pending)).map(\.event.id) == [e[1].id, e[3].id, after[0].id])
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 3, .dead: 1])
        let got = try s.exchange("w", now: f.clock.nowMillis())
        #expect(got.claimed.map(\.eventID) == [e[1].id, e[3].id, after[0].id])
        #expect(got.claimed.map(\.attempts) == [1, 0, 0] && got.claimed.map(\.fromCursor) == [false, false, true])
    }

    /// An event retention deleted while its attempt was under way gets no retry row when the
    /// attempt fails: a row without its event would never be claimed nor purged, and would
    /// count as pending for ever.
    @Test(arguments: StoreBackend.available)
    func aFailedAttemptOfADeletedEventLeavesNoRow(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let e = try events(s, 1)
        let now = f.clock.nowMillis()
        let got = try s.exchange("w", now: now)
        let hold = try #require(got.cursor)
        #expect(got.claimed.map(\.eventID) == [e[0].id])
        _ = try f.sql("DELETE FROM events WHERE seq = \(e[0].sequence)")
        _ = try s.exchange("w", results: [WebhookAttemptRecord(got.claimed[0], .retry(attemptedAt: now, at: now + 1_000, error: "HTTP 500"))],
                           cursor: WebhookCursorPosition(epoch: hold.epoch, through: hold.claimedThrough), now: now)
        #expect(try f.sql("SELECT count(*) FROM webhook_deliveries") == [["0"]])
        #expect(try s.webhookDeliveryCounts()["w"] == nil)
    }

    /// A new webhook's cursor is made in the transaction of the first event after it was
    /// configured. If that transaction rolls back, the next one makes it again, before its
    /// event: the event reaches the webhook. (The store believed the cursor made although its
    /// row had been rolled back; the sender then made it after the newest event, and the event
    /// was never sent.)
    @Test(arguments: StoreBackend.available)
    func aCursorMadeInARolledBackTransactionIsMadeAgain(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        _ = try f.sql("CREATE TABLE test_gate (x INTEGER)")
        _ = try f.sql("INSERT INTO test_gate VALUES (1)")
        switch backend {
        case .sqlite:
            _ = try f.sql("""
                CREATE TRIGGER test_refuse_event BEFORE INSERT ON events WHEN EXISTS (SELECT 1 FROM test_gate)
                BEGIN SELECT RAISE(ABORT, 'refused by the test'); END
                """)
        case .postgres:
            _ = try f.sql("""
                CREATE FUNCTION test_refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF EXISTS (SELECT 1 FROM test_gate) THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$
                """)
            _ = try f.sql("CREATE TRIGGER test_refuse_event BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION test_refuse_event()")
        }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let c = try s.createCredential(name: "c", apps: [app])
        _ = try s.ingestNow(sample(index: 1), secret: c.secret)
        let row = try s.claimDue(limit: 1)[0]
        let delivered = [DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)]
        #expect(throws: StoreError.self) { try s.apply(delivered) }
        #expect(try f.sql("SELECT count(*) FROM webhook_cursors") == [["0"]])
        _ = try f.sql("DELETE FROM test_gate")
        try s.apply(delivered)
        let e = try s.events(credentialID: c.record.id, after: 0, limit: 10)
        #expect(e.count == 1)
        #expect(try s.exchange("w", now: f.clock.nowMillis()).claimed.map(\.eventID) == e.map(\.id))
    }
}

/// The cursor's pure rules (WebhookCursorRules), both stores' one copy.
@Suite struct WebhookCursorRulesTests {
    @Test func whoGetsTheCursor() {
        // The holder keeps it, even past its lease (nobody took it meanwhile).
        #expect(WebhookCursorRules.grant(storedEpoch: 3, leaseUntil: 100, caller: 3, now: 500, takeUnleased: false) == .hold)
        // Another caller waits for the lease, then takes it under a new epoch.
        #expect(WebhookCursorRules.grant(storedEpoch: 3, leaseUntil: 100, caller: 2, now: 99, takeUnleased: false) == .none)
        #expect(WebhookCursorRules.grant(storedEpoch: 3, leaseUntil: 100, caller: nil, now: 99, takeUnleased: false) == .none)
        #expect(WebhookCursorRules.grant(storedEpoch: 3, leaseUntil: 100, caller: nil, now: 100, takeUnleased: false) == .take(epoch: 4))
        // SQLite: a starting sender (no epoch) takes it at once; one with a stale epoch does not.
        #expect(WebhookCursorRules.grant(storedEpoch: 3, leaseUntil: 100, caller: nil, now: 0, takeUnleased: true) == .take(epoch: 4))
        #expect(WebhookCursorRules.grant(storedEpoch: 3, leaseUntil: 100, caller: 2, now: 0, takeUnleased: true) == .none)
    }

    @Test func theCursorMovesOverTheFinishedPrefixOnly() {
        // Never back, never past what was handed out.
        #expect(WebhookCursorRules.advanced(seq: 10, claimedThrough: 20, through: 5) == 10)
        #expect(WebhookCursorRules.advanced(seq: 10, claimedThrough: 20, through: 15) == 15)
        #expect(WebhookCursorRules.advanced(seq: 10, claimedThrough: 20, through: 25) == 20)
        // Through: just before the first event still in flight, else all handed out.
        #expect(WebhookCursorRules.through(claimedThrough: 20, inFlight: [17, 12, 19]) == 11)
        #expect(WebhookCursorRules.through(claimedThrough: 20, inFlight: []) == 20)
    }

    @Test func theLeaseIsRenewedOnceAQuarterIsUsed() {
        #expect(WebhookCursorRules.renewedLease(current: 1000 + 60_000, now: 1000, wanted: 1000 + 60_000) == 61_000)
        #expect(WebhookCursorRules.renewedLease(current: 61_000, now: 15_999, wanted: 75_999) == 61_000)   // 45,001 left
        #expect(WebhookCursorRules.renewedLease(current: 61_000, now: 16_001, wanted: 76_001) == 76_001)   // 44,999 left
        #expect(WebhookCursorRules.renewedLease(current: 0, now: 5, wanted: 100) == 100)
    }

    @Test func subscriptionsRoundTripThroughTheRowAndFilterInSQL() {
        let all = WebhookSubscription(name: "a")
        let some = WebhookSubscription(name: "b", types: [.responseFailed, .tokenUnregistered], apps: ["com.example.app", "it's"])
        for s in [all, some, WebhookSubscription(name: "c", types: [], apps: [])] {
            let (types, apps) = WebhookCursorRules.encode(s)
            #expect(WebhookCursorRules.decode(name: s.name, types: types, apps: apps) == s)
        }
        // A row the migration made (no subscription yet) receives everything.
        #expect(WebhookCursorRules.decode(name: "m", types: nil, apps: nil) == WebhookSubscription(name: "m"))
        #expect(WebhookCursorRules.sqlFilter(all) == "1 = 1")
        #expect(WebhookCursorRules.sqlFilter(some) == "e.type IN ('response.failed','token.unregistered') AND e.app IN ('com.example.app','it''s')")
        #expect(WebhookCursorRules.sqlFilter(WebhookSubscription(name: "c", types: [], apps: nil)) == "0 = 1")
    }
}
