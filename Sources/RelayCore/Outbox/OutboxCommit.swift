// How a store tells the rest of the relay what it committed (modelled on GRDB's
// TransactionObserver: one protocol, told after COMMIT, never after a rollback). The dispatcher's
// channel is one observer (rows to send, queued rows to claim); the event feed and the webhook
// sender are others (events to read). Nothing an observer does reaches back into the
// transaction: a rolled-back transaction is simply never announced.
import Synchronization

/// What one COMMIT made that someone outside the store acts on.
public struct OutboxCommit: Sendable {
    /// Rows the commit inserted `inflight` for this observer, in insert order: it offered room
    /// for them (`roomForDueRows`) before the transaction, and owns them now (no claim will
    /// return them; if it cannot send them they are requeued at the next start, as any inflight
    /// row left behind). Empty for every other observer.
    public var handedOff: [OutboxRow] = []
    /// The commit stored rows that wait for a claim (`queued`: no room offered, or the token is
    /// paced and they are due later), or made held rows due again (a 410 cutoff scan finished).
    public var queuedDue = false
    /// The events it wrote, nil when none.
    public var events: EventsCommitted?

    public init(handedOff: [OutboxRow] = [], queuedDue: Bool = false, events: EventsCommitted? = nil) {
        self.handedOff = handedOff
        self.queuedDue = queuedDue
        self.events = events
    }

    var isEmpty: Bool { handedOff.isEmpty && !queuedDue && events == nil }
}

/// Told by a store after each COMMIT that changed something it acts on (`OutboxStore.addCommitObserver`).
/// Called on the store's own thread (the SQLite writer, a PostgreSQL worker), right after the
/// COMMIT returned and before that transaction's requests are answered: whoever sees a 202 also
/// sees the observers told. Implementations return quickly (post and signal; no I/O).
public protocol OutboxCommitObserver: AnyObject, Sendable {
    /// How many rows due now this observer takes at the next commit (the dispatcher: its free
    /// slots). Read by the store before each write transaction, outside it; a store that hands
    /// off (SQLite) inserts up to this many due rows `inflight` and gives them to this observer in
    /// `committed`. Taking them is not optional: they are its rows once committed. 0 (the
    /// default): every row waits for a claim.
    var roomForDueRows: Int { get }
    func committed(_ commit: OutboxCommit)
}

extension OutboxCommitObserver {
    public var roomForDueRows: Int { 0 }
}

/// A store's observers (held weakly: an observer's owner decides how long it listens), and the
/// one rule both backends follow to announce a commit.
final class CommitObservers: Sendable {
    private struct Entry {
        weak var observer: (any OutboxCommitObserver)?
    }

    private let entries = Mutex<[Entry]>([])

    init() {}

    func add(_ observer: any OutboxCommitObserver) {
        entries.withLock { list in
            list.removeAll { $0.observer == nil }
            list.append(Entry(observer: observer))
        }
    }

    /// The live observers, in registration order.
    var current: [any OutboxCommitObserver] { entries.withLock { $0.compactMap(\.observer) } }

    /// Before a write transaction: the first of `observers` (`current`, read once per
    /// transaction) offering room for due rows, and how much (nil: none offers any). One taker
    /// per transaction, so no row is handed to two observers.
    static func taker(among observers: [any OutboxCommitObserver]) -> (observer: any OutboxCommitObserver, room: Int)? {
        for o in observers {
            let room = o.roomForDueRows
            if room > 0 { return (o, room) }
        }
        return nil
    }

    /// After COMMIT (never after a rollback): the handed-off rows to `taker` (held by the
    /// store since the transaction began, so it is still there), the rest to every other
    /// observer: of `observers` when the store read them before the transaction (an observer
    /// added meanwhile hears from the next commit), else of `current`. Nothing is announced
    /// for a commit that changed nothing they act on.
    func committed(_ commit: OutboxCommit, taker: (any OutboxCommitObserver)? = nil, to observers: [any OutboxCommitObserver]? = nil) {
        precondition(commit.handedOff.isEmpty || taker != nil, "rows handed off without a taker")
        var others = commit
        others.handedOff = []
        if !others.isEmpty {
            for o in observers ?? current where o !== taker { o.committed(others) }
        }
        if let taker, !commit.isEmpty { taker.committed(commit) }
    }
}
