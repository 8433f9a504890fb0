// A connection's timeouts: one deadline derived from its state (PROXY header, TLS handshake,
// idle, head, body, a write the peer does not read), one libuv timer armed for it.

extension ServerConnection {
    /// When the connection has waited too long in its current state, or nil while a handler owns the time.
    private func deadline() -> UInt64? {
        let serving: ConnectionProtocol
        switch state.phase {
        case .awaitingProxyHeader: return startedAt + core.headerTimeoutMs
        case .open(let p), .draining(let p, _): serving = p
        case .lingering, .closed: return nil
        }
        if let queuedAt = socket.oldestWriteQueuedAt { return queuedAt + core.writeTimeoutMs }
        if let tls, !tls.handshakeDone { return startedAt + core.headerTimeoutMs }
        switch serving {
        case .sniffing:
            return (sniffed.isEmpty ? lastActivity + core.idleTimeoutMs
                                    : startedAt + core.headerTimeoutMs)
        case .http1:
            if slotsHead < slots.count { return nil }   // a handler is working
            if state.peerHalfClosed { return lastActivity }
            switch h1State {
            case .idle: return lastActivity + core.idleTimeoutMs
            case .head: return headStartedAt + core.headerTimeoutMs
            case .body: return bodyStartedAt + core.bodyTimeoutMs
            }
        case .http2:
            if let h2 {
                if let d = h2.receiveDeadline(timeoutMs: core.headerTimeoutMs + core.bodyTimeoutMs) { return d }
                if h2.handlersWorking > 0 { return nil }   // the handler owns that time
                return h2.lastStreamActivity + core.idleTimeoutMs   // frames without a stream do not count
            }
            return lastActivity + core.idleTimeoutMs
        }
    }

    /// Arms the timer only when the deadline moved earlier; a later deadline is picked up when
    /// the armed one fires (keep-alive traffic then costs no timer operations).
    func updateTimer() {
        guard !closed, let d = deadline() else { return }
        if armedDeadline == 0 || d < armedDeadline {
            armedDeadline = d
            let now = loop.now
            socket.armTimer(milliseconds: d > now ? d - now : 0)
        }
    }

    func onTimer() {
        switch state.timerFired() {
        case .ignore: return
        case .close: close(); return
        case .checkDeadline: break
        }
        armedDeadline = 0
        guard let d = deadline() else { return }
        let now = loop.now
        if now < d {
            armedDeadline = d
            socket.armTimer(milliseconds: d - now)
            return
        }
        if state.connectionProtocol == .http2, let h2, socket.writesInFlight == 0 {
            // Streams whose request did not arrive in time are reset; the connection and its
            // other streams carry on.
            let reset = h2.resetExpiredStreams(now: now, timeoutMs: core.headerTimeoutMs + core.bodyTimeoutMs)
            if reset > 0 {
                for _ in 0..<reset { core.recordTimeout() }
                flush()
                return
            }
        }
        core.recordTimeout()
        if state.awaitingProxyHeader {
            core.recordProxyRefused()
            close()
            return
        }
        if state.isHTTP1 && socket.writesInFlight == 0 && slotsHead == slots.count && h1State != .idle {
            // Tell a slow client why, then close.
            let kind = h1State == .head ? "header_timeout" : "body_timeout"
            h1WriteError(status: 408, kind: kind)
            stopParsing()
            state.closeAfterFlush(abrupt: true)
            flush()
            if !closed && socket.writesInFlight == 0 { close() }
            return
        }
        if state.connectionProtocol == .http2, let h2, socket.writesInFlight == 0 {
            h2.submitGoAway()
            state.closeAfterFlush(abrupt: true)
            flush()
            if !closed { close() }
            return
        }
        close()
    }
}
