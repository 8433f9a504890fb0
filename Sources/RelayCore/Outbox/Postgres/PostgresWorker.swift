// One store-owned thread that owns one PostgreSQL connection. libpq's blocking calls run only
// here: callers either enqueue a job and wait on a semaphore (their own thread blocks, never an
// event loop: the OutboxStore contract), or `submit` an item that the thread batches with
// everything else queued (group commit for ingest).
//
// The connection is opened lazily and reopened after it breaks, with jittered exponential
// back-off; while backing off, jobs fail at once with `StoreError.unavailable` (ingest answers
// 503) instead of queueing behind a dead database.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads

final class PostgresWorker<Item>: @unchecked Sendable {
    // @unchecked Sendable: the job queue is its own lock; `connection`,
    // the back-off fields and `lostLogged` only on the worker thread (inside jobs and the batch
    // handler, which run on it).
    private enum Job {
        case call(() -> Void)
        case item(Item)
    }

    let name: String
    private let url: String
    private let logger: RelayLogger?
    private let jobs: JobQueue<Job>

    private var connection_: PostgresConnection?
    private var nextConnectAt: Int64 = 0
    private var backoffMillis: Int64 = 0
    private var lostLogged = false
    /// Runs on the worker thread right after each (re)connect, e.g. `SET` session settings.
    var onConnect: ((PostgresConnection) throws -> Void)?

    static var minBackoffMillis: Int64 { 50 }
    static var maxBackoffMillis: Int64 { 2_000 }

    init(name: String, url: String, logger: RelayLogger?, maxBatch: Int = 1024) {
        self.name = name
        self.url = url
        self.logger = logger
        // One call alone, or the run of items at the head of the queue (up to maxBatch).
        jobs = JobQueue(name: name) { queue in
            guard case .item = queue[0] else { return 1 }
            var n = 1
            while n < queue.count, n < maxBatch, case .item = queue[n] { n += 1 }
            return n
        }
    }

    /// Starts the thread. Nothing touches the database before this. `batchHandler` runs on the
    /// worker thread with consecutive submitted items (at most `maxBatch`).
    func start(batchHandler: @escaping (PostgresWorker<Item>, [Item]) -> Void = { _, _ in }) {
        jobs.start { [self] taken in
            if case .call(let call) = taken[0] { return call() }
            batchHandler(self, taken.compactMap { if case .item(let i) = $0 { i } else { nil } })
        }
    }

    deinit { close() }

    // MARK: connection (worker thread only)

    /// The live connection, (re)connecting if the back-off allows. Worker thread only.
    func connection() throws -> PostgresConnection {
        if let c = connection_, c.isOK { return c }
        if connection_ != nil { dropConnection(reason: "connection broken") }
        let now = monotonicMicros() / 1000
        guard now >= nextConnectAt else {
            throw StoreError.unavailable("PostgreSQL unreachable; reconnecting in \(nextConnectAt - now) ms")
        }
        do {
            let c = try PostgresConnection(url: url, applicationName: "relay-\(name)")
            try onConnect?(c)
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

    // MARK: callers

    /// Runs `body` on the worker thread and waits for it. Blocking: call from a thread you own.
    func perform<T>(_ body: @escaping (PostgresWorker<Item>) throws -> T) throws -> T {
        let slot = ResultBox<Result<T, StoreError>>()  // written before signal(), read after wait()
        let done = DispatchSemaphore(value: 0)
        let accepted = enqueue(.call { [unowned self] in
            do {
                slot.value = .success(try body(self))
            } catch {
                self.noteFailure(error)
                slot.value = .failure((error as? StoreError) ?? .invalid("\(error)"))
            }
            done.signal()
        })
        guard accepted else { throw StoreError.closed }
        done.wait()
        return try slot.value!.get()
    }

    /// Runs `body` on the worker thread without waiting for it; errors are dropped (use for
    /// best-effort work such as recounting the outbox bound).
    func enqueueDetached(_ body: @escaping (PostgresWorker<Item>) throws -> Void) {
        _ = enqueue(.call { [unowned self] in
            do { try body(self) } catch { self.noteFailure(error) }
        })
    }

    /// Queues an item for the batch handler. Returns false when the worker is closed.
    func submit(_ item: Item) -> Bool { enqueue(.item(item)) }

    private func enqueue(_ job: Job) -> Bool { jobs.enqueue(job) }

    /// Stops accepting jobs, runs what is queued, joins the thread and closes the connection.
    func close() {
        jobs.close()
        connection_ = nil
    }
}
