// Store-owned threads, each owning one PostgreSQL connection. libpq's blocking calls run only
// here: callers either enqueue a job and wait on a semaphore (their own thread blocks, never an
// event loop: the OutboxStore contract), or `submit` an item that a thread batches with
// everything else queued (group commit for ingest). A worker with several connections runs as
// many threads on one queue, so several batches are in flight at once.
//
// Each connection (PostgresLink) is opened lazily and reopened after it breaks, with jittered
// exponential back-off; while backing off, jobs fail at once with `StoreError.unavailable`
// (ingest answers 503) instead of queueing behind a dead database.
//
// Every job has a deadline (PostgresTimeouts.requestMillis after it was queued): a job taken
// after its deadline fails without touching the database, and a connection whose answer does
// not come by then is abandoned (closed, then reconnected with back-off), so a stalled server
// costs a caller at most the deadline, never a hang.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

/// One connection and its reconnect state. Used by one thread at a time (the worker hands each
/// link to exactly one of its threads per job or batch).
final class PostgresLink: @unchecked Sendable {
    // @unchecked Sendable: every field is only touched by the thread that holds the link,
    // and a link is handed from thread to thread through the worker's Mutex.
    let name: String
    private let url: String
    private let logger: RelayLogger?
    private let timeouts: PostgresTimeouts
    /// Runs on each new connection before it is used (the store's schema-version check).
    var onConnect: ((PostgresConnection) throws -> Void)?
    /// The current job's deadline (monotonic ms; nil: none), set by whoever hands the link a job.
    var deadline: Int64?
    private var connection_: PostgresConnection?
    private var nextConnectAt: Int64 = 0
    private var backoffMillis: Int64 = 0
    private var lostLogged = false

    static var minBackoffMillis: Int64 { 50 }
    static var maxBackoffMillis: Int64 { 2_000 }

    init(name: String, url: String, logger: RelayLogger?, timeouts: PostgresTimeouts = PostgresTimeouts()) {
        self.name = name
        self.url = url
        self.logger = logger
        self.timeouts = timeouts
    }

    /// The live connection, (re)connecting if the back-off allows, with the job's deadline.
    func connection() throws -> PostgresConnection {
        let now = monotonicMillis()
        if let deadline, now >= deadline {
            throw StoreError.unavailable("PostgreSQL did not take the call within its deadline (it waited behind others)")
        }
        if let c = connection_, c.stillAlive() {
            c.deadline = deadline
            return c
        }
        if connection_ != nil { dropConnection(reason: "connection broken") }
        guard now >= nextConnectAt else {
            throw StoreError.unavailable("PostgreSQL unreachable; reconnecting in \(nextConnectAt - now) ms")
        }
        do {
            let c = try PostgresConnection(url: url, applicationName: "relay-\(name)", timeouts: timeouts, deadline: deadline)
            try onConnect?(c)
            c.statementsSent = 0
            connection_ = c
            if lostLogged { logger?.info("database connection restored", ["connection": name]) }
            lostLogged = false
            backoffMillis = 0
            return c
        } catch {
            connection_ = nil
            backoffMillis = min(Self.maxBackoffMillis, max(Self.minBackoffMillis, backoffMillis * 2))
            // Full jitter keeps several nodes from reconnecting in lock-step after a restart.
            nextConnectAt = now + Int64.random(in: (backoffMillis / 2)...backoffMillis)
            if !lostLogged {
                logger?.error("database unreachable; retrying with back-off", ["connection": name, "error": "\(error)"])
                lostLogged = true
            }
            throw (error as? StoreError) ?? .unavailable("\(error)")
        }
    }

    /// The open connection, if there is one (nothing is connected for it).
    func currentConnection() -> PostgresConnection? {
        guard let c = connection_, c.isOK else { return nil }
        c.deadline = deadline
        return c
    }

    /// After a failed job: forget a connection that libpq reports broken, that missed its
    /// deadline, or that an error says is gone or unfit (PGState.needsNewConnection: a standby,
    /// stale prepared statements), so the next job reconnects.
    func noteFailure(_ error: Error) {
        guard let c = connection_ else { return }
        var gone = !c.isOK
        if case .postgres(let state, _, _)? = error as? StoreError, PGState.needsNewConnection(state) { gone = true }
        if case .unavailable? = error as? StoreError { gone = true }
        guard gone else { return }
        let timedOut = c.timedOut
        dropConnection(reason: "\(error)")
        // A server that stalls would take every immediate reconnect's deadline too: back off.
        if timedOut { backOff(now: monotonicMillis()) }
    }

    private func backOff(now: Int64) {
        backoffMillis = min(Self.maxBackoffMillis, max(Self.minBackoffMillis, backoffMillis * 2))
        nextConnectAt = now + Int64.random(in: (backoffMillis / 2)...backoffMillis)
    }

    private func dropConnection(reason: String) {
        connection_ = nil
        if !lostLogged {
            logger?.error("database connection lost; reconnecting with back-off", ["connection": name, "error": reason])
            lostLogged = true
        }
        // The first reconnect is immediate: a restarted server may already accept connections.
        nextConnectAt = 0
    }

    /// Runs `body` with the connection. A connection that sat idle and died (the server
    /// restarted, an admin killed it) is seen before anything is sent (`stillAlive`). If it dies
    /// in the instant between, the first statement fails with the connection gone and its
    /// answer lost: only an `idempotent` body (reads; a transaction, whose first statement is
    /// BEGIN) then runs once more on a fresh connection. A single autocommit write is not
    /// re-run: it may have committed, so the caller gets the error (outcome unknown), never a
    /// second execution. A deadline is never retried.
    func withConnection<T>(idempotent: Bool, _ body: (PostgresConnection) throws -> T) throws -> T {
        let c = try connection()
        let reused = c.statementsSent > 0
        c.statementsSent = 0
        do {
            return try body(c)
        } catch {
            guard Self.mayRunAgain(idempotent: idempotent, reused: reused, statementsSent: c.statementsSent,
                                   connectionOK: c.isOK, timedOut: c.timedOut) else { throw error }
            noteFailure(error)
            let fresh = try connection()
            fresh.statementsSent = 0
            return try body(fresh)
        }
    }

    /// withConnection's rule, on its own for tests: a body runs again only when it is
    /// idempotent, its connection was reused (it may have died idle), only its first round trip
    /// was sent, the connection is gone, and no deadline passed.
    static func mayRunAgain(idempotent: Bool, reused: Bool, statementsSent: Int, connectionOK: Bool, timedOut: Bool) -> Bool {
        idempotent && reused && statementsSent <= 1 && !connectionOK && !timedOut
    }

    /// Runs `body` in BEGIN ... COMMIT on the worker thread, rolling back on error. Deadlocks
    /// and serialization failures (possible between nodes) are retried a few times.
    func transaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        var attempt = 0
        while true {
            do {
                return try withConnection(idempotent: true) { c in try self.transactionOnce(c, body) }
            } catch {
                if case .postgres(let state, _, _)? = error as? StoreError, PGState.isRetryable(state), attempt < 3 {
                    attempt += 1
                    continue
                }
                noteFailure(error)
                throw error
            }
        }
    }

    private func transactionOnce<T>(_ c: PostgresConnection, _ body: (PostgresConnection) throws -> T) throws -> T {
        c.afterCommit = []
        do {
            try c.execute("BEGIN")
            let value = try body(c)
            try c.execute("COMMIT")
            let committed = c.afterCommit
            c.afterCommit = []
            for action in committed { action() }
            return value
        } catch {
            c.afterCommit = []
            if c.isOK && !c.isIdle { try? c.execute("ROLLBACK") }
            throw error
        }
    }

    func close() { connection_ = nil }
}

final class PostgresWorker<Item>: @unchecked Sendable {
    // @unchecked Sendable: the job queue is its own lock; idle links are kept under a Mutex and
    // each one is used by a single thread between taking it and putting it back.
    enum Job {
        /// `deadline`: monotonic ms (nil: none).
        case call(deadline: Int64?, (PostgresLink) -> Void)
        case item(Item)
    }

    /// How long a call may take, queueing included.
    enum Wait: Sendable {
        /// PostgresTimeouts.requestMillis.
        case standard
        /// Migrations at start: as long as they take.
        case unbounded
        case millis(Int64)
    }

    let name: String
    private let jobs: JobQueue<Job>
    private let links: [PostgresLink]
    private let idle: Mutex<[Int]>
    let timeouts: PostgresTimeouts

    /// `connections` threads serve one queue, each with its own connection: with more than
    /// one, a batch is taken while earlier ones still wait for their commits.
    /// Items that may wait for the batch handler before `submit` answers `.full`
    /// (StoreRules.maxWaitingIngests); calls are not counted against it.
    let maxQueuedItems: Int

    init(name: String, url: String, logger: RelayLogger?, maxBatch: Int = 1024, connections: Int = 1,
         maxQueuedItems: Int = StoreRules.maxWaitingIngests, timeouts: PostgresTimeouts = PostgresTimeouts()) {
        self.name = name
        self.maxQueuedItems = maxQueuedItems
        self.timeouts = timeouts
        let n = max(1, connections)
        links = (0..<n).map { PostgresLink(name: n == 1 ? name : "\(name)-\($0)", url: url, logger: logger, timeouts: timeouts) }
        idle = Mutex(Array(0..<n))
        // One call alone, or the run of items at the head of the queue (up to maxBatch).
        jobs = JobQueue(name: name, threads: n) { queue in
            guard case .item = queue[0] else { return 1 }
            var n = 1
            while n < queue.count, n < maxBatch, case .item = queue[n] { n += 1 }
            return n
        }
    }

    /// Runs on every new connection of this worker before its first job (before `start`).
    func onConnect(_ check: @escaping (PostgresConnection) throws -> Void) {
        for l in links { l.onConnect = check }
    }

    /// Starts the threads. Nothing touches the database before this. `batchHandler` runs on a
    /// worker thread with consecutive submitted items (at most `maxBatch`) and that thread's
    /// link; it sets the link's deadline itself.
    func start(batchHandler: @escaping (PostgresLink, [Item]) -> Void = { _, _ in }) {
        jobs.start { [self] taken in
            // As many threads as links: one is always idle when a thread gets here.
            let i = idle.withLock { $0.removeLast() }
            defer { idle.withLock { $0.append(i) } }
            if case .call(let deadline, let call) = taken[0] {
                links[i].deadline = deadline
                return call(links[i])
            }
            batchHandler(links[i], taken.compactMap { if case .item(let item) = $0 { item } else { nil } })
        }
    }

    deinit { close() }

    func deadline(_ wait: Wait) -> Int64? {
        switch wait {
        case .standard: return monotonicMillis() + timeouts.requestMillis
        case .unbounded: return nil
        case .millis(let ms): return monotonicMillis() + ms
        }
    }

    // MARK: callers

    /// Runs `body` on the worker thread and waits for it. Blocking: call from a thread you own.
    /// Past its deadline the call fails with StoreError.unavailable (the worker abandons the
    /// connection; should the thread itself be stuck, the caller stops waiting a second later).
    func perform<T>(_ wait: Wait = .standard, _ body: @escaping (PostgresLink) throws -> T) throws -> T {
        let slot = ResultBox<Result<T, StoreError>>()  // written before signal(), read after wait()
        let done = DispatchSemaphore(value: 0)
        let deadline = deadline(wait)
        let accepted = enqueue(.call(deadline: deadline) { link in
            do {
                slot.value = .success(try body(link))
            } catch {
                link.noteFailure(error)
                slot.value = .failure((error as? StoreError) ?? .invalid("\(error)"))
            }
            done.signal()
        })
        guard accepted else { throw StoreError.closed }
        if let deadline {
            let left = max(0, deadline - monotonicMillis()) + 1_000
            guard done.wait(timeout: .now() + .milliseconds(Int(left))) == .success else {
                throw StoreError.unavailable("PostgreSQL did not answer within \(timeouts.requestMillis) ms")
            }
        } else {
            done.wait()
        }
        return try slot.value!.get()
    }

    /// Runs `body` on the worker thread without waiting for it; errors are dropped (use for
    /// best-effort work such as recounting the outbox bound). false: the worker is closed and
    /// `body` will never run. The body fails fast once its deadline has passed.
    @discardableResult
    func enqueueDetached(_ wait: Wait = .standard, _ body: @escaping (PostgresLink) throws -> Void) -> Bool {
        enqueue(.call(deadline: deadline(wait)) { link in
            do { try body(link) } catch { link.noteFailure(error) }
        })
    }

    /// Queues an item for the batch handler unless `maxQueuedItems` jobs already wait (`.full`)
    /// or the worker is closed (`.closed`).
    func submit(_ item: Item) -> JobQueue<Job>.EnqueueResult { jobs.enqueue(.item(item), limit: maxQueuedItems) }

    private func enqueue(_ job: Job) -> Bool { jobs.enqueue(job) }

    /// Stops accepting jobs, runs what is queued, joins the threads and closes the connections.
    func close() {
        jobs.close()
        for l in links { l.close() }
    }
}
