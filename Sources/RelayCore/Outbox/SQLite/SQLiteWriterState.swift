// What the SQLite writer thread keeps between and within its batches, as small owners: the
// pending counter, the open batch's facts (IngestBatch), the held statements, the dedupe index
// (SQLiteOutboxStore+Dedupe.swift), the token scans (TokenScans, +TokenScan.swift). WriterState ties them
// together and is the GroupCommitWriter's one observer: it hears of each batch's steps in
// order and tells the store's commit observers after COMMIT.
import FoundationEssentials
import Synchronization

/// queued + inflight + retry rows: read from outbox_stats at each batch start, adjusted by the
/// batch's jobs, written back before COMMIT (so relayctl's changes from another process are
/// seen, and start-up needs no count over the whole table). Writer thread only.
final class PendingCounter {
    var count = 0
    private var atBatchStart = 0
    private var read: SQLiteStatement?
    private var write: SQLiteStatement?

    func load(_ db: SQLiteDatabase) throws {
        let st = try db.held(&read, "SELECT pending FROM outbox_stats WHERE id = 1")
        count = try st.next() ? Int(st.int64(0)) : 0
        st.reset()
        atBatchStart = count
    }

    /// One row, one page: the counter and the newest id minted (the dedupe tail's upper bound),
    /// only when either moved.
    func store(_ db: SQLiteDatabase, dedupe: DedupeIndex) throws {
        guard count != atBatchStart || dedupe.mintedPastCommitted else { return }
        let st = try db.held(&write, "UPDATE outbox_stats SET pending = ?, minted_through = max(minted_through, ?) WHERE id = 1")
        try st.bind(1, Int64(count))
        try st.bind(2, dedupe.newestID)
        try st.stepOnce()
    }
}

/// The open batch's facts, reset before each BEGIN: settings as read then, credentials looked
/// up in it, the rows it hands off and whether it queued any, the events it wrote. What a
/// COMMIT announces is built from here (`commit()`); a ROLLBACK just drops it.
final class IngestBatch {
    var settings = IngestStoreSettings()
    var events = EventStoreSettings()
    /// Credential lookups within the current transaction (a revocation by another process
    /// cannot commit while we hold the write lock, so this is exact).
    var credentials: [[UInt8]: CredentialFacts?] = [:]
    /// The credential looked up last in this batch (same lifetime as `credentials`), whether
    /// its last_used_at was already checked in this batch, and StoreRules.admit's last verdict
    /// for it (a pure function of the credential, the requested app and `settings`, all fixed
    /// for the batch).
    struct LastCredential {
        var hash: [UInt8]
        var credential: CredentialFacts?
        var touchChecked = false
        var verdict: (requestedApp: String?, admission: StoreRules.Admission)?
    }
    var lastCredential: LastCredential?
    /// The observer that offered room for due rows before this batch (the dispatcher's
    /// channel), the room left, and the rows the batch inserted `inflight` for it: given to it
    /// after COMMIT; on ROLLBACK they never existed and nothing is owed.
    private(set) var taker: (any OutboxCommitObserver)?
    /// The store's commit observers, read once before BEGIN: the taker is one of them, and
    /// COMMIT is announced to them (CommitObservers reads its list under a lock).
    private(set) var observers: [any OutboxCommitObserver] = []
    private var room = 0
    private var handedOff: [OutboxRow] = []
    /// The batch stored rows that wait for a claim (queued), or made held rows due again.
    var queuedDue = false
    /// Events this batch wrote, by type, and the first one's sequence (the feed is told where
    /// they are).
    private var eventTypes = (delivered: 0, failed: 0, unregistered: 0)
    private var firstEvent: Int64?
    /// What the batch changed in the writer's in-memory mirrors, undone if it rolls back:
    /// tokens taken out of `watchedTokens` (a token wrongly left out would skip its mark's
    /// check), credentials whose `credentialTouched` moved (their last_used_at was not written).
    private(set) var unwatched: [String] = []
    private(set) var touchedCredentials: [String] = []

    func unwatch(_ token: String) { unwatched.append(token) }
    func touched(_ credentialID: String) { touchedCredentials.append(credentialID) }

    /// Before BEGIN. The room is a number read now, outside the transaction, not a slot taken.
    func begin(settings: IngestStoreSettings, events: EventStoreSettings, observers: [any OutboxCommitObserver]) {
        reset()
        self.settings = settings
        self.events = events
        self.observers = observers
        let taker = CommitObservers.taker(among: observers)
        self.taker = taker?.observer
        room = taker?.room ?? 0
    }

    /// One slot of the offered room for a row due now, if any is left.
    func takeRoom() -> Bool {
        guard room > 0 else { return false }
        room -= 1
        return true
    }

    func handOff(_ row: OutboxRow) { handedOff.append(row) }

    func eventWritten(seq: Int64, _ type: EventType) {
        if firstEvent == nil { firstEvent = seq }
        switch type {
        case .responseDelivered: eventTypes.delivered += 1
        case .responseFailed: eventTypes.failed += 1
        case .tokenUnregistered: eventTypes.unregistered += 1
        }
    }

    /// After COMMIT: what to announce (the handed-off array itself is handed over), with the
    /// events counted into `tally`. The batch is empty afterwards.
    func commit(tally: EventTally) -> OutboxCommit {
        var commit = OutboxCommit(handedOff: handedOff, queuedDue: queuedDue)
        let t = eventTypes
        let count = t.delivered + t.failed + t.unregistered
        if count > 0 {
            tally.add(.responseDelivered, t.delivered)
            tally.add(.responseFailed, t.failed)
            tally.add(.tokenUnregistered, t.unregistered)
            commit.events = EventsCommitted(credentials: nil, after: (firstEvent ?? 1) - 1, count: count)
        }
        reset()
        return commit
    }

    /// Empty: before each batch, after its COMMIT (announced) or its ROLLBACK (nothing is
    /// announced, nothing is owed; WriterState undoes `unwatched` and `touchedCredentials` first).
    func reset() {
        credentials.removeAll(keepingCapacity: true)
        lastCredential = nil
        taker = nil
        observers = []
        room = 0
        handedOff = []
        queuedDue = false
        eventTypes = (0, 0, 0)
        firstEvent = nil
        unwatched.removeAll(keepingCapacity: true)
        touchedCredentials.removeAll(keepingCapacity: true)
    }
}

/// Statements the hot paths run, prepared once and held, so they skip the connection's
/// statement cache (a dictionary keyed by the SQL text, hashed at every lookup).
final class HeldStatements {
    /// The two ingest INSERTs.
    var insertQueued: SQLiteStatement?
    var insertInflight: SQLiteStatement?
    /// The two statements every delivered push runs (apply).
    var insertAttempt: SQLiteStatement?
    var applyOutcome = [SQLiteStatement?](repeating: nil, count: SQLiteOutboxStore.outcomeShapes)
    /// The claim's (one SELECT per claimable state, the two row updates) and the credential lookup.
    var claimQueued: SQLiteStatement?
    var claimRetry: SQLiteStatement?
    var markInflight: SQLiteStatement?
    var markExpired: SQLiteStatement?
    var lookupCredential: SQLiteStatement?
    /// The outcome's event, and the webhook sender's exchange (SQLiteOutboxStore+Webhooks).
    var insertResponseEvent: SQLiteStatement?
    var insertDelivery: SQLiteStatement?
    var claimWebhookDeliveries: SQLiteStatement?
    var leaseWebhookDelivery: SQLiteStatement?
    var recordWebhookResult: SQLiteStatement?
    var readWebhookCursor: SQLiteStatement?
    var writeWebhookCursor: SQLiteStatement?
    var scanNewEvents: SQLiteStatement?
}

extension SQLiteOutboxStore {
    // Only touched inside writer jobs and batch steps (the writer thread), except the Mutexes
    // and the Atomic, which any thread may read.
    final class WriterState: GroupCommitObserver {
        /// `ingestSettings` and `eventSettings`, set from any thread; read into `batch` at each BEGIN.
        let sharedSettings = Mutex(IngestStoreSettings())
        let sharedEventSettings = Mutex(EventStoreSettings())
        let batch = IngestBatch()
        let pending = PendingCounter()
        let statements = HeldStatements()
        /// The dedupe index's tail, watermarks and merges (SQLiteOutboxStore+Dedupe).
        let dedupe = DedupeIndex()
        /// Told after each COMMIT (OutboxCommit.swift): the dispatcher's channel, the event feed,
        /// the webhook sender.
        let observers = CommitObservers()
        /// Events committed by this process, by type.
        let tally = EventTally()
        /// Event ids (their first 64 bits are `events.seq`), minted in commit order.
        var eventIDs = TimeOrderedIDs()
        /// The webhooks whose cursors this process made sure of (ensureCursors).
        var cursorsReadyFor: [WebhookSubscription] = []
        /// Response ids, minted on the writer thread in commit order.
        var ids = TimeOrderedIDs()
        /// When this store last wrote each credential's last_used_at.
        var credentialTouched: [String: Int64] = [:]
        /// Tokens present in unregistered_tokens or token_pacing. Only this process inserts
        /// there (relayctl only deletes), so a token outside the set needs no lookup.
        var watchedTokens: Set<String> = []
        /// Token scans behind 410 cutoffs (SQLiteOutboxStore+TokenScan.swift).
        let scans = TokenScans()
        /// For jobs the writer queues itself (the scan's next step); set once before it starts.
        weak var writer: GroupCommitWriter?
        var clock: any RelayClock = SystemRelayClock()
        /// The event settings read at this batch's BEGIN.
        var events: EventStoreSettings { batch.events }
        /// Copies the WAL into the database file between batches; set once before the writer starts.
        var checkpointer: SQLiteCheckpointer?

        // MARK: GroupCommitObserver (the writer thread, in this order per batch)

        func batchWillBegin() {
            batch.begin(settings: sharedSettings.withLock { $0 }, events: sharedEventSettings.withLock { $0 }, observers: observers.current)
        }

        func batchDidBegin(_ db: SQLiteDatabase) throws { try pending.load(db) }

        func batchWillCommit(_ db: SQLiteDatabase) throws { try pending.store(db, dedupe: dedupe) }

        func batchDidCommit() {
            dedupe.batchCommitted()
            let (taker, told) = (batch.taker, batch.observers)   // before `commit` resets the batch
            observers.committed(batch.commit(tally: tally), taker: taker, to: told)
        }

        /// Nothing is announced: the rows inserted for the taker were never committed.
        /// Cursors made in the batch went with it: the next event's batch makes them again, so
        /// a new webhook's cursor starts before that event, not wherever the sender's first
        /// exchange finds the newest.
        func batchDidRollback() {
            for token in batch.unwatched { watchedTokens.insert(token) }
            for id in batch.touchedCredentials { credentialTouched[id] = nil }
            batch.reset()
            dedupe.batchRolledBack()
            cursorsReadyFor = []
        }

        /// The dedupe merge first, so the checkpoint that may follow copies its pages too.
        func betweenBatches(_ db: SQLiteDatabase) {
            dedupe.maybeMerge(db)
            checkpointer?.betweenBatches(db)
        }
    }
}
