// The APNs client: validates and shapes each push, picks the least-busy connection slot, and
// hands it to that slot's thread, which owns one HTTP/2 connection at a time (nghttp2 client
// session over OpenSSL on a non-blocking socket; older connections drain beside it).
// See docs/pushclient.md for the threading and reconnection design.
import Basics
import FoundationEssentials
import Glibc
import Synchronization

public final class PushClient: Sendable {
    private let slots: [ConnectionSlot]
    private let shared: ClientShared

    public init(configuration: PushClientConfiguration) throws {
        guard (1...64).contains(configuration.connections) else {
            throw PushClientError.invalidConfiguration("connections must be 1...64, got \(configuration.connections)")
        }
        guard configuration.requestTimeout > .zero, configuration.connectTimeout > .zero else {
            throw PushClientError.invalidConfiguration("requestTimeout and connectTimeout must be positive")
        }
        guard configuration.pingInterval > .zero else {
            throw PushClientError.invalidConfiguration("pingInterval must be positive")
        }
        let endpoint = try Endpoint(url: configuration.environment.baseURL)
        if let ca = configuration.caFile, access(ca, R_OK) != 0 {
            throw PushClientError.invalidConfiguration("caFile \(ca) is not readable")
        }
        var certificate: (String, String, String?)? = nil
        var tokens: TokenProvider? = nil
        switch configuration.credentials {
        case .token(let key):
            tokens = TokenProvider(key: key)
        case .certificate(let cert, let key, let pass):
            guard access(cert, R_OK) == 0 else {
                throw PushClientError.invalidConfiguration("certificatePath \(cert) is not readable")
            }
            certificate = (cert, key, pass)
        }
        var tls: TLSClientContext? = nil
        if endpoint.tls {
            tls = try TLSClientContext(caFile: configuration.caFile, certificate: certificate)
        } else if certificate != nil {
            throw PushClientError.invalidConfiguration("certificate credentials need an https:// environment")
        }
        shared = ClientShared(endpoint: endpoint, tls: tls, tokens: tokens, clock: configuration.clock,
                              requestTimeout: configuration.requestTimeout, connectTimeout: configuration.connectTimeout,
                              pingInterval: configuration.pingInterval)
        // OpenSSL's socket BIO writes with plain write(2): a server that closed its end would
        // raise SIGPIPE, whose default action kills the process. Ignore it process-wide (as
        // HTTPServer does for libuv); the write then fails with EPIPE and the connection closes.
        signal(SIGPIPE, SIG_IGN)
        var slots: [ConnectionSlot] = []
        for i in 0..<configuration.connections { slots.append(try ConnectionSlot(index: i, shared: shared)) }
        self.slots = slots
        for s in slots { try s.start() }
    }

    deinit { shutdown() }

    /// Thread-safe and never blocks. `completion` runs exactly once, on a client thread: keep
    /// it short (it delays other pushes on that connection).
    public func send(_ request: PushRequest, completion: @escaping @Sendable (PushResult) -> Void) {
        let push = PendingPush(request: request, completion: completion, deadline: .now + shared.requestTimeout)
        if let refusal = Self.validate(request) {
            push.local = refusal
        } else {
            push.body = request.payload.jsonBody()
            if push.body.count > apnsMaximumPayloadBytes {
                push.local = .rejected(status: 413, reason: .payloadTooLarge, timestamp: nil)
            }
        }
        let slot = slots.min { $0.outstanding.load(ordering: .relaxed) < $1.outstanding.load(ordering: .relaxed) }!
        slot.enqueue(push)
    }

    public func send(_ request: PushRequest) async -> PushResult {
        await withCheckedContinuation { cont in
            send(request) { cont.resume(returning: $0) }
        }
    }

    /// Stops accepting pushes, lets in-flight ones finish for up to min(requestTimeout, 2 s),
    /// then completes everything left with `.transportFailure("shutdown")`. Blocks until the
    /// slot threads have exited; safe to call more than once.
    public func shutdown() {
        for s in slots { s.requestStop() }
        for s in slots { s.join() }
    }

    /// Connection-level counters summed over the slots (tests and diagnostics).
    var engineStats: EngineStats {
        slots.reduce(into: EngineStats()) { total, s in
            total.connectionsOpened += s.stats.connectionsOpened.load(ordering: .relaxed)
            total.pingsSent += s.stats.pingsSent.load(ordering: .relaxed)
            total.pingAcks += s.stats.pingAcks.load(ordering: .relaxed)
            total.deadConnections += s.stats.deadConnections.load(ordering: .relaxed)
            total.refusedRetries += s.stats.refusedRetries.load(ordering: .relaxed)
            total.maxStreamsInFlight = max(total.maxStreamsInFlight, s.stats.maxStreamsInFlight.load(ordering: .relaxed))
        }
    }

    /// Local refusals use the status and reason APNs itself would return, without any I/O.
    static func validate(_ r: PushRequest) -> PushResult? {
        if r.deviceToken.isEmpty { return .rejected(status: 400, reason: .missingDeviceToken, timestamp: nil) }
        // Checked through withUTF8 pointer loops: `utf8.allSatisfy` walked String.UTF8View's
        // index machinery, ~2.3k instructions per push for a 64-character token (callgrind).
        var token = r.deviceToken
        let tokenOK = token.withUTF8 { b in b.count <= 400 && b.allSatisfy(Hex.isDigit) }
        if !tokenOK { return .rejected(status: 400, reason: .badDeviceToken, timestamp: nil) }
        if r.bundleID.isEmpty { return .rejected(status: 400, reason: .missingTopic, timestamp: nil) }
        var topic = r.bundleID
        let topicOK = topic.withUTF8 { b in b.allSatisfy { $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: ":") } }
        if !topicOK { return .rejected(status: 400, reason: .badTopic, timestamp: nil) }
        if let p = r.priority, ![10, 5, 1].contains(p) { return .rejected(status: 400, reason: .badPriority, timestamp: nil) }
        if let e = r.expiration, e < 0 { return .rejected(status: 400, reason: .badExpirationDate, timestamp: nil) }
        return nil
    }

    static func milliseconds(_ d: Duration) -> Int {
        let (s, atto) = d.components
        return Int(s) * 1000 + Int(atto / 1_000_000_000_000_000)
    }
}

struct EngineStats: Sendable, Equatable {
    var connectionsOpened = 0
    var pingsSent = 0
    var pingAcks = 0
    /// Connections dropped because a PING went unanswered.
    var deadConnections = 0
    /// Pushes sent again because the server refused their stream unprocessed (GOAWAY, REFUSED_STREAM).
    var refusedRetries = 0
    /// Most streams one connection carried at once.
    var maxStreamsInFlight = 0
}

/// Immutable state every slot reads.
final class ClientShared: Sendable {
    let endpoint: Endpoint
    let tls: TLSClientContext?
    let tokens: TokenProvider?
    let clock: any PushClock
    let requestTimeout: Duration
    let connectTimeout: Duration
    let pingInterval: Duration
    /// How long a PING may go unanswered before the connection counts as dead.
    let pingTimeout: Duration

    init(endpoint: Endpoint, tls: TLSClientContext?, tokens: TokenProvider?, clock: any PushClock,
         requestTimeout: Duration, connectTimeout: Duration, pingInterval: Duration) {
        self.endpoint = endpoint
        self.tls = tls
        self.tokens = tokens
        self.clock = clock
        self.requestTimeout = requestTimeout
        self.connectTimeout = connectTimeout
        self.pingInterval = pingInterval
        // At least 1 s (a loaded machine must not look dead), at most 10 s.
        pingTimeout = min(max(pingInterval, .seconds(1)), .seconds(10))
    }
}

/// One push on its way: created by `send`, then owned by one slot thread until completed.
/// A class: it moves through the inbox, the queue and a stream, and retries mutate it, all
/// without copying the request.
///
/// `@unchecked Sendable`: `body` and `local` are set by `send` before the push is handed over
/// through the inbox's Mutex; after that only the slot thread reads or writes it.
final class PendingPush: @unchecked Sendable {
    let request: PushRequest
    /// The `apns-id` sent: the response callbacks compare the echoed one with it.
    var apnsID: String { request.apnsID.text }
    let completion: @Sendable (PushResult) -> Void
    /// Monotonic: queueing, retries and the wait for the response all fit inside it.
    let deadline: ContinuousClock.Instant
    /// Retries after a connection was lost before any body byte left (at most one), or after
    /// ExpiredProviderToken (at most one).
    var attempt = 0
    /// Retries after the server refused the stream unprocessed (bounded, inside the deadline).
    var refusals = 0
    var body: [UInt8] = []
    /// Refused before any I/O; completed on the slot thread like everything else.
    var local: PushResult?

    init(request: PushRequest, completion: @escaping @Sendable (PushResult) -> Void, deadline: ContinuousClock.Instant) {
        self.request = request
        self.completion = completion
        self.deadline = deadline
    }
}

/// The one shared provider token of a key: TokenPolicy decides, this signs and caches.
final class TokenProvider: Sendable {
    private let key: TokenKey
    private struct State {
        var policy = TokenPolicy()
        var jwt: String?
        var jwtGeneration = 0
    }
    private let state = Mutex(State())

    init(key: TokenKey) { self.key = key }

    /// The token for the next request on `slot`, and whether that slot must reconnect first.
    func token(slot: Int, now: Date) throws -> (jwt: String, generation: Int, freshConnection: Bool) {
        try state.withLock { s in
            let use = s.policy.tokenForRequest(connection: slot, now: now)
            if s.jwt == nil || s.jwtGeneration != use.token.generation {
                // Signing takes ~50 us and happens once per 50 minutes: fine under the lock.
                s.jwt = try ProviderToken.make(key: key, issuedAt: use.token.issuedAt)
                s.jwtGeneration = use.token.generation
            }
            return (s.jwt!, use.token.generation, use.freshConnection)
        }
    }

    func expired(generation: Int, now: Date) { state.withLock { $0.policy.expired(generation: generation, now: now) } }
    func requestRefresh(now: Date) { state.withLock { _ = $0.policy.requestRefresh(now: now) } }
    func connectionReset(slot: Int) { state.withLock { $0.policy.connectionReset(connection: slot) } }
    func connectionOpened(slot: Int, generation: Int, now: Date) {
        state.withLock { $0.policy.connectionOpened(connection: slot, generation: generation, now: now) }
    }
}

/// Counters a slot thread bumps and tests read.
final class SlotStats: Sendable {
    let connectionsOpened = Atomic<Int>(0)
    let pingsSent = Atomic<Int>(0)
    let pingAcks = Atomic<Int>(0)
    let deadConnections = Atomic<Int>(0)
    let refusedRetries = Atomic<Int>(0)
    let maxStreamsInFlight = Atomic<Int>(0)
}

/// Runs `body` on a new joinable POSIX thread (no Foundation Thread needed).
private final class ThreadBody {
    let run: () -> Void
    init(_ run: @escaping () -> Void) { self.run = run }
}

private func spawnThread(name: String, _ body: @escaping () -> Void) throws -> pthread_t {
    let box = Unmanaged.passRetained(ThreadBody {
        // pthread_setname_np is GNU-only and does not import; the kernel's per-thread comm
        // file is the same thing (shown by top -H / ps -L). Best effort.
        let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
        if fd >= 0 {
            let bytes = Array(name.utf8.prefix(15))
            _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            close(fd)
        }
        body()
    }).toOpaque()
    var tid = pthread_t()
    let rc = pthread_create(&tid, nil, { arg in
        Unmanaged<ThreadBody>.fromOpaque(arg!).takeRetainedValue().run()
        return nil
    }, box)
    guard rc == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(box).release()
        throw PushClientError.invalidConfiguration("cannot start a connection thread: \(String(cString: strerror(rc)))")
    }
    return tid
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
    private let shared: ClientShared
    private struct Inbox {
        var pending: [PendingPush] = []
        var stopping = false
        var thread: pthread_t?
        var joined = false
    }
    private let inbox = Mutex(Inbox())
    private let wakeRead: Int32
    private let wakeWrite: Int32

    // Slot-thread state.
    private var current: H2Connection?
    private var draining: [H2Connection] = []
    /// Pushes waiting for a stream, oldest first (retries go to the front).
    private var queue: [PendingPush] = []
    private var queueHead = 0
    /// The next push must go to a fresh connection (a stream timed out on the current one).
    private var reconnectNext = false
    private var stopping = false
    /// No stream deadline is earlier than this (conservative: may be stale-early, never late).
    private var earliestStreamDeadline = ContinuousClock.Instant.now + .seconds(86_400)
    private var authorization: (generation: Int, value: String)?
    private let scheme: String

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
        let tid = try spawnThread(name: "apns-slot-\(index)") { [self] in run() }
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
                if let local = p.local { complete(p, local) } else { queue.append(p) }
            }
            let now = ContinuousClock.now
            expire(now)
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

    /// Pushes whose deadline passed: queued ones complete, in-flight ones are reset.
    private func expire(_ now: ContinuousClock.Instant) {
        if queueHead < queue.count, queue[queueHead...].contains(where: { $0.deadline <= now }) {
            var kept: [PendingPush] = []
            var expired: [PendingPush] = []
            for p in queue[queueHead...] { if p.deadline <= now { expired.append(p) } else { kept.append(p) } }
            do {
                queue = kept
                queueHead = 0
                let why = current.map { $0.wasReady ? "waiting for a free stream" : "still connecting to \(shared.endpoint.authority)" }
                    ?? "no connection"
                for p in expired { complete(p, .transportFailure("timeout: request timed out before it could be sent (\(why))")) }
            }
        }
        guard now >= earliestStreamDeadline else { return }
        var earliest = now + .seconds(86_400)
        for c in [current].compactMap({ $0 }) + draining {
            for st in c.session.streams.values where !st.done {
                if st.push.deadline <= now {
                    st.done = true
                    c.session.cancel(st)
                    // The connection may be black-holed: this slot's next push goes to a fresh one.
                    if c === current { reconnectNext = true }
                    complete(st.push, .transportFailure("timeout: no response within requestTimeout (stream \(st.id))"))
                } else if st.push.deadline < earliest {
                    earliest = st.push.deadline
                }
            }
        }
        earliestStreamDeadline = earliest
    }

    /// Connection upkeep: replace dead or retired connections, PING idle ones, close drained ones.
    private func maintain(_ now: ContinuousClock.Instant) {
        if let c = current {
            if !c.wasReady && c.state != .closed && now >= c.connectDeadline {
                c.fail("timeout: no HTTP/2 connection to \(shared.endpoint.authority) within connectTimeout ("
                       + (c.isOpen ? "no SETTINGS from the server" : c.state == .handshaking ? "TLS handshake" : "TCP connect") + ")")
                reap(c)
            } else if c.isOpen && c.wasReady {
                if let sent = c.pingSentAt {
                    if now - sent >= shared.pingTimeout {
                        stats.deadConnections.add(1, ordering: .relaxed)
                        c.fail("no PING ACK within \(shared.pingTimeout): connection presumed dead")
                        reap(c)
                    }
                } else if c.streamCount == 0 && now - c.lastActivity >= shared.pingInterval {
                    if let error = c.session.ping() {
                        c.fail(error)
                        reap(c)
                    } else {
                        c.pingSentAt = now
                        stats.pingsSent.add(1, ordering: .relaxed)
                    }
                }
            }
            if let c = current, c.retired || c.state == .closed { retireCurrent() }
        }
        draining.removeAll { d in
            if d.state == .closed { return true }
            if d.isOpen && d.streamCount == 0 {
                d.closeGracefully()
                return true
            }
            // Only streams we already gave up on (timed out, RST_STREAM not yet written, maybe
            // never: the connection may be black-holed): nothing left to wait for.
            if d.session.streams.values.allSatisfy({ $0.done }) {
                d.fail("abandoned after its remaining streams timed out")
                reap(d)
                return true
            }
            return false
        }
        if current == nil && queueHead < queue.count && !stopping { openConnection() }
    }

    private func retireCurrent() {
        guard let c = current else { return }
        c.retired = true
        current = nil
        if c.state != .closed && c.streamCount > 0 { draining.append(c) } else if c.state != .closed { c.closeGracefully() }
    }

    private func openConnection() {
        do {
            current = try H2Connection(endpoint: shared.endpoint, tlsContext: shared.tls, connectTimeout: shared.connectTimeout)
            stats.connectionsOpened.add(1, ordering: .relaxed)
        } catch {
            failQueue("\(error)")
        }
    }

    private func failQueue(_ message: String) {
        let all = queue[queueHead...]
        queue.removeAll(keepingCapacity: true)
        queueHead = 0
        for p in all { complete(p, .transportFailure(message)) }
    }

    /// Starts queued pushes while the current connection has room under the server's limit.
    private func submitQueued() {
        while queueHead < queue.count, let c = current, c.hasStreamCapacity {
            let p = queue[queueHead]
            if reconnectNext {
                reconnectNext = false
                shared.tokens?.connectionReset(slot: index)
                if c.requestsCarried > 0 {
                    retireCurrent()
                    openConnection()
                    return
                }
            }
            var generation: Int? = nil
            var auth: String? = nil
            if let tokens = shared.tokens {
                do {
                    let t = try tokens.token(slot: index, now: shared.clock.now())
                    // A token change this soon on this connection would earn a 429: new connection.
                    if t.freshConnection && c.requestsCarried > 0 {
                        retireCurrent()
                        openConnection()
                        return
                    }
                    generation = t.generation
                    if authorization?.generation != t.generation { authorization = (t.generation, "bearer " + t.jwt) }
                    auth = authorization!.value
                } catch {
                    queueHead += 1
                    complete(p, .transportFailure("cannot sign provider token: \(error)"))
                    continue
                }
            }
            queueHead += 1
            let st = ClientStream(push: p, tokenGeneration: generation)
            do {
                try c.session.submit(st, scheme: scheme, authority: shared.endpoint.authority, head: Self.head(p.request, authorization: auth))
            } catch {
                complete(p, .transportFailure("\(error)"))
                continue
            }
            if c.requestsCarried == 0, let generation, let tokens = shared.tokens {
                // The token's first use on this connection is now, not when the policy chose it.
                tokens.connectionOpened(slot: index, generation: generation, now: shared.clock.now())
            }
            c.requestsCarried += 1
            if c.streamCount > stats.maxStreamsInFlight.load(ordering: .relaxed) {
                stats.maxStreamsInFlight.store(c.streamCount, ordering: .relaxed)
            }
            if p.deadline < earliestStreamDeadline { earliestStreamDeadline = p.deadline }
        }
        if queueHead > 0 && queueHead == queue.count {
            queue.removeAll(keepingCapacity: true)
            queueHead = 0
        }
    }

    /// The request headers after the pseudo-headers, in a fixed order.
    static func head(_ r: PushRequest, authorization: String?) -> RequestHead {
        var fields: [(name: StaticString, value: String)] = [
            ("apns-push-type", "accessory"),
            ("apns-topic", r.topic),
            ("apns-id", r.apnsID.text),
        ]
        if let e = r.expiration { fields.append(("apns-expiration", String(e))) }
        if let p = r.priority { fields.append(("apns-priority", String(p))) }
        if let authorization { fields.append(("authorization", authorization)) }
        fields.append(("content-type", "application/json"))
        return RequestHead(path: "/3/device/" + r.deviceToken.lowercased(), fields: fields)
    }

    private func reapAll() {
        if let c = current { reap(c) }
        for d in draining { reap(d) }
        if let c = current, c.state == .closed { retireCurrent() }
    }

    /// Handles streams that ended, PING ACKs, GOAWAY, and a connection that closed.
    private func reap(_ c: H2Connection) {
        if c.takePingAcks() > 0 {
            c.pingSentAt = nil
            stats.pingAcks.add(1, ordering: .relaxed)
        }
        if c.session.goAway != nil { c.retired = true }
        if !c.session.finished.isEmpty {
            let done = c.session.finished
            c.session.finished.removeAll(keepingCapacity: true)
            for st in done { finish(st) }
        }
        if c.state == .closed {
            let reason = c.failure ?? "connection closed"
            // A connection that never opened failed its setup: the pushes waiting for it get
            // that error now rather than a timeout later.
            if !c.wasReady && c === current { failQueue(reason) }
            for st in c.session.abandonAll() where !st.done { lost(st, reason: reason) }
        }
    }

    private func finish(_ st: ClientStream) {
        guard !st.done else { return }
        st.done = true
        if st.responseComplete && st.status > 0 { return respond(st) }
        if st.refused { return retryRefused(st.push) }
        lost(st, reason: "stream \(st.id) reset by server (\(H2ClientSession.errorName(st.closeCode ?? 0)))")
    }

    /// The stream never completed. Send it again only when APNs cannot have acted on it.
    private func lost(_ st: ClientStream, reason: String) {
        st.done = true
        if st.refused || !st.headersSent { return retryRefused(st.push) }
        if st.bodyBytesSent == 0 && st.push.attempt == 0 {
            st.push.attempt += 1
            reconnectNext = true
            return requeue(st.push)
        }
        complete(st.push, .transportFailure(reason))
    }

    private func retryRefused(_ p: PendingPush) {
        guard p.refusals < 5 else { return complete(p, .transportFailure("refused by the server 5 times (GOAWAY or REFUSED_STREAM)")) }
        p.refusals += 1
        stats.refusedRetries.add(1, ordering: .relaxed)
        requeue(p)
    }

    private func requeue(_ p: PendingPush) {
        if stopping { return complete(p, .transportFailure("shutdown")) }
        if queueHead > 0 {
            queueHead -= 1
            queue[queueHead] = p
        } else {
            queue.insert(p, at: 0)
        }
    }

    private func respond(_ st: ClientStream) {
        let p = st.push
        let result = Self.result(status: st.status, apnsID: st.apnsID, uniqueID: st.uniqueID, body: st.responseBody, sentID: p.apnsID)
        if case .rejected(_, let reason, _) = result, let gen = st.tokenGeneration, let tokens = shared.tokens {
            let now = shared.clock.now()
            if reason == .expiredProviderToken {
                tokens.expired(generation: gen, now: now)
                // Rejected, so never delivered: one retry with the new token is safe.
                if p.attempt == 0 {
                    p.attempt += 1
                    return requeue(p)
                }
            } else if reason == .invalidProviderToken {
                tokens.requestRefresh(now: now)
            }
        }
        complete(p, result)
    }

    private func complete(_ p: PendingPush, _ result: PushResult) {
        outstanding.subtract(1, ordering: .relaxed)
        p.completion(result)
    }

    private func pollTimeoutMS(now: ContinuousClock.Instant) -> Int32 {
        var wake = now + .seconds(1)
        if queueHead < queue.count {
            for p in queue[queueHead...] where p.deadline < wake { wake = p.deadline }
        }
        if earliestStreamDeadline < wake { wake = earliestStreamDeadline }
        if let c = current {
            if !c.wasReady { wake = min(wake, c.connectDeadline) }
            if c.isOpen && c.wasReady {
                if let sent = c.pingSentAt { wake = min(wake, sent + shared.pingTimeout) }
                else if c.streamCount == 0 { wake = min(wake, c.lastActivity + shared.pingInterval) }
            }
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

    /// Maps an HTTP response to a PushResult (pure; unit tested).
    static func result(status: Int, apnsID: String?, uniqueID: String?, body: [UInt8], sentID: String) -> PushResult {
        if status == 200 {
            return .delivered(apnsID: apnsID ?? sentID, uniqueID: uniqueID)
        }
        var reason = APNsReason.unknown("")
        var timestamp: Date? = nil
        if let parsed = try? JSONDecoder().decode(ErrorBody.self, from: Data(body)) {
            if let r = parsed.reason { reason = APNsReason(rawValue: r) }
            if status == 410, let ms = parsed.timestamp { timestamp = Date(timeIntervalSince1970: ms / 1000) }
        }
        return .rejected(status: status, reason: reason, timestamp: timestamp)
    }
}

/// APNs' error body: {"reason": "...", "timestamp": <ms since 1970, 410 only>}.
private struct ErrorBody: Decodable {
    var reason: String?
    var timestamp: Double?
}
