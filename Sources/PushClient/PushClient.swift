// The APNs client: validates and shapes each push, picks the least-busy connection slot, and
// hands it to that slot's thread, which owns one curl multi handle (= one HTTP/2 connection).
// See docs/pushclient.md for the threading and reconnection design.
import Foundation
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
        let base = configuration.environment.baseURL
        guard base.hasPrefix("https://") || base.hasPrefix("http://") else {
            throw PushClientError.invalidConfiguration("environment URL must start with https:// or http://, got \(base)")
        }
        if let ca = configuration.caFile, !FileManager.default.isReadableFile(atPath: ca) {
            throw PushClientError.invalidConfiguration("caFile \(ca) is not readable")
        }
        var certificate: (String, String, String?)? = nil
        var tokens: TokenProvider? = nil
        switch configuration.credentials {
        case .token(let key):
            tokens = TokenProvider(key: key)
        case .certificate(let cert, let key, let pass):
            guard FileManager.default.isReadableFile(atPath: cert) else {
                throw PushClientError.invalidConfiguration("certificatePath \(cert) is not readable")
            }
            certificate = (cert, key, pass)
        }
        let options = CurlConnectionOptions(
            http2PriorKnowledge: base.hasPrefix("http://"), caFile: configuration.caFile,
            certificate: certificate,
            requestTimeoutMS: Self.milliseconds(configuration.requestTimeout),
            connectTimeoutMS: Self.milliseconds(configuration.connectTimeout),
            keepaliveSeconds: max(1, Self.milliseconds(configuration.pingInterval) / 1000))
        shared = ClientShared(baseURL: base, options: options, tokens: tokens,
                              clock: configuration.clock, requestTimeout: configuration.requestTimeout)
        var slots: [ConnectionSlot] = []
        for i in 0..<configuration.connections { slots.append(try ConnectionSlot(index: i, shared: shared)) }
        self.slots = slots
        for s in slots { s.start() }
    }

    deinit { shutdown() }

    /// Thread-safe and never blocks. `completion` runs exactly once, on a client thread: keep
    /// it short (it delays other pushes on that connection).
    public func send(_ request: PushRequest, completion: @escaping @Sendable (PushResult) -> Void) {
        var push = PendingPush(request: request, completion: completion,
                               deadline: .now + shared.requestTimeout, attempt: 0, body: [], local: nil)
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

    /// Local refusals use the status and reason APNs itself would return, without any I/O.
    static func validate(_ r: PushRequest) -> PushResult? {
        if r.deviceToken.isEmpty { return .rejected(status: 400, reason: .missingDeviceToken, timestamp: nil) }
        if r.deviceToken.count > 400 || !r.deviceToken.utf8.allSatisfy({ $0.isHexDigit }) {
            return .rejected(status: 400, reason: .badDeviceToken, timestamp: nil)
        }
        if r.bundleID.isEmpty { return .rejected(status: 400, reason: .missingTopic, timestamp: nil) }
        if !r.bundleID.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: ":") }) {
            return .rejected(status: 400, reason: .badTopic, timestamp: nil)
        }
        if let p = r.priority, ![10, 5, 1].contains(p) { return .rejected(status: 400, reason: .badPriority, timestamp: nil) }
        if let e = r.expiration, e < 0 { return .rejected(status: 400, reason: .badExpirationDate, timestamp: nil) }
        return nil
    }

    static func milliseconds(_ d: Duration) -> Int {
        let (s, atto) = d.components
        return Int(s) * 1000 + Int(atto / 1_000_000_000_000_000)
    }
}

private extension UInt8 {
    var isHexDigit: Bool { (0x30...0x39).contains(self) || (0x61...0x66).contains(self) || (0x41...0x46).contains(self) }
}

/// Immutable state every slot reads.
final class ClientShared: Sendable {
    let baseURL: String
    let options: CurlConnectionOptions
    let tokens: TokenProvider?
    let clock: any PushClock
    let requestTimeout: Duration

    init(baseURL: String, options: CurlConnectionOptions, tokens: TokenProvider?, clock: any PushClock, requestTimeout: Duration) {
        self.baseURL = baseURL
        self.options = options
        self.tokens = tokens
        self.clock = clock
        self.requestTimeout = requestTimeout
    }
}

struct PendingPush: Sendable {
    let request: PushRequest
    let completion: @Sendable (PushResult) -> Void
    /// Monotonic: queueing, retries and libcurl's own timeout all fit inside it.
    let deadline: ContinuousClock.Instant
    var attempt: Int
    var body: [UInt8]
    /// Refused before any I/O; completed on the slot thread like everything else.
    var local: PushResult?
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

/// Travels inside a CurlTransfer so the completion finds its push (slot-thread only).
private final class TransferContext {
    let push: PendingPush
    let tokenGeneration: Int?
    init(push: PendingPush, tokenGeneration: Int?) {
        self.push = push
        self.tokenGeneration = tokenGeneration
    }
}

/// One HTTP/2 connection: a thread that owns a curl multi handle (MAX_HOST_CONNECTIONS 1).
///
/// `@unchecked Sendable`: `inbox` is a Mutex and `outstanding` an Atomic; the wake pipe's fds
/// are immutable and write(2) is thread-safe; `multi`, `draining`, `retries` and
/// `reconnectNext` are touched only by `thread` (created in `start`, joined in `join`).
final class ConnectionSlot: @unchecked Sendable {
    let index: Int
    let outstanding = Atomic<Int>(0)
    private let shared: ClientShared
    private struct Inbox {
        var pending: [PendingPush] = []
        var stopping = false
        var started = false
        var finished = false
    }
    private let inbox = Mutex(Inbox())
    private let exited = DispatchSemaphore(value: 0)
    private let wakeRead: Int32
    private let wakeWrite: Int32

    // Slot-thread state.
    private var multi: CurlMulti?
    private var draining: [CurlMulti] = []
    private var retries: [PendingPush] = []
    private var reconnectNext = false
    private var resetBudget = ResetBudget()
    /// Finished transfers (easy handles) kept for reuse.
    private var pool: [CurlTransfer] = []
    private let epoch = ContinuousClock.now

    init(index: Int, shared: ClientShared) throws {
        self.index = index
        self.shared = shared
        var fds: [Int32] = [0, 0]
        // A self-pipe rather than curl_multi_wakeup: it stays valid while the slot swaps its
        // multi handle for a fresh connection, and is polled via curl_multi_poll's extra fds.
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

    func start() {
        inbox.withLock { $0.started = true }
        let thread = Thread { [self] in
            run()
            exited.signal()
        }
        thread.name = "apns-slot-\(index)"
        thread.start()
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
        let wait = inbox.withLock { box -> Bool in
            guard box.started, !box.finished else { return false }
            box.finished = true
            return true
        }
        if wait { exited.wait() }
    }

    private func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)   // EAGAIN = pipe already full = already awake
    }

    private func drainWakePipe() {
        var buf = [UInt8](repeating: 0, count: 256)
        while read(wakeRead, &buf, buf.count) > 0 {}
    }

    // MARK: slot thread

    private func run() {
        while true {
            drainWakePipe()
            let (batch, stopping) = inbox.withLock { box -> ([PendingPush], Bool) in
                defer { box.pending.removeAll() }
                return (box.pending, box.stopping)
            }
            if stopping {
                for p in batch { complete(p, p.local ?? .transportFailure("shutdown")) }
                for p in retries { complete(p, .transportFailure("shutdown")) }
                retries.removeAll()
                drainForShutdown()
                return
            }
            let toStart = retries + batch
            retries.removeAll()
            for p in toStart { start(p) }
            performAll()
            do {
                if multi == nil { multi = try CurlMulti() }
                // While an old connection drains we must also drive it: poll briefly.
                try multi!.poll(wakeFD: wakeRead, timeoutMS: draining.isEmpty && retries.isEmpty ? 1000 : 5)
            } catch {
                // A broken multi handle: fail what it holds and start over with a new one.
                failAll(in: multi, "\(error)")
                multi = nil
                Thread.sleep(forTimeInterval: 0.01)
            }
        }
    }

    private func start(_ p: PendingPush) {
        if let local = p.local { return complete(p, local) }
        let remaining = ContinuousClock.now.duration(to: p.deadline)
        let remainingMS = PushClient.milliseconds(remaining)
        guard remainingMS > 0 else { return complete(p, .transportFailure("timeout: request timed out before it could be sent")) }
        var headers = [
            "apns-push-type: accessory",
            "apns-topic: \(p.request.topic)",
            "apns-id: \(p.request.apnsIDString)",
            "content-type: application/json",
            "Accept:",   // drop libcurl's default "Accept: */*"
        ]
        if let e = p.request.expiration { headers.append("apns-expiration: \(e)") }
        if let pr = p.request.priority { headers.append("apns-priority: \(pr)") }
        // Reconnect first, so the token policy sees the new connection's first use.
        let since = epoch.duration(to: .now).components
        if resetBudget.shouldReplace(now: Double(since.seconds) + Double(since.attoseconds) / 1e18) {
            reconnectNext = true
        }
        if reconnectNext {
            reconnectNext = false
            shared.tokens?.connectionReset(slot: index)
            replaceConnection()
        }
        var generation: Int? = nil
        if let tokens = shared.tokens {
            do {
                let t = try tokens.token(slot: index, now: shared.clock.now())
                headers.append("authorization: bearer \(t.jwt)")
                generation = t.generation
                if t.freshConnection { replaceConnection() }
            } catch {
                return complete(p, .transportFailure("cannot sign provider token: \(error)"))
            }
        }
        do {
            if multi == nil { multi = try CurlMulti() }
            let t = try pool.popLast() ?? CurlTransfer(options: shared.options)
            try t.prepare(url: shared.baseURL + "/3/device/" + p.request.deviceToken.lowercased(),
                          headers: headers, body: p.body, timeoutMS: remainingMS)
            t.context = TransferContext(push: p, tokenGeneration: generation)
            try multi!.add(t)
            resetBudget.started()
        } catch {
            complete(p, .transportFailure("\(error)"))
        }
    }

    /// New requests go to a new connection; the old one finishes its streams, then closes.
    private func replaceConnection() {
        if let m = multi, m.count > 0 { draining.append(m) }
        multi = nil
        resetBudget.reset()
    }

    private func performAll() {
        if let m = multi {
            do { for (t, o) in try m.perform() { finish(t, o) } } catch {
                failAll(in: m, "\(error)")
                multi = nil
            }
        }
        for d in draining {
            do { for (t, o) in try d.perform() { finish(t, o) } } catch { failAll(in: d, "\(error)") }
        }
        draining.removeAll { $0.count == 0 }
    }

    private func finish(_ t: CurlTransfer, _ o: CurlOutcome) {
        defer {
            t.context = nil
            if pool.count < 1024 { pool.append(t) }
        }
        guard let ctx = t.context as? TransferContext else { return }
        let p = ctx.push
        // libcurl reconnected on its own (after GOAWAY or a dead connection): the token this
        // transfer carried was first used on the new connection no earlier than now.
        if o.newConnections > 0, let gen = ctx.tokenGeneration, let tokens = shared.tokens {
            tokens.connectionOpened(slot: index, generation: gen, now: shared.clock.now())
        }
        if o.ok {
            let result = Self.result(status: o.status, headers: t.responseHeaders, body: t.responseBody, sentID: p.request.apnsIDString)
            if case .rejected(_, let reason, _) = result, let gen = ctx.tokenGeneration, let tokens = shared.tokens {
                let now = shared.clock.now()
                if reason == .expiredProviderToken {
                    tokens.expired(generation: gen, now: now)
                    // Rejected, so never delivered: one retry with the new token is safe.
                    if p.attempt == 0 { return retry(p) }
                } else if reason == .invalidProviderToken {
                    tokens.requestRefresh(now: now)
                }
            }
            return complete(p, result)
        }
        if o.timedOut {
            // A stream that timed out may sit on a black-holed connection: new requests of this
            // slot go to a fresh one.
            reconnectNext = true
            return complete(p, .transportFailure("timeout: \(o.message)"))
        }
        // Lost before any body byte left us (GOAWAY refusal, reset before sending): APNs
        // cannot have acted on it, so one retry on a new connection cannot duplicate it.
        if o.connectionLost && o.bytesUploaded == 0 && p.attempt == 0 {
            reconnectNext = true
            return retry(p)
        }
        complete(p, .transportFailure(o.message))
    }

    private func retry(_ p: PendingPush) {
        var again = p
        again.attempt += 1
        retries.append(again)
    }

    private func failAll(in m: CurlMulti?, _ message: String) {
        guard let m else { return }
        for t in m.abandonAll() {
            if let ctx = t.context as? TransferContext { complete(ctx.push, .transportFailure(message)) }
        }
    }

    private func complete(_ p: PendingPush, _ result: PushResult) {
        outstanding.subtract(1, ordering: .relaxed)
        p.completion(result)
    }

    private func drainForShutdown() {
        let grace = min(shared.requestTimeout, .seconds(2))
        let end = ContinuousClock.now + grace
        while ContinuousClock.now < end, (multi?.count ?? 0) > 0 || !draining.isEmpty {
            performAll()
            if let m = multi { try? m.poll(wakeFD: wakeRead, timeoutMS: 10) } else { Thread.sleep(forTimeInterval: 0.005) }
            drainWakePipe()
        }
        failAll(in: multi, "shutdown")
        for d in draining { failAll(in: d, "shutdown") }
        for p in retries { complete(p, .transportFailure("shutdown")) }
        retries.removeAll()
        multi = nil
        draining.removeAll()
        pool.removeAll()
    }

    /// Maps an HTTP response to a PushResult (pure; unit tested).
    static func result(status: Int, headers: [String: String], body: [UInt8], sentID: String) -> PushResult {
        if status == 200 {
            return .delivered(apnsID: headers["apns-id"] ?? sentID, uniqueID: headers["apns-unique-id"])
        }
        var reason = APNsReason.unknown("")
        var timestamp: Date? = nil
        if let obj = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] {
            if let r = obj["reason"] as? String { reason = APNsReason(rawValue: r) }
            if status == 410, let ms = obj["timestamp"] as? NSNumber {
                timestamp = Date(timeIntervalSince1970: ms.doubleValue / 1000)
            }
        }
        return .rejected(status: status, reason: reason, timestamp: timestamp)
    }
}
