// One accepted connection: TLS layering, protocol choice (HTTP/1.1, or HTTP/2 by ALPN or by the
// h2c client preface), output buffering, timeouts and shutdown. HTTP/1 request handling is in
// ServerConnection+H1.swift, HTTP/2 in H2Session.swift.

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
let http2Preface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

// @unchecked Sendable: every mutable field is touched only on the connection's loop thread.
// Other threads only hold the reference (inside an HTTPReplyWriter) and pass it back to that loop
// through `EventLoop.enqueue`.
final class ServerConnection: @unchecked Sendable {
    /// Strong: response writers keep their connection alive after the server stopped, and must
    /// still find the (stopped) loop to learn that. The loop drops its connections on close.
    let loop: EventLoop
    let socket: TCPSocket
    let core: ServerCore
    let id: UInt64
    /// The peer, or the client a PROXY header named.
    private(set) var remoteAddress: String
    /// The lifecycle (PROXY header, protocol, draining, lingering, closed) and whether the
    /// connection reads: ServerConnectionState.swift. This class performs its actions.
    var state = ServerConnectionState(protocol: .sniffing, proxyHeader: false, shuttingDown: false)
    /// The PROXY header so far (ProxyProtocol.swift).
    private var proxyBuffer: [UInt8] = []
    /// The socket peer's own per-address key (the balancer's, behind a PROXY header).
    var socketPeerKey: PeerKey?
    var tls: TLSSession?
    var tlsInfo: TLSInfo?
    private(set) var sniffed: [UInt8] = []

    /// Plaintext waiting to be written (encrypted first under TLS). Responses produced while a
    /// read is processed are coalesced and written once at the end of the read.
    var out: [UInt8] = []
    private var wire: [UInt8] = []
    /// A read is being processed: output waits for its end (see `flush`).
    var inRead = false
    /// Closed or lingering: nothing but the linger's discarding runs.
    var closed: Bool { state.isClosed }
    /// How long a lingering close reads and discards (ServerConnectionState.Phase.lingering).
    static let lingerMs: UInt64 = 2000
    /// Shorter while the server shuts down, so `shutdown` is not held up by idle clients.
    static let lingerShutdownMs: UInt64 = 500
    /// HTTPAdmission.goAwayAtStart: GOAWAY right after the server's SETTINGS.
    var goAwayAtStart = false
    /// `resumeAfterWrites` is running (it parses, and parsing may flush and call it again).
    private var resumingAfterWrites = false
    /// Output buffers grown past this by a burst are freed once written, so a connection does
    /// not keep its largest burst's capacity for life.
    static let keptBufferCapacity = 64 << 10

    // HTTP/1 state (ServerConnection+H1.swift)
    var parser: HTTP1Parser
    /// `parser.state` as of the last parse (reading it copies the parser: keep it off hot paths).
    var h1State: HTTP1ParserState = .idle
    var slots: [H1Slot] = []
    var slotsHead = 0
    var baseSequence: UInt64 = 0
    var nextSequence: UInt64 = 0
    var requestsSeen = 0
    var expectContinue = ExpectContinue.none
    var processingH1 = false

    // HTTP/2 state
    var h2: H2Session?

    /// Input bytes this connection holds (parser buffer and request in progress, h2 streams
    /// not yet handed to the handler, PROXY header and preface bytes), as last counted into
    /// `ServerCore.bufferedInput`.
    private(set) var inputHeld = 0

    // Timeouts, in loop milliseconds (uv_now).
    let startedAt: UInt64
    var headStartedAt: UInt64 = 0
    var bodyStartedAt: UInt64 = 0
    var lastActivity: UInt64
    /// Set when the per-address limit counted this connection (released when it goes).
    var perAddressKey: PeerKey?
    /// The peer's `PeerKey.text`, handed to every request of this connection.
    var clientKey = ""
    /// The deadline the timer is armed for; 0 = not armed (ServerConnection+Timeouts.swift).
    var armedDeadline: UInt64 = 0

    init(loop: EventLoop, socket: TCPSocket, id: UInt64, remoteAddress: String) {
        self.loop = loop
        self.socket = socket
        self.core = loop.core
        self.id = id
        self.remoteAddress = remoteAddress
        parser = HTTP1Parser(limits: loop.core.parserLimits)
        startedAt = loop.now
        lastActivity = startedAt
    }

    func start() {
        if let ctx = core.tls {
            do {
                tls = try TLSSession(context: ctx)
            } catch {
                close()
                return
            }
        }
        state = ServerConnectionState(protocol: tls == nil && !core.cleartextHTTP2 ? .http1 : .sniffing,
                                      proxyHeader: core.proxyProtocol != nil,
                                      shuttingDown: loop.shuttingDown)
        updateTimer()
    }

    // MARK: Input

    func onRead(_ bytes: UnsafeRawBufferPointer) {
        switch state.bytesRead(bytes.count) {
        case .payload: onPayload(bytes)
        case .proxyHeader: onProxyHeaderBytes(bytes)
        case .discard, .ignore: return
        case .close: close()
        }
    }

    /// Collects the PROXY header; once complete, the client it names becomes this connection's
    /// address (and per-address key), and the bytes after it are the connection's own.
    private func onProxyHeaderBytes(_ bytes: UnsafeRawBufferPointer) {
        proxyBuffer.append(contentsOf: bytes)
        switch ProxyProtocol.parse(proxyBuffer) {
        case .needMore:
            accountInput(heldOutsideHTTP1)
            updateTimer()
        case .invalid:
            core.recordProxyRefused()
            close()
        case .header(let header, let length):
            state.proxyHeaderReceived()
            var key = socketPeerKey
            if let text = header.sourceText, let source = header.sourceKey {
                remoteAddress = text
                key = source
                clientKey = source.text
            }
            if core.maxConnectionsPerAddress > 0, let key {
                guard core.reserveConnection(for: key) else {
                    core.recordRefused(perAddress: true)
                    close()
                    return
                }
                perAddressKey = key
            }
            let rest = Array(proxyBuffer[length...])
            proxyBuffer = []
            accountInput(0)
            armedDeadline = 0   // the header deadline is over; the next one may be later
            if rest.isEmpty {
                updateTimer()
            } else {
                rest.withUnsafeBytes { onPayload($0) }
            }
        }
    }

    private func onPayload(_ bytes: UnsafeRawBufferPointer) {
        lastActivity = loop.now
        inRead = true
        if let tls {
            guard tls.feed(bytes) else { inRead = false; close(); return }
            if !tls.handshakeDone {
                switch tls.handshake() {
                case .needMore:
                    inRead = false
                    flush()
                    updateTimer()
                    return
                case .failed:
                    core.recordHandshakeFailure()
                    inRead = false
                    state.closeAfterFlush(abrupt: true)
                    flush()
                    return
                case .done:
                    let info = tls.info
                    tlsInfo = info
                    if info.alpn == "h2" {
                        startHTTP2()
                    } else if info.alpn != nil || !core.cleartextHTTP2 {
                        state.protocolChosen(.http1)
                    }
                }
            }
            readTLS: while !closed {
                switch tls.read(into: loop.plainBuffer, capacity: EventLoop.plainBufferSize) {
                case .data(let n):
                    onPlaintext(UnsafeRawBufferPointer(start: loop.plainBuffer, count: n))
                case .needMore:
                    break readTLS
                case .closed:
                    inRead = false
                    onEOF()
                    return
                case .failed:
                    inRead = false
                    close()
                    return
                }
            }
        } else {
            onPlaintext(bytes)
        }
        inRead = false
        if !state.isHTTP1 { accountInput(heldOutsideHTTP1) }
        if inputHeld > 0 && core.inputOverBudget() { loop.closeGreediestInput() }
        guard !closed else { return }
        flush()
        updateTimer()
    }

    /// Input held outside the HTTP/1 parser (h1Process counts the parser's own).
    private var heldOutsideHTTP1: Int {
        sniffed.count + proxyBuffer.count + (h2?.bufferedBytes ?? 0)
    }

    /// Records `held` as this connection's input in the server-wide gauge.
    @inline(__always)
    func accountInput(_ held: Int) {
        guard held != inputHeld else { return }
        core.accountInput(from: inputHeld, to: held)
        inputHeld = held
    }

    private func onPlaintext(_ bytes: UnsafeRawBufferPointer) {
        switch state.connectionProtocol {
        case .http1:
            h1Receive(bytes)
        case .http2:
            h2?.receive(bytes)
        case nil:
            return
        case .sniffing:
            // Decide as soon as the bytes diverge from the preface; buffer only while they match.
            let offset = sniffed.count
            var matches = true
            for (i, b) in bytes.enumerated() where offset + i < http2Preface.count {
                if http2Preface[offset + i] != b { matches = false; break }
            }
            if !matches {
                state.protocolChosen(.http1)
                if sniffed.isEmpty {
                    h1Receive(bytes)
                } else {
                    sniffed.append(contentsOf: bytes)
                    let all = sniffed
                    sniffed = []
                    all.withUnsafeBytes { h1Receive($0) }
                }
            } else if offset + bytes.count >= http2Preface.count {
                sniffed.append(contentsOf: bytes)
                let all = sniffed
                sniffed = []
                startHTTP2()
                all.withUnsafeBytes { h2?.receive($0) }
            } else {
                sniffed.append(contentsOf: bytes)
            }
        }
    }

    private func startHTTP2() {
        state.protocolChosen(.http2)
        do {
            h2 = try H2Session(connection: self, settings: core.configuration.http2)
        } catch {
            close()
            return
        }
        if state.shuttingDown || goAwayAtStart { h2?.submitGoAway() }
    }

    func onEOF() {
        switch state.eofRead(requestsPending: slotsHead < slots.count) {
        case .ignore: return
        case .close: close()
        case .answerPending:
            // Half-closed: answer what was already received, then close.
            socket.stopReading()
            updateTimer()
        }
    }

    /// No further request of this connection will be parsed. From then on nothing is read
    /// (what a read in progress still delivers is dropped), so input held cannot grow in this
    /// state whatever the peer sends; a lingering close reads and discards a bounded amount.
    func stopParsing() {
        if state.stopParsing() { socket.stopReading() }
    }

    // MARK: Output

    /// Writes `out` (and, for HTTP/2, whatever nghttp2 has queued). Deferred while a read is
    /// being processed so pipelined responses leave in one write.
    func flush() {
        guard !closed, !inRead else { return }
        if let h2 {
            h2.pump()
            if !h2.wantsIO && socket.writesInFlight == 0 { state.closeAfterFlush() }
        }
        if let tls {
            if !out.isEmpty {
                let ok = out.withUnsafeBytes { tls.write($0) }
                out.removeAll(keepingCapacity: out.capacity <= ServerConnection.keptBufferCapacity)
                if !ok { close(); return }
            }
            tls.drainOutput(into: &wire)
            if !wire.isEmpty {
                let ok = wire.withUnsafeBytes { socket.write($0) }
                wire.removeAll(keepingCapacity: wire.capacity <= ServerConnection.keptBufferCapacity)
                if !ok { close(); return }
            }
        } else if !out.isEmpty {
            let ok = out.withUnsafeBytes { socket.write($0) }
            out.removeAll(keepingCapacity: out.capacity <= ServerConnection.keptBufferCapacity)
            if !ok { close(); return }
        }
        if socket.writesInFlight > 0 {
            if socket.queuedBytes > core.outputLimit() && socket.reading {
                // The peer does not read: stop producing (and reading requests) until it does,
                // and give back the output buffers' capacity while it waits.
                state.pauseForWrites()
                socket.stopReading()
                out = []
                wire = []
            }
        } else if state.closesAfterFlush {
            closeGracefully()
            return
        }
        resumeAfterWrites()
        updateTimer()
    }

    /// Undoes `gate.pausedForWrites` once the queued output drained (or the kernel took it all):
    /// parses the requests already buffered, then reads again.
    private func resumeAfterWrites() {
        guard state.gate.pausedForWrites, !resumingAfterWrites, socket.queuedBytes <= core.outputLimit() / 4 else { return }
        resumingAfterWrites = true
        defer { resumingAfterWrites = false }
        while state.gate.pausedForWrites && !closed && socket.queuedBytes <= core.outputLimit() / 4 {
            state.writesDrained()
            if state.isHTTP1 { h1Process() }   // flushes as handlers answer; may pause again
        }
        if !closed && state.gate.reads {
            socket.startReading()
        }
    }

    func onWriteDone() {
        guard !closed else { return }
        if socket.writesInFlight == 0 { lastActivity = loop.now }
        if state.closesAfterFlush && socket.writesInFlight == 0 && out.isEmpty {
            closeGracefully()
            return
        }
        flush()
    }

    // MARK: Responses from handlers

    func complete(_ writer: HTTPReplyWriter, _ response: HTTPReply, _ action: ConnectionAction) {
        guard !closed else { return }
        if state.connectionProtocol == .http2 {
            h2?.handlerAnswered(streamID: writer.streamID, response: response, isHEAD: writer.isHEAD, action: action)
            if action == .close { state.closeAfterFlush(abrupt: true) }
            flush()
        } else {
            h1Complete(writer, response, action)
        }
    }

    func setMaxConcurrentStreams(_ n: UInt32) {
        guard !closed, let h2 else { return }
        h2.submitMaxConcurrentStreams(n)
        flush()
    }

    // MARK: Shutdown and close

    func beginShutdown() {
        switch state.shutdownBegun(requestsPending: slotsHead < slots.count) {
        case .ignore:
            return
        case .goAway:
            h2?.submitGoAway()
            flush()
        case .stopReading(let flushNow):
            socket.stopReading()
            if flushNow { flush() }
        case .close:
            close()
        }
    }

    /// Closes the socket now (also ends a lingering close).
    func close() {
        guard state.closeRequested() else { return }
        socket.close()
    }

    /// The end of a connection the server decided to close after its last response was
    /// written: TLS close_notify, FIN (uv_shutdown, sent after queued writes), then linger.
    /// Abrupt closes and a peer that already sent EOF close at once.
    private func closeGracefully() {
        switch state.outputDrained() {
        case .none: return
        case .close: close(); return
        case .closeGracefully: break
        }
        if let tls, tls.handshakeDone {
            tls.shutdown()
            tls.drainOutput(into: &wire)
            if !wire.isEmpty {
                let ok = wire.withUnsafeBytes { socket.write($0) }
                wire.removeAll()
                if !ok { close(); return }
            }
        }
        guard socket.shutdownWrite() else { close(); return }
        state.lingerStarted()
        out = []
        socket.startReading()
        socket.armTimer(milliseconds: loop.shuttingDown ? ServerConnection.lingerShutdownMs : ServerConnection.lingerMs)
    }

    /// The socket's handles are closed: drop protocol state and leave the loop.
    func onSocketClosed() {
        accountInput(0)
        h2 = nil
        tls = nil
        slots.removeAll()
        loop.remove(self)
    }
}
