// SQLiteOutboxStore: reads on the reader connection (GET, relayctl, metrics).
import FoundationEssentials
import Glibc
import POSIXThreads

extension SQLiteOutboxStore {
    // Not shared: SQLite finds a row by its key id_high (schema v5), PostgreSQL by id.
    public func response(id: String) throws -> OutboxRow? {
        let id = id.lowercased()
        guard let high = UUIDText.high64(id) else { return nil }
        return try read { db in
            try db.query("SELECT \(Self.rowColumns) FROM responses WHERE id_high = ? AND id = ?", [.integer(high), .text(id)]).first.map(OutboxRow.init(columns:))
        }
    }

    public func attempts(responseID: String) throws -> [AttemptRecord] {
        try read { db in
            try db.query(StoreStatements.attempts(responseID: responseID)).map(AttemptRecord.init(columns:))
        }
    }

    // Not shared: a token prefix is a range here, starts_with in PostgreSQL, whose order adds id.
    public func list(_ filter: OutboxFilter) throws -> [OutboxRow] {
        var clauses: [String] = []
        var binds: [SQLValue] = []
        if let s = filter.state { clauses.append("state = ?"); binds.append(.text(s.rawValue)) }
        if let a = filter.app { clauses.append("app = ?"); binds.append(.text(a)) }
        if let p = filter.tokenPrefix {
            // A range instead of LIKE. No index holds the token text (the dedupe index holds its
            // hash), so this scans the table: relayctl list only.
            clauses.append("push_token >= ? AND push_token < ?")
            binds.append(.text(p.lowercased()))
            binds.append(.text(p.lowercased() + "\u{7f}"))
        }
        if let since = filter.createdSince { clauses.append("created_at >= ?"); binds.append(.integer(since)) }
        let whereSQL = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        binds.append(.integer(Int64(max(0, filter.limit))))
        let sql = "SELECT \(Self.rowColumns) FROM responses \(whereSQL) ORDER BY created_at DESC LIMIT ?"
        return try read { db in try db.query(sql, binds).map(OutboxRow.init(columns:)) }
    }

    // Not shared: a count per literal state here (partial indexes), one GROUP BY in PostgreSQL.
    public func counts() throws -> OutboxCounts {
        try read { db in
            var by: [ResponseState: Int] = [:]
            for s in ResponseState.allCases {
                // A literal state: responses_claim (pending states) or responses_done (terminal) covers it.
                by[s] = Int(try db.scalar("SELECT count(*) FROM responses WHERE state = '\(s.rawValue)'").int ?? 0)
            }
            let q = try db.scalar("SELECT min(created_at) FROM responses WHERE state = 'queued'").int
            let r = try db.scalar("SELECT min(created_at) FROM responses WHERE state = 'retry'").int
            let oldest = [q, r].compactMap { $0 }.min()
            return OutboxCounts(byState: by, oldestPendingCreatedAt: oldest)
        }
    }

    // Not shared: the OR is responses_done's predicate (SQLite proves the partial index from it);
    // PostgreSQL orders NULL reasons first explicitly.
    public func recentOutcomes(since: Int64) throws -> [(state: ResponseState, reason: String?, count: Int)] {
        try read { db in
            try db.query(
                "SELECT state, last_reason, count(*) FROM responses WHERE (state = 'delivered' OR state = 'failed') AND updated_at >= ? GROUP BY state, last_reason ORDER BY state, last_reason",
                [.integer(since)]
            ).compactMap { c in
                guard let s = c[0].string.flatMap(ResponseState.init(rawValue:)) else { return nil }
                return (s, c[1].string, Int(c[2].int ?? 0))
            }
        }
    }

    public func unregisteredTokens() throws -> [UnregisteredToken] {
        try read { db in
            try db.query(StoreStatements.unregisteredTokens).map(UnregisteredToken.init(columns:))
        }
    }
}
