// Connection management on the slot thread: deadlines, PINGs, replacing dead or retired
// connections (paced by the client's ConnectionPacer), and collecting what each connection's
// session reported.
import FoundationEssentials

extension ConnectionSlot {
    /// In-flight pushes whose deadline passed. A timeout alone does not condemn the connection
    /// (APNs may just be slow): it gets a PING and carries one stream at a time (probation);
    /// only an unanswered PING retires it (`maintain`). A request written in full on a live
    /// connection is not failed either: APNs has it, and failing it would make the caller's
    /// retry a duplicate. It keeps waiting, its connection PINGed every requestTimeout, until
    /// its answer, a dead connection (its streams fail in `reap`) or answerWaitCap. At the cap,
    /// or for a request not fully written, the stream is reset (RST_STREAM CANCEL) and the
    /// push fails with a timeout.
    func expire(_ now: ContinuousClock.Instant) {
        guard now >= earliestStreamDeadline else { return }
        var earliest = now + .seconds(86_400)
        for c in [current].compactMap({ $0 }) + draining {
            for st in c.session.streams.values where !st.done {
                let p = st.push
                guard p.deadline <= now else {
                    earliest = min(earliest, p.deadline)
                    continue
                }
                c.probation = true
                probe(c, now)
                if c.isOpen && now < p.answerBy && st.headersSent && st.bodyBytesSent == p.body.count {
                    if !p.overdue {
                        p.overdue = true
                        stats.answersAwaitedPastTimeout.add(1, ordering: .relaxed)
                        AnswerWaitCounts.awaitedTotal.add(1, ordering: .relaxed)
                    }
                    p.deadline = min(now + shared.requestTimeout, p.answerBy)
                    earliest = min(earliest, p.deadline)
                    continue
                }
                st.done = true
                c.session.cancel(st)
                if p.overdue {
                    stats.answerWaitsCapped.add(1, ordering: .relaxed)
                    AnswerWaitCounts.cappedTotal.add(1, ordering: .relaxed)
                    complete(p, .transportFailure("timeout: no response within answerWaitCap, connection alive (stream \(st.id))"))
                } else {
                    complete(p, .transportFailure("timeout: no response within requestTimeout (stream \(st.id))"))
                }
            }
        }
        earliestStreamDeadline = earliest
    }

    /// Queued pushes older than queueWaitCap fail as not sent: nothing of them was written (or
    /// only a request the server refused unprocessed), so the caller's retry is no duplicate,
    /// and the caller's own back-off takes over from the client's queue.
    func expireQueued(_ now: ContinuousClock.Instant) {
        guard queueHead < queue.count, now >= earliestQueueDeadline else { return }
        var kept: [PendingPush] = []
        var expired: [PendingPush] = []
        var earliest = now + .seconds(86_400)
        for p in queue[queueHead...] {
            if p.notSentBy <= now {
                expired.append(p)
            } else {
                kept.append(p)
                earliest = min(earliest, p.notSentBy)
            }
        }
        queue = kept
        queueHead = 0
        earliestQueueDeadline = earliest
        for p in expired {
            stats.notSent.add(1, ordering: .relaxed)
            AnswerWaitCounts.notSentTotal.add(1, ordering: .relaxed)
            complete(p, .transportFailure("not sent: queued longer than queueWaitCap (\(shared.queueWaitCap)) waiting for a connection or a stream"))
        }
    }

    /// PINGs `c` unless a PING is already waiting for its ACK.
    private func probe(_ c: H2Connection, _ now: ContinuousClock.Instant) {
        guard c.isOpen, c.pingSentAt == nil else { return }
        if let error = c.session.ping() { return c.fail(error) }
        c.pingSentAt = now
        stats.pingsSent.add(1, ordering: .relaxed)
        stats.timeoutPings.add(1, ordering: .relaxed)
    }

    /// An open connection whose PING went unanswered for pingTimeout is closed as dead; its
    /// streams are collected by `reap`. True when it was.
    private func pingExpired(_ c: H2Connection, _ now: ContinuousClock.Instant) -> Bool {
        guard c.isOpen, let sent = c.pingSentAt, now - sent >= shared.pingTimeout else { return false }
        stats.deadConnections.add(1, ordering: .relaxed)
        c.fail("no PING ACK within \(shared.pingTimeout): connection presumed dead")
        reap(c)
        return true
    }

    /// Connection upkeep: replace dead or retired connections, PING idle ones, close drained ones.
    func maintain(_ now: ContinuousClock.Instant) {
        if let c = current {
            if !c.wasReady && c.state != .closed && now >= c.connectDeadline {
                c.fail("timeout: no HTTP/2 connection to \(shared.endpoint.authority) within connectTimeout ("
                       + (c.isOpen ? "no SETTINGS from the server" : c.state == .handshaking ? "TLS handshake" : "TCP connect") + ")")
                reap(c)
            } else if c.isOpen && c.wasReady {
                if c.pingSentAt != nil {
                    _ = pingExpired(c, now)
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
            if let c = current, c.retired || c.state == .closed { retireCurrent(now: now) }
        }
        draining.removeAll { d in
            if d.state == .closed || pingExpired(d, now) { return true }
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
        if current == nil && queueHead < queue.count && !stopping {
            if let wait = nextOpenAt, wait > now { return }
            nextOpenAt = shared.pacer.withLock { $0.tryOpen(now: now, random: shared.random()) }
            if nextOpenAt == nil {
                openConnection(now)
            } else {
                stats.openingsDeferred.add(1, ordering: .relaxed)
            }
        }
    }

    /// The current connection takes no new streams: its open streams finish while it drains,
    /// and the pacer counts its end before the next connection may start.
    func retireCurrent(now: ContinuousClock.Instant) {
        guard let c = current else { return }
        c.retired = true
        current = nil
        shared.pacer.withLock { $0.failed(now: now, random: shared.random()) }
        if c.state != .closed && c.streamCount > 0 { draining.append(c) } else if c.state != .closed { c.closeGracefully() }
    }

    func openConnection(_ now: ContinuousClock.Instant) {
        do {
            current = try H2Connection(endpoint: shared.endpoint, tlsContext: shared.tls, connectTimeout: shared.connectTimeout)
            stats.connectionsOpened.add(1, ordering: .relaxed)
        } catch {
            shared.pacer.withLock { $0.failed(now: now, random: shared.random()) }
            failQueue("\(error)")
        }
    }

    func failQueue(_ message: String) {
        let all = queue[queueHead...]
        queue.removeAll(keepingCapacity: true)
        queueHead = 0
        for p in all { complete(p, .transportFailure(message)) }
    }

    func reapAll() {
        if let c = current { reap(c) }
        for d in draining { reap(d) }
        if let c = current, c.state == .closed { retireCurrent(now: .now) }
    }

    /// Handles streams that ended, PING ACKs, GOAWAY, and a connection that closed.
    func reap(_ c: H2Connection) {
        if c.takePingAcks() > 0 {
            c.pingSentAt = nil
            stats.pingAcks.add(1, ordering: .relaxed)
        }
        if c.session.goAway != nil { c.retired = true }
        if !c.session.finished.isEmpty {
            let done = c.session.finished
            c.session.finished.removeAll(keepingCapacity: true)
            for st in done { finish(st, on: c) }
        }
        // A connection that ended before carrying a request (refused, TLS or ALPN error, no
        // SETTINGS, GOAWAY before any stream) failed its setup: the pushes waiting for it get
        // that error now, not after the next paced attempt; the caller's retry counts it.
        if c === current && c.requestsCarried == 0 {
            if c.state == .closed {
                failQueue(c.failure ?? "connection closed before any request")
            } else if let g = c.session.goAway {
                failQueue("GOAWAY(\(H2ClientSession.errorName(g.errorCode))" + (g.debug.isEmpty ? "" : ", \(g.debug)")
                          + ") before any request on a new connection")
            }
        }
        if c.state == .closed {
            let reason = c.failure ?? "connection closed"
            for st in c.session.abandonAll() where !st.done { lost(st, reason: reason) }
        }
    }
}
