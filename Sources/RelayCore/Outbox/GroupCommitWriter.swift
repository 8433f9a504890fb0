// Group commit: ONE thread owns the SQLite write connection. Callers enqueue jobs; the thread
// takes everything queued (up to `maxBatch`), runs it inside one BEGIN IMMEDIATE ... COMMIT, and
// only after COMMIT returned completes each job. A failed statement or COMMIT fails every job of
// the batch (the ingest layer turns that into 503, never 202).
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

/// What the writer tells its store around each batch, in this order (one protocol, as GRDB's
/// TransactionObserver, instead of optional hooks). Writer thread only.
protocol GroupCommitObserver: AnyObject {
    /// Before BEGIN (per-batch state reset, settings read).
    func batchWillBegin()
    /// Inside the transaction, right after BEGIN and right before COMMIT (state kept in the
    /// database per batch, e.g. the pending-row counter). A throw fails the batch.
    func batchDidBegin(_ db: SQLiteDatabase) throws
    func batchWillCommit(_ db: SQLiteDatabase) throws
    /// After a successful COMMIT, before the jobs' completions.
    func batchDidCommit()
    /// After a batch rolled back (in-memory state derived from it is dropped), before the jobs'
    /// completions.
    func batchDidRollback()
    /// After the batch is over (its completions handed out), the connection outside any
    /// transaction: work that must not delay the batch's answers but only the writer can do
    /// (the WAL checkpoint that lets the next transaction restart it).
    func betweenBatches(_ db: SQLiteDatabase)
}

final class GroupCommitWriter: @unchecked Sendable {
    // @unchecked Sendable: `db`, the held statements and the observer are touched only by the
    // writer thread after `start()`; the job queue is its own lock.

    /// One unit of work in a batch. Subclasses override both methods: `IngestJob` (the hot path:
    /// one object per request, no closures) and `ClosureJob` (everything else).
    class Job {
        /// Runs inside the batch transaction on the writer thread. A throw fails the batch.
        func run(_ db: SQLiteDatabase) throws {}
        /// The batch ended: `error == nil` = committed (with the connection's `synchronous`
        /// durability), otherwise rolled back or never run. Called once, on the writer thread
        /// (or the caller's, for a job refused because the writer is closed).
        func finish(_ error: StoreError?) {}
        /// The writer no longer accepts jobs: called on the caller's thread instead of `run`
        /// and `finish`.
        func refuse(_ error: StoreError) { finish(error) }
        /// Refused (`refuse(.unavailable)`) rather than queued while `maxQueuedJobs` wait:
        /// client work that can be retried. The dispatcher's and operators' jobs always queue.
        var refusedWhenQueueFull: Bool { false }
    }

    private let db: SQLiteDatabase
    private let jobs: JobQueue<Job>
    /// BEGIN IMMEDIATE and COMMIT, prepared once (sqlite3_exec re-parsed both on every batch,
    /// and the connection's statement cache hashes the SQL text on every lookup).
    private var begin: SQLiteStatement?
    private var commit: SQLiteStatement?

    /// Told of each batch's steps (the store's per-batch state); nil: none.
    private let observer: (any GroupCommitObserver)?

    // Read by /metrics from other threads.
    private let batchCounter = Atomic<Int>(0)
    private let jobCounter = Atomic<Int>(0)
    private let transactionMicros = Atomic<Int>(0)
    var batchesCommitted: Int { batchCounter.load(ordering: .relaxed) }
    var jobsCommitted: Int { jobCounter.load(ordering: .relaxed) }
    /// Time spent inside transactions, BEGIN to the end of COMMIT (its fsync included), over
    /// every batch, committed or not: against wall-clock time, how busy the one writer is.
    var transactionTime: Int { transactionMicros.load(ordering: .relaxed) }

    /// Jobs that may wait before `refusedWhenQueueFull` jobs are refused (StoreRules.maxWaitingIngests).
    let maxQueuedJobs: Int

    init(db: SQLiteDatabase, maxBatch: Int = 1024, maxQueuedJobs: Int = StoreRules.maxWaitingIngests, name: String = "relay-sqlite-writer",
         observer: (any GroupCommitObserver)? = nil) {
        self.db = db
        self.observer = observer
        self.maxQueuedJobs = maxQueuedJobs
        // Everything queued (up to maxBatch) goes into one transaction.
        jobs = JobQueue(name: name) { queue in min(queue.count, maxBatch) }
    }

    func start() {
        jobs.start { [self] batch in runBatch(batch) }
    }

    /// Queues a job; it finishes with `.closed` when the writer no longer accepts jobs.
    func enqueue(_ job: Job) {
        if job.refusedWhenQueueFull {
            switch jobs.enqueue(job, limit: maxQueuedJobs) {
            case .queued: break
            case .full: job.refuse(.unavailable("the writer's queue is full (\(maxQueuedJobs) jobs)"))
            case .closed: job.refuse(.closed)
            }
        } else if !jobs.enqueue(job) {
            job.refuse(.closed)
        }
    }

    /// Runs `work` inside the next batch; `completion` runs on the writer thread after COMMIT
    /// (success) or ROLLBACK (failure).
    func enqueue<T>(_ work: @escaping (SQLiteDatabase) throws -> T, completion: @escaping (Result<T, StoreError>) -> Void) {
        enqueue(ClosureJob(work, completion))
    }

    /// Blocking variant for threads the caller owns.
    func perform<T>(_ work: @escaping (SQLiteDatabase) throws -> T) throws -> T {
        let slot = ResultBox<Result<T, StoreError>>()  // written before signal(), read after wait()
        let done = DispatchSemaphore(value: 0)
        enqueue(work) { result in
            slot.value = result
            done.signal()
        }
        done.wait()
        return try slot.value!.get()
    }

    /// Stops accepting jobs, commits what is queued, then stops the thread.
    func close() { jobs.close() }

    private func runBatch(_ batch: [Job]) {
        var failure: StoreError?
        observer?.batchWillBegin()
        let started = monotonicMicros()
        do {
            try db.held(&begin, "BEGIN IMMEDIATE").stepOnce()
            try observer?.batchDidBegin(db)
            for job in batch { try job.run(db) }
            try observer?.batchWillCommit(db)
            try db.held(&commit, "COMMIT").stepOnce()
        } catch {
            failure = (error as? StoreError) ?? .invalid("\(error)")
            if !db.isAutocommit { try? db.execute("ROLLBACK") }
            observer?.batchDidRollback()
        }
        transactionMicros.add(Int(monotonicMicros() - started), ordering: .relaxed)
        if failure == nil {
            batchCounter.add(1, ordering: .relaxed)
            jobCounter.add(batch.count, ordering: .relaxed)
            // The store's step first: the dispatcher gets the batch's rows before the jobs'
            // completions send their 202s, and whoever sees a completion also sees the hand-off.
            observer?.batchDidCommit()
        }
        for job in batch { job.finish(failure) }
        observer?.betweenBatches(db)
    }
}

/// A job made of two closures: for operator actions, the dispatcher's claims and outcome writes
/// and tests. The ingest hot path uses its own subclass instead (no closures, no boxing).
private final class ClosureJob<T>: GroupCommitWriter.Job {
    private let work: (SQLiteDatabase) throws -> T
    private let completion: (Result<T, StoreError>) -> Void
    private var value: T?

    init(_ work: @escaping (SQLiteDatabase) throws -> T, _ completion: @escaping (Result<T, StoreError>) -> Void) {
        self.work = work
        self.completion = completion
    }

    override func run(_ db: SQLiteDatabase) throws { value = try work(db) }

    override func finish(_ error: StoreError?) {
        if let error { completion(.failure(error)) } else if let value { completion(.success(value)) }
        else { completion(.failure(.invalid("job produced no value"))) }
    }
}

/// A mutable slot handed between closures. @unchecked Sendable: every use above orders the write
/// before the read (same thread, or a semaphore signal/wait pair).
final class ResultBox<T>: @unchecked Sendable {
    var value: T?
    init() {}
}
