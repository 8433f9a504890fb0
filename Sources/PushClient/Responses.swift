// Response handling: a finished stream becomes a PushResult, a retry, or a refusal retry; the
// mapping from status and body is pure and unit tested.
import FoundationEssentials

extension ConnectionSlot {

    func finish(_ st: ClientStream, on c: H2Connection) {
        guard !st.done else { return }
        st.done = true
        if st.responseComplete && st.status > 0 { return respond(st, on: c) }
        if st.refused { return retryRefused(st.push) }
        lost(st, reason: "stream \(st.id) reset by server (\(H2ClientSession.errorName(st.closeCode ?? 0)))")
    }

    /// The stream never completed. Send it again only when APNs cannot have acted on it.
    func lost(_ st: ClientStream, reason: String) {
        st.done = true
        if st.refused || !st.headersSent { return retryRefused(st.push) }
        if st.bodyBytesSent == 0 && st.push.attempt == 0 {
            st.push.attempt += 1
            return requeue(st.push)
        }
        complete(st.push, .transportFailure(reason))
    }

    func retryRefused(_ p: PendingPush) {
        guard p.refusals < 5 else { return complete(p, .transportFailure("refused by the server 5 times (GOAWAY or REFUSED_STREAM)")) }
        p.refusals += 1
        stats.refusedRetries.add(1, ordering: .relaxed)
        requeue(p)
    }

    func requeue(_ p: PendingPush) {
        if stopping { return complete(p, .transportFailure("shutdown")) }
        earliestQueueDeadline = min(earliestQueueDeadline, p.notSentBy)
        if queueHead > 0 {
            queueHead -= 1
            queue[queueHead] = p
        } else {
            queue.insert(p, at: 0)
        }
    }

    func respond(_ st: ClientStream, on c: H2Connection) {
        let p = st.push
        if p.overdue {
            stats.lateAnswers.add(1, ordering: .relaxed)
            AnswerWaitCounts.answeredLateTotal.add(1, ordering: .relaxed)
        }
        let result = Self.result(status: st.status, apnsID: st.apnsID, uniqueID: st.uniqueID, body: st.responseBody, sentID: p.apnsID)
        c.probation = false
        switch result {
        case .delivered where !c.delivered:
            c.delivered = true
            shared.pacer.withLock { $0.succeeded() }
        case .rejected(_, .shutdown, _), .rejected(_, .idleTimeout, _):
            // About the connection, not the push: APNs is closing it. Streams in flight finish
            // on it; new ones wait for the next (paced) connection.
            c.retired = true
        case .rejected(_, .tooManyProviderTokenUpdates, _):
            // Apple: the connection stays unusable for a while. Retire it; the slot's next
            // connection carries the current token as its first (not an update).
            c.retired = true
            shared.tokens?.connectionReset(slot: tokenConnection)
        default: break
        }
        if case .rejected(_, let reason, _) = result, let gen = st.tokenGeneration, let tokens = shared.tokens {
            let now = shared.clock.now()
            if reason == .expiredProviderToken {
                // Rejected, so never delivered: one retry with a new token is safe. When the
                // policy keeps the dead token (one early re-mint per 20 minutes), the answer
                // goes back to the caller, which pauses the app (docs/pushclient.md).
                if tokens.expired(generation: gen, now: now), p.attempt == 0 {
                    p.attempt += 1
                    return requeue(p)
                }
            } else if reason == .invalidProviderToken {
                tokens.requestRefresh(now: now)
            }
        }
        complete(p, result)
    }

    /// A push from `send` joins the end of the queue.
    func enqueueLocally(_ p: PendingPush) {
        earliestQueueDeadline = min(earliestQueueDeadline, p.notSentBy)
        queue.append(p)
    }

    func complete(_ p: PendingPush, _ result: PushResult) {
        outstanding.subtract(1, ordering: .relaxed)
        p.completion(result)
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
