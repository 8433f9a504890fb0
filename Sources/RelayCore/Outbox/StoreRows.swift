// The decoders of the stores' result rows, once for both backends: a backend only says how to
// read column i of a row (StoreColumns), the column order is the one its SELECTs name.

/// Column i of one result row, NULL as nil.
protocol StoreColumns {
    var columnCount: Int { get }
    func int(_ i: Int) -> Int64?
    func string(_ i: Int) -> String?
    func bytes(_ i: Int) -> [UInt8]?
}

/// One value of a backend's row array ([SQLValue], [PGValue]).
protocol StoreColumnValue {
    var int: Int64? { get }
    var string: String? { get }
    var bytes: [UInt8]? { get }
}

extension Array: StoreColumns where Element: StoreColumnValue {
    var columnCount: Int { count }
    func int(_ i: Int) -> Int64? { self[i].int }
    func string(_ i: Int) -> String? { self[i].string }
    func bytes(_ i: Int) -> [UInt8]? { self[i].bytes }
}

extension OutboxRow {
    /// id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id,
    /// state, attempts, next_attempt_at, created_at, expires_at, last_status, last_reason,
    /// updated_at (each store's `rowColumns`); a claim may append columns after these.
    init(columns c: some StoreColumns) throws {
        guard c.columnCount >= 16, let id = c.string(0), let state = c.string(8).flatMap(ResponseState.init(rawValue:)) else {
            throw StoreError.invalid("malformed responses row")
        }
        self.init(
            id: id, app: c.string(1) ?? "", pushToken: c.string(2) ?? "", sessionIdentifier: c.string(3) ?? "",
            keyID: c.bytes(4) ?? [], messageIndex: UInt32(truncatingIfNeeded: c.int(5) ?? 0), encryptedData: c.bytes(6) ?? [],
            credentialID: c.string(7) ?? "", state: state, attempts: Int(c.int(9) ?? 0), nextAttemptAt: c.int(10) ?? 0,
            createdAt: c.int(11) ?? 0, expiresAt: c.int(12) ?? 0, lastStatus: c.int(13).map { Int($0) }, lastReason: c.string(14),
            updatedAt: c.int(15) ?? 0)
    }
}

extension AttemptRecord {
    /// response_id, attempted_at, status, reason, apns_timestamp, latency_us.
    init(columns c: some StoreColumns) {
        self.init(responseID: c.string(0) ?? "", attemptedAt: c.int(1) ?? 0, status: c.int(2).map { Int($0) },
                  reason: c.string(3), apnsTimestamp: c.int(4), latencyMicros: c.int(5))
    }
}

extension CredentialRecord {
    /// id, name, apps, created_at, last_used_at, revoked_at.
    init(columns c: some StoreColumns) {
        self.init(id: c.string(0) ?? "", name: c.string(1) ?? "", apps: Credentials.splitApps(c.string(2) ?? ""),
                  createdAt: c.int(3) ?? 0, lastUsedAt: c.int(4), revokedAt: c.int(5))
    }
}

extension CredentialKey {
    /// id, hash, revoked_at, apps.
    init(columns c: some StoreColumns) {
        self.init(id: c.string(0) ?? "", hash: c.bytes(1) ?? [], revoked: c.int(2) != nil, apps: Credentials.splitApps(c.string(3) ?? ""))
    }
}

extension UnregisteredToken {
    /// token, apns_timestamp, recorded_at, reason.
    init(columns c: some StoreColumns) {
        self.init(token: c.string(0) ?? "", apnsTimestamp: c.int(1) ?? 0, recordedAt: c.int(2) ?? 0,
                  reason: c.string(3) ?? StoreRules.unregisteredReason)
    }
}
