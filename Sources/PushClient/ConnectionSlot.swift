// One connection slot: its thread, its inbox and the poll loop that drives its connections.
// See docs/pushclient.md for the threading and reconnection design.
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

/// Counters a slot thread bumps and tests read.
final class SlotStats: Sendable {
    let connectionsOpened = Atomic<Int>(0)
    let pingsSent = Atomic<Int>(0)
    let pingAcks = Atomic<Int>(0)
    let deadConnections = Atomic<Int>(0)
    let refusedRetries = Atomic<Int>(0)
    let maxStreamsInFlight = Atomic<Int>(0)
    let timeoutPings = Atomic<Int>(0)
    let openingsDeferred = Atomic<Int>(0)
    let answersAwaitedPastTimeout = Atomic<Int>(0)
    let lateAnswers = Atomic<Int>(0)
    let answerWaitsCapped = Atomic<Int>(0)
    let notSent = Atomic<Int>(0)
}

/// One connection slot: a thread that owns the slot's current HTTP/2 connection (plus older
/// ones still finishing their streams) and a local queue of pushes waiting for a stream.
///
/// `@unchecked Sendable`: `inbox` is a Mutex, `outstanding` and `stats` are atomics; the wake
/// pipe's fds are immutable and write(2) is thread-safe; everything else (connections, queue,
/// flags) is touched only by the slot thread (created in `start`, joined in `join`).
final class ConnectionSlot: @unchecked Sendable {
    let index: Int
    let outstanding = Atomic<Int>(0)
    let stats = SlotStats()
    let shared: ClientShared
    private struct Inbox {
        var pending: [PendingPush] = []
        var stopping = false
        var thread: pthread_t?
        var joined = false
    }
    private let inbox = Mutex(Inbox())
    private let wakeRead: Int32
    private let wakeWrite: Int32

    // Slot-thread state (internal for the extensions in ConnectionSlotUpkeep, Requests and
    // Responses; only the slot thread touches it).
    var current: H2Connection?
    var draining: [H2Connection] = []
    /// Pushes waiting for a stream, oldest first (retries go to the front).
    var queue: [PendingPush] = []
    var queueHead = 0
    /// The pacer's answer when the slot last wanted a connection and had to wait.
    var nextOpenAt: ContinuousClock.Instant?
    var stopping = false
    /// No stream deadline is earlier than this (conservative: may be stale-early, never late).
    var earliestStreamDeadline = ContinuousClock.Instant.now + .seconds(86_400)
    /// No queued push's `notSentBy` is earlier than this (conservative in the same way).
    var earliestQueueDeadline = ContinuousClock.Instant.now + .seconds(86_400)
    var authorization: (generation: Int, value: String)?
    let scheme: String

    init(index: Int, shared: ClientShared) throws {
        self.index = index
        self.shared = shared
        scheme = shared.endpoint.tls ? "https" : "http"
        var fds: [Int32] = [0, 0]
        // A self-pipe: `send` on any thread wakes the slot's poll(2).
        guard pipe(&fds) == 0 else {
            throw PushClientError.invalidConfiguration("pipe failed: \(String(cString: strerror(errno)))")
        }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        wakeRead = fds[0]
        wakeWrite = fds[1]
    }

    deinit {
        close(wakeRead)
        close(wakeWrite)
    }

    func start() throws {
        let tid: pthread_t
        do {
            tid = try startThread(name: "apns-slot-\(index)") { [self] in run() }
        } catch {
            throw PushClientError.invalidConfiguration("cannot start a connection thread: \(String(cString: strerror(error.code)))")
        }
        inbox.withLock { $0.thread = tid }
    }

    func enqueue(_ push: PendingPush) {
        outstanding.add(1, ordering: .relaxed)
        let (accepted, wasEmpty) = inbox.withLock { box -> (Bool, Bool) in
            guard !box.stopping else { return (false, false) }
            box.pending.append(push)
            return (true, box.pending.count == 1)
        }
        guard accepted else {
            outstanding.subtract(1, ordering: .relaxed)
            push.completion(push.local ?? .transportFailure("shutdown"))
            return
        }
        // The slot empties the inbox in one go after waking: one pipe write per batch, not per push.
        if wasEmpty { wake() }
    }

    func requestStop() {
        inbox.withLock { $0.stopping = true }
        wake()
    }

    func join() {
        let tid = inbox.withLock { box -> pthread_t? in
            guard let t = box.thread, !box.joined else { return nil }
            box.joined = true
            return t
        }
        // A completion that drops the last reference to the client runs shutdown on this
        // very thread: it is exiting anyway, and joining itself would deadlock.
        if let tid, pthread_equal(tid, pthread_self()) == 0 { pthread_join(tid, nil) }
    }

    private func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)   // EAGAIN = pipe already full = already awake
    }

    private func drainWakePipe() {
        var buf = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        while withUnsafeMutableBytes(of: &buf, { read(wakeRead, $0.baseAddress, $0.count) }) > 0 {}
    }

    // MARK: slot thread

    private func run() {
        var fds: [pollfd] = []
        var polled: [H2Connection] = []
        var wakeReadable = true
        while true {
            if wakeReadable { drainWakePipe() }
            let (batch, stop) = inbox.withLock { box -> ([PendingPush], Bool) in
                defer { box.pending.removeAll(keepingCapacity: true) }
                return (box.pending, box.stopping)
            }
            if stop { return shutdownSlot(batch) }
            for p in batch {
                if let local = p.local { complete(p, local) } else { enqueueLocally(p) }
            }
            let now = ContinuousClock.now
            expire(now)
            expireQueued(now)
            maintain(now)
            submitQueued()
            current?.flush()
            for d in draining { d.flush() }
            reapAll()

            fds.removeAll(keepingCapacity: true)
            polled.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            for c in [current].compactMap({ $0 }) + draining where c.fd >= 0 && c.pollEvents != 0 {
                fds.append(pollfd(fd: c.fd, events: c.pollEvents, revents: 0))
                polled.append(c)
            }
            let timeout = pollTimeoutMS(now: .now)
            let n = poll(&fds, nfds_t(fds.count), timeout)
            wakeReadable = n > 0 && fds[0].revents != 0
            if n > 0 {
                for (i, c) in polled.enumerated() where fds[i + 1].revents != 0 { c.handle(revents: fds[i + 1].revents) }
            }
            reapAll()
        }
    }



    private func pollTimeoutMS(now: ContinuousClock.Instant) -> Int32 {
        var wake = now + .seconds(1)
        if current == nil && queueHead < queue.count { wake = min(wake, nextOpenAt ?? now) }
        if earliestStreamDeadline < wake { wake = earliestStreamDeadline }
        if queueHead < queue.count { wake = min(wake, earliestQueueDeadline) }
        if let c = current {
            if !c.wasReady { wake = min(wake, c.connectDeadline) }
            if c.isOpen && c.wasReady && c.pingSentAt == nil && c.streamCount == 0 {
                wake = min(wake, c.lastActivity + shared.pingInterval)
            }
        }
        for c in [current].compactMap({ $0 }) + draining where c.isOpen {
            if let sent = c.pingSentAt { wake = min(wake, sent + shared.pingTimeout) }
        }
        guard wake > now else { return 0 }
        // Round up: waking a hair early would spin until the deadline.
        let (s, atto) = (wake - now).components
        return Int32(clamping: s * 1000 + (atto + 999_999_999_999_999) / 1_000_000_000_000_000)
    }

    private func shutdownSlot(_ batch: [PendingPush]) {
        stopping = true
        for p in batch { complete(p, p.local ?? .transportFailure("shutdown")) }
        failQueue("shutdown")
        let grace = min(shared.requestTimeout, .seconds(2))
        let end = ContinuousClock.now + grace
        var fds: [pollfd] = []
        var polled: [H2Connection] = []
        while ContinuousClock.now < end {
            let conns = [current].compactMap { $0 } + draining
            guard conns.contains(where: { $0.state != .closed && $0.streamCount > 0 }) else { break }
            fds.removeAll(keepingCapacity: true)
            polled.removeAll(keepingCapacity: true)
            for c in conns where c.fd >= 0 && c.pollEvents != 0 {
                c.flush()
                fds.append(pollfd(fd: c.fd, events: c.pollEvents, revents: 0))
                polled.append(c)
            }
            if fds.isEmpty { break }
            if poll(&fds, nfds_t(fds.count), 10) > 0 {
                for (i, c) in polled.enumerated() where fds[i].revents != 0 { c.handle(revents: fds[i].revents) }
            }
            for c in conns { reap(c) }
            failQueue("shutdown")
        }
        for c in [current].compactMap({ $0 }) + draining {
            for st in c.session.abandonAll() where !st.done {
                st.done = true
                complete(st.push, .transportFailure("shutdown"))
            }
            c.closeGracefully()
        }
        failQueue("shutdown")
        current = nil
        draining.removeAll()
    }

}
