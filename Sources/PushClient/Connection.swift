// One HTTP/2 connection of a slot: TCP connect -> TLS handshake (ALPN h2) -> nghttp2 client
// session, then frames in and out of a non-blocking socket. Slot-thread only. The slot decides
// what to send and when; this class moves bytes and reports what happened.
import Glibc

final class H2Connection {
    enum State { case connecting, handshaking, open, closed }

    private(set) var state: State = .connecting
    /// Why the connection closed (nil while it is usable).
    private(set) var failure: String?
    private let endpoint: Endpoint
    private let tlsContext: TLSClientContext?
    private var connector: TCPConnector?
    private var socket: Socket?
    private var transport: ByteTransport?
    let session: H2ClientSession
    private var out: [UInt8] = []
    private var outOffset = 0
    /// The transport needs POLLOUT (pending output, a connect, or TLS wanting to write).
    private var needsWritable = true

    let connectDeadline: ContinuousClock.Instant
    /// Last time bytes arrived (or the connection opened): PING when idle this long.
    private(set) var lastActivity: ContinuousClock.Instant
    var pingSentAt: ContinuousClock.Instant?
    private var pingAcksSeen = 0
    /// Requests submitted on this connection so far.
    var requestsCarried = 0
    /// No new streams: GOAWAY, 503 Shutdown or 400 IdleTimeout received, a token change, or dead.
    var retired = false
    /// A 200 arrived on this connection (the pacer was told once).
    var delivered = false
    /// A stream timed out here and no response has arrived since: one stream at a time, so a
    /// slow server is not handed requests that will time out too (each may become a duplicate
    /// when the caller retries it).
    var probation = false

    init(endpoint: Endpoint, tlsContext: TLSClientContext?, connectTimeout: Duration) throws {
        self.endpoint = endpoint
        self.tlsContext = tlsContext
        let now = ContinuousClock.now
        connectDeadline = now + connectTimeout
        lastActivity = now
        session = try H2ClientSession()
        let c = try TCPConnector(endpoint: endpoint)
        connector = c
        socket = c.socket
    }

    var fd: Int32 { socket?.fd ?? -1 }
    var isOpen: Bool { state == .open }
    /// The server's SETTINGS arrived: the connection is set up. It stays true after a close,
    /// so a failure before it is a setup failure (refused, TLS, ALPN, silent server).
    var wasReady: Bool { session.settingsReceived }
    var streamCount: Int { session.streams.count }

    /// May a new stream start here now? Waits for the server's SETTINGS first: APNs allows one
    /// stream until a valid token succeeds, and exceeding an acknowledged limit is a protocol
    /// error, so nothing is sent on nghttp2's default guess of 100.
    var hasStreamCapacity: Bool {
        state == .open && !retired && session.settingsReceived && session.goAway == nil
            && session.streams.count < (probation ? 1 : session.remoteMaxConcurrentStreams)
    }

    var pollEvents: Int16 {
        guard state != .closed else { return 0 }
        var ev = Int16(POLLIN)
        if needsWritable || state == .connecting || outOffset < out.count { ev |= Int16(POLLOUT) }
        return ev
    }

    /// New PING ACKs since the last call.
    func takePingAcks() -> Int {
        let n = session.pingAcks - pingAcksSeen
        pingAcksSeen = session.pingAcks
        return n
    }

    /// Reacts to poll's revents; drives connect, handshake, reads and writes.
    func handle(revents: Int16) {
        guard state != .closed else { return }
        var readable = revents & Int16(POLLIN | POLLERR | POLLHUP) != 0
        if state == .connecting {
            guard revents & Int16(POLLOUT | POLLERR | POLLHUP) != 0 else { return }
            do {
                guard try connector!.finish() else {
                    socket = connector!.socket   // the next address
                    return
                }
            } catch {
                return fail("\(error)")
            }
            connector = nil
            if let tlsContext {
                do { transport = try TLSClientTransport(context: tlsContext, fd: socket!.fd, host: endpoint.host) } catch {
                    return fail("\(error)")
                }
                state = .handshaking
            } else {
                transport = PlainTransport(fd: socket!.fd)
                becomeOpen()
            }
        }
        if state == .handshaking {
            switch transport!.handshake() {
            case .done:
                becomeOpen()
                readable = true   // TLS may already hold the server's first frames
            case .wantRead: needsWritable = false; return
            case .wantWrite: needsWritable = true; return
            case .failed(let m): return fail(m)
            }
        }
        if readable { readAvailable() }
        flush()
    }

    private func becomeOpen() {
        state = .open
        lastActivity = .now
        needsWritable = true
    }

    /// Reads everything the socket has and feeds it to nghttp2.
    private func readAvailable() {
        guard state == .open, let transport else { return }
        withUnsafeTemporaryAllocation(byteCount: 16384, alignment: 16) { buf in
            while state == .open {
                switch transport.read(buf.baseAddress!, buf.count) {
                case .bytes(let n):
                    lastActivity = .now
                    do { try session.receive(UnsafeRawBufferPointer(start: buf.baseAddress!, count: n)) } catch {
                        flush()   // nghttp2 may have queued a GOAWAY explaining why
                        return fail("\(error)")
                    }
                case .wouldBlock(let w):
                    if w { needsWritable = true }
                    return
                case .closed:
                    return fail(closedMessage)
                case .failed(let m):
                    return fail(m)
                }
            }
        }
    }

    /// Moves nghttp2's pending frames to the socket until it would block or nothing is left.
    func flush() {
        guard state == .open, let transport else { return }
        while true {
            if outOffset == out.count {
                out.removeAll(keepingCapacity: true)
                outOffset = 0
                do { try session.produce(into: &out, limit: 65536) } catch { return fail("\(error)") }
                if out.isEmpty {
                    needsWritable = false
                    if !session.wantsIO { fail("HTTP/2 session finished") }
                    return
                }
            }
            let r = out.withUnsafeBytes { transport.write($0.baseAddress! + outOffset, out.count - outOffset) }
            switch r {
            case .bytes(let n): outOffset += n
            case .wouldBlock:
                needsWritable = true
                return
            case .closed: return fail(closedMessage)
            case .failed(let m): return fail(m)
            }
        }
    }

    /// APNs explains a GOAWAY in its debug data ({"reason":"..."}): keep it in the message.
    private var closedMessage: String {
        guard let g = session.goAway else { return "connection closed by server" }
        return "connection closed by server after GOAWAY(\(H2ClientSession.errorName(g.errorCode))"
            + (g.debug.isEmpty ? ")" : ", \(g.debug))")
    }

    /// Closes now; the slot collects the streams still open via `session.abandonAll()`.
    func fail(_ message: String) {
        guard state != .closed else { return }
        failure = message
        close()
    }

    /// Ends a connection with no stream left: GOAWAY, close_notify, close.
    func closeGracefully() {
        guard state != .closed else { return }
        if state == .open {
            session.terminate()
            flush()
            transport?.shutdown()
        }
        failure = failure ?? "closed"
        close()
    }

    private func close() {
        state = .closed
        transport = nil   // frees the SSL before the fd closes
        socket = nil
        connector = nil
    }
}
