// Threads RelayCore owns for blocking work (SQLite reads for GET/readyz/metrics), so event-loop
// threads and Swift's cooperative pool never block.
import POSIXThreads

public final class WorkerPool: Sendable {
    private let jobs: JobQueue<@Sendable () -> Void>
    /// Jobs submitted with `submit(_:whenFull:)` are refused while this many wait: client
    /// reads are cheap to send and each holds a request, so a flood of them must not queue
    /// without end (the HTTP layer bounds them per connection, not in total).
    public let maxQueued: Int

    public init(name: String, threads count: Int, maxQueued: Int = 1024) {
        jobs = JobQueue(name: name, threads: count)
        self.maxQueued = maxQueued
        jobs.start { taken in for job in taken { job() } }
    }

    /// Queues `job` unless `maxQueued` jobs wait; then runs `whenFull` instead, on the
    /// caller's thread (a 503 for a client). After close `job` runs inline, as `submit`.
    public func submit(_ job: @escaping @Sendable () -> Void, whenFull: () -> Void) {
        switch jobs.enqueue(job, limit: maxQueued) {
        case .queued: break
        case .full: whenFull()
        case .closed: job()
        }
    }

    public func submit(_ job: @escaping @Sendable () -> Void) {
        // After close, run inline rather than drop a completion.
        if !jobs.enqueue(job) { job() }
    }

    /// Refuses new jobs (later ones run inline), runs the queued ones, then joins the threads.
    public func close() { jobs.close() }
}
