// The event body's exact bytes: what every webhook attempt signs and the feed lists. Pinned as
// literals, and against the string-interpolation renderer it replaced (kept here as the reference).
import Basics
import Testing
@testable import RelayCore

@Suite struct EventBodyTests {
    static let failed = EventRecord(
        id: "01938f6e-0000-7000-8000-000000000001", sequence: 1, type: .responseFailed, createdAt: 1_733_419_824_123, credentialID: "c1",
        app: "com.example.companion", pushToken: "a0b1", responseID: "01938f6e-aaaa-7000-8000-000000000002",
        sessionIdentifier: "6F1C5E0A-\"quoted\"\\\n\u{1}é", keyID: [1, 2, 3, 4], messageIndex: 7, state: "failed", status: 400,
        reason: "BadDeviceToken", attempts: 1, acceptedAt: 1_733_419_823_901, finishedAt: 1_733_419_824_123)
    static let unregistered = EventRecord(
        id: "01938f6e-0000-7000-8000-000000000003", sequence: 2, type: .tokenUnregistered, createdAt: 1_733_419_862_004, credentialID: "c1",
        app: "com.example.companion", pushToken: "a0b1", unregisteredAt: 1_733_419_861_000)
    static let delivered = EventRecord(
        id: "01938f6e-0000-7000-8000-000000000004", sequence: 3, type: .responseDelivered, createdAt: -1, credentialID: nil,
        app: "", pushToken: "", responseID: nil, messageIndex: Int64.min, state: "delivered", attempts: Int64.max)

    @Test func bodiesAreExactlyTheseBytes() {
        #expect(String(decoding: Self.failed.body, as: UTF8.self) == #"{"type":"response.failed","timestamp":"2024-12-05T17:30:24.123Z","data":{"id":"01938f6e-aaaa-7000-8000-000000000002","app":"com.example.companion","pushToken":"a0b1","sessionIdentifier":"6F1C5E0A-\"quoted\"\\\n\u0001é","keyID":"AQIDBA==","messageIndex":7,"state":"failed","status":400,"reason":"BadDeviceToken","attempts":1,"acceptedAt":"2024-12-05T17:30:23.901Z","finishedAt":"2024-12-05T17:30:24.123Z"}}"#)
        #expect(String(decoding: Self.unregistered.body, as: UTF8.self) == #"{"type":"token.unregistered","timestamp":"2024-12-05T17:31:02.004Z","data":{"pushToken":"a0b1","app":"com.example.companion","unregisteredAt":"2024-12-05T17:31:01.000Z"}}"#)
    }

    @Test func sameBytesAsTheInterpolatedRenderer() {
        for record in [Self.failed, Self.unregistered, Self.delivered] {
            #expect(record.body == Self.interpolated(record), "\(String(decoding: record.body, as: UTF8.self))")
        }
    }

    /// The renderer before the byte writer, verbatim.
    static func interpolated(_ r: EventRecord) -> [UInt8] {
        func str(_ s: String?) -> String { s.map(jsonString) ?? "null" }
        func int(_ i: Int64?) -> String { i.map { String($0) } ?? "null" }
        func time(_ t: Int64?) -> String { t.map { "\"\(IngestService.iso($0))\"" } ?? "null" }
        var s = "{\"type\":\"\(r.type.rawValue)\",\"timestamp\":\"\(IngestService.iso(r.createdAt))\",\"data\":{"
        switch r.type {
        case .tokenUnregistered:
            s += "\"pushToken\":\(str(r.pushToken)),\"app\":\(str(r.app)),\"unregisteredAt\":\(time(r.unregisteredAt))"
        case .responseDelivered, .responseFailed:
            s += "\"id\":\(str(r.responseID)),\"app\":\(str(r.app)),\"pushToken\":\(str(r.pushToken))"
            s += ",\"sessionIdentifier\":\(str(r.sessionIdentifier)),\"keyID\":\(str(r.keyID.map { Basics.Base64.encode($0) }))"
            s += ",\"messageIndex\":\(int(r.messageIndex)),\"state\":\(str(r.state)),\"status\":\(int(r.status)),\"reason\":\(str(r.reason))"
            s += ",\"attempts\":\(int(r.attempts)),\"acceptedAt\":\(time(r.acceptedAt)),\"finishedAt\":\(time(r.finishedAt))"
        }
        return Array((s + "}}").utf8)
    }
}
