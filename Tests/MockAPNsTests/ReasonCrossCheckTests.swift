import PushClient
import Testing
@testable import MockAPNs

/// The mock's reasons and PushClient's enum come from the same Apple table; they must agree.
@Suite struct ReasonCrossCheckTests {
    @Test func everyMockReasonIsOneAPNsDocumentsWithTheSameStatus() {
        for reason in MockReason.allCases where reason != .badPayload {
            let parsed = APNsReason(rawValue: reason.rawValue)
            #expect(parsed != .unknown(reason.rawValue), "\(reason.rawValue)")
            #expect(APNsReason.documented.first { $0.reason == parsed }?.status == reason.status, "\(reason.rawValue)")
        }
        #expect(MockReason.allCases.count == APNsReason.documented.count + 1)
        // The mock-only reason reaches PushClient as an unknown reason, kept verbatim.
        #expect(APNsReason(rawValue: MockReason.badPayload.rawValue) == .unknown("BadPayload"))
    }
}
