// The public server object, the writer handed to handlers, and the state every loop shares.
import POSIXThreads
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Configuration, handler, TLS context and counters shared by all loops of one server.
final class ServerCore: Sendable {
    let configuration: HTTPServerConfiguration
    let handler: HTTPHandler
    let tls: TLSContext?
    let parserLimits: HTTP1Limits
    // Hot-path copies of configuration values (reading `configuration` copies the struct).
    let idleTimeoutMs: UInt64
    let headerTimeoutMs: UInt64
    let bodyTimeoutMs: UInt64
    let writeTimeoutMs: UInt64
    let maxQueuedOutputBytes: Int
    let maxQueuedOutputBytesTotal: Int
    let socketSendBufferBytes: Int
    let proxyProtocol: ProxyProtocolConfiguration?
    /// Output bytes queued for peers (not yet taken by the kernel), over every connection.
    let queuedOutput = Atomic<Int>(0)
    /// Input bytes held by connections (ServerConnection.inputHeld), over every connection.
    let bufferedInput = Atomic<Int>(0)
    /// The most input one connection has held at once since the server started.
    let largestConnectionInput = Atomic<Int>(0)
    let maxBufferedInputBytesTotal: Int
    let maxRequestsPerConnection: Int
    let maxBodyBytes: Int
    let maxHeaderBytes: Int
    let maxHeaderCount: Int
    let cleartextHTTP2: Bool
    let serverHeaderLine: [UInt8]?
    let errorResponse: @Sendable (Int, String) -> HTTPReply
    let continueCheck: HTTPContinueCheck?
    let admission: (@Sendable () -> HTTPAdmission)?
    private let connectionIDs = Atomic<UInt64>(0)
    private let openConnections = Atomic<Int>(0)
    /// Open connections per client address, when `maxConnectionsPerAddress` is set.
    private let perAddress = Mutex<[PeerKey: Int]>([:])
    private let counters = Mutex(HTTPServerMetrics())
    // Per-response counters as atomics: one locked add instead of a lock round trip.
    private let status1xx = Atomic<Int>(0)
    private let status2xx = Atomic<Int>(0)
    private let status3xx = Atomic<Int>(0)
    private let status4xx = Atomic<Int>(0)
    private let status5xx = Atomic<Int>(0)

    init(configuration: HTTPServerConfiguration, handler: @escaping HTTPHandler) throws {
        self.configuration = configuration
        self.handler = handler
        self.tls = try configuration.tls.map { try TLSContext(configuration: $0) }
        let l = configuration.limits
        parserLimits = HTTP1Limits(maxHeaderBytes: l.maxHeaderBytes, maxHeaderCount: l.maxHeaderCount,
                                   maxBodyBytes: l.maxBodyBytes)
        idleTimeoutMs = l.idleTimeout.milliseconds
        headerTimeoutMs = l.headerTimeout.milliseconds
        bodyTimeoutMs = l.bodyTimeout.milliseconds
        writeTimeoutMs = l.writeTimeout.milliseconds
        maxQueuedOutputBytes = max(0, l.maxQueuedOutputBytes)
        maxQueuedOutputBytesTotal = max(0, l.maxQueuedOutputBytesTotal)
        maxBufferedInputBytesTotal = max(0, l.maxBufferedInputBytesTotal)
        socketSendBufferBytes = max(0, l.socketSendBufferBytes)
        proxyProtocol = configuration.proxyProtocol
        maxRequestsPerConnection = l.maxRequestsPerConnection
        maxBodyBytes = l.maxBodyBytes
        maxHeaderBytes = l.maxHeaderBytes
        maxHeaderCount = l.maxHeaderCount
        cleartextHTTP2 = configuration.cleartextHTTP2
        serverHeaderLine = configuration.serverName.map { Array("server: \($0)\r\n".utf8) }
        errorResponse = configuration.errorResponse
        continueCheck = configuration.continueCheck
        admission = configuration.admission
    }

    /// How much output one connection may have queued before it stops reading requests:
    /// `maxQueuedOutputBytes`, or nothing at all while the server-wide queue is over its budget
    /// (connections whose peers read keep going: their output leaves at once).
    @inline(__always)
    func outputLimit() -> Int {
        maxQueuedOutputBytesTotal > 0 && queuedOutput.load(ordering: .relaxed) > maxQueuedOutputBytesTotal
            ? 0 : maxQueuedOutputBytes
    }

    /// Moves one connection's input from `old` to `new` bytes in the server-wide gauge.
    @inline(__always)
    func accountInput(from old: Int, to new: Int) {
        bufferedInput.add(new - old, ordering: .relaxed)
        if new > old && new > largestConnectionInput.load(ordering: .relaxed) {
            var seen = largestConnectionInput.load(ordering: .relaxed)
            while new > seen {
                let (done, original) = largestConnectionInput.compareExchange(expected: seen, desired: new, ordering: .relaxed)
                if done { break }
                seen = original
            }
        }
    }

    /// Whether connections hold more input than `maxBufferedInputBytesTotal` allows.
    @inline(__always)
    func inputOverBudget() -> Bool {
        maxBufferedInputBytesTotal > 0 && bufferedInput.load(ordering: .relaxed) > maxBufferedInputBytesTotal
    }

    func nextConnectionID() -> UInt64 { connectionIDs.add(1, ordering: .relaxed).newValue }

    /// Counts a new connection unless `maxConnections` are already open.
    func reserveConnection() -> Bool {
        let limit = configuration.limits.maxConnections
        var current = openConnections.load(ordering: .relaxed)
        while current < limit {
            let (exchanged, original) = openConnections.compareExchange(
                expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged {
                counters.withLock { $0.connectionsOpen += 1; $0.connectionsTotal += 1 }
                return true
            }
            current = original
        }
        return false
    }

    func releaseConnection() {
        openConnections.subtract(1, ordering: .relaxed)
        counters.withLock { $0.connectionsOpen -= 1 }
    }

    var maxConnectionsPerAddress: Int { configuration.limits.maxConnectionsPerAddress }

    /// Counts a connection from `key` unless it already holds `maxConnectionsPerAddress`.
    /// Per accepted connection, not per request: one lock shared by the loops.
    func reserveConnection(for key: PeerKey) -> Bool {
        perAddress.withLock { counts in
            let n = counts[key, default: 0]
            guard n < maxConnectionsPerAddress else { return false }
            counts[key] = n + 1
            return true
        }
    }

    func releaseConnection(for key: PeerKey) {
        perAddress.withLock { counts in
            let n = (counts[key] ?? 1) - 1
            counts[key] = n > 0 ? n : nil
        }
    }

    func recordRefused(perAddress: Bool = false) {
        counters.withLock {
            $0.connectionsRefused += 1
            if perAddress { $0.connectionsRefusedPerAddress += 1 }
        }
    }
    func recordProxyRefused() { counters.withLock { $0.proxyHeaderFailures += 1 } }
    func recordTimeout() { counters.withLock { $0.timeouts += 1 } }
    func recordAcceptFailure() { counters.withLock { $0.acceptFailures += 1 } }
    /// HTTPServerConfiguration.onAcceptError, if set (the listener tells each episode once).
    func tellAcceptError(_ message: String) { configuration.onAcceptError?(message) }
    func recordInputBudgetClose() { counters.withLock { $0.connectionsClosedForInputBudget += 1 } }
    func recordHandshakeFailure() { counters.withLock { $0.tlsHandshakeFailures += 1 } }
    func recordParseError(_ kind: String) { counters.withLock { $0.parseErrorsByKind[kind, default: 0] += 1 } }
    func recordStatus(_ status: Int) {
        switch status / 100 {
        case 1: status1xx.add(1, ordering: .relaxed)
        case 2: status2xx.add(1, ordering: .relaxed)
        case 3: status3xx.add(1, ordering: .relaxed)
        case 4: status4xx.add(1, ordering: .relaxed)
        case 5: status5xx.add(1, ordering: .relaxed)
        default: break
        }
    }

    var metrics: HTTPServerMetrics {
        var m = counters.withLock { $0 }
        m.queuedOutputBytes = queuedOutput.load(ordering: .relaxed)
        m.bufferedInputBytes = bufferedInput.load(ordering: .relaxed)
        m.largestConnectionInputBytes = largestConnectionInput.load(ordering: .relaxed)
        m.requestsByStatusClass = [0, status1xx.load(ordering: .relaxed), status2xx.load(ordering: .relaxed),
                                   status3xx.load(ordering: .relaxed), status4xx.load(ordering: .relaxed),
                                   status5xx.load(ordering: .relaxed)]
        return m
    }
}

/// The answer to an `Expect: 100-continue` head (HTTPContinueCheck). Callable from any
/// thread; the first call wins.
public final class HTTPContinueDecision: Sendable {
    let connection: ServerConnection
    /// The sequence the request will have on its connection.
    let sequence: UInt64
    private let answered = Atomic<Bool>(false)

    init(connection: ServerConnection, sequence: UInt64) {
        self.connection = connection
        self.sequence = sequence
    }

    /// Sends `100 Continue` (after the answers to earlier pipelined requests).
    public func proceed() { decide(nil) }

    /// Sends `response` as the request's final answer, without reading its body; the
    /// connection closes after it.
    public func refuse(_ response: HTTPReply) { decide(response) }

    private func decide(_ refusal: HTTPReply?) {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let loop = connection.loop
        if loop.isCurrentThread {
            connection.continueDecided(sequence: sequence, refusal: refusal)
        } else {
            loop.enqueue(.continueDecided(connection, sequence, refusal))
        }
    }
}

/// A reply built where it is written (`HTTPReplyWriter.respond(building:)`): `makeReply` runs
/// once, on the connection's loop thread (or, if the server stopped first, where the reply was
/// handed over or on the stopping loop, and the reply is dropped).
public protocol HTTPReplySource: Sendable {
    func makeReply() -> HTTPReply
}

/// Answers one request. Callable from any thread; the first `respond` or `abortConnection`
/// wins and later calls are ignored. The server decides where the reply is written: on the
/// connection's loop, directly when called there, else through the loop's task queue (one
/// wake-up for every reply queued before the loop runs: a batch of replies from the store's
/// writer costs one).
public final class HTTPReplyWriter: Sendable {
    let connection: ServerConnection
    /// The connection's loop, kept here: a thread answering from elsewhere (the store's writer)
    /// touches only this object, not the connection the loop is busy with (its reference count
    /// and fields share cache lines the loop writes all the time).
    let loop: EventLoop
    /// HTTP/1: the request's position on its connection; HTTP/2: the stream identifier.
    let sequence: UInt64
    let streamID: Int32
    let isHEAD: Bool
    private let answered = Atomic<Bool>(false)

    init(connection: ServerConnection, sequence: UInt64, streamID: Int32, isHEAD: Bool) {
        self.connection = connection
        loop = connection.loop
        self.sequence = sequence
        self.streamID = streamID
        self.isHEAD = isHEAD
    }

    public func respond(_ response: HTTPReply, then action: ConnectionAction = .keep) {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if loop.isCurrentThread {
            connection.complete(self, response, action)
        } else {
            loop.enqueue(.respond(self, response, action))
        }
    }

    /// Sends the reply `source` builds, building it on the connection's loop: at once when
    /// called there, else when the loop runs its task queue. For an answer that becomes ready
    /// on another thread (a store's writer after its COMMIT): that thread only queues it, and
    /// the reply's memory is allocated and freed on the loop that writes it.
    /// Once the loop has stopped (the server's `stop`), nothing is sent, but the reply is still
    /// built, here, and dropped: what building it records (a request counted, a log line) is
    /// not lost with the connection.
    public func respond(building source: some HTTPReplySource, then action: ConnectionAction = .keep) {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if loop.isCurrentThread {
            connection.complete(self, source.makeReply(), action)
        } else if !loop.enqueue(.build(self, source, action)) {
            _ = source.makeReply()
        }
    }

    /// Closes the socket now: no response, no GOAWAY.
    public func abortConnection() {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if loop.isCurrentThread { connection.close() } else { loop.enqueue(.abort(connection)) }
    }

    /// HTTP/2: sends a new SETTINGS frame with this SETTINGS_MAX_CONCURRENT_STREAMS on this
    /// connection. No-op on HTTP/1. Does not count as the response.
    public func setMaxConcurrentStreams(_ n: UInt32) {
        if loop.isCurrentThread {
            connection.setMaxConcurrentStreams(n)
        } else {
            loop.enqueue(.setMaxConcurrentStreams(connection, n))
        }
    }

    /// Whether `respond` or `abortConnection` was already called.
    public var hasResponded: Bool { answered.load(ordering: .acquiring) }
}

private struct ServerState {
    var loops: [EventLoop] = []
    var port = 0
    var started = false
    var stopped = false
}

/// An event-loop HTTP/1.1 + HTTP/2 server (libuv, OpenSSL, nghttp2). See docs/http.md.
public final class HTTPServer: Lifecycle {
    let core: ServerCore
    private let state = Mutex(ServerState())

    public init(configuration: HTTPServerConfiguration, handler: @escaping HTTPHandler) throws {
        guard configuration.loopThreads >= 1 else {
            throw HTTPServerError.invalidAddress("loopThreads must be at least 1")
        }
        core = try ServerCore(configuration: configuration, handler: handler)
    }

    /// Binds and starts the loop thread(s); returns once listening.
    public func start() throws {
        // A peer that vanishes while we write (kill -9 of a client, a modem dropping) makes
        // write(2) fail with EPIPE, and the default SIGPIPE action would kill the whole process.
        // libuv writes with plain write(2) (no MSG_NOSIGNAL), so ignore the signal process-wide
        // as every libuv server does; the write then fails with EPIPE and the connection closes.
        signal(SIGPIPE, SIG_IGN)
        try state.withLock { s in
            guard !s.started else { throw HTTPServerError.alreadyStarted }
            let c = core.configuration
            var loops: [EventLoop] = []
            var port = c.port
            do {
                for i in 0..<c.loopThreads {
                    let loop = try EventLoop(core: core)
                    loops.append(loop)
                    let bound = try loop.listen(host: c.host, port: port, reusePort: c.loopThreads > 1)
                    if i == 0 { port = bound }
                }
                for loop in loops { try loop.startThread() }
            } catch {
                for loop in loops {
                    if loop.hasThread {
                        loop.enqueue(.forceClose)
                        loop.join()
                    } else {
                        loop.stopWithoutThread()
                    }
                }
                throw error
            }
            s.loops = loops
            s.port = port
            s.started = true
        }
    }

    public var localPort: Int { state.withLock { $0.port } }

    /// Blocking. Stops accepting, sends GOAWAY (HTTP/2) / `Connection: close` (HTTP/1) and
    /// closes idle connections, waits for in-flight requests up to `grace`, then closes
    /// everything and joins the loop threads. Safe to call more than once.
    public func stop(grace: Duration = .seconds(10)) {
        let loops: [EventLoop] = state.withLock { s in
            guard s.started, !s.stopped else { return [] }
            s.stopped = true
            return s.loops
        }
        guard !loops.isEmpty else { return }
        for l in loops { l.enqueue(.beginShutdown) }
        let deadline = ContinuousClock.now + grace
        while ContinuousClock.now < deadline {
            if loops.allSatisfy({ $0.connectionCount.load(ordering: .relaxed) == 0 }) { break }
            usleep(2000)
        }
        for l in loops { l.enqueue(.forceClose) }
        for l in loops { l.join() }
        state.withLock { $0.loops = [] }
    }

    public var metrics: HTTPServerMetrics { core.metrics }

    deinit {
        stop(grace: .zero)
    }
}
