// One loop's listening socket, accepted by hand: a uv_poll on the descriptor, accept4, and each
// new socket handed to a TCPSocket (uv_tcp_open). Not uv_listen: libuv's accept loop hands every
// failed accept to its callback and tries again at once, for as long as the descriptor is open,
// so a listener broken under it (EINVAL once it was shut down, or closed and its number reused)
// or a shortage (ENOBUFS, ENOMEM) kept the loop thread at 100% inside libuv, where nothing else
// on that loop ran again, stop() included. Here a shortage pauses accepting with a back-off and
// a broken listener stops it, each told once (HTTPServerConfiguration.onAcceptError).
internal import CUV
#if canImport(Glibc)
import Glibc
#endif

/// What a failed accept(2) means for the listener.
enum AcceptFailure: Equatable {
    /// Nothing pending: wait until the socket is readable again.
    case drained
    /// That one connection failed (aborted, or a network error accept(2) passes on from it,
    /// which its man page says to treat like EAGAIN by retrying): take the next.
    case retry
    /// Out of descriptors, socket buffers or memory: stop accepting for a while.
    case pause
    /// The descriptor is not a listening socket any more (closed, shut down, reused): stop.
    case broken

    init(errno e: Int32) {
        switch e {
        case EAGAIN, EWOULDBLOCK: self = .drained
        case EINTR, ECONNABORTED, EPERM, EPROTO, ENOPROTOOPT, ENETDOWN, ENETUNREACH, EHOSTDOWN, EHOSTUNREACH, ENONET:
            self = .retry
        case EMFILE, ENFILE, ENOBUFS, ENOMEM: self = .pause
        default: self = .broken   // EBADF, EINVAL, ENOTSOCK, EOPNOTSUPP, EFAULT
        }
    }
}

/// How long accepting pauses after a shortage: 10 ms, doubling to 1 s while it lasts, from the
/// start again once a connection is accepted. Pending connections wait in the kernel's backlog.
struct AcceptBackoff: Equatable {
    static let firstMilliseconds: UInt64 = 10
    static let capMilliseconds: UInt64 = 1000
    private(set) var pauseMilliseconds: UInt64 = 0

    /// Another shortage: how long to pause, and whether it starts an episode (the one to tell).
    mutating func failed() -> (milliseconds: UInt64, startsEpisode: Bool) {
        let first = pauseMilliseconds == 0
        pauseMilliseconds = first ? Self.firstMilliseconds : min(Self.capMilliseconds, pauseMilliseconds * 2)
        return (pauseMilliseconds, first)
    }

    /// A connection was accepted: true when that ends an episode.
    mutating func succeeded() -> Bool {
        defer { pauseMilliseconds = 0 }
        return pauseMilliseconds != 0
    }
}

/// A bound, listening socket polled on its loop. Loop-thread only once the loop runs. Retains
/// itself until both handles' close callbacks ran.
final class Listener {
    /// unowned(unsafe): a loop outlives its handles (it runs until every handle closed).
    unowned(unsafe) let loop: EventLoop
    let fd: Int32
    /// "host:port", for what is told.
    let address: String
    /// The socket's identity: closing time checks the descriptor still names it, so a number
    /// closed under the server and reused is never closed by it.
    private let device: UInt64
    private let inode: UInt64
    private let poll: UnsafeMutablePointer<uv_poll_t>
    private let timer: UnsafeMutablePointer<uv_timer_t>
    private var backoff = AcceptBackoff()
    /// Consecutive `.retry` failures tolerated in one wake-up before pausing: a retryable error
    /// that does not consume a connection must not spin either.
    static let maxRetriesInARow = 64
    /// Connections accepted per readable event before the loop gets a turn.
    static let maxAcceptsPerWake = 64
    private var stopped = false
    private var closing = false
    private var pendingCloses = 0

    /// Takes `fd` (bound, listening, non-blocking) and starts polling it. On a throw `fd` is
    /// closed.
    init(loop: EventLoop, fd: Int32, address: String) throws {
        self.loop = loop
        self.fd = fd
        self.address = address
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            let e = errno
            Glibc.close(fd)
            throw HTTPServerError.libuv(operation: "listen \(address)", message: "fstat: \(String(cString: strerror(e)))")
        }
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
        poll = .allocate(capacity: 1)
        timer = .allocate(capacity: 1)
        let rc = uv_poll_init_socket(loop.loop, poll, fd)
        guard rc == 0 else {
            poll.deallocate()
            timer.deallocate()
            Glibc.close(fd)
            throw HTTPServerError.libuv(operation: "listen \(address)", message: String(cString: uv_strerror(rc)))
        }
        uv_timer_init(loop.loop, timer)
        let me = Unmanaged.passRetained(self).toOpaque()
        poll.pointee.data = me
        timer.pointee.data = me
        startPolling()
    }

    private static func from(_ data: UnsafeMutableRawPointer?) -> Listener {
        Unmanaged<Listener>.fromOpaque(data!).takeUnretainedValue()
    }

    private func startPolling() {
        uv_poll_start(poll, Int32(UV_READABLE.rawValue)) { handle, status, _ in
            Listener.from(handle!.pointee.data).readable(status: status)
        }
    }

    private func readable(status: Int32) {
        guard !stopped else { return }
        guard status == 0 else { return broken("poll: \(String(cString: uv_strerror(status)))") }
        var retries = 0
        var accepted = 0
        while !stopped {
            // Then back to the loop: the poll is level-triggered and fires again at its next
            // turn, after the reads, writes, timers and close callbacks (which free the numbers
            // of refused connections) that a steady stream of connections would otherwise hold up.
            guard accepted < Self.maxAcceptsPerWake else { return }
            let c = cuv_accept(fd)
            if c >= 0 {
                retries = 0
                accepted += 1
                if backoff.succeeded() { loop.core.tellAcceptError("\(address): accepting connections again") }
                loop.accepted(c)
                continue
            }
            let e = errno
            switch AcceptFailure(errno: e) {
            case .drained: return
            case .retry:
                retries += 1
                if retries < Self.maxRetriesInARow { continue }
                return pause(e)
            case .pause: return pause(e)
            case .broken: return broken("accept: \(String(cString: strerror(e)))")
            }
        }
    }

    private func pause(_ e: Int32) {
        loop.core.recordAcceptFailure()
        let (milliseconds, first) = backoff.failed()
        if first {
            loop.core.tellAcceptError("\(address): accept failed: \(String(cString: strerror(e))); new connections wait in the backlog, retried after \(milliseconds) ms, doubling to \(AcceptBackoff.capMilliseconds) ms, until one is accepted")
        }
        uv_poll_stop(poll)
        uv_timer_start(timer, { t in
            let l = Listener.from(t!.pointee.data)
            if !l.stopped { l.startPolling() }
        }, milliseconds, 0)
    }

    private func broken(_ why: String) {
        loop.core.recordAcceptFailure()
        stopped = true
        uv_poll_stop(poll)
        loop.core.tellAcceptError("\(address): listener broken (\(why)); this loop accepts no more connections until the server restarts")
    }

    /// Stops accepting and closes both handles; the descriptor is closed once libuv is done
    /// with it, and only if it still is this listener's socket.
    func close() {
        guard !closing else { return }
        closing = true
        stopped = true
        pendingCloses = 2
        let cb: uv_close_cb = { h in Listener.from(h!.pointee.data).handleClosed() }
        uv_close(UnsafeMutableRawPointer(poll).assumingMemoryBound(to: uv_handle_t.self), cb)
        uv_close(UnsafeMutableRawPointer(timer).assumingMemoryBound(to: uv_handle_t.self), cb)
    }

    private func handleClosed() {
        pendingCloses -= 1
        guard pendingCloses == 0 else { return }
        poll.deallocate()
        timer.deallocate()
        var st = stat()
        if fstat(fd, &st) == 0, UInt64(st.st_dev) == device, UInt64(st.st_ino) == inode { Glibc.close(fd) }
        Unmanaged.passUnretained(self).release()
    }
}
