// Threads RelayCore owns for blocking work (SQLite reads for GET/readyz/metrics), so event-loop
// threads and Swift's cooperative pool never block.
import POSIXThreads

public final class WorkerPool: Sendable {
    private let jobs: JobQueue<@Sendable () -> Void>

    public init(name: String, threads count: Int) {
        jobs = JobQueue(name: name, threads: count)
        jobs.start { taken in for job in taken { job() } }
    }

    public func submit(_ job: @escaping @Sendable () -> Void) {
        // After shutdown, run inline rather than drop a completion.
        if !jobs.enqueue(job) { job() }
    }

    /// Runs queued jobs, then joins the threads.
    public func shutdown() { jobs.close() }
}
