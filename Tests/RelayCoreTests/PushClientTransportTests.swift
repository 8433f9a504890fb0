import Foundation
import PushClient
import Testing
@testable import RelayCore

@Suite struct PushClientTransportTests {
    @Test func answersMapStatusReasonTimestampAndClassification() {
        let ok = PushClientTransport.answer(.delivered(apnsID: "x", uniqueID: nil))
        #expect(ok == PushAnswer(status: 200, reason: nil, classification: .done))
        let gone = PushClientTransport.answer(.rejected(status: 410, reason: APNsReason(rawValue: "Unregistered"), timestamp: Date(timeIntervalSince1970: 1_700_000_000.123)))
        #expect(gone.status == 410 && gone.reason == "Unregistered" && gone.apnsTimestamp == 1_700_000_000_123)
        #expect(gone.classification == .terminal("Unregistered"))
        let busy = PushClientTransport.answer(.rejected(status: 429, reason: APNsReason(rawValue: "TooManyRequests"), timestamp: nil))
        #expect(busy.classification == .retryAfterDelay && busy.reason == "TooManyRequests")
        let expired = PushClientTransport.answer(.rejected(status: 403, reason: APNsReason(rawValue: "ExpiredProviderToken"), timestamp: nil))
        #expect(expired.classification == .refreshTokenAndReconnect)
        let down = PushClientTransport.answer(.rejected(status: 503, reason: APNsReason(rawValue: "ServiceUnavailable"), timestamp: nil))
        #expect(down.classification == .backOff)
        let reset = PushClientTransport.answer(.transportFailure("connection reset"))
        #expect(reset.status == nil && reset.reason == "connection reset" && reset.classification == .backOff)
    }
}
