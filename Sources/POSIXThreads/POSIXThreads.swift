// Threads and condition variables on pthreads, for modules that must not link Foundation
// (Foundation's Thread/NSCondition pull in libFoundation and ICU: ~7 MB of relay-server's RSS).
// Only what the relay's own long-lived threads need: start a named thread, wait on a condition
// with an optional wall-clock deadline.
import Glibc
import FoundationEssentials

/// A detached, named OS thread running `body` once. Start it with `start()`.
///
/// `@unchecked Sendable`: `body` and `name` are set before `start()` (which hands them to the
/// new thread through pthread_create's memory barrier) and never written afterwards.
public final class OSThread: @unchecked Sendable {
    private let body: @Sendable () -> Void
    /// Shown by `top -H` / `ps -L` (Linux truncates to 15 bytes). Set before `start()`.
    public var name: String?

    public init(_ body: @escaping @Sendable () -> Void) {
        self.body = body
    }

    /// Starts the thread (detached: callers that must wait for it signal a semaphore at the end
    /// of `body`, as they did with Foundation's Thread). Traps if the OS refuses a thread,
    /// which only happens when the process is out of memory or over its thread limit.
    public func start() {
        do { _ = try startThread(name: name, detached: true, body) } catch { fatalError("\(error)") }
    }
}

/// pthread_create refused a thread (EAGAIN: out of memory or over the thread limit).
public struct ThreadStartError: Error, CustomStringConvertible {
    public let code: Int32
    public var description: String { "pthread_create failed: \(String(cString: strerror(code)))" }
}

/// Runs `body` on a new OS thread named `name`: the one place that calls pthread_create.
/// A joinable thread (the default) must be joined with `pthread_join` on the returned id.
@discardableResult
public func startThread(name: String?, detached: Bool = false, _ body: @escaping () -> Void) throws(ThreadStartError) -> pthread_t {
    let box = Unmanaged.passRetained(ThreadStart(name: name, body: body)).toOpaque()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    if detached { pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED)) }
    var tid = pthread_t()
    let rc = pthread_create(&tid, &attributes, { raw in
        let start = Unmanaged<ThreadStart>.fromOpaque(raw!).takeRetainedValue()
        if let name = start.name { setCurrentThreadName(name) }
        start.body()
        return nil
    }, box)
    guard rc == 0 else {
        Unmanaged<ThreadStart>.fromOpaque(box).release()
        throw ThreadStartError(code: rc)
    }
    return tid
}

/// What a new thread runs, handed over through pthread_create's argument.
private final class ThreadStart {
    let name: String?
    let body: () -> Void
    init(name: String?, body: @escaping () -> Void) {
        self.name = name
        self.body = body
    }
}

/// pthread_setname_np is a GNU extension the Glibc module does not export; the kernel's
/// per-thread `comm` file is the same thing without it (Linux >= 3.17). Best effort.
private func setCurrentThreadName(_ name: String) {
    let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else { return }
    let bytes = Array(name.utf8.prefix(15))
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
}

/// A mutex with one condition variable: the subset of NSCondition the relay uses.
///
/// `@unchecked Sendable`: the pthread objects live in heap memory allocated once, never moved,
/// and are only touched through pthread calls, which are thread-safe by definition.
public final class Condition: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let cond: UnsafeMutablePointer<pthread_cond_t>

    public init() {
        mutex = .allocate(capacity: 1)
        cond = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        // Deadlines are given as wall-clock Dates (as with NSCondition), so CLOCK_REALTIME.
        pthread_condattr_setclock(&attributes, CLOCK_REALTIME)
        pthread_cond_init(cond, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }
    public func signal() { pthread_cond_signal(cond) }
    public func broadcast() { pthread_cond_broadcast(cond) }

    /// Waits (lock held) until signalled; spurious wake-ups are possible, so loop on a predicate.
    public func wait() { pthread_cond_wait(cond, mutex) }

    /// Waits (lock held) until signalled or `deadline`; false when the deadline passed.
    @discardableResult
    public func wait(until deadline: Date) -> Bool {
        let t = max(0, deadline.timeIntervalSince1970)
        var ts = timespec(tv_sec: Int(t), tv_nsec: Int((t - t.rounded(.down)) * 1_000_000_000))
        return pthread_cond_timedwait(cond, mutex, &ts) == 0
    }

    public func withLock<R>(_ body: () throws -> R) rethrows -> R {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// A closable FIFO of jobs served by threads of its own: the one mechanism behind the relay's
/// group-commit writer, its PostgreSQL workers and its reader pool. Each thread waits for work,
/// lets `take` choose how many jobs from the head of the queue go together (under the lock),
/// and runs `serve` on them without the lock. `close()` refuses new jobs, lets the threads
/// serve everything already queued, and returns when they have exited.
///
/// `@unchecked Sendable`: `queue`, `closed`, `running` and `serve` are only touched under
/// `condition` (serve is read there and called after unlocking).
public final class JobQueue<Job>: @unchecked Sendable {
    private let condition = Condition()
    private var queue: [Job] = []
    private var closed = false
    private var running = 0
    private var serve: (([Job]) -> Void)?
    private let take: ([Job]) -> Int
    private let name: String
    private let threadCount: Int

    /// `take` gets the (non-empty) queue and returns how many head jobs one `serve` call gets,
    /// 1...queue.count; the default serves jobs one at a time.
    public init(name: String, threads: Int = 1, take: @escaping ([Job]) -> Int = { _ in 1 }) {
        self.name = name
        self.threadCount = max(1, threads)
        self.take = take
    }

    /// Starts the threads ("name" for one thread, "name-i" for several). `serve` is kept until
    /// the threads have exited, then released (it may capture the queue's owner).
    public func start(_ serve: @escaping ([Job]) -> Void) {
        condition.withLock {
            self.serve = serve
            running = threadCount
        }
        for i in 0..<threadCount {
            let t = OSThread { [self] in loop() }
            t.name = threadCount == 1 ? name : "\(name)-\(i)"
            t.start()
        }
    }

    /// Queues `job`; false (job not queued) once `close()` has been called.
    @discardableResult
    public func enqueue(_ job: Job) -> Bool {
        condition.withLock {
            guard !closed else { return false }
            queue.append(job)
            condition.signal()
            return true
        }
    }

    /// Queues `job` unless `limit` jobs are already waiting: `.full` then (and `.closed` once
    /// `close()` has been called). For callers that refuse work rather than queue without end.
    public func enqueue(_ job: Job, limit: Int) -> EnqueueResult {
        condition.withLock {
            guard !closed else { return .closed }
            guard queue.count < limit else { return .full }
            queue.append(job)
            condition.signal()
            return .queued
        }
    }

    public enum EnqueueResult: Sendable { case queued, full, closed }

    /// Refuses new jobs, waits until the threads have served the queue and exited (at once if
    /// they were never started). Safe to call more than once.
    public func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        while running > 0 { condition.wait() }
        condition.unlock()
    }

    private func loop() {
        while true {
            condition.lock()
            while queue.isEmpty && !closed { condition.wait() }
            guard !queue.isEmpty, let serve else {
                running -= 1
                if running == 0 { self.serve = nil }
                condition.broadcast()
                condition.unlock()
                return
            }
            let n = min(max(1, take(queue)), queue.count)
            let jobs: [Job]
            if n == queue.count {
                jobs = queue
                queue = []
            } else {
                jobs = Array(queue.prefix(n))
                queue.removeFirst(n)
            }
            condition.unlock()
            serve(jobs)
        }
    }
}
