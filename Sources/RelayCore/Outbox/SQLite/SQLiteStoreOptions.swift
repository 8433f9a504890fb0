// Tuning and mode of a SQLiteOutboxStore (store.* keys of the config).
public struct SQLiteStoreOptions: Sendable {
    public enum Synchronous: String, Sendable {
        case full = "FULL", normal = "NORMAL"
    }
    /// FULL (default) survives power loss; NORMAL in WAL mode survives process crashes only.
    public var synchronous: Synchronous = .full
    public var busyTimeoutMillis: Int32 = 5000
    public var maxBatch: Int = 1024
    /// Open only a read connection (relayctl status/list while the server runs).
    public var readOnly: Bool = false
    /// store.minFreeBytes: ingest answers storageFull below it (0 = off); `freeSpaceProbe`
    /// replaces statvfs in tests.
    public var minFreeBytes: Int64 = 0
    public var freeSpaceProbe: FreeSpaceGuard.Probe?
    /// Called about once a second while opening the store takes long (a schema migration that
    /// rebuilds the outbox: ~16 s per million rows), with a human-readable stage. relay-server
    /// uses it to extend systemd's start timeout (EXTEND_TIMEOUT_USEC) and to log progress.
    public var onSlowStart: (@Sendable (String) -> Void)?
    /// When the background checkpointer copies the WAL into the database file (SQLiteCheckpointer).
    public var checkpoint = SQLiteCheckpointPolicy()
    /// false for short-lived writers (relayctl): no checkpointer thread and no TRUNCATE
    /// checkpoint at close (which could hold a running relay-server's writer for its copy);
    /// SQLite's own PASSIVE autocheckpoint in the COMMIT instead, as any SQLite client.
    public var backgroundCheckpoints = true
    /// Where the checkpointer and the dedupe merge report failures (nil: nowhere).
    public var logger: RelayLogger?
    /// Unmerged dedupe keys at which the writer merges them into the on-disk index (memory
    /// and restart rebuild are bounded by it; larger merges share more index pages).
    public var dedupeMergeRows: Int = DedupeIndex.defaultMergeRows
    /// Tests only: replaces the keyed dedupe hash (e.g. a constant, to force collisions).
    public var dedupeHash: DedupeHashFunction?
    public init(synchronous: Synchronous = .full, busyTimeoutMillis: Int32 = 5000, maxBatch: Int = 1024, readOnly: Bool = false) {
        self.synchronous = synchronous
        self.busyTimeoutMillis = busyTimeoutMillis
        self.maxBatch = maxBatch
        self.readOnly = readOnly
    }
}
