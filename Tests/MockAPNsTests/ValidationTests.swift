import Foundation
import Testing
@testable import MockAPNs

struct ValidationCase: CustomTestStringConvertible, Sendable {
    var name: String
    var method = "POST"
    var path = "/3/device/" + Fixture.deviceToken
    var headers = Fixture.headers()
    var body = Fixture.accessoryBody()
    var status: Int
    var reason: String
    var testDescription: String { name }
}

@Suite struct RequestValidationTests {
    static let cases: [ValidationCase] = [
        .init(name: "GET", method: "GET", status: 405, reason: "MethodNotAllowed"),
        .init(name: "wrong path", path: "/2/device/abcd", status: 404, reason: "BadPath"),
        .init(name: "no token", path: "/3/device/", status: 400, reason: "MissingDeviceToken"),
        .init(name: "no token no slash", path: "/3/device", status: 400, reason: "MissingDeviceToken"),
        .init(name: "odd-length token", path: "/3/device/abc", status: 400, reason: "BadDeviceToken"),
        .init(name: "non-hex token", path: "/3/device/zz11", status: 400, reason: "BadDeviceToken"),
        .init(name: "token with slash", path: "/3/device/ab/cd", status: 400, reason: "BadDeviceToken"),
        .init(name: "duplicate topic", headers: Fixture.headers(extra: [("apns-topic", Fixture.topic)]), status: 400, reason: "DuplicateHeaders"),
        .init(name: "bad apns-id", headers: Fixture.headers(extra: [("apns-id", "not-a-uuid")]), status: 400, reason: "BadMessageId"),
        .init(name: "no authorization", headers: Fixture.headers(token: nil), status: 403, reason: "MissingProviderToken"),
        .init(name: "garbage token", headers: Fixture.headers(token: "abc"), status: 403, reason: "InvalidProviderToken"),
        .init(name: "stale iat", headers: Fixture.headers(token: Fixture.token(iat: Fixture.now - 3601)), status: 403, reason: "ExpiredProviderToken"),
        .init(name: "no topic", headers: Fixture.headers(topic: nil), status: 400, reason: "MissingTopic"),
        .init(name: "topic with space", headers: Fixture.headers(topic: "com.example app"), status: 400, reason: "BadTopic"),
        .init(name: "unknown bundle", headers: Fixture.headers(topic: "com.other.app.push-type.accessory"), status: 400, reason: "TopicDisallowed"),
        .init(name: "accessory push without suffix", headers: Fixture.headers(topic: Fixture.bundleID), status: 400, reason: "DeviceTokenNotForTopic"),
        .init(name: "accessory push with voip suffix", headers: Fixture.headers(topic: Fixture.bundleID + ".voip"), status: 400, reason: "DeviceTokenNotForTopic"),
        .init(name: "alert push to accessory topic", headers: Fixture.headers(pushType: "alert"), status: 400, reason: "DeviceTokenNotForTopic"),
        .init(name: "unknown push type", headers: Fixture.headers(pushType: "teleport"), status: 400, reason: "InvalidPushType"),
        .init(name: "priority 7", headers: Fixture.headers(extra: [("apns-priority", "7")]), status: 400, reason: "BadPriority"),
        .init(name: "priority text", headers: Fixture.headers(extra: [("apns-priority", "high")]), status: 400, reason: "BadPriority"),
        .init(name: "expiration negative", headers: Fixture.headers(extra: [("apns-expiration", "-1")]), status: 400, reason: "BadExpirationDate"),
        .init(name: "expiration text", headers: Fixture.headers(extra: [("apns-expiration", "tomorrow")]), status: 400, reason: "BadExpirationDate"),
        .init(name: "collapse id 65 bytes", headers: Fixture.headers(extra: [("apns-collapse-id", String(repeating: "c", count: 65))]), status: 400, reason: "BadCollapseId"),
        .init(name: "empty body", body: [], status: 400, reason: "PayloadEmpty"),
        .init(name: "4097 bytes", body: Array(repeating: 0x20, count: 4097), status: 413, reason: "PayloadTooLarge"),
        .init(name: "not JSON", body: Array("hello".utf8), status: 400, reason: "BadPayload"),
        .init(name: "no aps", body: Array(#"{"x":1}"#.utf8), status: 400, reason: "BadPayload"),
        .init(name: "accessory extra key", body: Array(#"{"aps":{"alert":"hi"}}"#.utf8), status: 400, reason: "BadPayload"),
        .init(name: "numeric messageIndex", body: Array(String(decoding: Fixture.accessoryBody(), as: UTF8.self)
            .replacingOccurrences(of: "\"messageIndex\":\"7\"", with: "\"messageIndex\":7").utf8), status: 400, reason: "BadPayload"),
        .init(name: "keyID 3 bytes", body: Fixture.accessoryBody(keyID: [1, 2, 3]), status: 400, reason: "BadPayload"),
        .init(name: "messageIndex beyond UInt32", body: Array(String(decoding: Fixture.accessoryBody(), as: UTF8.self)
            .replacingOccurrences(of: "\"messageIndex\":\"7\"", with: "\"messageIndex\":\"4294967296\"").utf8), status: 400, reason: "BadPayload"),
    ]

    @Test(arguments: cases)
    func rejects(_ c: ValidationCase) {
        var connection = ConnectionAuthState()
        let result = Fixture.validator.validate(method: c.method, path: c.path, headers: c.headers, body: c.body,
                                                connection: &connection, now: Fixture.now)
        guard case .rejected(let rejection, let apnsID) = result else {
            Issue.record("\(c.name): accepted, expected \(c.status) \(c.reason)")
            return
        }
        #expect(rejection.status == c.status)
        #expect(rejection.reason == c.reason)
        #expect(MockReason(rawValue: c.reason)?.status == c.status)
        #expect(isCanonicalUUID(apnsID) && apnsID == apnsID.lowercased())
        let body = try? JSONSerialization.jsonObject(with: Data(rejection.body())) as? [String: Any]
        #expect(body?["reason"] as? String == c.reason)
    }

    @Test func acceptsAccessoryPushAndEchoesLowercaseID() throws {
        var connection = ConnectionAuthState()
        let id = "5D3F1C2B-1111-4A2B-8C3D-0123456789AB"
        let result = Fixture.validator.validate(method: "POST", path: "/3/device/" + Fixture.deviceToken.uppercased(),
                                                headers: Fixture.headers(extra: [("apns-id", id), ("apns-priority", "10"), ("apns-expiration", "0")]),
                                                body: Fixture.accessoryBody(index: 4_294_967_295), connection: &connection, now: Fixture.now)
        guard case .accepted(let push) = result else { Issue.record("rejected: \(result)"); return }
        #expect(push.apnsID == id.lowercased())
        #expect(push.deviceToken == Fixture.deviceToken)
        #expect(push.priority == 10 && push.expiration == 0)
        #expect(push.accessory?.messageIndex == 4_294_967_295)
        #expect(push.accessory?.keyID == [1, 2, 3, 4])
        #expect(push.accessory?.sessionIdentifier == Fixture.sessionID)
        #expect(push.claims == ProviderTokenClaims(keyID: Fixture.keyID, teamID: Fixture.teamID, issuedAt: Fixture.now - 10))
        #expect(connection.boundKeyID == Fixture.keyID && connection.boundTeamID == Fixture.teamID)
    }

    @Test func generatesAnIDWhenAbsent() {
        var connection = ConnectionAuthState()
        let fixed = UUID(uuidString: "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE")!
        let result = Fixture.validator.validate(method: "POST", path: "/3/device/" + Fixture.deviceToken, headers: Fixture.headers(),
                                                body: Fixture.accessoryBody(), connection: &connection, now: Fixture.now,
                                                generateID: { fixed })
        guard case .accepted(let push) = result else { Issue.record("rejected: \(result)"); return }
        #expect(push.apnsID == "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee")
    }

    @Test func randomUUIDsAreVersion4AndDistinct() {
        let ids = (0..<200).map { _ in randomUUID().uuidString.lowercased() }
        #expect(Set(ids).count == 200)
        for id in ids {
            #expect(isCanonicalUUID(id))
            let chars = Array(id)
            #expect(chars[14] == "4")
            #expect("89ab".contains(chars[19]))
        }
        #expect(trimmedSpaces("  a b\t ") == "a b" && trimmedSpaces("   ") == "")
        for _ in 0..<50 {
            let u = UUID()
            #expect(lowercaseString(u) == u.uuidString.lowercased())
            #expect(parseCanonicalUUID(u.uuidString) == u && parseCanonicalUUID(u.uuidString.lowercased()) == u)
        }
        #expect(parseCanonicalUUID("6f1c8a52-3b7e-4c1e-9a0b-2d4e5f60718") == nil)
    }

    @Test func acceptsAnyEvenLengthTokenAndOtherPushTypes() {
        var connection = ConnectionAuthState()
        let short = Fixture.validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(), body: Fixture.accessoryBody(),
                                               connection: &connection, now: Fixture.now)
        #expect(short.acceptedPush != nil)
        let alert = Fixture.validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(topic: Fixture.bundleID, pushType: nil),
                                               body: Array(#"{"aps":{"alert":"hi"}}"#.utf8), connection: &connection, now: Fixture.now)
        #expect({ () -> Bool in guard let p = alert.acceptedPush else { return false }; return p.pushType == "alert" && p.accessory == nil }())
    }

    @Test func connectionIsBoundToTheFirstKeyAndTeam() {
        let second = MockTokenKey(keyID: "ZZZ999ZZZZ", teamID: "OTHERTEAM1", key: Fixture.otherKey)
        var validator = RequestValidator(allowedBundleIDs: [Fixture.bundleID],
                                         tokenVerifier: ProviderTokenVerifier(keys: [MockTokenKey(keyID: Fixture.keyID, teamID: Fixture.teamID, key: Fixture.key), second]))
        validator.tokenUpdateInterval = 0
        var connection = ConnectionAuthState()
        let first = validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(), body: Fixture.accessoryBody(),
                                       connection: &connection, now: Fixture.now)
        #expect(first.acceptedPush != nil)
        let other = Fixture.token(keyID: second.keyID, teamID: second.teamID, key: Fixture.otherKey)
        let result = validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(token: other), body: Fixture.accessoryBody(),
                                        connection: &connection, now: Fixture.now)
        #expect({ () -> Bool in guard let r = result.rejection else { return false }; return r.status == 403 && r.reason == "UnrelatedKeyIdInToken" }())
        // The same token works on a fresh connection.
        var fresh = ConnectionAuthState()
        let alone = validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(token: other), body: Fixture.accessoryBody(),
                                       connection: &fresh, now: Fixture.now)
        #expect(alone.acceptedPush != nil)
    }

    @Test func tokenChangesAreLimitedPerConnection() {
        let validator = Fixture.validator  // 20 minutes
        var connection = ConnectionAuthState()
        func send(_ token: String, at now: Int64) -> ValidationResult {
            validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(token: token), body: Fixture.accessoryBody(),
                               connection: &connection, now: now)
        }
        let t0 = Fixture.now
        let first = Fixture.token(iat: t0)
        #expect(send(first, at: t0).acceptedPush != nil)
        let early = send(Fixture.token(iat: t0 + 60), at: t0 + 60)
        #expect({ () -> Bool in guard let r = early.rejection else { return false }; return r.status == 429 && r.reason == "TooManyProviderTokenUpdates" }())
        #expect(send(first, at: t0 + 120).acceptedPush != nil)
        #expect(send(Fixture.token(iat: t0 + 1200), at: t0 + 1200).acceptedPush != nil)
    }

    @Test func injectedExpiryCutoff() {
        var validator = Fixture.validator
        validator.expireTokensIssuedBefore = Fixture.now - 5
        var connection = ConnectionAuthState()
        let result = validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(token: Fixture.token(iat: Fixture.now - 10)),
                                        body: Fixture.accessoryBody(), connection: &connection, now: Fixture.now)
        #expect({ () -> Bool in guard let r = result.rejection else { return false }; return r.status == 403 && r.reason == "ExpiredProviderToken" }())
    }

    @Test func authOffIgnoresAuthorization() {
        let validator = RequestValidator(allowedBundleIDs: [], tokenVerifier: nil)
        var connection = ConnectionAuthState()
        let result = validator.validate(method: "POST", path: "/3/device/00ff", headers: Fixture.headers(token: nil, topic: "any.bundle.push-type.accessory"),
                                        body: Fixture.accessoryBody(), connection: &connection, now: Fixture.now)
        #expect({ () -> Bool in guard let p = result.acceptedPush else { return false }; return p.claims == nil }())
    }
}

extension ValidationResult {
    var acceptedPush: AcceptedPush? { if case .accepted(let p) = self { return p } else { return nil } }
    var rejection: Rejection? { if case .rejected(let r, _) = self { return r } else { return nil } }
}
