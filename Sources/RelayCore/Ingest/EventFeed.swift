// GET /v1/events: a credential's delivery events after a cursor, with an optional long poll.
// Reads run on the worker pool like GET /v1/responses/<id>; a poll that found nothing waits
// here, off every thread that serves requests, and is read again only when events of its own
// credential commit: this process's commits name their credentials or where their events are
// (the feed is a commit observer, OutboxStore.addCommitObserver; looked up on the feed's thread), other nodes' are asked for every
// `pollMillis` (eventCredentials). At most `maxRereads` woken
// polls are read at once; at its deadline a poll is answered empty without a read. The HTTP
// loop never blocks: the answer is completed later.
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
    /// percent-decode; a percent-encoded one is refused like any other bad cursor). `after` must
    /// be a cursor `cursor` sealed for `credentialID`.
    static func parse(_ query: String, cursor: FeedCursor, credentialID: String) -> Result<EventFeedQuery, ClientError> {
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
                guard let seq = cursor.open(value, credentialID: credentialID) else {
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
        /// Parked polls by credential: a commit of a credential's events reads only its own.
        var waiting: [String: [Waiter]] = [:]
        var waitingCount = 0
        /// Woken polls waiting for one of `maxRereads` read slots.
        var due: [Waiter] = []
        /// Reads of this feed under way, and the re-reads of woken polls among them.
        var reading = 0
        var rereading = 0
        /// The most re-reads under way at once so far (tests check the bound).
        var peakRereading = 0
        /// Bumped by each wake of a credential (and `all` of every one) while reads are under
        /// way: a read that began before its credential's bump may have missed those events, so
        /// it is read again instead of parked. Cleared when no read is under way.
        var generations: [String: UInt64] = [:]
        var all: UInt64 = 0
        var threadRunning = false
        var kicked = false
        /// This process's commits whose credentials the feed's thread is to look up
        /// (EventsCommitted without them): consecutive commits, merged. Only kept while a read is
        /// under way or a poll waits (nobody to wake otherwise, and a commit skipped then would
        /// make the next merge cover the wrong events).
        var unresolved: (after: Int64, count: Int)?
        /// Where the query for other processes' events goes on from (kept while no poll waits,
        /// so a poll parked later still hears of what committed meanwhile); nil until known.
        var polledThrough: Int64?
    }

    /// Long polls waiting at once; past it a poll is answered at once (empty, as if `wait` were 0).
    static let maxWaiting = 1024
    /// Of those, one credential's: its extra polls are answered at once, so one tenant's polls
    /// never fill the waiting room and turn another tenant's long polls into short ones.
    static let maxWaitingPerCredential = 64
    /// Woken polls read at once: a commit for many credentials queues their reads here instead
    /// of filling the worker pool (whose queue, when full, answers every read 503).
    static let maxRereads = 4
    /// Events looked at per query for other processes' commits.
    static let pollLimit = 10_000
    /// How often this feed asks the store which credentials got events from other processes
    /// (PostgreSQL nodes): those credentials' polls are read again. nil: never (SQLite, where
    /// only this process commits events).
    let pollMillis: Int64?
    /// eventPage calls made (tests count them).
    let storeReads = Atomic<Int>(0)
    private let store: any OutboxStore
    private let workers: WorkerPool
    private let state = Mutex(State())
    private let wake = Condition()
    /// The database's cursor key, read once (`cursor`).
    private let sealing = Mutex<(cursor: FeedCursor?, loading: Bool)>((nil, false))

    init(store: any OutboxStore, workers: WorkerPool, pollMillis: Int64? = 1000) {
        self.store = store
        self.workers = workers
        self.pollMillis = pollMillis
    }

    /// The cursor sealer, or nil while the key is not read yet (the store could not be read:
    /// a 503); then a read of the key is started.
    func cursor() -> FeedCursor? {
        let start = sealing.withLock { s -> Bool in
            guard s.cursor == nil, !s.loading else { return false }
            s.loading = true
            return true
        }
        if start {
            workers.submit { [self] in
                let key = try? store.feedCursorKey()
                sealing.withLock { $0 = (key.map(FeedCursor.init(key:)), false) }
            }
        }
        return sealing.withLock { $0.cursor }
    }

    /// At start-up, on the caller's thread: reads the cursor key, so the first request need not
    /// wait, and where other processes' events are looked for from.
    func prepare() {
        if let key = try? store.feedCursorKey() { sealing.withLock { $0.cursor = FeedCursor(key: key) } }
        if let last = try? store.lastEventSequence() { state.withLock { $0.polledThrough = $0.polledThrough ?? last } }
    }

    /// Reads now; with nothing to return and time left, waits. `answer(nil)`: the worker pool
    /// is full (a 503).
    func serve(credentialID: String, query: EventFeedQuery, deadlineMicros: Int64,
               answer: @escaping @Sendable (Result<EventPage, StoreError>?) -> Void) {
        read(Waiter(credentialID: credentialID, query: query, deadlineMicros: deadlineMicros, answer: answer), reread: false)
    }

    /// This process committed events: the waiting polls of their credentials are read again.
    /// Without the credentials, they are looked up on the feed's thread, only while someone
    /// waits (the committer, SQLite's writer, pays nothing).
    func eventsCommitted(_ c: EventsCommitted) {
        if let credentials = c.credentials { return eventsCommitted(credentials: credentials) }
        guard c.count > 0 else { return }
        let start = state.withLock { s -> Bool? in
            guard s.reading > 0 || s.waitingCount > 0 else {
                s.unresolved = nil
                return nil
            }
            if let u = s.unresolved { s.unresolved = (u.after, u.count + c.count) } else { s.unresolved = (c.after, c.count) }
            guard !s.threadRunning else { return false }
            s.threadRunning = true
            return true
        }
        guard let start else { return }
        if start { startThread() } else { kick() }
    }

    /// Events of `credentials` were committed: their waiting polls are read again.
    func eventsCommitted(credentials: Set<String>) {
        guard !credentials.isEmpty, state.withLock({ wakeLocked(&$0, credentials) }) else { return }
        kick()
    }

    var waitingCount: Int { state.withLock { $0.waitingCount + $0.due.count } }
    var readsUnderWay: Int { state.withLock { $0.reading } }
    var peakRereads: Int { state.withLock { $0.peakRereading } }
    /// Parked polls (not woken ones).
    var parkedCount: Int { state.withLock { $0.waitingCount } }

    /// In the state's lock: true when a parked poll became due.
    private func wakeLocked(_ s: inout State, _ credentials: Set<String>) -> Bool {
        guard s.reading > 0 || s.waitingCount > 0 else { return false }
        var woke = false
        for c in credentials {
            if s.reading > 0 { s.generations[c, default: 0] &+= 1 }
            if let ws = s.waiting.removeValue(forKey: c) {
                s.waitingCount -= ws.count
                s.due += ws
                woke = true
            }
        }
        return woke
    }

    private func kick() {
        wake.withLock {
            state.withLock { $0.kicked = true }
            wake.signal()
        }
    }

    /// `reread`: a woken poll, holding one of the `maxRereads` slots.
    private func read(_ w: Waiter, reread: Bool) {
        let seen = state.withLock { s in
            s.reading += 1
            return (s.all, s.generations[w.credentialID] ?? 0)
        }
        workers.submit({ [self] in
            storeReads.add(1, ordering: .relaxed)
            let result = Result { try store.eventPage(credentialID: w.credentialID, after: w.query.after, limit: w.query.limit) }.mapError {
                ($0 as? StoreError) ?? .invalid("\($0)")
            }
            var parked: Waiter?
            if case .success(let page) = result, page.events.isEmpty, monotonicMicros() < w.deadlineMicros {
                // Waits from where the read stopped (past other credentials' events).
                var next = w
                next.query.after = page.next
                parked = next
            }
            if !settle(parked, seen: seen, reread: reread) { w.answer(result) }
        }, whenFull: {
            _ = settle(nil, seen: seen, reread: reread)
            w.answer(nil)
        })
    }

    /// A read ended: parks `w` (true) unless nothing is to wait or the waiting room is full.
    private func settle(_ w: Waiter?, seen: (all: UInt64, credential: UInt64), reread: Bool) -> Bool {
        let (parked, start, freed) = state.withLock { s -> (Bool, Bool, Bool) in
            s.reading -= 1
            if reread { s.rereading -= 1 }
            var parked = false
            if let w {
                if s.all != seen.all || (s.generations[w.credentialID] ?? 0) != seen.credential {
                    s.due.append(w)   // woken while it read: read again
                    parked = true
                } else if s.waitingCount < Self.maxWaiting, (s.waiting[w.credentialID]?.count ?? 0) < Self.maxWaitingPerCredential {
                    s.waiting[w.credentialID, default: []].append(w)
                    s.waitingCount += 1
                    parked = true
                }
            }
            if s.reading == 0 { s.generations.removeAll() }
            let start = parked && !s.threadRunning
            if start { s.threadRunning = true }
            return (parked, start, reread || !s.due.isEmpty)
        }
        if start { startThread() } else if freed { kick() }
        return parked
    }

    /// After setting threadRunning.
    private func startThread() {
        let t = OSThread { [weak self] in
            guard let feed = self else { return }
            var poll = PollState()
            while feed.runOnce(&poll) {}
        }
        t.name = "relay-event-feed"
        t.start()
    }

    private struct PollState {
        var nextAt: Int64 = 0
    }

    /// One round: other processes' events, deadlines, re-reads up to the bound, then a wait;
    /// false once nothing waits (the thread ends; the next long poll starts another).
    private func runOnce(_ poll: inout PollState) -> Bool {
        if let u = state.withLock({ s -> (after: Int64, count: Int)? in defer { s.unresolved = nil }; return s.unresolved }) {
            // This process's commits: their events' credentials, by sequence.
            if let owners = try? store.eventCredentials(after: u.after, limit: u.count) {
                _ = state.withLock { wakeLocked(&$0, owners.credentials) }
            } else {
                // Unreadable now: every poll is read again rather than left to its deadline.
                state.withLock { s in
                    s.all &+= 1
                    s.due += s.waiting.values.joined()
                    s.waiting = [:]
                    s.waitingCount = 0
                }
            }
        }
        var now = monotonicMicros()
        if let pollMillis, now >= poll.nextAt {
            var credentials: Set<String> = []
            var everyone = false
            var more = false
            do {
                if let through = state.withLock({ $0.polledThrough }) {
                    let owners = try store.eventCredentials(after: through, limit: Self.pollLimit)
                    state.withLock { $0.polledThrough = owners.through }
                    credentials = owners.credentials
                    more = owners.examined >= Self.pollLimit
                } else {
                    // From the newest on; polls parked before may have missed what came between
                    // their read and this one: all are read again once.
                    let last = try store.lastEventSequence()
                    state.withLock { $0.polledThrough = last }
                    everyone = true
                }
            } catch {
                more = false   // the store is unreachable: asked again at the next poll
            }
            poll.nextAt = more ? now : now + pollMillis * 1000
            _ = state.withLock { s -> Bool in
                if everyone {
                    s.all &+= 1
                    s.due += s.waiting.values.joined()
                    s.waiting = [:]
                    s.waitingCount = 0
                    return true
                }
                return wakeLocked(&s, credentials)
            }
        }
        now = monotonicMicros()
        var expired: [Waiter] = []
        let (reads, nearest, running) = state.withLock { s -> ([Waiter], Int64?, Bool) in
            s.kicked = false
            // At its deadline a poll is answered empty, from where it waits: no read.
            var nearest: Int64?
            for (c, ws) in s.waiting {
                var keep: [Waiter] = []
                for w in ws {
                    if w.deadlineMicros <= now { expired.append(w) } else {
                        keep.append(w)
                        nearest = min(nearest ?? w.deadlineMicros, w.deadlineMicros)
                    }
                }
                s.waiting[c] = keep.isEmpty ? nil : keep
            }
            s.waitingCount -= expired.count
            let n = max(0, min(s.due.count, Self.maxRereads - s.rereading))
            let reads = Array(s.due.prefix(n))
            s.due.removeFirst(n)
            s.rereading += n
            s.peakRereading = max(s.peakRereading, s.rereading)
            if s.waitingCount == 0 && s.due.isEmpty && s.rereading == 0 && s.unresolved == nil {
                s.threadRunning = false
                return (reads, nil, false)
            }
            return (reads, nearest, true)
        }
        for w in expired { w.answer(.success(EventPage(events: [], next: w.query.after))) }
        for w in reads { read(w, reread: true) }
        guard running else { return false }
        let until = pollMillis == nil ? nearest ?? .max : min(poll.nextAt, nearest ?? poll.nextAt)
        wake.withLock {
            if !state.withLock({ $0.kicked || $0.unresolved != nil }) {
                // At most a minute: nothing is due without a deadline or a kick, so this is only a bound.
                _ = wake.wait(until: Date().addingTimeInterval(Double(min(60_000_000, max(0, until - monotonicMicros()))) / 1e6))
            }
        }
        return true
    }

    /// `{"events":[{"id":...,"type":...,"timestamp":...,"data":{...}}, ...],"next":"<cursor>"}`:
    /// each entry is the webhook body with the event id in front.
    static func render(_ page: EventPage, next: String) -> [UInt8] {
        var out = Array("{\"events\":[".utf8)
        for (i, e) in page.events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += Array("{\"id\":\"\(e.id)\",".utf8)
            out += e.body.dropFirst()
        }
        out += Array("],\"next\":\"\(next)\"}".utf8)
        return out
    }
}

extension EventFeed: OutboxCommitObserver {
    /// The store's commits: those that wrote events read their credentials' waiting polls again.
    func committed(_ commit: OutboxCommit) {
        if let events = commit.events { eventsCommitted(events) }
    }
}
