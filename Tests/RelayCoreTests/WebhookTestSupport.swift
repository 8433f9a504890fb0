// Test doubles for the webhook sender: an in-memory WebhookOutbox (the store half's contract as
// the sender sees it) and a loopback HTTP/1.1 receiver that verifies every signature and can
// answer with faults (a status, no answer, a redirect).
import Foundation
import Glibc
import Synchronization
import TestSupport
@testable import RelayCore

/// Pending deliveries of one webhook in memory, with the lease and due-time rules of the protocol.
final class InMemoryWebhookOutbox: WebhookOutbox, @unchecked Sendable {
    // @unchecked Sendable: every field is touched only under `lock`.
    struct Row {
        var event: StoredEvent
        var state: WebhookDeliveryState = .pending
        var attempts = 0
        var firstAttemptAt: Int64?
        var nextAttemptAt: Int64 = 0
        var leaseUntil: Int64 = 0
        var lastError: String?
        var errors: [String] = []
        var deadAttemptedAt: Int64?
        var deliveredAt: Int64?
        var claim: Int64 = 0
    }
    private let lock = NSLock()
    private var rows: [String: [Row]] = [:]
    private var sequence: Int64 = 0
    private(set) var claims = 0

    init(webhooks: [String]) { for w in webhooks { rows[w] = [] } }

    /// Adds an event for every webhook (the fan-out is the store's; here everything goes everywhere).
    @discardableResult
    func add(type: EventType = .responseDelivered, app: String = "com.example.app", createdAt: Int64 = SystemRelayClock().nowMillis()) -> StoredEvent {
        lock.lock(); defer { lock.unlock() }
        sequence += 1
        let id = UUIDv7Text.next()
        let body = Array("{\"type\":\"\(type.rawValue)\",\"timestamp\":\"2026-12-05T19:00:00.000Z\",\"data\":{\"id\":\"\(id)\",\"sequence\":\(sequence)}}".utf8)
        let event = StoredEvent(id: id, sequence: sequence, type: type, createdAt: createdAt, credentialID: "c1", app: app, body: body)
        for key in rows.keys { rows[key]!.append(Row(event: event)) }
        return event
    }

    func claimWebhookDeliveries(webhook: String, now: Int64, leaseUntil: Int64, limit: Int) throws -> [WebhookDelivery] {
        lock.lock(); defer { lock.unlock() }
        claims += 1
        var out: [WebhookDelivery] = []
        for i in rows[webhook, default: []].indices where out.count < limit {
            let r = rows[webhook]![i]
            guard r.state == .pending, r.nextAttemptAt <= now, r.leaseUntil <= now else { continue }
            rows[webhook]![i].leaseUntil = leaseUntil
            rows[webhook]![i].claim += 1
            out.append(WebhookDelivery(event: r.event, attempts: r.attempts, firstAttemptAt: r.firstAttemptAt, claim: r.claim + 1))
        }
        return out
    }

    private var notSentErrors: [String] = []
    /// The errors of `notSent` results recorded (requests never sent), in order.
    var notSent: [String] { lock.lock(); defer { lock.unlock() }; return notSentErrors }

    /// Returns the positions of the results not recorded (stale).
    func recordWebhookResults(webhook: String, _ results: [WebhookAttemptRecord]) throws -> [Int] {
        lock.lock(); defer { lock.unlock() }
        var stale: [Int] = []
        for (at, record) in results.enumerated() {
            guard let i = rows[webhook]?.firstIndex(where: { $0.event.id == record.eventID }),
                  rows[webhook]![i].state == .pending, rows[webhook]![i].claim == record.claim else { stale.append(at); continue }
            var r = rows[webhook]![i]
            r.leaseUntil = 0
            if case .notSent(_, let at, let error) = record.result {
                r.nextAttemptAt = at
                r.lastError = error
                notSentErrors.append(error)
                rows[webhook]![i] = r
                continue
            }
            r.attempts += 1
            switch record.result {
            case .delivered(let at): r.state = .delivered; r.deliveredAt = at; r.firstAttemptAt = r.firstAttemptAt ?? at
            case .retry(let attemptedAt, let at, let error):
                r.firstAttemptAt = r.firstAttemptAt ?? attemptedAt
                r.nextAttemptAt = at
                r.lastError = error
                r.errors.append(error)
            case .dead(let attemptedAt, let error):
                r.firstAttemptAt = r.firstAttemptAt ?? attemptedAt
                r.state = .dead
                r.deadAttemptedAt = attemptedAt
                r.lastError = error
                r.errors.append(error)
            case .notSent: break
            }
            rows[webhook]![i] = r
        }
        return stale
    }

    /// As a replay does: every pending delivery's claim bumped and its lease ended, so a result
    /// of the claim in flight is stale and the delivery is handed out again.
    func replayPending(webhook: String) {
        lock.lock(); defer { lock.unlock() }
        for i in rows[webhook, default: []].indices where rows[webhook]![i].state == .pending {
            rows[webhook]![i].claim += 1
            rows[webhook]![i].leaseUntil = 0
        }
    }

    private var failingCommits = false
    /// While set, an exchange with results fails as a commit that did not happen: nothing recorded.
    var commitsFail: Bool {
        get { lock.lock(); defer { lock.unlock() }; return failingCommits }
        set { lock.lock(); defer { lock.unlock() }; failingCommits = newValue }
    }

    /// Every event has a row here (no cursor): the sender's cursor logic is the stores' to test.
    func recordAndClaimWebhookDeliveries(webhook: String, results: [WebhookAttemptRecord], cursor: WebhookCursorPosition?, now: Int64,
                                         leaseUntil: Int64, limit: Int, releaseCursor: Bool) throws -> WebhookExchange {
        if !results.isEmpty && commitsFail { throw StoreError.unavailable("commit failed (test)") }
        let stale = results.isEmpty ? [] : try recordWebhookResults(webhook: webhook, results)
        return WebhookExchange(staleResults: stale, claimed: limit > 0 ? try claimWebhookDeliveries(webhook: webhook, now: now, leaseUntil: leaseUntil, limit: limit) : [])
    }

    func pendingWebhookDeliveries(webhook: String) throws -> Int? {
        lock.lock(); defer { lock.unlock() }
        return rows[webhook]?.count { $0.state == .pending }
    }

    func snapshot(_ webhook: String) -> [Row] {
        lock.lock(); defer { lock.unlock() }
        return rows[webhook] ?? []
    }

    func totalAttempts(_ webhook: String) -> Int { snapshot(webhook).reduce(0) { $0 + $1.attempts } }
}

/// Increasing UUIDv7-shaped ids for test events.
enum UUIDv7Text {
    private static let counter = Mutex<UInt64>(0)
    static func next() -> String {
        let n = counter.withLock { $0 += 1; return $0 }
        let hex = String(n, radix: 16)
        let tail = String(repeating: "0", count: 12 - hex.count) + hex
        return "01939a3b-0000-7000-8000-\(tail)"
    }
}

/// A loopback HTTP/1.1 server (keep-alive, one thread per connection) that records every POST
/// and checks its Standard Webhooks signature against each of `secrets`.
final class WebhookTestReceiver: @unchecked Sendable {
    // @unchecked Sendable: mutable state only under `lock`; the sockets are in `listener` and
    // `connections`, which close each descriptor once and never touch one after that.
    enum Action { case status(Int), noAnswer, redirect(String), largeBody(status: Int, bytes: Int) }
    struct Received {
        var id: String
        var timestamp: String
        var signature: String
        var body: [UInt8]
        /// Per secret: did one of the signatures verify with it.
        var verified: [Bool]
        var httpVersion: String
    }

    let port: Int
    private let listener: LoopbackListener
    private let connections = ServedConnections()
    private let secrets: [WebhookSecret]
    private let decide: @Sendable (Int) -> Action
    private let lock = NSLock()
    private var received: [Received] = []
    private var accepted = 0

    /// `decide` gets the request's number (0, 1, ...) and says how to answer it.
    init(secrets: [WebhookSecret], port: Int? = nil, decide: @escaping @Sendable (Int) -> Action = { _ in .status(204) }) throws {
        self.secrets = secrets
        self.decide = decide
        listener = try port.map { try LoopbackListener(port: $0) } ?? LoopbackListener()
        self.port = listener.port
        listener.acceptInBackground { [self] c in
            guard connections.add(c) else { return }
            lock.lock(); accepted += 1; lock.unlock()
            Thread.detachNewThread { [self] in serve(c) }
        }
    }

    var url: String { "http://127.0.0.1:\(port)/hook" }
    var requests: [Received] { lock.lock(); defer { lock.unlock() }; return received }
    var connectionsAccepted: Int { lock.lock(); defer { lock.unlock() }; return accepted }
    /// Connections accepted and not closed yet (a serving thread closes its connection when
    /// the sender closes it).
    var connectionsOpen: Int { connections.count }

    /// Stops accepting and ends the connections still open. Idempotent.
    func close() {
        listener.close()
        connections.shutdownAll()
    }

    deinit { close() }

    private func serve(_ fd: Int32) {
        defer { connections.close(fd) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        func fill() -> Bool {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { return false }
            buffer.append(contentsOf: chunk[0..<n])
            return true
        }
        while true {
            var headerEnd: Int?
            while headerEnd == nil {
                if let r = buffer.firstRange(of: Array("\r\n\r\n".utf8)) { headerEnd = r.upperBound } else if !fill() { return }
            }
            let head = String(decoding: buffer[0..<headerEnd!], as: UTF8.self)
            var lines = head.components(separatedBy: "\r\n")
            let requestLine = lines.removeFirst()
            var headers: [String: String] = [:]
            for line in lines where !line.isEmpty {
                guard let colon = line.firstIndex(of: ":") else { continue }
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
            let length = Int(headers["content-length"] ?? "0") ?? 0
            while buffer.count < headerEnd! + length { if !fill() { return } }
            let body = Array(buffer[headerEnd!..<(headerEnd! + length)])
            buffer.removeSubrange(0..<(headerEnd! + length))
            let now = Int64(Date().timeIntervalSince1970)
            let entry = Received(id: headers["webhook-id"] ?? "", timestamp: headers["webhook-timestamp"] ?? "",
                                 signature: headers["webhook-signature"] ?? "", body: body,
                                 verified: secrets.map { WebhookSigning.verify(id: headers["webhook-id"] ?? "", timestamp: headers["webhook-timestamp"] ?? "",
                                                                               signatures: headers["webhook-signature"] ?? "", body: body, secret: $0, nowSeconds: now) },
                                 httpVersion: String(requestLine.split(separator: " ").last ?? ""))
            lock.lock()
            let number = received.count
            received.append(entry)
            lock.unlock()
            let answer: String
            switch decide(number) {
            case .status(let status): answer = "HTTP/1.1 \(status) X\r\nContent-Length: 2\r\n\r\nok"
            case .redirect(let location): answer = "HTTP/1.1 302 Found\r\nLocation: \(location)\r\nContent-Length: 0\r\n\r\n"
            case .largeBody(let status, let bytes): answer = "HTTP/1.1 \(status) X\r\nContent-Length: \(bytes)\r\n\r\n" + String(repeating: "x", count: bytes)
            case .noAnswer:
                // Holds the connection until the sender gives up on it and closes it.
                while fill() {}
                return
            }
            let bytes = Array(answer.utf8)
            guard bytes.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == bytes.count else { return }
        }
    }
}

/// Polls `condition` every 20 ms until it holds or `seconds` pass; returns whether it held.
func eventually(_ seconds: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

/// A 32-byte secret as `whsec_` text.
func makeWebhookSecretText(_ fill: UInt8) -> String { "whsec_" + Data(repeating: fill, count: 32).base64EncodedString() }
