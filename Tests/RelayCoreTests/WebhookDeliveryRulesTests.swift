// WebhookDeliveryRules without a database: what both stores list, count, replay and trim
// (the contract tests in EventStoreTests run the same on each backend).
import Testing
@testable import RelayCore

@Suite struct WebhookDeliveryRulesTests {
    /// A cursor started at 10, delivered through 20, handed out through 25.
    let cursor = WebhookCursorRow(webhook: "w", seq: 20, claimedThrough: 25, startSeq: 10, epoch: 3, leaseUntil: 500,
                                  subscription: WebhookSubscription(name: "w", types: [.responseFailed], apps: ["a"]))

    @Test func eventsWithoutARowArePlacedByTheCursor() {
        let r = WebhookDeliveryRules.self
        #expect(r.rowlessRange(cursor, state: nil) == WebhookSeqRange(after: 10, through: nil))
        #expect(r.rowlessRange(cursor, state: .pending) == WebhookSeqRange(after: 20, through: nil))
        #expect(r.rowlessRange(cursor, state: .delivered) == WebhookSeqRange(after: 10, through: 20))
        #expect(r.rowlessRange(cursor, state: .dead) == nil)
        #expect(WebhookSeqRange(after: 10, through: 20).sql == "e.seq > 10 AND e.seq <= 20")
        #expect(WebhookSeqRange(after: 20, through: nil).sql == "e.seq > 20")
        // Handed out but not finished is still pending; the state agrees with the ranges.
        #expect(r.rowlessState(seq: 20, cursor) == (.delivered, 1))
        #expect(r.rowlessState(seq: 21, cursor) == (.pending, 0))
        for seq in Int64(11)...30 {
            let state = r.rowlessState(seq: seq, cursor).state
            for s in [WebhookDeliveryState.pending, .delivered] {
                let range = r.rowlessRange(cursor, state: s)!
                #expect((seq > range.after && seq <= (range.through ?? .max)) == (state == s), "seq \(seq) as \(s)")
            }
        }
        #expect(r.rowlessStateSQL(cursor).state == "CASE WHEN e.seq <= 20 THEN 'delivered' ELSE 'pending' END")
        #expect(r.rowlessStateSQL(cursor).attempts == "CASE WHEN e.seq <= 20 THEN 1 ELSE 0 END")
        // Retention's tally: after the cursor and received only.
        #expect(r.rowlessPending(cursor, seq: 21, type: .responseFailed, app: "a"))
        #expect(!r.rowlessPending(cursor, seq: 20, type: .responseFailed, app: "a"))
        #expect(!r.rowlessPending(cursor, seq: 21, type: .responseDelivered, app: "a"))
        #expect(!r.rowlessPending(cursor, seq: 21, type: .responseFailed, app: "b"))
    }

    @Test func countsAddRowlessPendingToTheRows() {
        let counts = WebhookDeliveryRules.counts(rows: [("w", .pending, 2), ("w", .dead, 1), ("v", .dead, 4), ("u", .delivered, 9), ("t", .pending, 0)],
                                                 rowlessPending: [("w", 3), ("v", 0), ("x", 5)])
        #expect(counts == ["w": [.pending: 5, .dead: 1], "v": [.dead: 4], "x": [.pending: 5]])
        #expect(WebhookDeliveryRules.backlog(pendingRows: 3, rowlessPending: 4, cap: 10) == 7)
        #expect(WebhookDeliveryRules.backlog(pendingRows: 10, rowlessPending: 10, cap: 10) == 10)
    }

    @Test func aReplayAddsARowOnlyWhereTheCursorPassedAReceivedEvent() {
        let r = WebhookDeliveryRules.self
        #expect(r.replayAddsRow(cursor, seq: 15, type: .responseFailed, app: "a"))
        #expect(r.replayAddsRow(cursor, seq: 20, type: .responseFailed, app: "a"))
        #expect(!r.replayAddsRow(cursor, seq: 10, type: .responseFailed, app: "a"))      // before the webhook
        #expect(!r.replayAddsRow(cursor, seq: 21, type: .responseFailed, app: "a"))      // still pending
        #expect(!r.replayAddsRow(cursor, seq: 15, type: .tokenUnregistered, app: "a"))   // not received
        #expect(r.replaySetSQL(now: "?1") == "state = 'pending', next_attempt_at = ?1, lease_until = 0, claim = claim + 1, first_attempt_at = NULL, updated_at = ?1")
        #expect(r.replayedRowAttempts == 1)
    }

    @Test("The bound: events after the cursor first, then retry rows; at most `max` a pass, from counts capped at trimCountCap")
    func theBacklogTrimsOldestEventsFirstAndBoundsEachPass() {
        let r = WebhookDeliveryRules.self
        #expect(r.trimCountCap(max: 1000) == 2000)
        #expect(r.trimCountCap(max: 0) == 1)
        func trim(_ rows: Int, _ after: Int, _ max: Int) -> WebhookBacklogTrim {
            // The stores count each up to the cap: the decision must not need more.
            r.trim(pendingRows: min(rows, r.trimCountCap(max: max)), rowlessPending: min(after, r.trimCountCap(max: max)), max: max)
        }
        #expect(trim(3, 4, 10) == WebhookBacklogTrim(skipEvents: 0, dropRows: 0))
        #expect(trim(3, 7, 10) == WebhookBacklogTrim(skipEvents: 0, dropRows: 0))
        #expect(trim(3, 8, 10) == WebhookBacklogTrim(skipEvents: 1, dropRows: 0))
        #expect(trim(8, 5, 10) == WebhookBacklogTrim(skipEvents: 3, dropRows: 0))
        #expect(trim(12, 5, 10) == WebhookBacklogTrim(skipEvents: 5, dropRows: 2))
        #expect(trim(14, 0, 10) == WebhookBacklogTrim(skipEvents: 0, dropRows: 4))
        // Far over: one pass drops `max`, events first, whatever the true counts.
        #expect(trim(0, 1_000_000, 10) == WebhookBacklogTrim(skipEvents: 10, dropRows: 0))
        #expect(trim(1_000_000, 3, 10) == WebhookBacklogTrim(skipEvents: 3, dropRows: 7))
        #expect(trim(15, 0, 10) == WebhookBacklogTrim(skipEvents: 0, dropRows: 5))
        #expect(r.trimPassWasFull(dropped: 10, max: 10) && !r.trimPassWasFull(dropped: 9, max: 10))
        // Passes until one is not full leave exactly `max`, each dropped once.
        var (rows, after, dropped) = (30, 45, 0)
        while true {
            let t = trim(rows, after, 10)
            after -= t.skipEvents
            rows -= t.dropRows
            dropped += t.skipEvents + t.dropRows
            if !r.trimPassWasFull(dropped: t.skipEvents + t.dropRows, max: 10) { break }
        }
        #expect(rows == 10 && after == 0 && dropped == 65)
    }

    @Test func aSkipStartsANewEpochFromTheNewSeq() {
        var row = cursor
        WebhookCursorRules.skipped(&row, to: 23)
        #expect(row.seq == 23 && row.claimedThrough == 23 && row.epoch == 4 && row.leaseUntil == 0)
        // The holder's results are now of an older epoch; anyone takes the cursor at once and is
        // handed out from 23.
        #expect(WebhookCursorRules.grant(storedEpoch: row.epoch, leaseUntil: row.leaseUntil, caller: 3, now: 1, takeUnleased: false) == .take(epoch: 5))
        // Never back.
        WebhookCursorRules.skipped(&row, to: 5)
        #expect(row.seq == 23 && row.epoch == 5)
    }

    @Test func resultsGoToTheirRowsNewRetryRowsOrNowhere() {
        func r(_ id: String, _ claim: Int64, _ result: WebhookAttemptResult, fromCursor: Bool) -> WebhookAttemptRecord {
            WebhookAttemptRecord(eventID: id, claim: claim, result: result, fromCursor: fromCursor)
        }
        let results = [
            r("row-delivered", 9, .delivered(at: 1), fromCursor: false),
            r("row-retry", 2, .retry(attemptedAt: 1, at: 2, error: "e"), fromCursor: false),
            r("new-delivered", 4, .delivered(at: 1), fromCursor: true),
            r("new-retry", 4, .retry(attemptedAt: 1, at: 2, error: "e"), fromCursor: true),
            r("new-dead", 4, .dead(attemptedAt: 1, error: "e"), fromCursor: true),
            r("new-not-sent", 4, .notSent(failedAt: 1, at: 2, error: "e"), fromCursor: true),
            r("old-epoch", 3, .retry(attemptedAt: 1, at: 2, error: "e"), fromCursor: true),
            r("old-epoch-delivered", 3, .delivered(at: 1), fromCursor: true),
        ]
        let sorted = WebhookCursorRules.sortResults(results, epoch: 4)
        #expect(sorted.rowResults.map { results[$0].eventID } == ["row-delivered", "row-retry"])
        #expect(sorted.newRows.map { results[$0].eventID } == ["new-retry", "new-dead", "new-not-sent"])
        #expect(sorted.stale == [6, 7])
    }
}
