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
        let box = Unmanaged.passRetained(self).toOpaque()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        var tid = pthread_t()
        let rc = pthread_create(&tid, &attributes, { raw in
            let thread = Unmanaged<OSThread>.fromOpaque(raw!).takeRetainedValue()
            if let name = thread.name { setCurrentThreadName(name) }
            thread.body()
            return nil
        }, box)
        if rc != 0 {
            Unmanaged<OSThread>.fromOpaque(box).release()
            fatalError("pthread_create failed: \(String(cString: strerror(rc)))")
        }
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
