// SQLiteOutboxStore: recording a 410 for a token with many rows without holding the writer.
// The cutoff (StoreRules.markCutoff) needs the newest created_at among the token's
// pending rows, and a busy token can have a million. They are read StoreRules.tokenWalkChunk
// at a time, each step a writer job of its own (the ingest batches queued meanwhile commit
// between steps); then one transaction checks the newest candidates again, fails the answered
// rows and writes the cutoff, as the answer's own transaction did before. Meanwhile the token's
// due rows wait (StoreRules.claimVerdict) and its further 410s join the scan. Nothing is written
// before that last transaction: after a crash the answered rows are inflight, requeued at start,
// pushed and answered 410 again. Once the cutoff is committed, claims fail the token's rows
// accepted up to it, in claim-sized transactions, at start too (the cutoff is durable).
import FoundationEssentials
import Synchronization

/// One token's 410s waiting for their cutoff.
struct TokenScan {
    /// The 410 outcomes to write (their rows stay inflight until then).
    var updates: [DeliveryUpdate] = []
    /// Rows answered 410 (not candidates: they are failed before the cutoff is read, as before).
    var answered: Set<Int64> = []
    let range: ClosedRange<Int64>
    /// RelayClock ms when the first 410 arrived (how long the token's due rows are put back).
    var startedAt: Int64 = 0
    /// Next response_keys position to read past; nil once the index part is read.
    var keyCursor: (h: Int64, id: Int64)?
    /// The token's unmerged rows when the scan began (they may be merged meanwhile).
    var tailIDs: [Int64]
    var tailNext = 0
    /// Rows committed later than this id are read by id range (any token), in steps too.
    var arrivalsAfter: Int64
    /// Told once the 410s are written (nil) or dropped (the store closed).
    var waiters: [(StoreError?) -> Void] = []
    /// The newest pending rows seen (createdAt, id), newest first.
    var newest: [(createdAt: Int64, id: Int64)] = []
    static let keep = 64

    mutating func saw(createdAt: Int64, id: Int64) {
        guard newest.count < Self.keep || createdAt > newest[newest.count - 1].createdAt else { return }
        let at = newest.firstIndex { $0.createdAt < createdAt } ?? newest.count
        newest.insert((createdAt, id), at: at)
        if newest.count > Self.keep { newest.removeLast() }
    }

    mutating func restart(tailIDs: [Int64], arrivalsAfter: Int64) {
        keyCursor = (range.lowerBound, .min)
        self.tailIDs = tailIDs
        tailNext = 0
        self.arrivalsAfter = arrivalsAfter
        newest = []
    }
}

/// The scans under way, oldest first, and the writer's bookkeeping of their steps. Writer
/// thread only, except `steps`.
final class TokenScans {
    var byToken: [String: TokenScan] = [:]
    private(set) var order: [String] = []
    /// A step is in the writer's queue.
    var queued = false
    /// Told after the current step's COMMIT (the scans it finished).
    var written: [(StoreError?) -> Void] = []
    var walkChunk = StoreRules.tokenWalkChunk
    var readRow: SQLiteStatement?
    /// Steps run (read from any thread: tests count the transactions a scan took).
    let steps = Atomic<Int>(0)

    var isEmpty: Bool { byToken.isEmpty }

    /// When the token's scan began (its due rows wait meanwhile: StoreRules.claimVerdict).
    func startedAt(_ token: String) -> Int64? { byToken.isEmpty ? nil : byToken[token]?.startedAt }

    func begin(_ token: String, _ scan: TokenScan) {
        byToken[token] = scan
        order.append(token)
    }

    func remove(_ token: String) {
        byToken[token] = nil
        order.removeAll { $0 == token }
    }

    func removeAll() {
        byToken = [:]
        order = []
    }
}

extension SQLiteOutboxStore {
    /// A 410 outcome (writer thread, inside the apply job): starts or joins its token's scan.
    static func beginTokenScan(_ u: DeliveryUpdate, db: SQLiteDatabase, state: WriterState, written: ((StoreError?) -> Void)?) throws {
        guard let high = UUIDText.high64(u.id) else { return }
        if state.scans.byToken[u.pushToken] == nil {
            let range = state.dedupe.hasher.tokenRange(u.pushToken)
            var scan = TokenScan(range: range, startedAt: state.clock.nowMillis(), tailIDs: [], arrivalsAfter: 0)
            scan.restart(tailIDs: try unmergedTokenIDs(u.pushToken, range: range, db: db, state: state),
                         arrivalsAfter: state.dedupe.newestID)
            state.scans.begin(u.pushToken, scan)
        }
        state.scans.byToken[u.pushToken]?.updates.append(u)
        state.scans.byToken[u.pushToken]?.answered.insert(high)
        if let written { state.scans.byToken[u.pushToken]?.waiters.append(written) }
        scheduleTokenScan(state)
    }

    /// The token's rows above merged_through: this store's tail, or read from the table.
    private static func unmergedTokenIDs(_ token: String, range: ClosedRange<Int64>, db: SQLiteDatabase, state: WriterState) throws -> [Int64] {
        if state.dedupe.isPrepared { return state.dedupe.tail.tokenIDs(range) }
        return try db.query("""
            SELECT id_high FROM responses WHERE push_token = ?
              AND id_high > (SELECT merged_through FROM outbox_stats WHERE id = 1)
            """, [.text(token)]).compactMap { $0[0].int }
    }

    /// Queues the next step unless one is queued. Called again by claims (the dispatcher's poll)
    /// after a step's batch failed, so a failing disk is not retried in a tight loop.
    static func scheduleTokenScan(_ state: WriterState) {
        guard !state.scans.byToken.isEmpty, !state.scans.queued, let writer = state.writer else { return }
        state.scans.queued = true
        writer.enqueue({ db in try tokenScanStep(db, state: state) }, completion: { result in
            state.scans.queued = false
            let told = state.scans.written
            state.scans.written = []
            switch result {
            case .success:
                for w in told { w(nil) }
                scheduleTokenScan(state)
            case .failure(.closed):
                // The store closed: the answered rows stay inflight (requeued at the next start).
                for w in told + state.scans.byToken.values.flatMap(\.waiters) { w(.closed) }
                state.scans.removeAll()
            case .failure(let error):
                // Rolled back: those 410s are not written; their rows stay inflight as after
                // any failed outcome write.
                for w in told { w(error) }
            }
        })
    }

    /// One step of the oldest scan: up to tokenWalkChunk rows read, or its last transaction.
    static func tokenScanStep(_ db: SQLiteDatabase, state: WriterState) throws {
        guard let token = state.scans.order.first, var scan = state.scans.byToken[token] else { return }
        state.scans.steps.add(1, ordering: .relaxed)
        let chunk = state.scans.walkChunk
        let read = try db.held(&state.scans.readRow, "SELECT created_at, state, push_token FROM responses WHERE id_high = ?")
        func look(_ id: Int64) throws {
            defer { read.reset() }
            try read.bind(1, id)
            guard try read.next(), read.text(2) == token, !scan.answered.contains(id),
                  let s = ResponseState(rawValue: read.text(1)), !s.isTerminal else { return }
            scan.saw(createdAt: read.int64(0), id: id)
        }
        if let cursor = scan.keyCursor {
            // The row value alone starts the search at the cursor (with `h BETWEEN` as well, SQLite
            // seeks to the range's start and filters: every step would re-read the ones before).
            let keys = try db.query(
                "SELECT h, id_high FROM response_keys WHERE (h, id_high) > (?, ?) AND h <= ? ORDER BY h, id_high LIMIT ?",
                [.integer(cursor.h), .integer(cursor.id), .integer(scan.range.upperBound), .integer(Int64(chunk))])
            for k in keys { if let id = k[1].int { try look(id) } }
            if keys.count < chunk { scan.keyCursor = nil } else if let h = keys.last?[0].int, let id = keys.last?[1].int { scan.keyCursor = (h, id) }
        } else if scan.tailNext < scan.tailIDs.count {
            let end = min(scan.tailIDs.count, scan.tailNext + chunk)
            for id in scan.tailIDs[scan.tailNext..<end] { try look(id) }
            scan.tailNext = end
        } else {
            // Rows committed since the scan began (every token's, in id order): the last stretch,
            // up to this transaction's own rows, is read by the transaction that writes the cutoff.
            let upTo = state.dedupe.newestID
            let rows = try db.query("SELECT id_high, created_at, state, push_token FROM responses WHERE id_high > ? AND id_high <= ? ORDER BY id_high LIMIT ?",
                                    [.integer(scan.arrivalsAfter), .integer(upTo), .integer(Int64(chunk))])
            for r in rows {
                guard let id = r[0].int, let at = r[1].int, r[3].string == token, !scan.answered.contains(id),
                      let s = r[2].string.flatMap(ResponseState.init(rawValue:)), !s.isTerminal else { continue }
                scan.saw(createdAt: at, id: id)
            }
            if rows.count == chunk, let last = rows.last?[0].int {
                scan.arrivalsAfter = last
            } else {
                state.scans.byToken[token] = scan
                try finishTokenScan(token, db: db, state: state)
                return
            }
        }
        state.scans.byToken[token] = scan
    }

    /// The scan's last transaction: the newest candidate still pending (checked again: it may
    /// have been delivered meanwhile) is the cutoff's newest waiting row, the answered rows
    /// fail, and the cutoff is written, as the answer's own transaction did before.
    private static func finishTokenScan(_ token: String, db: SQLiteDatabase, state: WriterState) throws {
        guard var scan = state.scans.byToken[token] else { return }
        var newestPending: Int64?
        let read = try db.held(&state.scans.readRow, "SELECT created_at, state, push_token FROM responses WHERE id_high = ?")
        for c in scan.newest {
            defer { read.reset() }
            try read.bind(1, c.id)
            if try read.next(), read.text(2) == token, let s = ResponseState(rawValue: read.text(1)), !s.isTerminal {
                newestPending = c.createdAt
                break
            }
        }
        if newestPending == nil && scan.newest.count == TokenScan.keep {
            // Every candidate kept went terminal meanwhile (rare): older pending rows may
            // remain, so the scan starts over (nothing written yet).
            scan.restart(tailIDs: try unmergedTokenIDs(token, range: scan.range, db: db, state: state),
                         arrivalsAfter: state.dedupe.newestID)
            state.scans.byToken[token] = scan
            return
        }
        let now = state.clock.nowMillis()
        var answers: [StoreRules.MarkingAnswer] = []
        for u in scan.updates {
            let finished = try applyOutcome(u, now: now, db: db, state: state)
            guard case .unregistered(let reason, let ts) = u.outcome, let high = UUIDText.high64(u.id),
                  let owner = try db.query("SELECT credential_id, app FROM responses WHERE id_high = ?", [.integer(high)]).first else { continue }
            answers.append(StoreRules.MarkingAnswer(reason: reason, apnsTimestamp: ts, credentialID: owner[0].string ?? "", app: owner[1].string ?? "",
                                                    finished: finished))
        }
        let mark = StoreRules.markFrom(answers.map { ($0.reason, $0.apnsTimestamp) })
        let apns = mark?.apnsTimestamp ?? now
        state.watchedTokens.insert(token)
        try db.run(
            """
            INSERT INTO unregistered_tokens (token, apns_timestamp, recorded_at, reason) VALUES (?, ?, ?, ?)
            ON CONFLICT (token) DO UPDATE SET apns_timestamp = max(apns_timestamp, excluded.apns_timestamp), recorded_at = excluded.recorded_at,
                reason = excluded.reason
            """, [.text(token), .integer(StoreRules.markCutoff(apnsTimestamp: apns, newestPendingCreatedAt: newestPending, now: now)), .integer(now),
                  .text(mark?.reason ?? StoreRules.unregisteredReason)])
        if let events = StoreRules.tokenUnregisteredEvents(answers) {
            try recordTokenEvents(token: token, owners: events.owners, unregisteredAt: events.unregisteredAt, now: now, db: db, state: state)
        }
        state.scans.remove(token)
        state.scans.written += scan.waiters   // told after COMMIT
        // The token's held rows are due again (announced after COMMIT): the next claim fails them.
        state.batch.queuedDue = true
    }
}
