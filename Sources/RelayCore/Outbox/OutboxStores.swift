// Opens the configured OutboxStore backend. relay-server and relayctl both call this, so every
// store command works the same on SQLite (one node) and PostgreSQL (several nodes).
import FoundationEssentials

public enum OutboxStores {
    /// `readOnly`: SQLite opens only a read connection; PostgreSQL skips migrations and refuses
    /// writes. Either way the schema must already be current (relay-server migrates on start).
    /// `onSlowStart`: see SQLiteStoreOptions.onSlowStart (a long SQLite migration).
    /// `exclusiveNode` (relay-server): a PostgreSQL store refuses to open while another live
    /// process holds its node id (PostgresStoreOptions.exclusiveNode).
    public static func open(_ config: RelayConfig.Store, readOnly: Bool = false, exclusiveNode: Bool = false, clock: any RelayClock = SystemRelayClock(),
                            logger: RelayLogger? = nil,
                            onSlowStart: (@Sendable (String) -> Void)? = nil, backgroundCheckpoints: Bool = true) throws -> any OutboxStore {
        switch config.kind {
        case "postgres":
            guard let url = config.url else { throw StoreError.invalid("store.url is required with store.kind \"postgres\"") }
            return try PostgresOutboxStore(
                options: PostgresStoreOptions(url: url, nodeID: config.nodeID, leaseMillis: Int64(config.leaseSeconds) * 1000, readOnly: readOnly,
                                              maxClockOffsetMillis: Int64(config.maxClockOffsetSeconds) * 1000,
                                              timeouts: config.timeouts, exclusiveNode: exclusiveNode && !readOnly),
                clock: clock, logger: logger)
        case "sqlite":
            var options = SQLiteStoreOptions(synchronous: config.synchronous, busyTimeoutMillis: Int32(config.busyTimeoutMillis), readOnly: readOnly)
            options.minFreeBytes = config.minFreeBytes
            options.onSlowStart = onSlowStart
            options.logger = logger
            options.backgroundCheckpoints = backgroundCheckpoints
            return try SQLiteOutboxStore(path: config.path, options: options, clock: clock)
        default:
            throw StoreError.invalid("unknown store kind \(config.kind)")
        }
    }

    /// Group-commit counters for /metrics, whichever backend.
    public static func writerStats(_ store: any OutboxStore) -> (batches: Int, jobs: Int)? {
        switch store {
        case let s as SQLiteOutboxStore: return s.writerStats
        case let s as PostgresOutboxStore: return s.writerStats
        default: return nil
        }
    }

    /// Retention and free-space metrics.
    public static func collectDiskMetrics(_ store: any OutboxStore, retention: RetentionSweeper?, into r: inout PrometheusRegistry) {
        retention?.collectMetrics(into: &r)
        if let g = store.freeSpaceGuard {
            r.gauge("relay_store_free_bytes", help: "Bytes free on the database's filesystem (probed at most once a second).", g.freeBytes ?? -1)
            r.gauge("relay_store_min_free_bytes", help: "store.minFreeBytes: below it ingest answers 503 storage_full.", g.minFreeBytes)
        }
    }

    /// Where the data lives, for logs (a PostgreSQL URL without its password).
    public static func describe(_ config: RelayConfig.Store) -> String {
        config.kind == "postgres" ? redactPostgresURL(config.url ?? "") : config.path
    }
}
