import Foundation
@testable import MockAPNs

/// Shared test material: one P-256 key registered as ABC123DEFG of team TEAM123456.
enum Fixture {
    static let keyID = "ABC123DEFG"
    static let teamID = "TEAM123456"
    static let bundleID = "com.example.app"
    static let topic = "com.example.app.push-type.accessory"
    static let deviceToken = String(repeating: "ab", count: 32)
    static let now: Int64 = 1_800_000_000
    static let key: ECKey = try! ECKey.generateP256()
    static let otherKey: ECKey = try! ECKey.generateP256()

    /// One fixed token: ECDSA signatures are randomized, and a different token string on the
    /// same connection counts as a token update.
    static let defaultToken = token()

    static func token(iat: Int64 = now - 10, keyID: String = keyID, teamID: String = teamID, key: ECKey = key) -> String {
        try! ProviderTokenMinter.mint(key: key, keyID: keyID, teamID: teamID, issuedAt: iat)
    }

    static var verifier: ProviderTokenVerifier {
        ProviderTokenVerifier(keys: [MockTokenKey(keyID: keyID, teamID: teamID, key: key)])
    }

    static var validator: RequestValidator {
        RequestValidator(allowedBundleIDs: [bundleID], tokenVerifier: verifier)
    }

    static let sessionID = UUID(uuidString: "6f1c8a52-3b7e-4c1e-9a0b-2d4e5f607182")!

    static func accessoryBody(index: UInt32 = 7, keyID: [UInt8] = [1, 2, 3, 4], data: [UInt8] = Array(repeating: 9, count: 40)) -> [UInt8] {
        Array(#"{"aps":{"encryptedData":"\#(Data(data).base64EncodedString())","sessionIdentifier":"\#(sessionID.uuidString.lowercased())","keyID":"\#(Data(keyID).base64EncodedString())","messageIndex":"\#(index)"}}"#.utf8)
    }

    static func headers(token: String? = Fixture.defaultToken, topic: String? = Fixture.topic, pushType: String? = "accessory",
                        extra: [(String, String)] = []) -> [(String, String)] {
        var h: [(String, String)] = []
        if let token { h.append(("authorization", "bearer \(token)")) }
        if let topic { h.append(("apns-topic", topic)) }
        if let pushType { h.append(("apns-push-type", pushType)) }
        return h + extra
    }
}
