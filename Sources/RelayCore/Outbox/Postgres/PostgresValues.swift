// What crosses the libpq boundary as Swift values: bound and read values, and the SQLSTATEs the
// store acts on.

/// A value bound to or read from PostgreSQL. Times are bigint milliseconds since 1970.
enum PGValue: Sendable, Equatable {
    case null
    case int(Int64)
    case text(String)
    case bytes([UInt8])
    case bool(Bool)
    /// text[] (elements may be NULL)
    case textArray([String?])
    /// bigint[] (elements may be NULL)
    case intArray([Int64?])
    /// bytea[]
    case bytesArray([[UInt8]])

    var int: Int64? { if case .int(let v) = self { return v }; return nil }
    var string: String? { if case .text(let v) = self { return v }; return nil }
    var bytes: [UInt8]? { if case .bytes(let v) = self { return v }; return nil }
    var bool: Bool? { if case .bool(let v) = self { return v }; return nil }
    var isNull: Bool { self == .null }
}

/// One row of a result, by column position.
typealias PGRow = [PGValue]

/// SQLSTATEs the store reacts to (https://www.postgresql.org/docs/15/errcodes-appendix.html).
enum PGState {
    static let serializationFailure = "40001"
    static let deadlockDetected = "40P01"
    static let uniqueViolation = "23505"
    /// A write on a standby (hot standby, or a primary demoted by a failover), or a session
    /// whose default_transaction_read_only is on.
    static let readOnlyTransaction = "25006"
    /// A prepared statement the server no longer knows (a pooler handed us another session).
    static let invalidStatementName = "26000"
    /// "cached plan must not change result type": a table changed under a prepared statement
    /// (another node migrated).
    static let featureNotSupported = "0A000"
    /// Class 08 (connection exception) and 57P0x (admin/crash shutdown, cannot connect now):
    /// the connection is gone.
    static func isConnectionLoss(_ s: String) -> Bool { s.hasPrefix("08") || s.hasPrefix("57P0") }
    static func isRetryable(_ s: String) -> Bool { s == serializationFailure || s == deadlockDetected }
    /// The connection is open but unfit: it reached a standby (25006), or its prepared
    /// statements no longer match the server (26000, 0A000). The owner replaces it, which also
    /// clears the statement cache and re-checks the schema version; with
    /// `target_session_attrs=read-write` in the URL the new one reaches the primary.
    static func needsNewConnection(_ s: String) -> Bool {
        isConnectionLoss(s) || s == readOnlyTransaction || s == invalidStatementName || s == featureNotSupported
    }
}

extension PGValue: StoreColumnValue {}

// The shared statements (StoreStatement.swift), run on PostgreSQL as written.
extension PostgresConnection {
    /// Every row of a shared statement, run as written.
    @discardableResult
    func query(_ s: StoreStatement) throws -> [PGRow] {
        try query(s.sql.postgres, s.values.map(PGValue.init))
    }

    /// Runs a shared statement as written; also returns the affected-row count.
    func run(_ s: StoreStatement) throws -> (rows: [PGRow], affected: Int) {
        try run(s.sql.postgres, s.values.map(PGValue.init))
    }
}

extension PGValue {
    init(_ v: StoreValue) {
        switch v {
        case .null: self = .null
        case .int(let i): self = .int(i)
        case .text(let s): self = .text(s)
        case .bytes(let b): self = .bytes(b)
        }
    }
}
