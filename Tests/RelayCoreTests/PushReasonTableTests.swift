// docs/pushclient.md "Every APNs reason" against the code: one row per documented reason with
// Apple's status, and what its last column says the relay does is what PushClient's classify
// and DeliveryPolicy decide; the rows saying "pause app" are PauseRule's reasons (the
// dispatcher's paused-app state); "new token" rows are PushClient's own re-mint.
import Foundation
import PushClient
import Testing
@testable import RelayCore

@Suite struct PushReasonTableTests {
    struct Row { var status: Int; var reason: String; var relay: String }

    static func rows() throws -> [Row] {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/pushclient.md").standardized.path
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let parts = text.components(separatedBy: "\n## Every APNs reason")
        guard parts.count == 2 else { return [] }
        let section = parts[1].components(separatedBy: "\n## ")[0]
        return section.split(separator: "\n").compactMap { line -> Row? in
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count == 6, let status = Int(cells[1]) else { return nil }
            return Row(status: status, reason: cells[2], relay: cells[4])
        }
    }

    @Test func everyDocumentedReasonHasOneRowWithApplesStatus() throws {
        let rows = try Self.rows()
        #expect(rows.count == APNsReason.documented.count)
        for d in APNsReason.documented {
            #expect(rows.filter { $0.reason == d.reason.rawValue }.map(\.status) == [d.status], "\(d.reason.rawValue)")
        }
    }

    @Test func theRelayColumnIsWhatTheDispatcherDecides() throws {
        let policy = DeliveryPolicy(backoffBaseMillis: 1000, backoffCapMillis: 60_000, tooManyRequestsDelayMillis: 30_000)
        let row = OutboxRow(id: "id", app: "a", pushToken: "ab", sessionIdentifier: "s", keyID: [1, 2, 3, 4], messageIndex: 1,
                            encryptedData: [], credentialID: "c", state: .inflight, attempts: 0, nextAttemptAt: 0, createdAt: 0,
                            expiresAt: 10_000_000, lastStatus: nil, lastReason: nil, updatedAt: 0)
        let now: Int64 = 1_000
        var checked = 0
        for r in try Self.rows() where !r.relay.hasPrefix("pause app") && !r.relay.hasPrefix("new token") {
            let answer = PushClientTransport.answer(.rejected(status: r.status, reason: APNsReason(rawValue: r.reason),
                                                              timestamp: r.status == 410 ? Date(timeIntervalSince1970: 0.5) : nil))
            let outcome = policy.decide(answer, row: row, now: now, random: 0.5)
            switch outcome {
            case .failed(let reason):
                #expect(r.relay.hasPrefix("fail row") && !r.relay.hasPrefix("fail row; mark token") && reason == r.reason, "\(r.reason): \(outcome)")
            case .unregistered(let reason, _):
                #expect(r.relay.hasPrefix("fail row; mark token") && reason == r.reason, "\(r.reason): \(outcome)")
            case .retry(_, let pace):
                let says = r.relay.hasPrefix("retry") || r.relay.hasPrefix("retire the connection (as after GOAWAY); retry")
                #expect(says && (pace != nil) == r.relay.hasPrefix("retry after"), "\(r.reason): \(outcome)")
            case .delivered, .requeue, .release:
                Issue.record("\(r.reason): \(outcome)")
            }
            checked += 1
        }
        #expect(checked >= 20)   // every reason but the paused-app ones
    }

    /// The rows saying "pause app" (ExpiredProviderToken's: after PushClient's own new token) are
    /// exactly the reasons the dispatcher's PauseRule pauses on.
    @Test func thePauseRowsAreThePauseRule() throws {
        let rows = try Self.rows()
        #expect(!rows.isEmpty)
        for r in rows {
            let pauses = PauseRule.reason(status: r.status, reason: r.reason) != nil
            #expect(pauses == r.relay.contains("pause app"), "\(r.status) \(r.reason): the table says '\(r.relay)'")
        }
        #expect(Set(rows.filter { $0.relay.contains("pause app") }.map(\.reason)) == PauseRule.reasons)
    }
}
