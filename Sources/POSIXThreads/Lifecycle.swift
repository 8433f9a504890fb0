// The one start/stop contract of the long-running parts (servers, the dispatcher, background
// threads), so an owner keeps them in a list, starts it in order and stops it in reverse.

/// A part that runs on threads of its own between `start()` and `stop(grace:)`.
public protocol Lifecycle: Sendable {
    /// Starts the part's threads; returns once it serves (a server: once it listens).
    func start() throws
    /// Stops taking new work, gives work in progress up to `grace`, ends what is left and
    /// returns once the part's threads have exited. Blocking; safe to call more than once,
    /// and on a part that never started.
    func stop(grace: Duration)
}

/// Starts parts in order and stops them in reverse: a part stops only after every part that
/// started after it (and may use it) has stopped.
///
/// `@unchecked Sendable`: `parts` is only touched under `lock`; stop runs the parts' stops
/// outside it, after taking the list.
public final class LifecycleList: @unchecked Sendable {
    private let lock = Condition()
    private var parts: [(part: any Lifecycle, grace: Duration)] = []

    public init() {}

    /// Starts `part` and appends it to the list; if `start()` throws, it is not appended.
    public func start(_ part: any Lifecycle, grace: Duration = .zero) throws {
        try part.start()
        lock.withLock { parts.append((part, grace)) }
    }

    /// Appends a part that is already running (its threads started when it was made).
    public func adopt(_ part: any Lifecycle, grace: Duration = .zero) {
        lock.withLock { parts.append((part, grace)) }
    }

    /// Stops every part, the last started first, each with the grace it was added with.
    public func stopAll() {
        let running = lock.withLock {
            let p = parts
            parts = []
            return p
        }
        for (part, grace) in running.reversed() { part.stop(grace: grace) }
    }
}

/// A part with nothing to start whose stop is a closure (a store's close, a worker pool's).
public struct StopAction: Lifecycle {
    private let action: @Sendable (Duration) -> Void
    public init(_ action: @escaping @Sendable (Duration) -> Void) { self.action = action }
    public func start() {}
    public func stop(grace: Duration) { action(grace) }
}
