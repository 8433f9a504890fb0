// Request encoding: what `send` checks before any I/O, the push on its way, and how a slot turns
// queued pushes into HTTP/2 streams (headers in a fixed order, the provider token).
import Basics
import FoundationEssentials

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
    /// Monotonic, set each time the push is written to a connection (requestTimeout from
    /// then): time spent queued for a connection or a stream does not count. Past it on a live
    /// connection, the next time to PING and look again (every requestTimeout, up to `answerBy`).
    var deadline = ContinuousClock.Instant.now + .seconds(86_400 * 365)
    /// answerWaitCap from when the push was written: a written push fails no later than this.
    var answerBy = ContinuousClock.Instant.now + .seconds(86_400 * 365)
    /// queueWaitCap from `send`: a push still queued then (nothing of it written, or only a
    /// request the server refused unprocessed) fails as not sent, a safe retry for the caller.
    var notSentBy = ContinuousClock.Instant.now + .seconds(86_400 * 365)
    /// Its request outlived requestTimeout on a live connection and is still awaited.
    var overdue = false
    /// Retries after a connection was lost before any body byte left (at most one), or after
    /// ExpiredProviderToken (at most one).
    var attempt = 0
    /// Retries after the server refused the stream unprocessed (bounded, inside the deadline).
    var refusals = 0
    var body: [UInt8] = []
    /// Refused before any I/O; completed on the slot thread like everything else.
    var local: PushResult?

    init(request: PushRequest, completion: @escaping @Sendable (PushResult) -> Void) {
        self.request = request
        self.completion = completion
    }
}

extension PushClient {
    /// Local refusals use the status and reason APNs itself would return, without any I/O.
    static func validate(_ r: PushRequest) -> PushResult? {
        if r.deviceToken.isEmpty { return .rejected(status: 400, reason: .missingDeviceToken, timestamp: nil) }
        // Checked through withUTF8 pointer loops: `utf8.allSatisfy` walks String.UTF8View's
        // index machinery for every byte.
        var token = r.deviceToken
        let tokenOK = token.withUTF8 { PushToken.isValid($0) }
        if !tokenOK { return .rejected(status: 400, reason: .badDeviceToken, timestamp: nil) }
        if r.bundleID.isEmpty { return .rejected(status: 400, reason: .missingTopic, timestamp: nil) }
        var topic = r.bundleID
        let topicOK = topic.withUTF8 { b in b.allSatisfy { $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: ":") } }
        if !topicOK { return .rejected(status: 400, reason: .badTopic, timestamp: nil) }
        if ![10, 5, 1].contains(r.priority) { return .rejected(status: 400, reason: .badPriority, timestamp: nil) }
        if let e = r.expiration, e < 0 { return .rejected(status: 400, reason: .badExpirationDate, timestamp: nil) }
        return nil
    }
}

extension ConnectionSlot {
    /// This slot's connection id at the TokenProvider (unique among the provider's clients).
    var tokenConnection: Int { shared.firstTokenConnection + index }

    /// Starts queued pushes while the current connection has room under the server's limit.
    func submitQueued() {
        while queueHead < queue.count, let c = current, c.hasStreamCapacity {
            let p = queue[queueHead]
            var generation: Int? = nil
            var auth: String? = nil
            if let tokens = shared.tokens {
                do {
                    let t = try tokens.token(slot: tokenConnection, now: shared.clock.now())
                    // A token change this soon on this connection would earn a 429: new connection.
                    if t.freshConnection && c.requestsCarried > 0 {
                        retireCurrent(now: .now)
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
                tokens.connectionOpened(slot: tokenConnection, generation: generation, now: shared.clock.now())
            }
            c.requestsCarried += 1
            let written = ContinuousClock.now
            p.deadline = written + shared.requestTimeout
            p.answerBy = written + shared.answerWaitCap
            p.overdue = false
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
        fields.append(("apns-priority", String(r.priority)))
        if let authorization { fields.append(("authorization", authorization)) }
        fields.append(("content-type", "application/json"))
        return RequestHead(path: "/3/device/" + r.deviceToken.lowercased(), fields: fields)
    }
}
