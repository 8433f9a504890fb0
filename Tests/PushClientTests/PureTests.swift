// Pure parts: reasons, classification, payload shape, response parsing, local validation, JWT.
import Foundation
import Testing
@testable import PushClient

@Suite struct APNsReasonTests {
    @Test func documentedSetHas32ReasonsWithApplesStatuses() {
        #expect(APNsReason.documented.count == 32)
        #expect(Set(APNsReason.documented.map(\.reason)).count == 32)
        var perStatus: [Int: Int] = [:]
        for d in APNsReason.documented { perStatus[d.status, default: 0] += 1 }
        #expect(perStatus == [400: 14, 403: 8, 404: 1, 405: 1, 410: 2, 413: 1, 429: 2, 500: 1, 503: 2])
    }

    @Test func rawValuesRoundTripAndMatchApplesSpelling() {
        let spelled = ["BadCollapseId", "BadDeviceToken", "BadExpirationDate", "BadMessageId", "BadPriority",
                       "BadTopic", "DeviceTokenNotForTopic", "DuplicateHeaders", "IdleTimeout", "InvalidPushType",
                       "MissingDeviceToken", "MissingTopic", "PayloadEmpty", "TopicDisallowed", "BadCertificate",
                       "BadCertificateEnvironment", "ExpiredProviderToken", "Forbidden", "InvalidProviderToken",
                       "MissingProviderToken", "UnrelatedKeyIdInToken", "BadEnvironmentKeyIdInToken", "BadPath",
                       "MethodNotAllowed", "ExpiredToken", "Unregistered", "PayloadTooLarge",
                       "TooManyProviderTokenUpdates", "TooManyRequests", "InternalServerError",
                       "ServiceUnavailable", "Shutdown"]
        #expect(APNsReason.documented.map(\.reason.rawValue) == spelled)
        for s in spelled {
            let r = APNsReason(rawValue: s)
            #expect(r.rawValue == s)
            if case .unknown = r { Issue.record("\(s) parsed as unknown") }
        }
    }

    @Test func unknownReasonsAreKeptVerbatim() {
        #expect(APNsReason(rawValue: "SomethingNew") == .unknown("SomethingNew"))
        #expect(APNsReason(rawValue: "badDeviceToken") == .unknown("badDeviceToken"))   // case matters
        #expect(APNsReason.unknown("X").rawValue == "X")
    }
}

@Suite struct ClassificationTests {
    /// Written out by hand (not derived from `classify`): the decision for every documented reason.
    static let expected: [String: PushDecision] = [
        "BadCollapseId": .terminal(.badCollapseId), "BadDeviceToken": .terminal(.badDeviceToken),
        "BadExpirationDate": .terminal(.badExpirationDate), "BadMessageId": .terminal(.badMessageId),
        "BadPriority": .terminal(.badPriority), "BadTopic": .terminal(.badTopic),
        "DeviceTokenNotForTopic": .terminal(.deviceTokenNotForTopic), "DuplicateHeaders": .terminal(.duplicateHeaders),
        "IdleTimeout": .backOff, "InvalidPushType": .terminal(.invalidPushType),
        "MissingDeviceToken": .terminal(.missingDeviceToken), "MissingTopic": .terminal(.missingTopic),
        "PayloadEmpty": .terminal(.payloadEmpty), "TopicDisallowed": .terminal(.topicDisallowed),
        "BadCertificate": .terminal(.badCertificate), "BadCertificateEnvironment": .terminal(.badCertificateEnvironment),
        "ExpiredProviderToken": .refreshTokenAndReconnect, "Forbidden": .terminal(.forbidden),
        "InvalidProviderToken": .terminal(.invalidProviderToken), "MissingProviderToken": .terminal(.missingProviderToken),
        "UnrelatedKeyIdInToken": .terminal(.unrelatedKeyIdInToken),
        "BadEnvironmentKeyIdInToken": .terminal(.badEnvironmentKeyIdInToken),
        "BadPath": .terminal(.badPath), "MethodNotAllowed": .terminal(.methodNotAllowed),
        "ExpiredToken": .terminal(.expiredToken), "Unregistered": .terminal(.unregistered),
        "PayloadTooLarge": .terminal(.payloadTooLarge),
        "TooManyProviderTokenUpdates": .retryAfterDelay, "TooManyRequests": .retryAfterDelay,
        "InternalServerError": .backOff, "ServiceUnavailable": .backOff, "Shutdown": .backOff,
    ]

    @Test(arguments: APNsReason.documented.map { ($0.reason.rawValue, $0.status) })
    func everyDocumentedReason(reason: String, status: Int) {
        let got = classify(.rejected(status: status, reason: APNsReason(rawValue: reason), timestamp: nil))
        #expect(Self.expected[reason] != nil, "no expectation written for \(reason)")
        #expect(got == Self.expected[reason], "\(status) \(reason)")
    }

    @Test func deliveredIsDoneAndTransportBacksOff() {
        #expect(classify(.delivered(apnsID: "x", uniqueID: nil)) == .done)
        #expect(classify(.transportFailure("Couldn't connect to server")) == .backOff)
        #expect(classify(.transportFailure("shutdown")) == .backOff)
    }

    @Test func unknownReasonsFallBackOnStatus() {
        #expect(classify(.rejected(status: 429, reason: .unknown("New"), timestamp: nil)) == .retryAfterDelay)
        #expect(classify(.rejected(status: 500, reason: .unknown(""), timestamp: nil)) == .backOff)
        #expect(classify(.rejected(status: 502, reason: .unknown(""), timestamp: nil)) == .backOff)
        #expect(classify(.rejected(status: 403, reason: .unknown("New"), timestamp: nil)) == .terminal(.unknown("New")))
        #expect(classify(.rejected(status: 400, reason: .unknown(""), timestamp: nil)) == .terminal(.unknown("")))
    }

    @Test func gone410KeepsTimestampAndIsTerminal() {
        let r = ConnectionSlot.result(status: 410, apnsID: nil, uniqueID: nil, body: Array(#"{"reason":"Unregistered","timestamp":1700000000123}"#.utf8), sentID: "id")
        #expect(r == .rejected(status: 410, reason: .unregistered, timestamp: Date(timeIntervalSince1970: 1_700_000_000.123)))
        #expect(classify(r) == .terminal(.unregistered))
    }
}

@Suite struct ResponseParsingTests {
    @Test func deliveredUsesEchoedIDAndUniqueID() {
        let r = ConnectionSlot.result(status: 200, apnsID: "abc", uniqueID: "u-1", body: [], sentID: "mine")
        #expect(r == .delivered(apnsID: "abc", uniqueID: "u-1"))
        #expect(ConnectionSlot.result(status: 200, apnsID: nil, uniqueID: nil, body: [], sentID: "mine") == .delivered(apnsID: "mine", uniqueID: nil))
    }

    @Test func errorBodies() {
        #expect(ConnectionSlot.result(status: 400, apnsID: nil, uniqueID: nil, body: Array(#"{"reason":"BadDeviceToken"}"#.utf8), sentID: "")
                == .rejected(status: 400, reason: .badDeviceToken, timestamp: nil))
        // Timestamps count only on 410.
        #expect(ConnectionSlot.result(status: 429, apnsID: nil, uniqueID: nil, body: Array(#"{"reason":"TooManyRequests","timestamp":5}"#.utf8), sentID: "")
                == .rejected(status: 429, reason: .tooManyRequests, timestamp: nil))
        // No or garbage body: the status still tells the story.
        #expect(ConnectionSlot.result(status: 503, apnsID: nil, uniqueID: nil, body: Array("<html>".utf8), sentID: "")
                == .rejected(status: 503, reason: .unknown(""), timestamp: nil))
    }
}

@Suite struct PayloadTests {
    @Test func exactAppleShape() throws {
        let body = String(decoding: samplePayload(bytes: 3, index: 4_000_000_000).jsonBody(), as: UTF8.self)
        #expect(body == #"{"aps":{"encryptedData":"AAEC","sessionIdentifier":"E621E1F8-C36C-495A-93FC-0C247A3E6E5F","keyID":"3q2+7w==","messageIndex":"4000000000"}}"#)
        let obj = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
        let aps = try #require(obj["aps"] as? [String: Any])
        #expect(Set(aps.keys) == ["encryptedData", "sessionIdentifier", "keyID", "messageIndex"])
        #expect(aps["messageIndex"] as? String == "4000000000")   // a string, not a number
    }

    @Test func bodyMatchesFoundationEncodingForEveryPaddingCase() throws {
        for count in [0, 1, 2, 3, 4, 5, 47, 48, 49, 255] {
            let data = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            let key: [UInt8] = Array(data.prefix(count % 5))
            let session = UUID()
            let p = AccessoryPayload(encryptedData: data, sessionIdentifier: session, keyID: key, messageIndex: UInt32(count))
            let expected = "{\"aps\":{\"encryptedData\":\"\(Data(data).base64EncodedString())\",\"sessionIdentifier\":\"\(session.uuidString)\","
                + "\"keyID\":\"\(Data(key).base64EncodedString())\",\"messageIndex\":\"\(count)\"}}"
            #expect(String(decoding: p.jsonBody(), as: UTF8.self) == expected)
        }
    }

    @Test func endpointParsing() throws {
        let prod = try Endpoint(url: APNsEnvironment.production.baseURL)
        #expect(prod == Endpoint(tls: true, host: "api.push.apple.com", port: 443, authority: "api.push.apple.com"))
        let alt = try Endpoint(url: "https://api.sandbox.push.apple.com:2197")
        #expect(alt.port == 2197 && alt.authority == "api.sandbox.push.apple.com:2197" && alt.tls)
        let v6 = try Endpoint(url: "http://[::1]:8080")
        #expect(v6 == Endpoint(tls: false, host: "::1", port: 8080, authority: "[::1]:8080"))
        #expect(try Endpoint(url: "http://127.0.0.1").authority == "127.0.0.1")
        for bad in ["ftp://x", "https://", "https://host:0", "https://host:99999", "https://host:x", "https://[::1", "https://host/path"] {
            #expect(throws: PushClientError.self, "\(bad)") { try Endpoint(url: bad) }
        }
    }

    /// The header block after the pseudo-headers, exactly as documented (docs/pushclient.md).
    @Test func requestHeaderBlock() {
        let id = UUID(uuidString: "A0B1C2D3-E4F5-4677-8899-AABBCCDDEEFF")!
        func fields(_ h: RequestHead) -> [String] { h.fields.map { "\($0.name): \($0.value)" } }
        let plain = ConnectionSlot.head(PushRequest(deviceToken: "ABcd", bundleID: "com.example.app", apnsID: id, payload: samplePayload()),
                                        authorization: "bearer x.y.z")
        #expect(plain.path == "/3/device/abcd")
        #expect(fields(plain) == ["apns-push-type: accessory", "apns-topic: com.example.app.push-type.accessory",
                                  "apns-id: a0b1c2d3-e4f5-4677-8899-aabbccddeeff", "apns-priority: 10",
                                  "authorization: bearer x.y.z", "content-type: application/json"])
        let full = ConnectionSlot.head(PushRequest(deviceToken: "ab", bundleID: "com.example.app", apnsID: id, payload: samplePayload(),
                                                   expiration: 0, priority: 5),
                                        authorization: nil)
        #expect(fields(full) == ["apns-push-type: accessory", "apns-topic: com.example.app.push-type.accessory",
                                 "apns-id: a0b1c2d3-e4f5-4677-8899-aabbccddeeff", "apns-expiration: 0", "apns-priority: 5",
                                 "content-type: application/json"])
    }

    @Test func requestHeadersValues() {
        let id = UUID(uuidString: "A0B1C2D3-E4F5-4677-8899-AABBCCDDEEFF")!
        let r = PushRequest(deviceToken: "ab", bundleID: "com.example.app", apnsID: id, payload: samplePayload())
        #expect(r.topic == "com.example.app.push-type.accessory")
        #expect(r.apnsIDString == "a0b1c2d3-e4f5-4677-8899-aabbccddeeff")
        for _ in 0..<100 {
            let u = UUID()
            #expect(PushRequest(deviceToken: "ab", bundleID: "b", apnsID: u, payload: samplePayload()).apnsIDString
                    == u.uuidString.lowercased())
        }
    }

    @Test func localRefusals() {
        func check(_ token: String, _ bundle: String = "com.example.app", priority: Int = PushRequest.immediatePriority, expiration: Int? = nil) -> PushResult? {
            PushClient.validate(PushRequest(deviceToken: token, bundleID: bundle, payload: samplePayload(),
                                            expiration: expiration, priority: priority))
        }
        #expect(check("00ff") == nil)
        #expect(check("") == .rejected(status: 400, reason: .missingDeviceToken, timestamp: nil))
        #expect(check("zz") == .rejected(status: 400, reason: .badDeviceToken, timestamp: nil))
        #expect(check("ab/../x") == .rejected(status: 400, reason: .badDeviceToken, timestamp: nil))
        #expect(check("ab", "") == .rejected(status: 400, reason: .missingTopic, timestamp: nil))
        #expect(check("ab", "com.x\r\nevil: 1") == .rejected(status: 400, reason: .badTopic, timestamp: nil))
        #expect(check("00FFaB") == nil)                                          // either case of hex
        #expect(check(String(repeating: "a", count: 200)) == nil)                 // the longest accepted (Basics.PushToken)
        #expect(check(String(repeating: "a", count: 202)) == .rejected(status: 400, reason: .badDeviceToken, timestamp: nil))
        #expect(check("abc") == .rejected(status: 400, reason: .badDeviceToken, timestamp: nil))   // odd
        #expect(check("ab", "com.example:app") == .rejected(status: 400, reason: .badTopic, timestamp: nil))
        #expect(check("ab", "com.exämple") == .rejected(status: 400, reason: .badTopic, timestamp: nil))  // non-ASCII
        #expect(check("ab", priority: 7) == .rejected(status: 400, reason: .badPriority, timestamp: nil))
        #expect(check("ab", priority: 5) == nil)
        #expect(check("ab", expiration: -1) == .rejected(status: 400, reason: .badExpirationDate, timestamp: nil))
    }
}

@Suite struct JWTTests {
    @Test func structureAndSignatureVerifiedByOpenSSLCLI() throws {
        let dir = try TempDir()
        let (p8, pub) = try makeP8(in: dir)
        let key = try TokenKey(p8Path: p8, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        let jwt = try ProviderToken.make(key: key, issuedAt: Date(timeIntervalSince1970: 1_800_000_123.9))
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3)
        #expect(!jwt.contains("=") && !jwt.contains("+") && !jwt.contains("/"))
        let header = try #require(base64URLDecode(parts[0]))
        let claims = try #require(base64URLDecode(parts[1]))
        let h = try #require(try JSONSerialization.jsonObject(with: Data(header)) as? [String: Any])
        let c = try #require(try JSONSerialization.jsonObject(with: Data(claims)) as? [String: Any])
        #expect(h.count == 2 && h["alg"] as? String == "ES256" && h["kid"] as? String == "ABC123DEFG")
        #expect(c.count == 2 && c["iss"] as? String == "DEF123GHIJ")
        #expect((c["iat"] as? NSNumber)?.int64Value == 1_800_000_123)
        #expect(String(decoding: claims, as: UTF8.self).contains("\"iat\":1800000123"))   // a number, not a string
        let sig = try #require(base64URLDecode(parts[2]))
        #expect(sig.count == 64)

        // Independent verifier: the openssl CLI on our own DER re-encoding of r||s.
        let input = dir.file("input"), sigFile = dir.file("sig.der")
        try Data("\(parts[0]).\(parts[1])".utf8).write(to: URL(fileURLWithPath: input))
        try Data(derSignature(raw: sig)).write(to: URL(fileURLWithPath: sigFile))
        let ok = try run("openssl", ["dgst", "-sha256", "-verify", pub, "-signature", sigFile, input])
        #expect(ok.status == 0, "\(ok.output)")
        #expect(ok.output.contains("Verified OK"))

        // The same check must fail for a tampered claim set.
        try Data("\(parts[0]).\(ProviderToken.base64URL(Array(#"{"iss":"DEF123GHIJ","iat":1800000124}"#.utf8)))".utf8)
            .write(to: URL(fileURLWithPath: input))
        let bad = try run("openssl", ["dgst", "-sha256", "-verify", pub, "-signature", sigFile, input])
        #expect(bad.status != 0)
    }

    @Test func signaturesDifferButBothVerifyLength() throws {
        // ECDSA is randomised; two tokens with the same iat differ only in the signature.
        let dir = try TempDir()
        let (p8, _) = try makeP8(in: dir)
        let key = try TokenKey(p8Path: p8, keyID: "K", teamID: "T")
        let a = try ProviderToken.make(key: key, issuedAt: Date(timeIntervalSince1970: 1))
        let b = try ProviderToken.make(key: key, issuedAt: Date(timeIntervalSince1970: 1))
        #expect(a != b)
        #expect(a.split(separator: ".").prefix(2) == b.split(separator: ".").prefix(2))
    }

    @Test func badKeysAreRefusedWithAClearError() throws {
        #expect(throws: PushClientError.self) { try TokenKey(p8PEM: "not a key", keyID: "K", teamID: "T") }
        let dir = try TempDir()
        let rsa = dir.file("rsa.pem")
        _ = try run("openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", rsa])
        #expect(throws: PushClientError.invalidKey("APNs keys are P-256 EC keys")) {
            try TokenKey(p8Path: rsa, keyID: "K", teamID: "T")
        }
        // A 256-bit EC key on another curve is no ES256 key either (it used to pass a bits == 256 check).
        let k1 = dir.file("secp256k1.pem")
        _ = try run("openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:secp256k1", "-out", k1])
        #expect(throws: PushClientError.invalidKey("APNs keys are P-256 EC keys")) {
            try TokenKey(p8Path: k1, keyID: "K", teamID: "T")
        }
        let (p8, _) = try makeP8(in: dir)
        #expect(throws: PushClientError.self) { try TokenKey(p8Path: p8, keyID: "bad\"id", teamID: "T") }
        #expect(throws: PushClientError.self) { try TokenKey(p8Path: dir.file("missing.p8"), keyID: "K", teamID: "T") }
    }
}
