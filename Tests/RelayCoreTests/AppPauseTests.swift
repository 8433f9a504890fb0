// Paused apps: the one rule of which answers pause (a table over every APNs reason), the probe
// schedule, and the state machine's pause, probe, release and resume, without threads or I/O.
import Testing
@testable import RelayCore

@Suite struct AppPauseTests {
    typealias Action = DispatcherStateMachine.Action
    static let app = "com.example.app"

    /// Every reason in Apple's table (PROTOCOL.md), with its status, and whether it pauses the
    /// app. Anything about the push or the device keeps its usual outcome.
    static let table: [(status: Int, reason: String, pauses: Bool)] = [
        (400, "BadCollapseId", false), (400, "BadDeviceToken", false), (400, "BadExpirationDate", false),
        (400, "BadMessageId", false), (400, "BadPriority", false), (400, "BadTopic", true),
        (400, "DeviceTokenNotForTopic", false), (400, "DuplicateHeaders", false), (400, "IdleTimeout", false),
        (400, "InvalidPushType", false), (400, "MissingDeviceToken", false), (400, "MissingTopic", true),
        (400, "PayloadEmpty", false), (400, "TopicDisallowed", true),
        (403, "BadCertificate", true), (403, "BadCertificateEnvironment", true), (403, "ExpiredProviderToken", true),
        (403, "Forbidden", false), (403, "InvalidProviderToken", true), (403, "MissingProviderToken", true),
        (403, "UnrelatedKeyIdInToken", true), (403, "BadEnvironmentKeyIdInToken", true),
        (404, "BadPath", false), (405, "MethodNotAllowed", false),
        (410, "ExpiredToken", false), (410, "Unregistered", false), (413, "PayloadTooLarge", false),
        (429, "TooManyProviderTokenUpdates", true), (429, "TooManyRequests", false),
        (500, "InternalServerError", false), (503, "ServiceUnavailable", false), (503, "Shutdown", false),
    ]

    @Test func theTableCoversEveryDocumentedReason() {
        #expect(Self.table.count == 32)
        #expect(Set(Self.table.map(\.reason)).count == 32)
        #expect(Set(Self.table.filter(\.pauses).map(\.reason)) == PauseRule.reasons)
    }

    @Test(arguments: table.map { ($0.status, $0.reason, $0.pauses) })
    func whichAnswersPause(status: Int, reason: String, pauses: Bool) {
        #expect(PauseRule.reason(status: status, reason: reason) == (pauses ? reason : nil))
    }

    @Test func transportFailuresPauseOnlyForCredentialFiles() {
        #expect(PauseRule.reason(status: nil, reason: "credential_file: /etc/relay/AuthKey.p8: cannot sign provider token: x") == "credential_file")
        #expect(PauseRule.reason(status: nil, reason: "connect: Connection refused") == nil)
        #expect(PauseRule.reason(status: nil, reason: "InvalidProviderToken") == nil)   // a text, not an answer
        #expect(PauseRule.reason(status: 200, reason: nil) == nil)
    }

    @Test func probeWaitsDoubleFromOneSecondToFiveMinutesWithEqualJitter() {
        let s = PauseSchedule()
        #expect(s.delay(step: 0, random: 0) == 500 && s.delay(step: 0, random: 1) == 1000)
        #expect(s.delay(step: 1, random: 0) == 1000 && s.delay(step: 1, random: 1) == 2000)
        #expect(s.delay(step: 8, random: 1) == 256_000)
        #expect(s.delay(step: 9, random: 0) == 150_000 && s.delay(step: 9, random: 1) == 300_000)
        #expect(s.delay(step: 500, random: 0.5) == 225_000)
    }

    // MARK: the state machine

    func machine() -> DispatcherStateMachine {
        DispatcherStateMachine(claimBatch: 10, idlePollMillis: 1000, policy: DeliveryPolicy(backoffBaseMillis: 1000, backoffCapMillis: 4000),
                               apps: [Self.app], pause: PauseSchedule(baseMillis: 1000, capMillis: 8000, holdMillis: 100))
    }

    func row(_ n: Int, expiresAt: Int64 = 1_000_000) -> OutboxRow {
        OutboxRow(id: "id-\(n)", app: Self.app, pushToken: String(repeating: "ab", count: 32), sessionIdentifier: "S", keyID: [1, 2, 3, 4],
                  messageIndex: UInt32(n), encryptedData: [0], credentialID: "cred_1", state: .inflight, attempts: 0,
                  nextAttemptAt: 0, createdAt: 0, expiresAt: expiresAt, lastStatus: nil, lastReason: nil, updatedAt: 0, leaseEpoch: 7)
    }

    func refused(_ r: OutboxRow, at: Int64, reason: String = "InvalidProviderToken") -> FinishedPush {
        FinishedPush(row: r, answer: PushAnswer(status: 403, reason: reason, classification: .terminal(reason)), at: at, latencyMicros: 5, random: 1)
    }

    func delivered(_ r: OutboxRow, at: Int64) -> FinishedPush {
        FinishedPush(row: r, answer: PushAnswer(status: 200, reason: nil, classification: .done), at: at, latencyMicros: 5, random: 1)
    }

    func updates(_ actions: [Action]) -> [DeliveryUpdate] {
        actions.flatMap { a -> [DeliveryUpdate] in if case .apply(let u) = a { return u } else { return [] } }
    }

    func sent(_ actions: [Action]) -> [OutboxRow] {
        actions.flatMap { a -> [OutboxRow] in if case .send(let r) = a { return r } else { return [] } }
    }

    func release(_ r: OutboxRow, at: Int64) -> DeliveryUpdate {
        DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .release(at: at), attempt: nil, leaseEpoch: r.leaseEpoch)
    }

    @Test func aCredentialAnswerPausesReleasesWithoutAnAttemptAndProbesOncePerStep() {
        var m = machine()
        let rows = (0..<4).map { row($0) }
        _ = m.received(DispatchInbox(freeSlots: 10, takenAt: 0))
        _ = m.claimed(rows, limit: 10, now: 0)
        // Two in-flight answers are refused: one pause (one log line), both released unsent.
        let a = m.received(DispatchInbox(answers: [refused(rows[0], at: 10), refused(rows[1], at: 11)], freeSlots: 8, takenAt: 11))
        #expect(a.filter { if case .paused = $0 { true } else { false } } == [.paused(app: Self.app, reason: "InvalidProviderToken", detail: "InvalidProviderToken")])
        #expect(updates(a) == [release(rows[0], at: 1010), release(rows[1], at: 1010)])
        #expect(m.paused[Self.app]?.probeAt == 1010)
        // Rows arriving before the probe time are released to it.
        let early = m.claimed([row(5)], limit: 10, now: 500)
        #expect(sent(early).isEmpty && updates(early) == [release(row(5), at: 1010)])
        // At the probe time exactly one row goes out; the others come back after the hold.
        let due = m.claimed([rows[0], rows[1]], limit: 10, now: 1010)
        #expect(sent(due) == [rows[0]] && updates(due) == [release(rows[1], at: 1110)])
        // The probe is refused: next step (2 s), the probe row released to it.
        let b = m.received(DispatchInbox(answers: [refused(rows[0], at: 1020)], freeSlots: 10, takenAt: 1020))
        #expect(updates(b) == [release(rows[0], at: 3020)])
        #expect(m.paused[Self.app]?.step == 1)
        #expect(!b.contains { if case .paused = $0 { true } else { false } })   // no second log line
        // A probe refused for another reason says so once (the reason /readyz shows changes).
        var other = m
        _ = other.claimed([rows[3]], limit: 10, now: 3020)
        let changed = other.received(DispatchInbox(answers: [refused(rows[3], at: 3030, reason: "TopicDisallowed")], freeSlots: 10, takenAt: 3030))
        #expect(changed.contains(.paused(app: Self.app, reason: "TopicDisallowed", detail: "TopicDisallowed")))
        #expect(other.paused[Self.app]?.reason == "TopicDisallowed" && other.paused[Self.app]?.step == 2)
        // The in-flight rows of before the pause answered meanwhile do not move the step.
        let c = m.received(DispatchInbox(answers: [refused(rows[2], at: 1030)], freeSlots: 10, takenAt: 1030))
        #expect(updates(c) == [release(rows[2], at: 3020)] && m.paused[Self.app]?.step == 1)
        // The next probe is accepted: resumed (one log line), the row delivered as usual.
        let probe = m.claimed([rows[1]], limit: 10, now: 3020)
        #expect(sent(probe) == [rows[1]])
        let d = m.received(DispatchInbox(answers: [delivered(rows[1], at: 3030)], freeSlots: 10, takenAt: 3030))
        #expect(d.contains(.resumed(app: Self.app, why: "probe accepted")))
        #expect(updates(d).map(\.outcome) == [.delivered])
        #expect(m.paused.isEmpty)
        #expect(sent(m.claimed([rows[2], rows[3]], limit: 10, now: 3040)) == [rows[2], rows[3]])
    }

    @Test func whilePausedRowsFailOnlyByTheirTTL() {
        var m = machine()
        let r = row(1, expiresAt: 900), long = row(2)
        _ = m.received(DispatchInbox(freeSlots: 10, takenAt: 0))
        _ = m.claimed([r, long], limit: 10, now: 0)
        let a = m.received(DispatchInbox(answers: [refused(r, at: 10), refused(long, at: 10)], freeSlots: 10, takenAt: 10))
        #expect(updates(a) == [DeliveryUpdate(id: r.id, pushToken: r.pushToken, outcome: .failed(reason: "expired"), attempt: nil,
                                              leaseEpoch: r.leaseEpoch),
                               release(long, at: 1010)])
    }

    @Test func aProbeWithoutAnAnswerKeepsThePauseAndWaitsLonger() {
        var m = machine()
        let r = row(1)
        _ = m.received(DispatchInbox(freeSlots: 10, takenAt: 0))
        _ = m.claimed([r], limit: 10, now: 0)
        _ = m.received(DispatchInbox(answers: [refused(r, at: 0, reason: "BadCertificate")], freeSlots: 10, takenAt: 0))
        #expect(sent(m.claimed([r], limit: 10, now: 1000)) == [r])
        let lost = FinishedPush(row: r, answer: PushAnswer(status: nil, reason: "connect: refused", classification: .backOff), at: 1100,
                                latencyMicros: 5, random: 1)
        let a = m.received(DispatchInbox(answers: [lost], freeSlots: 10, takenAt: 1100))
        #expect(m.paused[Self.app]?.step == 1 && m.paused[Self.app]?.probeAt == 3100 && m.paused[Self.app]?.reason == "BadCertificate")
        if case .retry = updates(a).first?.outcome {} else { Issue.record("a transport failure retries as usual: \(a)") }
        // A 503 for the next probe says nothing about the credentials either.
        #expect(sent(m.claimed([row(2)], limit: 10, now: 3100)) == [row(2)])
        let busy = FinishedPush(row: row(2), answer: PushAnswer(status: 503, reason: "ServiceUnavailable", classification: .backOff), at: 3200,
                                latencyMicros: 5, random: 1)
        let b = m.received(DispatchInbox(answers: [busy], freeSlots: 10, takenAt: 3200))
        #expect(m.paused[Self.app]?.step == 2 && !b.contains { if case .resumed = $0 { true } else { false } })
    }

    @Test func aReloadResumesAtOnce() {
        var m = machine()
        let r = row(1)
        _ = m.received(DispatchInbox(freeSlots: 10, takenAt: 0))
        _ = m.claimed([r], limit: 10, now: 0)
        _ = m.received(DispatchInbox(answers: [refused(r, at: 0, reason: "TopicDisallowed")], freeSlots: 10, takenAt: 0))
        #expect(m.paused[Self.app]?.reason == "TopicDisallowed")
        let a = m.received(DispatchInbox(mayHaveDue: true, resumeApps: [Self.app], freeSlots: 10, takenAt: 5))
        #expect(a.first == .resumed(app: Self.app, why: "reload"))
        #expect(m.paused.isEmpty)
        // Another app's reload changes nothing.
        #expect(!m.received(DispatchInbox(resumeApps: ["other"], freeSlots: 10, takenAt: 6)).contains { if case .resumed = $0 { true } else { false } })
    }
}
