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
        guard configuration.answerWaitCap >= configuration.requestTimeout else {
            throw PushClientError.invalidConfiguration("answerWaitCap must be at least requestTimeout")
        }
        guard configuration.queueWaitCap > .zero else {
            throw PushClientError.invalidConfiguration("queueWaitCap must be positive")
        }
        guard configuration.pingInterval > .zero else {
            throw PushClientError.invalidConfiguration("pingInterval must be positive")
        }
        let pacing = configuration.connectionPacing
        guard pacing.backoffBase > .zero, pacing.backoffCap >= pacing.backoffBase, pacing.maxNewConnections >= 1,
              pacing.window > .zero else {
            throw PushClientError.invalidConfiguration("connectionPacing needs backoffBase > 0, backoffCap >= backoffBase, maxNewConnections >= 1 and window > 0")
        }
        let endpoint = try Endpoint(url: configuration.environment.baseURL)
        if let ca = configuration.caFile, access(ca, R_OK) != 0 {
            throw PushClientError.invalidConfiguration("caFile \(ca) is not readable")
        }
        var certificate: (String, String, String?)? = nil
        var tokens: TokenProvider? = nil
        switch configuration.credentials {
        case .token(let key):
            tokens = (configuration.tokenRegistry ?? TokenRegistry()).provider(for: key, now: configuration.clock.now())
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
                              requestTimeout: configuration.requestTimeout, answerWaitCap: configuration.answerWaitCap,
                              queueWaitCap: configuration.queueWaitCap, connectTimeout: configuration.connectTimeout,
                              pingInterval: configuration.pingInterval, pacing: pacing,
                              firstTokenConnection: tokens?.reserveConnections(configuration.connections) ?? 0)
        // OpenSSL's socket BIO writes with plain write(2): a server that closed its end would
        // raise SIGPIPE, whose default action kills the process. Ignore it process-wide (as
        // HTTPServer does for libuv); the write then fails with EPIPE and the connection closes.
        signal(SIGPIPE, SIG_IGN)
        var slots: [ConnectionSlot] = []
        for i in 0..<configuration.connections { slots.append(try ConnectionSlot(index: i, shared: shared)) }
        self.slots = slots
        for s in slots { try s.start() }
    }

    deinit {
        shutdown()
        shared.tokens?.releaseConnections(first: shared.firstTokenConnection, count: slots.count)
    }

    /// This client's provider token source (nil with certificate credentials).
    public var tokenProvider: TokenProvider? { shared.tokens }

    /// Thread-safe and never blocks. `completion` runs exactly once, on a client thread: keep
    /// it short (it delays other pushes on that connection).
    public func send(_ request: PushRequest, completion: @escaping @Sendable (PushResult) -> Void) {
        let push = PendingPush(request: request, completion: completion)
        push.notSentBy = .now + shared.queueWaitCap
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
            total.timeoutPings += s.stats.timeoutPings.load(ordering: .relaxed)
            total.openingsDeferred += s.stats.openingsDeferred.load(ordering: .relaxed)
            total.answersAwaitedPastTimeout += s.stats.answersAwaitedPastTimeout.load(ordering: .relaxed)
            total.lateAnswers += s.stats.lateAnswers.load(ordering: .relaxed)
            total.answerWaitsCapped += s.stats.answerWaitsCapped.load(ordering: .relaxed)
            total.notSent += s.stats.notSent.load(ordering: .relaxed)
            total.maxStreamsInFlight = max(total.maxStreamsInFlight, s.stats.maxStreamsInFlight.load(ordering: .relaxed))
        }
    }
}

/// How a slow APNs was waited for, summed over every client in the process (the relay exports
/// them; a reload's new client keeps counting): docs/pushclient.md, "Timeouts, health, reconnection".
public struct AnswerWaitCounts: Sendable, Equatable {
    /// Written requests still unanswered at requestTimeout on a live connection, kept waiting.
    public var awaitedPastTimeout = 0
    /// Of those, the ones whose answer then arrived.
    public var answeredLate = 0
    /// Of those, the ones failed at answerWaitCap.
    public var capped = 0
    /// Pushes failed unsent after queueWaitCap.
    public var notSent = 0

    public init(awaitedPastTimeout: Int = 0, answeredLate: Int = 0, capped: Int = 0, notSent: Int = 0) {
        self.awaitedPastTimeout = awaitedPastTimeout
        self.answeredLate = answeredLate
        self.capped = capped
        self.notSent = notSent
    }

    static let awaitedTotal = Atomic<Int>(0)
    static let answeredLateTotal = Atomic<Int>(0)
    static let cappedTotal = Atomic<Int>(0)
    static let notSentTotal = Atomic<Int>(0)

    /// The process-wide totals so far.
    public static var process: AnswerWaitCounts {
        AnswerWaitCounts(awaitedPastTimeout: awaitedTotal.load(ordering: .relaxed), answeredLate: answeredLateTotal.load(ordering: .relaxed),
                         capped: cappedTotal.load(ordering: .relaxed), notSent: notSentTotal.load(ordering: .relaxed))
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
    /// PINGs sent because a stream timed out (the answer decides whether the connection stays).
    var timeoutPings = 0
    /// Times a slot wanted a connection and the pacer made it wait.
    var openingsDeferred = 0
    /// Written requests still unanswered at requestTimeout on a live connection, kept waiting.
    var answersAwaitedPastTimeout = 0
    /// Of those, the ones whose answer then arrived.
    var lateAnswers = 0
    /// Of those, the ones failed at answerWaitCap (RST_STREAM CANCEL).
    var answerWaitsCapped = 0
    /// Pushes failed unsent after queueWaitCap.
    var notSent = 0
}

/// Immutable state every slot reads.
final class ClientShared: Sendable {
    let endpoint: Endpoint
    let tls: TLSClientContext?
    let tokens: TokenProvider?
    let clock: any PushClock
    let requestTimeout: Duration
    let answerWaitCap: Duration
    let queueWaitCap: Duration
    let connectTimeout: Duration
    let pingInterval: Duration
    /// How long a PING may go unanswered before the connection counts as dead.
    let pingTimeout: Duration
    /// One pacer for all slots: a server that refuses one slot refuses the others too.
    let pacer: Mutex<ConnectionPacer>
    let random: @Sendable () -> Double
    /// Slot i is connection `firstTokenConnection + i` to the (possibly shared) TokenProvider.
    let firstTokenConnection: Int

    init(endpoint: Endpoint, tls: TLSClientContext?, tokens: TokenProvider?, clock: any PushClock,
         requestTimeout: Duration, answerWaitCap: Duration, queueWaitCap: Duration,
         connectTimeout: Duration, pingInterval: Duration, pacing: ConnectionPacing,
         firstTokenConnection: Int = 0, random: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }) {
        self.firstTokenConnection = firstTokenConnection
        self.endpoint = endpoint
        self.tls = tls
        self.tokens = tokens
        self.clock = clock
        self.requestTimeout = requestTimeout
        self.answerWaitCap = answerWaitCap
        self.queueWaitCap = queueWaitCap
        self.connectTimeout = connectTimeout
        self.pingInterval = pingInterval
        pacer = Mutex(ConnectionPacer(pacing))
        self.random = random
        // At least 1 s (a loaded machine must not look dead), at most 10 s.
        pingTimeout = min(max(pingInterval, .seconds(1)), .seconds(10))
    }
}
