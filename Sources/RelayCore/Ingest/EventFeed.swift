// GET /v1/events: a credential's delivery events after a cursor, with an optional long poll.
// Reads run on the worker pool like GET /v1/responses/<id>; a poll that found nothing waits
// here, off every thread that serves requests, and is read again when this process commits
// events (OutboxStore.observeEvents), at least every `pollMillis` (other nodes' commits), and
// once more at its deadline. The HTTP loop never blocks: the answer is completed later.
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization

/// The query of GET /v1/events, validated: each bad parameter is a 400 naming it.
struct EventFeedQuery: Equatable {
    var after: Int64 = 0
    var limit = 100
    var waitSeconds = 0

    static let maxLimit = 1000
    static let maxWaitSeconds = 30

    /// `query`: the request target after "?", as sent (cursors are base64url: nothing to
    /// percent-decode; a percent-encoded one is refused like any other bad cursor).
    static func parse(_ query: String) -> Result<EventFeedQuery, ClientError> {
        var q = EventFeedQuery()
        var seen: Set<String> = []
        for pair in query.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = String(parts[0])
            let value = parts.count > 1 ? String(parts[1]) : ""
            guard ["after", "limit", "wait"].contains(name) else {
                return .failure(ClientError(status: 400, code: "unknown_parameter", field: String(name.prefix(64)), message: "known parameters: after, limit, wait"))
            }
            guard seen.insert(name).inserted else {
                return .failure(ClientError(status: 400, code: "duplicate_parameter", field: name, message: "\(name) given twice"))
            }
            switch name {
            case "after":
                guard let seq = EventCursor.decode(value) else {
                    return .failure(ClientError(status: 400, code: "invalid_cursor", field: "after", message: "not a cursor from this feed's \"next\""))
                }
                q.after = seq
            case "limit":
                guard let n = smallInt(value), (1...maxLimit).contains(n) else {
                    return .failure(ClientError(status: 400, code: "invalid_limit", field: "limit", message: "an integer from 1 to \(maxLimit)"))
                }
                q.limit = n
            default:
                guard let n = smallInt(value), (0...maxWaitSeconds).contains(n) else {
                    return .failure(ClientError(status: 400, code: "invalid_wait", field: "wait", message: "whole seconds from 0 to \(maxWaitSeconds)"))
                }
                q.waitSeconds = n
            }
        }
        return .success(q)
    }

    /// Decimal digits only (no sign, no spaces), at most 4 of them.
    private static func smallInt(_ s: String) -> Int? {
        guard !s.isEmpty, s.utf8.count <= 4, s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int(s)
    }
}

final class EventFeed: Sendable {
    struct Waiter {
        var credentialID: String
        var query: EventFeedQuery
        var deadlineMicros: Int64
        var answer: @Sendable (Result<EventPage, StoreError>?) -> Void
    }

    private struct State {
        var waiting: [Waiter] = []
        var threadRunning = false
        var woken = false
    }

    /// Long polls waiting at once; past it a poll is answered at once (empty, as if `wait` were 0).
    static let maxWaiting = 1024
    /// How often waiting polls are read again without a commit of this process (other nodes').
    let pollMillis: Int64
    private let store: any OutboxStore
    private let workers: WorkerPool
    private let state = Mutex(State())
    private let wake = Condition()

    init(store: any OutboxStore, workers: WorkerPool, pollMillis: Int64 = 1000) {
        self.store = store
        self.workers = workers
        self.pollMillis = pollMillis
    }

    /// Reads now; with nothing to return and time left, waits. `answer(nil)`: the worker pool
    /// is full (a 503).
    func serve(credentialID: String, query: EventFeedQuery, deadlineMicros: Int64,
               answer: @escaping @Sendable (Result<EventPage, StoreError>?) -> Void) {
        workers.submit({ [self] in
            let result = Result { try store.eventPage(credentialID: credentialID, after: query.after, limit: query.limit) }.mapError {
                ($0 as? StoreError) ?? .invalid("\($0)")
            }
            if case .success(let page) = result, page.events.isEmpty, monotonicMicros() < deadlineMicros {
                // Waits from where the read stopped (past other credentials' events).
                var q = query
                q.after = page.next
                if park(Waiter(credentialID: credentialID, query: q, deadlineMicros: deadlineMicros, answer: answer)) { return }
            }
            answer(result)
        }, whenFull: { answer(nil) })
    }

    /// Something was committed: waiting polls are read again.
    func eventsCommitted() {
        guard state.withLock({ !$0.waiting.isEmpty }) else { return }
        wake.withLock {
            state.withLock { $0.woken = true }
            wake.signal()
        }
    }

    var waitingCount: Int { state.withLock { $0.waiting.count } }

    private func park(_ w: Waiter) -> Bool {
        let start = state.withLock { s -> Bool? in
            guard s.waiting.count < Self.maxWaiting else { return nil }
            s.waiting.append(w)
            defer { s.threadRunning = true }
            return !s.threadRunning
        }
        guard let start else { return false }
        if start {
            let t = OSThread { [weak self] in
                while let feed = self, feed.runOnce() {}
            }
            t.name = "relay-event-feed"
            t.start()
        } else {
            wake.withLock { wake.signal() }
        }
        return true
    }

    /// One wait and one round of reads; false once nothing waits (the thread ends; the next
    /// long poll starts another).
    private func runOnce() -> Bool {
        let now = monotonicMicros()
        let (nearest, woken) = state.withLock { s in (s.waiting.map(\.deadlineMicros).min(), s.woken) }
        if !woken {
            let waitMicros = min(pollMillis * 1000, max(0, (nearest ?? now) - now))
            wake.withLock {
                if !state.withLock({ $0.woken }) { _ = wake.wait(until: Date().addingTimeInterval(Double(waitMicros) / 1e6)) }
            }
        }
        let due: [Waiter]? = state.withLock { s in
            s.woken = false
            guard !s.waiting.isEmpty else {
                s.threadRunning = false
                return nil
            }
            defer { s.waiting = [] }
            return s.waiting
        }
        guard let due else { return false }
        // Each is read once more (after its deadline: answered whatever it finds).
        for w in due { serve(credentialID: w.credentialID, query: w.query, deadlineMicros: w.deadlineMicros, answer: w.answer) }
        // A pause so a stream of commits does not turn into a stream of reads per poll.
        usleep(50_000)
        return true
    }

    /// `{"events":[{"id":...,"type":...,"timestamp":...,"data":{...}}, ...],"next":"<cursor>"}`:
    /// each entry is the webhook body with the event id in front.
    static func render(_ page: EventPage) -> [UInt8] {
        var out = Array("{\"events\":[".utf8)
        for (i, e) in page.events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += Array("{\"id\":\"\(e.id)\",".utf8)
            out += e.body.dropFirst()
        }
        out += Array("],\"next\":\"\(EventCursor.encode(page.next))\"}".utf8)
        return out
    }
}
