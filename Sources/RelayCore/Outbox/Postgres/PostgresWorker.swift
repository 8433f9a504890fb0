// Store-owned threads, each owning one PostgreSQL connection. libpq's blocking calls run only
// here: callers either enqueue a job and wait on a semaphore (their own thread blocks, never an
// event loop: the OutboxStore contract), or `submit` an item that a thread batches with
// everything else queued (group commit for ingest). A worker with several connections runs as
// many threads on one queue, so several batches are in flight at once.
//
// Each connection (PostgresLink) is opened lazily and reopened after it breaks, with jittered
// exponential back-off; while backing off, jobs fail at once with `StoreError.unavailable`
// (ingest answers 503) instead of queueing behind a dead database.
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
    private var connection_: PostgresConnection?
    private var nextConnectAt: Int64 = 0
    private var backoffMillis: Int64 = 0
    private var lostLogged = false

    static var minBackoffMillis: Int64 { 50 }
    static var maxBackoffMillis: Int64 { 2_000 }

    init(name: String, url: String, logger: RelayLogger?) {
        self.name = name
        self.url = url
        self.logger = logger
    }

    /// The live connection, (re)connecting if the back-off allows.
    func connection() throws -> PostgresConnection {
        if let c = connection_, c.isOK { return c }
        if connection_ != nil { dropConnection(reason: "connection broken") }
        let now = monotonicMicros() / 1000
        guard now >= nextConnectAt else {
            throw StoreError.unavailable("PostgreSQL unreachable; reconnecting in \(nextConnectAt - now) ms")
        }
        do {
            let c = try PostgresConnection(url: url, applicationName: "relay-\(name)")
            connection_ = c
            if lostLogged { logger?.info("database connection restored", ["connection": name]) }
            lostLogged = false
            backoffMillis = 0
            return c
        } catch {
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

    /// After a failed job: forget a connection that libpq reports broken (or that an error says
    /// is gone), so the next job reconnects.
    func noteFailure(_ error: Error) {
        guard let c = connection_ else { return }
        var gone = !c.isOK
        if case .postgres(let state, _, _)? = error as? StoreError, PGState.isConnectionLoss(state) { gone = true }
        if case .unavailable? = error as? StoreError { gone = true }
        if gone { dropConnection(reason: "\(error)") }
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

    /// Runs `body` with the connection. A connection that sat idle may have died unnoticed (the
    /// server restarted, an admin killed it): when the very first statement of `body` finds it
    /// gone, nothing was done, so `body` runs once more on a fresh connection.
    func withConnection<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        let c = try connection()
        let reused = c.statementsSent > 0
        c.statementsSent = 0
        do {
            return try body(c)
        } catch {
            guard reused, c.statementsSent <= 1, !c.isOK else { throw error }
            noteFailure(error)
            let fresh = try connection()
            fresh.statementsSent = 0
            return try body(fresh)
        }
    }

    /// Runs `body` in BEGIN ... COMMIT on the worker thread, rolling back on error. Deadlocks
    /// and serialization failures (possible between nodes) are retried a few times.
    func transaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        var attempt = 0
        while true {
            do {
                return try withConnection { c in try self.transactionOnce(c, body) }
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
        do {
            try c.execute("BEGIN")
            let value = try body(c)
            try c.execute("COMMIT")
            return value
        } catch {
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
        case call((PostgresLink) -> Void)
        case item(Item)
    }

    let name: String
    private let jobs: JobQueue<Job>
    private let links: [PostgresLink]
    private let idle: Mutex<[Int]>

    /// `connections` threads serve one queue, each with its own connection: with more than
    /// one, a batch is taken while earlier ones still wait for their commits.
    /// Items that may wait for the batch handler before `submit` answers `.full`
    /// (StoreRules.maxWaitingIngests); calls are not counted against it.
    let maxQueuedItems: Int

    init(name: String, url: String, logger: RelayLogger?, maxBatch: Int = 1024, connections: Int = 1,
         maxQueuedItems: Int = StoreRules.maxWaitingIngests) {
        self.name = name
        self.maxQueuedItems = maxQueuedItems
        let n = max(1, connections)
        links = (0..<n).map { PostgresLink(name: n == 1 ? name : "\(name)-\($0)", url: url, logger: logger) }
        idle = Mutex(Array(0..<n))
        // One call alone, or the run of items at the head of the queue (up to maxBatch).
        jobs = JobQueue(name: name, threads: n) { queue in
            guard case .item = queue[0] else { return 1 }
            var n = 1
            while n < queue.count, n < maxBatch, case .item = queue[n] { n += 1 }
            return n
        }
    }

    /// Starts the threads. Nothing touches the database before this. `batchHandler` runs on a
    /// worker thread with consecutive submitted items (at most `maxBatch`) and that thread's link.
    func start(batchHandler: @escaping (PostgresLink, [Item]) -> Void = { _, _ in }) {
        jobs.start { [self] taken in
            // As many threads as links: one is always idle when a thread gets here.
            let i = idle.withLock { $0.removeLast() }
            defer { idle.withLock { $0.append(i) } }
            if case .call(let call) = taken[0] { return call(links[i]) }
            batchHandler(links[i], taken.compactMap { if case .item(let item) = $0 { item } else { nil } })
        }
    }

    deinit { close() }

    // MARK: callers

    /// Runs `body` on the worker thread and waits for it. Blocking: call from a thread you own.
    func perform<T>(_ body: @escaping (PostgresLink) throws -> T) throws -> T {
        let slot = ResultBox<Result<T, StoreError>>()  // written before signal(), read after wait()
        let done = DispatchSemaphore(value: 0)
        let accepted = enqueue(.call { link in
            do {
                slot.value = .success(try body(link))
            } catch {
                link.noteFailure(error)
                slot.value = .failure((error as? StoreError) ?? .invalid("\(error)"))
            }
            done.signal()
        })
        guard accepted else { throw StoreError.closed }
        done.wait()
        return try slot.value!.get()
    }

    /// Runs `body` on the worker thread without waiting for it; errors are dropped (use for
    /// best-effort work such as recounting the outbox bound). false: the worker is closed and
    /// `body` will never run.
    @discardableResult
    func enqueueDetached(_ body: @escaping (PostgresLink) throws -> Void) -> Bool {
        enqueue(.call { link in
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
