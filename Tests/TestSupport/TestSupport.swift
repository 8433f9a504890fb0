// Helpers every test target needs and none can import from another test target: a seeded PRNG
// (failing inputs replay) and loopback sockets. Depends on nothing but Glibc and POSIXThreads
// (no Foundation), so any test target can use it without pulling in another module.
import Glibc
import POSIXThreads
import Synchronization

/// SplitMix64: small and seedable, so a failing seed can be replayed.
public struct SeededGenerator: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public init(state: UInt64) { self.state = state }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

public struct LoopbackSocketError: Error, CustomStringConvertible {
    public let description: String
}

/// A TCP socket bound to 127.0.0.1 on an ephemeral port and listening (nothing accepts unless
/// the owner does, or `acceptInBackground` starts a thread that does). Closed by `close()` or on
/// deinit.
///
/// The descriptor is closed only once no thread of this listener can call accept(2) on it any
/// more: a test server whose accept thread went round once more after the close accepted on
/// whatever the kernel had given the number to meanwhile (another test's server listener) and
/// closed those connections.
public final class LoopbackListener: Sendable {
    public let fd: Int32
    public let port: Int
    private struct State {
        var closed = false
        var acceptThread: pthread_t?
    }
    /// Shared with the accept thread, which must not keep the listener itself alive.
    private final class Shared: Sendable {
        let state = Mutex(State())
    }
    private let shared = Shared()

    /// `port` 0: an ephemeral one. A given port (one found free earlier) is bound with
    /// SO_REUSEADDR, for tests where nothing listens on it at first.
    public init(port: Int = 0, backlog: Int32 = 16) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw LoopbackSocketError(description: "socket: errno \(errno)") }
        var one: Int32 = 1
        if port != 0 { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sp -> Bool in
                bind(fd, sp, len) == 0 && listen(fd, backlog) == 0 && getsockname(fd, sp, &len) == 0
            }
        }
        guard ok else {
            let e = errno
            Glibc.close(fd)
            throw LoopbackSocketError(description: "cannot listen on 127.0.0.1: errno \(e)")
        }
        self.fd = fd
        self.port = Int(UInt16(bigEndian: addr.sin_port))
    }

    /// Accepts on a thread of its own until `close()`, handing each connection to `handle` on
    /// that thread (which then owns the descriptor). `close()` waits for `handle` to return,
    /// so anything that may block for long belongs on a thread `handle` starts. At most once.
    public func acceptInBackground(_ handle: @escaping @Sendable (Int32) -> Void) {
        let fd = fd
        let shared = shared
        shared.state.withLock { s in
            precondition(s.acceptThread == nil, "one accept thread per listener")
            guard !s.closed else { return }
            // Started under the lock: close() either sees the thread or the thread sees `closed`.
            do {
                s.acceptThread = try startThread(name: "test-accept") {
                    while !shared.state.withLock({ $0.closed }) {
                        let c = accept(fd, nil, nil)
                        if c >= 0 { handle(c); continue }
                        if errno == EINTR || errno == ECONNABORTED { continue }
                        return   // EINVAL once close() shut the listener down
                    }
                }
            } catch {
                fatalError("\(error)")
            }
        }
    }

    /// Shuts the listener down (an accept in progress returns EINVAL), waits for the accept
    /// thread to leave, then closes the descriptor. Idempotent; callable from `handle`.
    public func close() {
        let (first, thread) = shared.state.withLock { s -> (Bool, pthread_t?) in
            defer { s.closed = true; s.acceptThread = nil }
            return (!s.closed, s.acceptThread)
        }
        guard first else { return }
        shutdown(fd, Int32(SHUT_RDWR))
        if let thread {
            // From `handle` on the accept thread itself: it checks `closed` before accepting again.
            if pthread_equal(thread, pthread_self()) != 0 { pthread_detach(thread) } else { pthread_join(thread, nil) }
        }
        Glibc.close(fd)
    }

    deinit { close() }
}

/// The accepted connections of a test server whose serving threads close their own
/// descriptors. A descriptor is shut down only while registered, and closed only after it left
/// the set, both under one lock: `shutdownAll()` cannot reach a number a serving thread has
/// closed and the kernel has given to another test meanwhile (the webhook receiver's did, and
/// a concurrent test's client read EOF instead of its response).
public final class ServedConnections: Sendable {
    private struct State {
        var open: Set<Int32> = []
        var shut = false
    }
    private let state = Mutex(State())

    public init() {}

    /// Registers `fd`; false once `shutdownAll()` ran, and `fd` is then closed here.
    public func add(_ fd: Int32) -> Bool {
        state.withLock { s in
            guard !s.shut else { Glibc.close(fd); return false }
            s.open.insert(fd)
            return true
        }
    }

    /// Unregisters and closes `fd` (the serving thread, when it is done with it).
    public func close(_ fd: Int32) {
        state.withLock { s in
            s.open.remove(fd)
            Glibc.close(fd)
        }
    }

    /// Shuts every registered connection down both ways (their threads read EOF and close
    /// them) and refuses connections added from now on.
    public func shutdownAll() {
        state.withLock { s in
            s.shut = true
            for fd in s.open { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    /// Connections registered and not closed yet.
    public var count: Int { state.withLock { $0.open.count } }
}

/// A loopback port that was free a moment ago (bound to 0, read back, released), for tools
/// that cannot bind port 0 themselves.
public func freeLoopbackPort() throws -> Int {
    let l = try LoopbackListener(backlog: 1)
    defer { l.close() }
    return l.port
}
