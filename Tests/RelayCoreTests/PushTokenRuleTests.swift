import Basics
import Foundation
import MockAPNs
@testable import PushClient
import Testing
@testable import RelayCore

/// Basics.PushToken is the one rule for a push token; ingest (both validators), PushClient's
/// local refusal and mock-apns must agree with it on every case (issue 26: they used to apply
/// three different limits).
struct PushTokenRuleTests {
    static let cases: [(token: String, valid: Bool)] = [
        ("", false), ("a", false), ("ab", true), ("AB", true), ("0aF9", true), ("abc", false),
        ("zz", false), ("ab/cd", false), ("ab cd", false), ("+abc", false), ("ab-c", false), ("abçd", false),
        (String(repeating: "ab", count: 32), true),
        (String(repeating: "a", count: 198), true), (String(repeating: "a", count: 199), false),
        (String(repeating: "a", count: 200), true), (String(repeating: "a", count: 202), false),
        (String(repeating: "a", count: 400), false),
    ]

    @Test(arguments: cases)
    func everyCheckerFollowsTheOneRule(token: String, valid: Bool) throws {
        #expect(PushToken.isValid(token) == valid)
        #expect(PushToken.canonical(token) == (valid ? token.lowercased() : nil))

        // Ingest, the general validator and the fast path.
        let body = Array(#"{"pushToken":"\#(token)","sessionIdentifier":"6F9619FF-8B86-D011-B42D-00C04FC964FF","keyID":"AQIDBA==","messageIndex":7,"encryptedData":"\#(Data(repeating: 7, count: 40).base64EncodedString())"}"#.utf8)
        switch IngestValidation.validate(contentType: "application/json", body: body) {
        case .success(let r): #expect(valid && r.pushToken == token.lowercased())
        case .failure(let e): #expect(!valid && e.code == "invalid_push_token" && e.field == "pushToken", "\(e)")
        }
        let fast = body.withUnsafeBufferPointer { IngestValidation.fastValidate($0, limits: IngestLimits()) }
        if valid { #expect(fast?.pushToken == token.lowercased()) } else { #expect(fast == nil) }

        // PushClient refuses locally what APNs would.
        let payload = AccessoryPayload(encryptedData: Array(repeating: 7, count: 40), sessionIdentifier: UUID(), keyID: [1, 2, 3, 4], messageIndex: 7)
        let local = PushClient.validate(PushRequest(deviceToken: token, bundleID: "com.example.app", payload: payload))
        var refusedForToken = false
        if case .rejected(let status, let reason, _)? = local {
            refusedForToken = status == 400 && (reason == .badDeviceToken || reason == .missingDeviceToken)
        }
        #expect(refusedForToken == !valid, "PushClient: \(String(describing: local))")

        // mock-apns answers BadDeviceToken (or MissingDeviceToken for none) by the same rule.
        var auth = ConnectionAuthState()
        let result = RequestValidator(allowedBundleIDs: ["com.example.app"], tokenVerifier: nil)
            .validate(method: "POST", path: "/3/device/" + token, headers: [("apns-topic", "com.example.app"), ("apns-push-type", "accessory")],
                      body: Array("{}".utf8), connection: &auth, now: 0)
        if case .rejected(let r, _) = result, ["BadDeviceToken", "MissingDeviceToken"].contains(r.reason) {
            #expect(!valid, "mock-apns refused a valid token: \(r)")
        } else {
            #expect(valid, "mock-apns passed an invalid token: \(result)")
        }
    }
}
