// The lifecycle of one server connection as a value: which phase it is in (PROXY header,
// serving a protocol, draining its output before a close, lingering, closed) and whether it
// reads. Events go in as methods; what the connection must do comes back as an action, so
// every transition is unit tested without a socket (ServerConnectionStateTests).
// ServerConnection performs the actions: socket calls, parsing, TLS.

/// The protocol a connection speaks. `.sniffing`: cleartext HTTP/2 is allowed and the first
/// bytes have not yet shown whether they are the h2c preface (or, under TLS, ALPN chose
/// neither).
enum ConnectionProtocol: Equatable {
    case sniffing, http1, http2
}

struct ServerConnectionState {
    enum Phase: Equatable {
        /// PROXY protocol: nothing else is read until the header arrived; then `next`.
        case awaitingProxyHeader(next: ConnectionProtocol)
        case open(ConnectionProtocol)
        /// Closes once the output (and the socket's queued writes) drained. `abrupt`: that
        /// close skips the FIN-and-linger (`.close` actions, timeouts, TLS handshake failures).
        case draining(ConnectionProtocol, abrupt: Bool)
        /// Lingering close (like nginx's lingering_close): the last response is out and FIN
        /// sent; input is read and discarded until EOF, the linger time or the byte cap, so the
        /// kernel never answers late client bytes with a RST that would destroy responses the
        /// client has not read yet.
        case lingering(discarded: Int)
        case closed
    }

    /// Whether, and why not, the connection reads. Reading stops for good once no further
    /// request will be parsed, and pauses while output or pipelined requests pile up.
    struct ReadGate: Equatable {
        enum Input: Equatable {
            case parsing
            /// No further request is parsed: what a read in progress still delivers is dropped,
            /// so input held cannot grow whatever the peer sends.
            case stopped
            /// The peer sent EOF with requests still unanswered: answer them, then close.
            case peerHalfClosed
        }
        /// Changed only through the state's events: a stop is for good.
        fileprivate(set) var input: Input = .parsing
        /// Too much output is queued for a peer that does not read (`ServerCore.outputLimit`).
        fileprivate(set) var pausedForWrites = false
        /// `maxPipelinedRequests` requests wait for handlers.
        fileprivate(set) var pausedForPipeline = false

        var reads: Bool { input == .parsing && !pausedForWrites && !pausedForPipeline }
    }

    static let lingerMaxBytes = 64 << 10

    private(set) var phase: Phase
    var gate = ReadGate()
    /// The server is shutting down: no keep-alive, GOAWAY on HTTP/2, a shorter linger.
    private(set) var shuttingDown: Bool

    init(protocol p: ConnectionProtocol, proxyHeader: Bool, shuttingDown: Bool) {
        phase = proxyHeader ? .awaitingProxyHeader(next: p) : .open(p)
        self.shuttingDown = shuttingDown
    }

    // MARK: Queries (hot path: one switch each)

    /// Closed or lingering: nothing but the linger's discarding runs.
    var isClosed: Bool {
        switch phase {
        case .lingering, .closed: return true
        default: return false
        }
    }

    var awaitingProxyHeader: Bool {
        if case .awaitingProxyHeader = phase { return true }
        return false
    }

    /// The protocol, while the connection is not closed.
    var connectionProtocol: ConnectionProtocol? {
        switch phase {
        case .awaitingProxyHeader(let p), .open(let p), .draining(let p, _): return p
        case .lingering, .closed: return nil
        }
    }

    var isHTTP1: Bool {
        switch phase {
        case .open(.http1), .draining(.http1, _), .awaitingProxyHeader(next: .http1): return true
        default: return false
        }
    }

    /// The connection closes once its output drained.
    var closesAfterFlush: Bool {
        if case .draining = phase { return true }
        return false
    }

    /// No further request will be parsed.
    var stopsParsing: Bool { gate.input != .parsing }

    var peerHalfClosed: Bool { gate.input == .peerHalfClosed }

    // MARK: Input

    enum ReadAction: Equatable {
        /// Closed: drop the bytes.
        case ignore
        /// Lingering: the bytes are discarded.
        case discard
        /// Lingering, past `lingerMaxBytes`: close now.
        case close
        case proxyHeader
        case payload
    }

    mutating func bytesRead(_ count: Int) -> ReadAction {
        switch phase {
        case .open, .draining: return .payload
        case .awaitingProxyHeader: return .proxyHeader
        case .lingering(let discarded):
            let total = discarded + count
            phase = .lingering(discarded: total)
            return total > Self.lingerMaxBytes ? .close : .discard
        case .closed: return .ignore
        }
    }

    mutating func proxyHeaderReceived() {
        if case .awaitingProxyHeader(let next) = phase { phase = .open(next) }
    }

    /// TLS ALPN or the h2c preface (or its absence) chose the protocol.
    mutating func protocolChosen(_ p: ConnectionProtocol) {
        switch phase {
        case .awaitingProxyHeader: phase = .awaitingProxyHeader(next: p)
        case .open: phase = .open(p)
        case .draining(_, let abrupt): phase = .draining(p, abrupt: abrupt)
        case .lingering, .closed: break
        }
    }

    enum EOFAction: Equatable {
        case ignore
        case close
        /// HTTP/1 with requests unanswered: stop reading, answer them, then close.
        case answerPending
    }

    mutating func eofRead(requestsPending: Bool) -> EOFAction {
        switch phase {
        case .closed: return .ignore
        case .lingering: return .close
        case .awaitingProxyHeader, .open, .draining:
            guard isHTTP1 && requestsPending else { return .close }
            gate.input = .peerHalfClosed
            return .answerPending
        }
    }

    /// No further request will be parsed. Returns whether reading must stop now (the first
    /// time only).
    mutating func stopParsing() -> Bool {
        guard gate.input == .parsing else { return false }
        gate.input = .stopped
        return true
    }

    // MARK: Read pauses (the connection stops and starts the socket's reading)

    /// Too much output is queued for a peer that does not read: no reading or parsing until
    /// `writesDrained`.
    mutating func pauseForWrites() { gate.pausedForWrites = true }

    mutating func writesDrained() { gate.pausedForWrites = false }

    /// `maxPipelinedRequests` requests wait for handlers: no reading or parsing until
    /// `pipelineHasRoom`.
    mutating func pauseForPipeline() { gate.pausedForPipeline = true }

    enum PipelineAction: Equatable {
        case none
        /// Parse the requests already buffered; reading stays paused for the output.
        case parse
        case readAndParse
    }

    /// Handlers answered enough of the pipelined requests.
    mutating func pipelineHasRoom() -> PipelineAction {
        guard gate.pausedForPipeline, gate.input == .parsing else { return .none }
        gate.pausedForPipeline = false
        return gate.pausedForWrites ? .parse : .readAndParse
    }

    // MARK: Output and close

    /// Close once the output drained (`abrupt`: without FIN and linger). An abrupt request
    /// stays abrupt.
    mutating func closeAfterFlush(abrupt: Bool = false) {
        switch phase {
        case .awaitingProxyHeader(let p), .open(let p): phase = .draining(p, abrupt: abrupt)
        case .draining(let p, let was): phase = .draining(p, abrupt: was || abrupt)
        case .lingering, .closed: break
        }
    }

    enum DrainedAction: Equatable {
        /// Keep the connection.
        case none
        /// Close the socket at once (abrupt, or the peer already sent EOF).
        case close
        /// TLS close_notify, FIN, then `lingerStarted`.
        case closeGracefully
    }

    /// The output and the socket's queued writes drained.
    func outputDrained() -> DrainedAction {
        guard case .draining(_, let abrupt) = phase else { return .none }
        return abrupt || gate.input == .peerHalfClosed ? .close : .closeGracefully
    }

    /// FIN was sent: discard input until EOF, the linger time or the byte cap.
    mutating func lingerStarted() {
        guard case .draining = phase else { return }
        phase = .lingering(discarded: 0)
    }

    /// Returns whether the socket must be closed now (not when already closed; a lingering
    /// close ends).
    mutating func closeRequested() -> Bool {
        if case .closed = phase { return false }
        phase = .closed
        return true
    }

    enum TimerAction: Equatable {
        case ignore
        /// The linger time is over.
        case close
        /// Compare the deadline with the clock.
        case checkDeadline
    }

    func timerFired() -> TimerAction {
        switch phase {
        case .closed: return .ignore
        case .lingering: return .close
        case .awaitingProxyHeader, .open, .draining: return .checkDeadline
        }
    }

    // MARK: Server shutdown

    enum ShutdownAction: Equatable {
        case ignore
        /// HTTP/2: GOAWAY; the streams open finish.
        case goAway
        /// HTTP/1: reading stops and nothing more is parsed; the requests pending are answered
        /// with `connection: close`. `flush`: none is pending, the connection closes once its
        /// output drained.
        case stopReading(flush: Bool)
        /// Nothing was received yet to tell the protocol: close.
        case close
    }

    mutating func shutdownBegun(requestsPending: Bool) -> ShutdownAction {
        guard let p = connectionProtocol else { return .ignore }
        shuttingDown = true
        switch p {
        case .http2: return .goAway
        case .sniffing: return .close
        case .http1:
            _ = stopParsing()
            if !requestsPending { closeAfterFlush() }
            return .stopReading(flush: !requestsPending)
        }
    }
}
