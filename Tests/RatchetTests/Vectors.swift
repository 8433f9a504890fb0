import Foundation
import Ratchet

/// Loads checked-in vector files next to this source file (no SwiftPM resources needed).
enum VectorFile {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Vectors")

    static func load<T: Decodable>(_ name: String, as type: T.Type) throws -> T {
        let data = try Data(contentsOf: directory.appendingPathComponent(name))
        return try JSONDecoder().decode(T.self, from: data)
    }
}

struct RFC5869File: Decodable {
    struct Case: Decodable { let name, ikm, salt, info, prk, okm: String; let length: Int }
    let cases: [Case]
}

struct AESGCMFile: Decodable {
    struct Valid: Decodable { let name, key, iv, aad, pt, ct, tag: String }
    struct Invalid: Decodable { let name, key, iv, aad, ct, tag: String }
    let valid: [Valid]
    let invalid: [Invalid]
}

struct RatchetVectorFile: Decodable {
    struct Step: Decodable { let index: UInt32; let chainKey, info, messageKey, nextChainKey: String }
    struct Chain: Decodable { let name, rootKey: String; let steps: [Step] }
    struct KeyIDCase: Decodable { let publicKey, sha384, keyID: String }
    struct Response: Decodable {
        let notificationIdentifier, sourceIdentifier, actionIdentifier, userText: String
        let body, rootKey: String
        let messageIndex: UInt32
        let messageKey, nonce, sealed, publicKey, keyID, internetMessage: String
    }
    let chains: [Chain]
    let singleSteps: [Step]
    let keyIDs: [KeyIDCase]
    let response: Response
}

/// Hex that must parse: a malformed vector file is a test failure, reported by the caller's #require.
func hex(_ s: String) -> [UInt8]? { [UInt8](hex: s) }
