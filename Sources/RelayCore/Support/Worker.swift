// Threads RelayCore owns for blocking work (SQLite reads for GET/readyz/metrics), so event-loop
// threads and Swift's cooperative pool never block.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads

public final class WorkerPool: @unchecked Sendable {
    // @unchecked Sendable: `jobs` and `closed` are only touched under `condition`.
    private let condition = Condition()
    private var jobs: [@Sendable () -> Void] = []
    private var closed = false
    private var threads: [OSThread] = []
    private let group = DispatchGroup()

    public init(name: String, threads count: Int) {
        for i in 0..<max(1, count) {
            group.enter()
            let t = OSThread { [self] in
                self.run()
                self.group.leave()
            }
            t.name = "\(name)-\(i)"
            threads.append(t)
            t.start()
        }
    }

    public func submit(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        if closed {
            condition.unlock()
            job()  // after shutdown, run inline rather than drop a completion
            return
        }
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    /// Runs queued jobs, then joins the threads.
    public func shutdown() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
        group.wait()
    }

    private func run() {
        while true {
            condition.lock()
            while jobs.isEmpty && !closed { condition.wait() }
            if jobs.isEmpty {
                condition.unlock()
                return
            }
            let job = jobs.removeFirst()
            condition.unlock()
            job()
        }
    }
}

