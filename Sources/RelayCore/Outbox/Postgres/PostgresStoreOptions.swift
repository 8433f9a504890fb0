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

    public init(url: String, nodeID: String? = nil, leaseMillis: Int64 = 60_000, maxBatch: Int = 1024, ingestConnections: Int = 2,
                readOnly: Bool = false, pendingRefreshMillis: Int64 = 1_000, maxClockOffsetMillis: Int64 = 10_000) {
        self.url = url
        self.nodeID = nodeID ?? Self.defaultNodeID()
        self.leaseMillis = leaseMillis
        self.maxBatch = maxBatch
        self.ingestConnections = ingestConnections
        self.readOnly = readOnly
        self.pendingRefreshMillis = pendingRefreshMillis
        self.maxClockOffsetMillis = maxClockOffsetMillis
    }

    /// host-pid: unique among live processes, new on every start.
    public static func defaultNodeID() -> String {
        "\(ProcessInfo.processInfo.hostName)-\(getpid())"
    }
}
