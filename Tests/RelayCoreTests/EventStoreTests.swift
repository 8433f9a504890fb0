import Foundation
import Testing
@testable import RelayCore

/// Delivery events (issue 24) on every backend: written with their outcome, never without it;
/// the webhook deliveries the sender claims and records; the feed's reads; retention and the
/// backlog bound.
@Suite struct EventStoreContractTests {
    let app = "com.example.app"

    /// A store with one credential, `n` responses claimed (inflight).
    func claimed(_ s: any OutboxStore, _ n: Int, token: String = String(repeating: "ab", count: 32)) throws -> (secret: String, credentialID: String, rows: [OutboxRow]) {
        let c = try s.createCredential(name: "c", apps: [app])
        for i in 0..<n { _ = try s.ingestNow(sample(token: token, index: UInt32(i)), secret: c.secret) }
        let rows = try s.claimDue(limit: n).sorted { $0.id < $1.id }
        #expect(rows.count == n)
        return (c.secret, c.record.id, rows)
    }

    func body(_ e: StoredEvent) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(e.body)) as? [String: Any])
    }

    @Test(arguments: StoreBackend.available)
    func outcomesWriteTheirEventsAndOnlyTerminalOnes(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let (_, cred, rows) = try claimed(s, 4)
        let t = f.clock.nowMillis()
        try s.apply([
            DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered,
                           attempt: AttemptRecord(responseID: rows[0].id, attemptedAt: t, status: 200, reason: nil)),
            DeliveryUpdate(id: rows[1].id, pushToken: rows[1].pushToken, outcome: .failed(reason: "BadDeviceToken"),
                           attempt: AttemptRecord(responseID: rows[1].id, attemptedAt: t, status: 400, reason: "BadDeviceToken")),
            DeliveryUpdate(id: rows[2].id, pushToken: rows[2].pushToken, outcome: .retry(at: t + 5000, paceTokenUntil: nil),
                           attempt: AttemptRecord(responseID: rows[2].id, attemptedAt: t, status: 503, reason: "ServiceUnavailable")),
            DeliveryUpdate(id: rows[3].id, pushToken: rows[3].pushToken, outcome: .requeue, attempt: nil),
        ])
        let events = try s.events(credentialID: cred, after: 0, limit: 100)
        #expect(events.map(\.type) == [.responseDelivered, .responseFailed])
        #expect(s.eventsCreated.counts == [.responseDelivered: 1, .responseFailed: 1])   // relay_events_created_total
        #expect(events.map(\.sequence) == events.map(\.sequence).sorted())
        #expect(events.allSatisfy { UUIDText.isCanonical($0.id) && $0.id.dropFirst(14).first == "7" && $0.credentialID == cred && $0.app == app })
        let delivered = try body(events[0])
        #expect(delivered["type"] as? String == "response.delivered")
        #expect(delivered["timestamp"] as? String == IngestService.iso(t))
        let d = try #require(delivered["data"] as? [String: Any])
        #expect(d["id"] as? String == rows[0].id && d["app"] as? String == app && d["pushToken"] as? String == rows[0].pushToken)
        #expect(d["sessionIdentifier"] as? String == rows[0].sessionIdentifier && d["keyID"] as? String == "AQIDBA==")
        #expect(d["messageIndex"] as? Int == Int(rows[0].messageIndex) && d["state"] as? String == "delivered" && d["status"] as? Int == 200)
        #expect(d["reason"] is NSNull && d["attempts"] as? Int == 1)
        #expect(d["acceptedAt"] as? String == IngestService.iso(rows[0].createdAt) && d["finishedAt"] as? String == IngestService.iso(t))
        #expect(d["encryptedData"] == nil)
        let failed = try #require(try body(events[1])["data"] as? [String: Any])
        #expect(failed["state"] as? String == "failed" && failed["status"] as? Int == 400 && failed["reason"] as? String == "BadDeviceToken")
        // The body is rendered from columns that never change: the same bytes on every read.
        #expect(try s.event(id: events[0].id) == events[0])
        #expect(try s.event(id: events[0].id.uppercased())?.body == events[0].body)
        #expect(try s.event(id: "not-an-id") == nil)
        // Applying the same outcome again (the row is no longer inflight) writes nothing.
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered, attempt: nil)])
        #expect(try s.events(credentialID: cred, after: 0, limit: 100).count == 2)
        #expect(s.eventsCreated.counts == [.responseDelivered: 1, .responseFailed: 1])
        // Paging by sequence.
        #expect(try s.events(credentialID: cred, after: events[0].sequence, limit: 100) == [events[1]])
        #expect(try s.events(credentialID: cred, after: 0, limit: 1) == [events[0]])
        #expect(try s.lastEventSequence() == events[1].sequence)
    }

    @Test(arguments: StoreBackend.available)
    func expiryAtClaimAndA410WriteTheirEvents(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: [app])
        guard case .accepted(let expiring) = try s.ingestNow(sample(token: String(repeating: "cd", count: 32)), secret: c.secret, ttl: 1000) else {
            Issue.record("not accepted"); return
        }
        f.clock.advance(1000)
        #expect(try s.claimDue(limit: 10).isEmpty)
        var events = try s.events(credentialID: c.record.id, after: 0, limit: 10)
        #expect(events.map(\.type) == [.responseFailed])
        #expect(s.eventsCreated.counts == [.responseFailed: 1])
        let expired = try #require(try body(events[0])["data"] as? [String: Any])
        #expect(expired["id"] as? String == expiring && expired["reason"] as? String == "expired" && expired["status"] is NSNull)

        _ = try s.ingestNow(sample(index: 7), secret: c.secret)
        let row = try s.claimDue(limit: 1)[0]
        let ts = f.clock.nowMillis() - 3
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .unregistered(reason: "Unregistered", apnsTimestamp: ts),
                                    attempt: AttemptRecord(responseID: row.id, attemptedAt: f.clock.nowMillis(), status: 410, reason: "Unregistered", apnsTimestamp: ts))])
        events = try s.events(credentialID: c.record.id, after: events[0].sequence, limit: 10)
        #expect(events.map(\.type) == [.responseFailed, .tokenUnregistered])
        #expect(s.eventsCreated.counts == [.responseFailed: 2, .tokenUnregistered: 1])
        let token = try body(events[1])
        #expect(token["type"] as? String == "token.unregistered")
        let td = try #require(token["data"] as? [String: Any])
        #expect(td["pushToken"] as? String == row.pushToken && td["app"] as? String == app && td["unregisteredAt"] as? String == IngestService.iso(ts))
        #expect(td.count == 3)
        let failed = try #require(try body(events[0])["data"] as? [String: Any])
        #expect(failed["status"] as? Int == 410 && failed["reason"] as? String == "Unregistered")
    }

    /// token.unregistered follows one rule on both backends (StoreRules.tokenUnregisteredEvents):
    /// the same answer sequences write the same events. A first 410 writes one for its row's
    /// credential and app; the same 410 applied again (the row already failed) writes none; a
    /// 410 older than the row's own ingest still writes one, with APNs' timestamp; a
    /// BadDeviceToken writes none, also beside a 410 in one batch (whose rows alone count).
    @Test(arguments: StoreBackend.available)
    func tokenUnregisteredIsDecidedAlikeOnEveryBackend(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: [app])
        let b = try s.createCredential(name: "b", apps: [app])
        let names = [a.record.id: "a", b.record.id: "b"]
        let t = String(repeating: "ab", count: 32), u = String(repeating: "cd", count: 32)
        var ids: [String: String] = [:]
        for (key, secret, token, index) in [("a1", a.secret, t, 1), ("a2", a.secret, t, 2), ("b1", b.secret, t, 3), ("ua", a.secret, u, 4), ("ub", b.secret, u, 5)] {
            guard case .accepted(let id) = try s.ingestNow(sample(token: token, index: UInt32(index)), secret: secret) else { Issue.record("\(key) refused"); return }
            ids[key] = id
        }
        #expect(try s.claimDue(limit: 10).count == 5)
        let now = f.clock.nowMillis()
        func answer(_ key: String, _ reason: String, _ ts: Int64) -> DeliveryUpdate {
            let token = key.hasPrefix("u") ? u : t
            let status = reason == StoreRules.badDeviceTokenReason ? 400 : 410
            return DeliveryUpdate(id: ids[key]!, pushToken: token, outcome: .unregistered(reason: reason, apnsTimestamp: ts),
                                  attempt: AttemptRecord(responseID: ids[key]!, attemptedAt: now, status: status, reason: reason, apnsTimestamp: ts))
        }
        var seen = 0
        /// The token.unregistered events written since the last call: credential name, app, token, unregisteredAt.
        func written() throws -> [String] {
            let all = try s.listEvents(type: .tokenUnregistered, limit: 100).reversed()
            defer { seen = all.count }
            return try all.dropFirst(seen).map { e in
                let d = try #require(try body(e)["data"] as? [String: Any])
                return "\(names[e.credentialID ?? ""] ?? "?") \(e.app) \((d["pushToken"] as? String ?? "").prefix(2)) \(d["unregisteredAt"] as? String ?? "")"
            }
        }
        try s.apply([answer("a1", "Unregistered", now - 10)])
        #expect(try written() == ["a \(app) ab \(IngestService.iso(now - 10))"])
        try s.apply([answer("a1", "Unregistered", now - 5)])   // the row is failed already
        #expect(try written() == [])
        try s.apply([answer("b1", "ExpiredToken", now - 60_000)])   // older than b1's ingest
        #expect(try written() == ["b \(app) ab \(IngestService.iso(now - 60_000))"])
        try s.apply([answer("a2", StoreRules.badDeviceTokenReason, now)])
        #expect(try written() == [])
        try s.apply([answer("ua", "Unregistered", now - 100), answer("ub", StoreRules.badDeviceTokenReason, now)])
        #expect(try written() == ["a \(app) cd \(IngestService.iso(now - 100))"])
        // The mark records the newest answer's reason (here the BadDeviceToken), alike too.
        #expect(try s.unregisteredTokens().first { $0.token == u }?.reason == StoreRules.badDeviceTokenReason)
    }

    /// The backlog gauge counts the pending deliveries up to a cap (StoreRules
    /// .webhookBacklogCountCap), never the whole backlog: a bounded read every 10 s.
    @Test(arguments: StoreBackend.available)
    func theBacklogCountStopsAtItsCap(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let (_, _, rows) = try claimed(s, 5)
        try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        func count(_ cap: Int) throws -> Int? {
            if let q = s as? SQLiteOutboxStore { return try q.pendingWebhookDeliveries(webhook: "w", cap: cap) }
            if let p = s as? PostgresOutboxStore { return try p.pendingWebhookDeliveries(webhook: "w", cap: cap) }
            return nil
        }
        #expect(try count(3) == 3)
        #expect(try count(100) == 5)
        #expect(try s.pendingWebhookDeliveries(webhook: "w") == 5)
        #expect(try s.pendingWebhookDeliveries(webhook: "other") == 0)
    }

    /// An event exists if and only if its outcome committed: an event write that fails rolls
    /// the outcome back with it (the row stays inflight, as after any failed outcome write).
    @Test(arguments: StoreBackend.available)
    func aRolledBackOutcomeLeavesNoEventAndAFailedEventNoOutcome(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let (_, cred, rows) = try claimed(s, 1)
        switch backend {
        case .sqlite:
            _ = try f.sql("CREATE TRIGGER refuse_events BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'refused by test'); END")
        case .postgres:
            _ = try f.sql("CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by test'; END $$")
            _ = try f.sql("CREATE TRIGGER refuse_events BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse_events()")
        }
        let update = DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered,
                                    attempt: AttemptRecord(responseID: rows[0].id, attemptedAt: f.clock.nowMillis(), status: 200, reason: nil))
        #expect(throws: StoreError.self) { try s.apply([update]) }
        #expect(try s.response(id: rows[0].id)?.state == .inflight)
        #expect(try s.attempts(responseID: rows[0].id).isEmpty)
        #expect(try s.events(credentialID: cred, after: 0, limit: 10).isEmpty)
        #expect(s.eventsCreated.counts.isEmpty)   // a rolled-back event is not counted
        _ = try f.sql("DROP TRIGGER refuse_events" + (backend == .postgres ? " ON events" : ""))
        try s.apply([update])
        #expect(try s.response(id: rows[0].id)?.state == .delivered)
        #expect(try s.events(credentialID: cred, after: 0, limit: 10).map(\.type) == [.responseDelivered])
        #expect(s.eventsCreated.counts == [.responseDelivered: 1])
    }

    @Test(arguments: StoreBackend.available)
    func anotherCredentialSeesNoneOfTheseEvents(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let (_, cred, rows) = try claimed(s, 1)
        let other = try s.createCredential(name: "other", apps: [app])
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered, attempt: nil)])
        #expect(try s.events(credentialID: cred, after: 0, limit: 10).count == 1)
        #expect(try s.events(credentialID: other.record.id, after: 0, limit: 10).isEmpty)
        // Nothing of its own: next stays (SQLite moves past others' events only a whole
        // scanned stretch at a time; PostgreSQL reads its index).
        let page = try s.eventPage(credentialID: other.record.id, after: 0, limit: 10)
        #expect(page.events.isEmpty && page.next == 0)
    }

    /// New events come from the webhook's cursor (no row per event); a failed attempt writes
    /// the event's retry row and the cursor moves past it; the listing and counts join both.
    @Test(arguments: StoreBackend.available)
    func newEventsComeFromTheCursorAndFailuresBecomeRetryRows(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [
            WebhookSubscription(name: "all"),
            WebhookSubscription(name: "failures", types: [.responseFailed]),
            WebhookSubscription(name: "elsewhere", apps: ["com.example.other"]),
        ])
        let (_, _, rows) = try claimed(s, 3)
        try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: $0 == rows[1] ? .failed(reason: "BadDeviceToken") : .delivered, attempt: nil) })
        // The outcome commit wrote no delivery rows.
        #expect(try f.sql("SELECT count(*) FROM webhook_deliveries") == [["0"]])
        let now = f.clock.nowMillis()
        #expect(try s.exchange("elsewhere", now: now).claimed.isEmpty)
        let failures = try s.exchange("failures", now: now)
        #expect(failures.claimed.map(\.event.type) == [.responseFailed])
        // Commit order, from the cursor: attempts 0, the cursor's epoch as the generation.
        let first = try s.exchange("all", now: now, limit: 2)
        let hold = try #require(first.cursor)
        #expect(first.claimed.map(\.event.type) == [.responseDelivered, .responseFailed])
        #expect(first.claimed.allSatisfy { $0.attempts == 0 && $0.firstAttemptAt == nil && $0.fromCursor && $0.claim == hold.epoch })
        #expect(hold.claimedThrough == first.claimed[1].sequence)
        // The holder goes on after them; its cursor stays before what is in flight.
        let rest = try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch, through: first.claimed[0].sequence - 1), now: now)
        #expect(rest.claimed.count == 1 && rest.claimed[0].sequence > first.claimed[1].sequence && rest.cursor?.epoch == hold.epoch)
        // Another sender (an older epoch) gets nothing new while the holder's lease runs.
        let other = try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch - 1, through: 0), now: now + 999)
        #expect(other.claimed.isEmpty && other.cursor == nil)

        let t = now + 1000
        let all = first.claimed + rest.claimed
        // Results: delivered (nothing written), a retry and a dead (their rows); the cursor
        // passes all three. A result under an older epoch is stale.
        let done = try s.exchange("all", results: [
            WebhookAttemptRecord(all[0], .delivered(at: t)),
            WebhookAttemptRecord(all[1], .retry(attemptedAt: t, at: t + 5000, error: "status 500")),
            WebhookAttemptRecord(all[2], .dead(attemptedAt: t, error: "timeout")),
            WebhookAttemptRecord(eventID: all[0].eventID, claim: hold.epoch - 1, result: .dead(attemptedAt: t, error: "late"), fromCursor: true),
        ], cursor: WebhookCursorPosition(epoch: hold.epoch, through: rest.cursor!.claimedThrough), now: t)
        #expect(done.stale == 1 && done.claimed.isEmpty)
        #expect(try f.sql("SELECT count(*) FROM webhook_deliveries WHERE webhook = 'all'") == [["2"]])
        #expect(try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch, through: 0), now: t + 4999).claimed.isEmpty)
        let retried = try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch, through: 0), now: t + 5000).claimed
        #expect(retried.map(\.eventID) == [all[1].eventID])
        #expect(retried[0].attempts == 1 && retried[0].firstAttemptAt == t && !retried[0].fromCursor)
        // Not sent (a local failure): no attempt, due again at its time, the error kept.
        #expect(try s.exchange("all", results: [WebhookAttemptRecord(retried[0], .notSent(failedAt: t + 5000, at: t + 5500, error: "out of memory"))],
                               now: t + 5000, limit: 0).stale == 0)
        #expect(try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch, through: 0), now: t + 5499).claimed.isEmpty)
        let notSent = try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "all", eventID: retried[0].eventID))
        #expect(notSent.first?.attempts == 1 && notSent.first?.lastError == "out of memory" && notSent.first?.firstAttemptAt == t)
        let resent = try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch, through: 0), now: t + 5500).claimed
        #expect(resent.map(\.eventID) == [retried[0].eventID] && resent[0].attempts == 1 && resent[0].firstAttemptAt == t)

        // "failures" has its event in flight (after its cursor): pending, without a row.
        #expect(try s.webhookDeliveryCounts()["all"] == [.pending: 1, .dead: 1])
        #expect(try s.webhookDeliveryCounts()["failures"] == [.pending: 1])
        #expect(try s.webhookDeliveryCounts()["elsewhere"] == nil)
        let dead = try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "all", state: .dead))
        #expect(dead.map(\.event.id) == [all[2].event.id] && dead[0].lastError == "timeout" && dead[0].attempts == 1)
        let delivered = try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "all", state: .delivered))
        #expect(delivered.map(\.event.id) == [all[0].event.id] && delivered[0].attempts == 1)
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "all", state: .pending)).map(\.event.id) == [all[1].event.id])
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "failures", state: .pending)).map(\.event.id) == [all[1].event.id])
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter(type: .responseFailed)).map(\.webhook).sorted() == ["all", "failures"])
        #expect(try s.webhookDeliveries(WebhookDeliveryFilter()).count == 4)

        // Replay: pending again, due now, same id and body, attempts kept; a delivered event
        // without a row gets one.
        #expect(try s.replayDeadWebhookDeliveries(webhook: "all") == 1)
        #expect(try s.replayWebhookDelivery(eventID: all[0].event.id, webhook: "all") == 1)
        #expect(try s.replayWebhookDelivery(eventID: UUID().uuidString, webhook: nil) == 0)
        let replayed = try s.exchange("all", cursor: WebhookCursorPosition(epoch: hold.epoch, through: 0), now: t + 6000).claimed
        #expect(Set(replayed.map(\.event.id)) == [all[0].event.id, all[2].event.id])
        #expect(replayed.first { $0.event.id == all[2].event.id }?.attempts == 1)
        #expect(replayed.first { $0.event.id == all[2].event.id }?.event.body == all[2].event.body)
    }

    @Test("A late result of an earlier claim (lease ended, replay) never overwrites what a later claim wrote", arguments: StoreBackend.available)
    func lateResultsOfAnEarlierClaimAreDropped(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let (_, _, rows) = try claimed(s, 2)
        try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        let now = f.clock.nowMillis()
        func row(_ id: String) throws -> WebhookDeliveryRecord {
            try #require(try s.webhookDeliveries(WebhookDeliveryFilter(webhook: "w", eventID: id)).first)
        }
        // Both new events fail to be sent: their retry rows, due now.
        let new = try s.exchange("w", now: now, lease: 100)
        let cursor = try #require(new.cursor)
        #expect(try s.exchange("w", results: new.claimed.map { WebhookAttemptRecord($0, .notSent(failedAt: now, at: now, error: "not sent")) },
                               cursor: WebhookCursorPosition(epoch: cursor.epoch, through: cursor.claimedThrough), now: now, limit: 0).stale == 0)
        // The first claim's lease ends (its sender is slow); both are claimed again.
        let first = try s.exchange("w", cursor: WebhookCursorPosition(epoch: cursor.epoch, through: 0), now: now, lease: 100).claimed
        let second = try s.exchange("w", cursor: WebhookCursorPosition(epoch: cursor.epoch, through: 0), now: now + 100, lease: 99_900).claimed
        #expect(first.count == 2 && second.map(\.eventID) == first.map(\.eventID))
        #expect(zip(first, second).allSatisfy { $0.claim < $1.claim })
        // The second claim's answer comes first: [0] to be retried later. With it, a late answer
        // of the first claim for [1]: not recorded, and named by its position.
        #expect(try s.exchange("w", results: [
            WebhookAttemptRecord(first[1], .delivered(at: now + 150)),
            WebhookAttemptRecord(second[0], .retry(attemptedAt: now + 200, at: now + 60_000, error: "HTTP 500")),
        ], now: now + 200, limit: 0).staleResults == [0])
        // Then the first claim's late answers: neither is recorded.
        #expect(try s.exchange("w", results: [
            WebhookAttemptRecord(first[0], .delivered(at: now + 300)),
            WebhookAttemptRecord(first[1], .dead(attemptedAt: now + 300, error: "timeout")),
        ], now: now + 300, limit: 0).staleResults == [0, 1])
        let zero = try row(first[0].eventID), one = try row(first[1].eventID)
        #expect(zero.state == .pending && zero.attempts == 1 && zero.lastError == "HTTP 500" && zero.nextAttemptAt == now + 60_000)
        #expect(one.state == .pending && one.attempts == 0 && one.lastError == "not sent")
        // [1] is still leased by the second claim.
        #expect(try s.exchange("w", cursor: WebhookCursorPosition(epoch: cursor.epoch, through: 0), now: now + 300, lease: 99_700).claimed.isEmpty)

        // A replay bumps the generation too: the second claim's late answer for [1] is dropped,
        // and the replayed delivery is claimed (at once) under a newer one.
        #expect(try s.replayWebhookDelivery(eventID: second[1].eventID, webhook: "w") == 1)
        #expect(try s.exchange("w", results: [WebhookAttemptRecord(second[1], .dead(attemptedAt: now + 400, error: "timeout"))], now: now + 400, limit: 0).stale == 1)
        #expect(try row(second[1].eventID).state == .pending)
        // One transaction: the stale result dropped, the replayed delivery claimed.
        let third = try s.exchange("w", results: [WebhookAttemptRecord(second[1], .delivered(at: now + 500))],
                                   cursor: WebhookCursorPosition(epoch: cursor.epoch, through: 0), now: now + 500, lease: 99_500)
        #expect(third.stale == 1 && third.claimed.map(\.eventID) == [second[1].eventID])
        let replayed = try #require(third.claimed.first)
        #expect(replayed.claim > second[1].claim + 1)
        let fourth = try s.exchange("w", results: [WebhookAttemptRecord(replayed, .delivered(at: now + 600))],
                                    cursor: WebhookCursorPosition(epoch: cursor.epoch, through: 0), now: now + 600, lease: 99_400)
        #expect(fourth.stale == 0 && fourth.claimed.isEmpty)
        #expect(try row(second[1].eventID).state == .delivered)
    }

    @Test(arguments: StoreBackend.available)
    func retentionRemovesEventsWithTheirDeliveriesAndTheBacklogDropsItsOldest(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "all")])
        let (_, cred, rows) = try claimed(s, 4)
        try s.apply(Array(rows[0..<2]).map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        f.clock.advance(10)
        let cutoff = f.clock.nowMillis()
        try s.apply(Array(rows[2..<4]).map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        let all = try s.events(credentialID: cred, after: 0, limit: 10)
        #expect(all.count == 4)
        // Only the types asked for, only before the cutoff, at most `limit` per call.
        #expect(try s.purgeEvents(types: [.responseFailed], olderThan: cutoff, limit: 10).events == 0)
        #expect(try s.purgeEvents(types: [.responseDelivered], olderThan: cutoff, limit: 1).events == 1)
        #expect(try s.purgeEvents(types: [.responseDelivered], olderThan: cutoff, limit: 10).events == 1)
        #expect(try s.events(credentialID: cred, after: 0, limit: 10) == Array(all[2...]))
        #expect(try s.webhookDeliveryCounts()["all"] == [.pending: 2])

        #expect(try s.trimWebhookBacklogs(max: 5).isEmpty)
        #expect(try s.trimWebhookBacklogs(max: 1) == ["all": 1])
        let now = f.clock.nowMillis()
        #expect(try s.exchange("all", now: now, lease: 1).claimed.map(\.event.id) == [all[3].id])
        // The events themselves stay (the feed still lists them).
        #expect(try s.events(credentialID: cred, after: 0, limit: 10).count == 2)
    }

    /// The bound skips events a sender holds in flight: under a new epoch, so the holder's
    /// results for them are stale (no retry rows bring them back) and each is dropped and
    /// counted once; the cursor is handed out again from where the skip left it.
    @Test(arguments: StoreBackend.available)
    func aBacklogSkipCountsEachDroppedEventOnceAndTakesTheCursorBack(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")])
        let (_, cred, rows) = try claimed(s, 5)
        try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        let events = try s.events(credentialID: cred, after: 0, limit: 10)
        let now = f.clock.nowMillis()
        // A sender holds the cursor with the first three in flight.
        let held = try s.exchange("w", now: now, lease: 60_000, limit: 3)
        let grant = try #require(held.cursor)
        #expect(held.claimed.map(\.eventID) == events[0..<3].map(\.id))
        #expect(try s.trimWebhookBacklogs(max: 3) == ["w": 2])
        // Its attempts fail: results of the old epoch, recorded nowhere; it takes the cursor
        // again at once and is handed out from the skip: the third event and the two after.
        let late = try s.exchange("w", results: held.claimed.map { WebhookAttemptRecord($0, .retry(attemptedAt: now, at: now, error: "HTTP 500")) },
                                  cursor: WebhookCursorPosition(epoch: grant.epoch, through: grant.claimedThrough, claimedThrough: grant.claimedThrough),
                                  now: now + 1, lease: 60_000, limit: 10)
        #expect(late.stale == 3)
        #expect(late.claimed.map(\.eventID) == events[2...].map(\.id))
        #expect(try #require(late.cursor).epoch > grant.epoch)
        #expect(try f.sql("SELECT count(*) FROM webhook_deliveries") == [["0"]])
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 3])
        #expect(try s.trimWebhookBacklogs(max: 3).isEmpty)
    }

    /// One pass of the bound drops at most the bound (its counts stop there); the sweeper runs
    /// passes until the backlog is under it, each event counted once.
    @Test(arguments: StoreBackend.available)
    func aBacklogPassIsBoundedAndTheSweeperRepeatsIt(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")], maxBacklogPerWebhook: 2)
        let (_, cred, rows) = try claimed(s, 9)
        try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        // Two of them failed once: retry rows, the cursor past them.
        let now = f.clock.nowMillis()
        let first = try s.exchange("w", now: now, limit: 2)
        let grant = try #require(first.cursor)
        #expect(try s.exchange("w", results: first.claimed.map { WebhookAttemptRecord($0, .retry(attemptedAt: now, at: now + 60_000, error: "HTTP 500")) },
                               cursor: WebhookCursorPosition(epoch: grant.epoch, through: grant.claimedThrough), now: now, limit: 0).stale == 0)
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 9])
        #expect(try s.trimWebhookBacklogs(max: 2) == ["w": 2])
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 7])
        let sweeper = RetentionSweeper(store: s, policy: RetentionPolicy(), clock: f.clock, logger: RelayLogger(capture: true))
        sweeper.sweepOnce()
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 2])
        var r = PrometheusRegistry()
        sweeper.collectMetrics(into: &r)
        #expect(r.render().contains("relay_webhook_backlog_dropped_total{webhook=\"w\"} 5"))
        // The two retry rows are what is left; the events after the cursor all went.
        #expect(try s.exchange("w", now: now + 60_000, limit: 10).claimed.map(\.eventID).sorted() == first.claimed.map(\.eventID).sorted())
        #expect(try s.events(credentialID: cred, after: 0, limit: 10).count == 9)
    }

    @Test(arguments: StoreBackend.available)
    func eventIDsStayAboveTheStoredOnesAcrossARestart(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        var s = try f.open()
        let (secret, cred, rows) = try claimed(s, 1)
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered, attempt: nil)])
        s.close()
        f.clock.advance(-60_000)   // the clock went back while the relay was down
        s = try f.open()
        defer { s.close() }
        _ = try s.ingestNow(sample(index: 9), secret: secret)
        let row = try s.claimDue(limit: 1)[0]
        try s.apply([DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered, attempt: nil)])
        let events = try s.events(credentialID: cred, after: 0, limit: 10)
        #expect(events.count == 2 && events[1].sequence > events[0].sequence)
    }

    /// The sweeper applies store.retention to events as to their rows, and the backlog bound:
    /// the oldest pending dropped, counted and logged.
    @Test(arguments: StoreBackend.available)
    func theRetentionSweeperRemovesOldEventsAndBoundsTheBacklog(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        s.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "w")], maxBacklogPerWebhook: 2)
        let (_, cred, rows) = try claimed(s, 4)
        try s.apply([DeliveryUpdate(id: rows[0].id, pushToken: rows[0].pushToken, outcome: .delivered, attempt: nil),
                     DeliveryUpdate(id: rows[1].id, pushToken: rows[1].pushToken, outcome: .failed(reason: "BadDeviceToken"), attempt: nil)])
        f.clock.advance(5000)
        try s.apply(Array(rows[2...]).map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        let logger = RelayLogger(capture: true)
        let sweeper = RetentionSweeper(store: s, policy: RetentionPolicy(deliveredSeconds: 4, failedSeconds: 3600), clock: f.clock, logger: logger, batch: 1)
        sweeper.sweepOnce()
        // The old delivered event went (its row too); the failed one is kept for an hour.
        let left = try s.events(credentialID: cred, after: 0, limit: 10)
        #expect(left.map(\.type) == [.responseFailed, .responseDelivered, .responseDelivered])
        // Three pending for "w" over a bound of two: the oldest dropped.
        #expect(try s.webhookDeliveryCounts()["w"] == [.pending: 2])
        let now = f.clock.nowMillis()
        #expect(try s.exchange("w", now: now, lease: 1).claimed.map(\.event.id) == Array(left[1...]).map(\.id))
        var r = PrometheusRegistry()
        sweeper.collectMetrics(into: &r)
        let text = r.render()
        #expect(text.contains("relay_webhook_backlog_dropped_total{webhook=\"w\"} 1"))
        #expect(text.contains("relay_events_removed_total 1"))
        #expect(logger.capturedLines.contains { $0.contains("webhook backlog over events.maxBacklogPerWebhook") })
        // The deleted event was still pending for "w": counted and logged, never sent.
        #expect(text.contains("relay_webhook_deliveries_expired_total{webhook=\"w\"} 1"))
        #expect(logger.capturedLines.contains { $0.contains("retention deleted events still pending for a webhook") && $0.contains("\"deliveries\":1") })
    }

    @Test func cursorsRoundTripAndRefuseAnythingElse() {
        let cursor = FeedCursor(key: Array(repeating: 7, count: FeedCursor.keyLength))
        for v: Int64 in [0, 1, 255, 1 << 40, .max] {
            let text = cursor.seal(v, credentialID: "cred-a")
            #expect(text.utf8.count == FeedCursor.textLength)
            #expect(cursor.open(text, credentialID: "cred-a") == v)
            // Another credential's cursor, or another database's, opens to nothing.
            #expect(cursor.open(text, credentialID: "cred-b") == nil)
            #expect(FeedCursor(key: Array(repeating: 8, count: FeedCursor.keyLength)).open(text, credentialID: "cred-a") == nil)
            // Any character changed is refused.
            let chars = Array(text)
            for i in chars.indices {
                var t = chars
                t[i] = t[i] == "A" ? "B" : "A"
                #expect(cursor.open(String(t), credentialID: "cred-a") == nil, "\(String(t))")
            }
        }
        // Deterministic per credential (an unchanged position reads as unchanged), another
        // credential's differs.
        #expect(cursor.seal(5, credentialID: "cred-a") == cursor.seal(5, credentialID: "cred-a"))
        #expect(cursor.seal(5, credentialID: "cred-a") != cursor.seal(5, credentialID: "cred-b"))
        for bad in ["", "abc", "AAAAAAAAAAA", String(repeating: "A", count: 21), String(repeating: "A", count: 22), String(repeating: "A", count: 23)] {
            #expect(cursor.open(bad, credentialID: "cred-a") == nil, "\(bad)")
        }
    }

    /// A credential's position does not move with other credentials' events (below a whole
    /// scanned stretch): its cursor cannot count them.
    @Test(arguments: StoreBackend.available)
    func aPositionDoesNotMoveWithOtherCredentialsEvents(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        let a = try s.createCredential(name: "a", apps: ["com.example.app"])
        let b = try s.createCredential(name: "b", apps: ["com.example.app"])
        func deliver(_ c: CreatedCredential, _ index: UInt32) throws {
            _ = try s.ingestNow(sample(index: index), secret: c.secret)
            let rows = try s.claimDue(limit: 10)
            try s.apply(rows.map { DeliveryUpdate(id: $0.id, pushToken: $0.pushToken, outcome: .delivered, attempt: nil) })
        }
        try deliver(a, 1)
        let first = try s.eventPage(credentialID: a.record.id, after: 0, limit: 10)
        #expect(first.events.count == 1)
        for i in 2...4 { try deliver(b, UInt32(i)) }
        let empty = try s.eventPage(credentialID: a.record.id, after: first.next, limit: 10)
        #expect(empty.events.isEmpty && empty.next == first.next)
        try deliver(a, 5)
        let later = try s.eventPage(credentialID: a.record.id, after: empty.next, limit: 10)
        #expect(later.events.count == 1 && later.next == later.events[0].sequence)
    }

    /// The cursor key is the database's: made once, the same after a restart.
    @Test(arguments: StoreBackend.available)
    func theCursorKeySurvivesARestart(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        var s = try f.open()
        let key = try s.feedCursorKey()
        #expect(key.count == FeedCursor.keyLength && key != Array(repeating: 0, count: FeedCursor.keyLength))
        #expect(try s.feedCursorKey() == key)
        s.close()
        s = try f.open()
        defer { s.close() }
        #expect(try s.feedCursorKey() == key)
    }
}

/// The webhook claim never walks a backlog: it reads the due pending rows of one webhook in its
/// order from an index and stops at its limit (on SQLite, on the one writer thread).
@Suite struct EventClaimPlanTests {
    @Test(arguments: StoreBackend.available)
    func theClaimReadsTheDueIndexInOrder(_ backend: StoreBackend) throws {
        let f = try StoreFixture(backend)
        let s = try f.open()
        defer { s.close() }
        switch backend {
        case .sqlite:
            let plan = try SQLiteDatabase(path: f.dir.db, readOnly: true)
                .query("EXPLAIN QUERY PLAN " + SQLiteOutboxStore.claimSQL, [.text("w"), .integer(0), .integer(8)]).compactMap { $0.last?.string }
            // The range on (webhook, next_attempt_at) of the partial index, no sort, events by key.
            #expect(plan.contains { $0.contains("USING INDEX webhook_deliveries_due (webhook=? AND next_attempt_at<?)") }, "\(plan)")
            #expect(!plan.contains { $0.contains("TEMP B-TREE") }, "\(plan)")
            #expect(plan.contains { $0.contains("SEARCH e USING INTEGER PRIMARY KEY") }, "\(plan)")
        case .postgres:
            // An empty table is read sequentially whatever the indexes: forbid that to see the
            // plan the claim gets once the table has rows.
            let c = try PostgresConnection(url: f.pgURL, applicationName: "relay-test-plan")
            try c.execute("SET enable_seqscan = off")
            let plan = try c.query("EXPLAIN " + PostgresOutboxStore.claimSQL, [.text("w"), .int(0), .int(8), .int(1)]).compactMap { $0.first?.string }
            // The LIMIT takes the index's rows as they come (no sort below it); the claimed rows
            // (at most the limit) may be sorted again at the end.
            let limit = try #require(plan.firstIndex { $0.contains("->  Limit") }, "\(plan.joined(separator: "\n"))")
            let scan = try #require(plan.firstIndex { $0.contains("Index Scan using webhook_deliveries_due") }, "\(plan.joined(separator: "\n"))")
            #expect(limit < scan && plan[limit...scan].allSatisfy { !$0.contains("Sort") && !$0.contains("Bitmap") }, "\(plan.joined(separator: "\n"))")
            #expect(plan[scan + 1].contains("Index Cond: ((webhook = 'w'::text) AND (next_attempt_at <= '0'::bigint))"), "\(plan.joined(separator: "\n"))")
        }
    }
}

extension WebhookOutbox {
    /// One exchange as the sender makes it (tests): `lease` from `now`.
    func exchange(_ webhook: String, results: [WebhookAttemptRecord] = [], cursor: WebhookCursorPosition? = nil, now: Int64, lease: Int64 = 1000,
                  limit: Int = 10, release: Bool = false) throws -> WebhookExchange {
        try recordAndClaimWebhookDeliveries(webhook: webhook, results: results, cursor: cursor, now: now, leaseUntil: now + lease, limit: limit,
                                            releaseCursor: release)
    }
}
