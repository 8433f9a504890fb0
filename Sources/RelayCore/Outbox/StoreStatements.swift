// The statements both stores run with the same SQL and the same values, each written once
// (the seam: StoreStatement.swift). A statement whose dialects differ (RETURNING, arrays,
// leases, SKIP LOCKED, ON CONFLICT, a partial index's predicate) stays in its store, which says
// why where it runs it. Times are passed in each store's own clock (PostgreSQL's database time).

enum StoreStatements {
    // MARK: Attempts

    /// What AttemptRecord(columns:) reads, in its order; also the attempt INSERTs' columns.
    static let attemptColumns = "response_id, attempted_at, status, reason, apns_timestamp, latency_us"

    private static let attemptsSQL = StoreSQL("SELECT \(attemptColumns) FROM attempts WHERE response_id = $1 ORDER BY id")
    static func attempts(responseID: String) -> StoreStatement {
        StoreStatement(attemptsSQL, [.text(responseID.lowercased())])
    }

    // MARK: Credentials

    /// What CredentialRecord(columns:) reads, in its order.
    static let credentialColumns = "id, name, apps, created_at, last_used_at, revoked_at"

    static let credentials = StoreStatement(StoreSQL("SELECT \(credentialColumns) FROM credentials ORDER BY created_at, id"))

    /// The credential columns, then hash (column 6, compared again in constant time).
    private static let authenticateSQL = StoreSQL("SELECT \(credentialColumns), hash FROM credentials WHERE hash = $1")
    static func authenticate(hash: [UInt8]) -> StoreStatement { StoreStatement(authenticateSQL, [.bytes(hash)]) }

    private static let revokeSQL = StoreSQL("UPDATE credentials SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
    static func revokeCredential(id: String, now: Int64) -> StoreStatement { StoreStatement(revokeSQL, [.int(now), .text(id)]) }

    static let credentialGeneration = StoreStatement(StoreSQL("SELECT generation FROM credential_generation WHERE id = 1"))
    /// What CredentialKey(columns:) reads, every credential.
    static let credentialKeys = StoreStatement(StoreSQL("SELECT id, hash, revoked_at, apps FROM credentials"))

    // MARK: Tokens

    /// What UnregisteredToken(columns:) reads; newest first, ties by token.
    static let unregisteredTokens = StoreStatement(StoreSQL(
        "SELECT token, apns_timestamp, recorded_at, reason FROM unregistered_tokens ORDER BY recorded_at DESC, token"))

    private static let forgetTokenSQL = StoreSQL("DELETE FROM unregistered_tokens WHERE token = $1")
    static func forgetToken(_ token: String) -> StoreStatement { StoreStatement(forgetTokenSQL, [.text(token.lowercased())]) }

    // MARK: Responses

    /// An app's queued rows that wait (released by a pause) become due now. state = 'queued'
    /// as a literal: SQLite's partial claim index narrows it to those rows.
    private static let hastenSQL = StoreSQL("UPDATE responses SET next_attempt_at = $1 WHERE state = 'queued' AND next_attempt_at > $1 AND app = $2")
    static func hastenQueued(app: String, now: Int64) -> StoreStatement { StoreStatement(hastenSQL, [.int(now), .text(app)]) }

    /// A purge's dry run (an operator's command: its text is rendered at each call). The state
    /// is a literal (a terminal enum value, not client input) so SQLite's planner can use the
    /// partial index responses_done, which a bound parameter would not prove.
    static func purgeCount(state: ResponseState, olderThan: Int64) throws -> StoreStatement {
        try StoreRules.checkPurgeable(state)
        return StoreStatement(StoreSQL("SELECT count(*) FROM responses WHERE state = '\(state.rawValue)' AND updated_at < $1"), [.int(olderThan)])
    }
}
