// PostgresOutboxStore: reads on the query connection (GET, relayctl, metrics).
import FoundationEssentials
import Glibc
import Synchronization

extension PostgresOutboxStore {
    public func response(id: String) throws -> OutboxRow? {
        try read { c in
            try c.query("SELECT \(Self.rowColumns) FROM responses r WHERE r.id = $1", [.text(id.lowercased())]).first.map(OutboxRow.init(columns:))
        }
    }

    public func attempts(responseID: String) throws -> [AttemptRecord] {
        try read { c in
            try c.query(StoreStatements.attempts(responseID: responseID)).map(AttemptRecord.init(columns:))
        }
    }

    /// Which node made each attempt of a response (tests and `relayctl show` diagnostics).
    public func attemptNodes(responseID: String) throws -> [String?] {
        try read { c in
            try c.query("SELECT node FROM attempts WHERE response_id = $1 ORDER BY id", [.text(responseID.lowercased())]).map { $0[0].string }
        }
    }

    public func list(_ filter: OutboxFilter) throws -> [OutboxRow] {
        var clauses: [String] = []
        var binds: [PGValue] = []
        func bind(_ v: PGValue) -> String {
            binds.append(v)
            return "$\(binds.count)"
        }
        if let s = filter.state { clauses.append("r.state = " + bind(.text(s.rawValue))) }
        if let a = filter.app { clauses.append("r.app = " + bind(.text(a))) }
        if let p = filter.tokenPrefix { clauses.append("starts_with(r.push_token, " + bind(.text(p.lowercased())) + ")") }
        if let since = filter.createdSince { clauses.append("r.created_at >= " + bind(.int(since))) }
        let whereSQL = clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ")
        let limit = bind(.int(Int64(max(0, filter.limit))))
        let sql = "SELECT \(Self.rowColumns) FROM responses r \(whereSQL) ORDER BY r.created_at DESC, r.id LIMIT \(limit)"
        let params = binds
        return try read { c in try c.query(sql, params).map(OutboxRow.init(columns:)) }
    }

    /// On the admin connection (adminRead): the GROUP BY reads the whole table.
    public func counts() throws -> OutboxCounts {
        try adminRead { c in
            var by: [ResponseState: Int] = [:]
            for s in ResponseState.allCases { by[s] = 0 }
            for r in try c.query("SELECT state, count(*) FROM responses GROUP BY state") {
                if let s = r[0].string.flatMap(ResponseState.init(rawValue:)) { by[s] = Int(r[1].int ?? 0) }
            }
            let oldest = try c.query("SELECT min(created_at) FROM responses WHERE state IN ('queued','retry')").first?.first?.int
            return OutboxCounts(byState: by, oldestPendingCreatedAt: oldest)
        }
    }

    public func recentOutcomes(since: Int64) throws -> [(state: ResponseState, reason: String?, count: Int)] {
        let since = clock.toDatabase(since)
        return try read { c in
            try c.query(
                """
                SELECT state, last_reason, count(*) FROM responses WHERE state IN ('delivered','failed') AND updated_at >= $1
                GROUP BY state, last_reason ORDER BY state, last_reason NULLS FIRST
                """, [.int(since)]
            ).compactMap { r in
                guard let s = r[0].string.flatMap(ResponseState.init(rawValue:)) else { return nil }
                return (s, r[1].string, Int(r[2].int ?? 0))
            }
        }
    }
    public func unregisteredTokens() throws -> [UnregisteredToken] {
        try read { c in
            try c.query(StoreStatements.unregisteredTokens).map(UnregisteredToken.init(columns:))
        }
    }
}
