// Connection, node name, lease and batching of a PostgresOutboxStore (store.postgres.* keys).
import FoundationEssentials
import Glibc

public struct PostgresStoreOptions: Sendable {
    /// libpq connection URI or key=value string (may carry sslmode, options=-csearch_path=...).
    public var url: String
    /// This node's name in leases. Two live nodes must never share one. A name that stays the
    /// same across restarts lets `recoverInflight` take back this node's own leases at once;
    /// otherwise they return to the queue when they expire.
    public var nodeID: String
    /// How long a claimed row stays leased to this node. Longer than the APNs request timeout,
    /// so a live node's push is never reclaimed while its answer is on the way.
    public var leaseMillis: Int64
    public var maxBatch: Int
    /// Ingest batches in flight at once, each on its own connection and thread: while one
    /// waits for its commit's WAL flush the next is already being read and decided, and the
    /// server flushes their commits together.
    public var ingestConnections: Int
    /// Do not migrate; refuse writes (relayctl status/list next to running nodes).
    public var readOnly: Bool
    /// How often the shared outbox-bound estimate is recounted from the database.
    public var pendingRefreshMillis: Int64
    /// Past this offset between the node's clock and the database's (store.maxClockOffsetSeconds)
    /// the node claims nothing: its clock is broken (docs/postgres.md "One clock").
    public var maxClockOffsetMillis: Int64

    /// Deadlines of every call to the database (store.requestTimeoutMs and friends;
    /// docs/postgres.md "Deadlines").
    public var timeouts: PostgresTimeouts
    /// Hold a session advisory lock keyed by `nodeID` for the store's lifetime and refuse to
    /// open when another live process holds it (relay-server; relayctl shares the node's id
    /// without being a node).
    public var exclusiveNode: Bool

    public init(url: String, nodeID: String? = nil, leaseMillis: Int64 = 60_000, maxBatch: Int = 1024, ingestConnections: Int = 2,
                readOnly: Bool = false, pendingRefreshMillis: Int64 = 1_000, maxClockOffsetMillis: Int64 = 10_000,
                timeouts: PostgresTimeouts = PostgresTimeouts(), exclusiveNode: Bool = false) {
        self.url = url
        self.nodeID = nodeID ?? Self.defaultNodeID()
        self.leaseMillis = leaseMillis
        self.maxBatch = maxBatch
        self.ingestConnections = ingestConnections
        self.readOnly = readOnly
        self.pendingRefreshMillis = pendingRefreshMillis
        self.maxClockOffsetMillis = maxClockOffsetMillis
        self.timeouts = timeouts
        self.exclusiveNode = exclusiveNode
    }

    /// host-pid: unique among live processes, new on every start.
    public static func defaultNodeID() -> String {
        "\(ProcessInfo.processInfo.hostName)-\(getpid())"
    }
}

/// How long anything may wait for PostgreSQL. The relay's own deadline (`requestMillis`) bounds
/// what a caller waits, queueing included; the server-side ones end what the server would
/// otherwise keep running (a lock wait, a long statement, a transaction whose client stalled),
/// and `tcpUserMillis` lets the kernel give up on a peer that stopped acknowledging.
public struct PostgresTimeouts: Sendable, Equatable {
    /// store.requestTimeoutMs: a call (an ingest batch, a claim, a read) that has not been
    /// answered this long after it was queued fails with StoreError.unavailable (ingest: 503
    /// storage_unavailable) and its connection is abandoned, never reused in an unknown state.
    public var requestMillis: Int64 = 5_000
    /// store.statementTimeoutMs: the server's statement_timeout (0: off).
    public var statementMillis: Int64 = 4_000
    /// store.lockTimeoutMs: the server's lock_timeout (0: off).
    public var lockMillis: Int64 = 2_000
    /// store.idleInTransactionTimeoutMs: idle_in_transaction_session_timeout (0: off).
    public var idleInTransactionMillis: Int64 = 10_000
    /// store.tcpUserTimeoutMs: libpq's tcp_user_timeout (0: the kernel's default); the URL's
    /// own tcp_user_timeout wins.
    public var tcpUserMillis: Int64 = 10_000

    public init() {}

    /// /readyz's own connection answers within this (never more than a request).
    public var readinessMillis: Int64 { min(2_000, requestMillis) }

    /// Connecting (TCP, TLS, authentication, the session settings) gives up after this, or at
    /// the call's deadline if that comes first.
    static let connectMillis: Int64 = 5_000

    /// Run once on every new connection.
    var sessionSQL: String {
        "SET statement_timeout = \(statementMillis); SET lock_timeout = \(lockMillis); "
            + "SET idle_in_transaction_session_timeout = \(idleInTransactionMillis)"
    }
}
