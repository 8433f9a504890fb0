// SQLiteOutboxStore: the ingest job on the group-commit writer (facts gathered here,
// decided by StoreRules), completed on the writer thread after its batch's COMMIT.
import FoundationEssentials
import Glibc
import POSIXThreads

extension SQLiteOutboxStore {
    public var ingestSettings: IngestStoreSettings {
        get { writerState.sharedSettings.withLock { $0 } }
        set { writerState.sharedSettings.withLock { $0 = newValue } }
    }

    public func submit(_ request: IngestRequest,
                       completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
        guard let writer else { return completion(.failure(.invalid("store opened read-only"))) }
        // Cached statvfs (once a second at most): the hot path pays a lock and a clock read.
        if let g = freeSpaceGuard, g.isBelowFloor { return completion(.success(.storageFull)) }
        writer.enqueue(IngestJob(request, now: clock.nowMillis(), state: writerState, completion: completion))
    }

    /// One submit in the writer's queue: the request in, the outcome out. One object per request instead of four closure contexts, a result
    /// box and a Result per job.
    // @unchecked Sendable: a job is touched by one thread at a time: the writer thread runs and
    // finishes it (or the submitting thread refuses it when the queue is full or closed).
    final class IngestJob: GroupCommitWriter.Job, @unchecked Sendable {
        /// Let go before the completion runs (`complete`), so the submitter's reference is the
        /// last and the request is freed where the submitter drops it.
        private var held: IngestRequest?
        var request: IngestRequest { held.unsafelyUnwrapped }
        let now: Int64
        let state: WriterState
        let completion: @Sendable (Result<IngestOutcome, StoreError>) -> Void
        var outcome: IngestOutcome?
        var error: StoreError?
        override var refusedWhenQueueFull: Bool { true }

        init(_ request: IngestRequest, now: Int64, state: WriterState,
             completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void) {
            held = request
            self.now = now
            self.state = state
            self.completion = completion
        }

        // What `ingest` reads: the request's fields and the store's settings for this batch.
        var response: NewResponse { request.response }
        var credentialHash: [UInt8] { request.credentialHash }
        var configuredApps: Set<String> { state.batch.settings.configuredApps }
        var ttlMillis: Int64 { state.batch.settings.ttlMillis }
        var maxPending: Int { state.batch.settings.maxPending }

        override func run(_ db: SQLiteDatabase) throws {
            outcome = try SQLiteOutboxStore.ingest(self, now: now, db: db, state: state)
        }

        override func finish(_ error: StoreError?) {
            self.error = error
            // After COMMIT (or ROLLBACK): the completion runs here, on the writer thread; the
            // HTTP server moves the reply to the loop that writes it.
            complete()
        }

        override func refuse(_ error: StoreError) {
            self.error = error
            complete()
        }

        func complete() {
            held = nil
            if let error { return completion(.failure(error)) }
            if let outcome { completion(.success(outcome)) } else { completion(.failure(.invalid("ingest produced no outcome"))) }
        }
    }

    /// A plain INSERT: the dedupe key was checked before it (SQLiteOutboxStore+Dedupe), so
    /// the only constraint it can fail is the id_high key.
    private static func insertSQL(state: ResponseState) -> String {
        """
        INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
            state, attempts, next_attempt_at, created_at, expires_at, updated_at)
        VALUES (?12, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, '\(state.rawValue)', 0, ?9, ?10, ?11, ?10)
        """
    }
    private static let insertQueuedSQL = insertSQL(state: .queued)
    private static let insertInflightSQL = insertSQL(state: .inflight)

    /// Runs on the writer thread inside the batch transaction, step by step: the credential,
    /// the dedupe key, the token's marks and the outbox bound, the INSERT. A row inserted
    /// `inflight` in the room the taker offered is handed off (`state.batch`), given to it after
    /// COMMIT.
    private static func ingest(_ request: IngestJob, now: Int64, db: SQLiteDatabase, state: WriterState) throws -> IngestOutcome {
        let credID: String, app: String
        switch try admit(request, now: now, db: db, state: state) {
        case .refused(let outcome): return outcome
        case .admitted(let c, let a): (credID, app) = (c, a)
        }
        let r = request.response
        // Duplicates first, so a retried POST gets its 200 whatever else changed since.
        let dedupe = state.dedupe
        if !dedupe.isPrepared { try prepareIngest(db, state: state) }
        try dedupe.checkTailBound()
        let h = dedupe.hasher.hash(app: app, r)
        if let dup = try dedupe.existing(r, app: app, h: h, db: db) {
            return StoreRules.dedupe(dup, credentialID: credID, encryptedData: r.encryptedData)
        }
        let due: Int64
        switch try tokenAndBound(r.pushToken, maxPending: request.maxPending, now: now, db: db, state: state) {
        case .refused(let outcome): return outcome
        case .dueAt(let at): due = at
        }
        // Due now and room offered before the batch (DispatchChannel): inserted `inflight` and
        // given to the taker after COMMIT, no claim needed.
        let handOff = due <= now && state.batch.takeRoom()
        let expires = now + request.ttlMillis
        let (id, high) = try insert(r, app: app, credentialID: credID, inflight: handOff, due: due, now: now, expires: expires, db: db, state: state)
        dedupe.added(h, id: high)
        state.pending.count += 1
        guard handOff else {
            state.batch.queuedDue = true
            return .accepted(id: id)
        }
        state.batch.handOff(OutboxRow(id: id, app: app, pushToken: r.pushToken, sessionIdentifier: r.sessionIdentifier, keyID: r.keyID,
                                      messageIndex: r.messageIndex, encryptedData: r.encryptedData, credentialID: credID, state: .inflight,
                                      attempts: 0, nextAttemptAt: due, createdAt: now, expiresAt: expires, lastStatus: nil, lastReason: nil,
                                      updatedAt: now))
        return .accepted(id: id)
    }

    /// The credential, looked up in the same transaction (a revocation committed by relayctl
    /// takes effect for the very next batch), decided by StoreRules.admit; its last_used_at
    /// kept to the minute (checked once per credential and batch, not per row).
    private static func admit(_ request: IngestJob, now: Int64, db: SQLiteDatabase, state: WriterState) throws -> StoreRules.Admission {
        let batch = state.batch
        let requestedApp = request.response.app
        let cred: CredentialFacts?
        if let last = batch.lastCredential, last.hash == request.credentialHash {
            // The common case: a batch from one credential, no lookup; the same question again
            // has the answer it had (and a credential admitted then had its touch checked).
            if let memo = last.verdict, memo.requestedApp == requestedApp { return memo.admission }
            cred = last.credential
        } else if let cached = batch.credentials[request.credentialHash] {
            cred = cached
            batch.lastCredential = IngestBatch.LastCredential(hash: request.credentialHash, credential: cached)
        } else {
            let lookup = try db.held(&state.statements.lookupCredential, "SELECT id, hash, apps, revoked_at FROM credentials WHERE hash = ?")
            defer { lookup.reset() }
            try lookup.bind(1, request.credentialHash)
            if try lookup.next(), !lookup.isNull(0), !lookup.isNull(1) {
                cred = CredentialFacts(id: lookup.text(0), hash: lookup.blob(1), apps: Credentials.splitApps(lookup.text(2)), revoked: !lookup.isNull(3))
            } else {
                cred = nil
            }
            batch.credentials[request.credentialHash] = .some(cred)
            batch.lastCredential = IngestBatch.LastCredential(hash: request.credentialHash, credential: cred)
        }
        let verdict = StoreRules.admit(credential: cred, presentedHash: request.credentialHash, requestedApp: requestedApp,
                                       configuredApps: request.configuredApps)
        if batch.lastCredential?.touchChecked == false, case .admitted(let credID, _) = verdict {
            if StoreRules.lastUsedIsStale(touchedAt: state.credentialTouched[credID], now: now) {
                try db.run("UPDATE credentials SET last_used_at = ? WHERE id = ?", [.integer(now), .text(credID)])
                state.credentialTouched[credID] = now
                state.batch.touched(credID)
            }
            batch.lastCredential?.touchChecked = true
        }
        batch.lastCredential?.verdict = (requestedApp, verdict)
        return verdict
    }

    private enum TokenVerdict {
        case refused(IngestOutcome)
        case dueAt(Int64)
    }

    /// The slow path (rare): the token is marked or paced, or the outbox is at its bound. A
    /// probe's hold starts again with it: the next response waits for its answer or the hold.
    private static func tokenAndBound(_ token: String, maxPending: Int, now: Int64, db: SQLiteDatabase, state: WriterState) throws -> TokenVerdict {
        // isEmpty first: no hashing of the token when nothing is marked or paced.
        guard (!state.watchedTokens.isEmpty && state.watchedTokens.contains(token)) || state.pending.count >= maxPending else { return .dueAt(now) }
        var probe = false
        if let mark = try db.query("SELECT recorded_at, reason FROM unregistered_tokens WHERE token = ?", [.text(token)]).first,
           let recordedAt = mark[0].int {
            switch StoreRules.markAdmission(reason: mark[1].string ?? StoreRules.unregisteredReason, recordedAt: recordedAt, now: now,
                                            settings: state.batch.settings) {
            case .refused(let outcome): return .refused(outcome)
            case .probe: probe = true
            case .open: break
            }
        }
        guard state.pending.count < maxPending else { return .refused(.overCapacity) }
        var due = now
        if let paced = try db.query("SELECT paced_until FROM token_pacing WHERE token = ?", [.text(token)]).first?[0].int, paced > now {
            due = paced
        }
        if probe { try db.run("UPDATE unregistered_tokens SET recorded_at = ? WHERE token = ?", [.integer(now), .text(token)]) }
        return .dueAt(due)
    }

    /// The row, under a freshly minted id (two statements with the state as a literal, bound
    /// without [SQLValue] arrays). Returns its id and key.
    private static func insert(_ r: NewResponse, app: String, credentialID: String, inflight: Bool, due: Int64, now: Int64, expires: Int64,
                               db: SQLiteDatabase, state: WriterState) throws -> (id: String, high: Int64) {
        var (id, high) = state.ids.mint(nowMillis: now)
        let insert = inflight ? try db.held(&state.statements.insertInflight, insertInflightSQL)
            : try db.held(&state.statements.insertQueued, insertQueuedSQL)
        var clashes = 0
        while true {
            try insert.bind(1, id)
            try insert.bind(2, app)
            try insert.bind(3, r.pushToken)
            try insert.bind(4, r.sessionIdentifier)
            try insert.bind(5, r.keyID)
            try insert.bind(6, Int64(r.messageIndex))
            try insert.bind(7, r.encryptedData)
            try insert.bind(8, credentialID)
            try insert.bind(9, due)
            try insert.bind(10, now)
            try insert.bind(11, expires)
            try insert.bind(12, high)
            do {
                try insert.stepOnce()
                return (id, high)
            } catch let error as StoreError where error.isPrimaryKeyConflict && clashes < maxKeyClashes {
                // The id's high word is taken. Ids are minted above minted_through (also after
                // a restart with the clock stepped back), so only a row inserted by other means
                // (a script's fixture) can hold it. Only this statement failed; move past the
                // highest key of that millisecond (exact: we hold the write lock) and mint again.
                clashes += 1
                let bucket = high & ~0xfff   // same ms, version 7, counter 0
                let top = try db.scalar("SELECT max(id_high) FROM responses WHERE id_high BETWEEN ? AND ?",
                                        [.integer(bucket), .integer(bucket | 0xfff)]).int
                state.ids.advance(pastHigh: top ?? high)
                (id, high) = state.ids.mint(nowMillis: now)
            }
        }
    }

    /// Ingest attempts per row whose id's high word was taken (each moves past a whole
    /// millisecond's keys, so one is almost always enough).
    static let maxKeyClashes = 16
}
