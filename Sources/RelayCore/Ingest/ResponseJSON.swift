// The JSON of `GET /v1/responses/<id>` (docs/api.md): the row and its attempts.
import Basics

extension IngestService {
    static func iso(_ ms: Int64) -> String {
        iso8601UTC(millis: ms)
    }

    static func render(_ row: OutboxRow, _ attempts: [AttemptRecord]) -> String {
        var s = "{\"id\":\"\(row.id)\",\"state\":\"\(row.state.rawValue)\",\"app\":\(jsonString(row.app))"
        s += ",\"attempts\":\(row.attempts)"
        s += ",\"lastStatus\":\(row.lastStatus.map(String.init) ?? "null")"
        s += ",\"lastReason\":\(row.lastReason.map(jsonString) ?? "null")"
        s += ",\"createdAt\":\"\(iso(row.createdAt))\",\"updatedAt\":\"\(iso(row.updatedAt))\",\"expiresAt\":\"\(iso(row.expiresAt))\""
        if row.state == .queued || row.state == .retry { s += ",\"nextAttemptAt\":\"\(iso(row.nextAttemptAt))\"" }
        s += ",\"history\":["
        s += attempts.map { a in
            "{\"at\":\"\(iso(a.attemptedAt))\",\"status\":\(a.status.map(String.init) ?? "null"),\"reason\":\(a.reason.map(jsonString) ?? "null")}"
        }.joined(separator: ",")
        return s + "]}"
    }
}
