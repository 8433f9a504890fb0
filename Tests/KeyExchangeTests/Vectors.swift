// Locates the published vectors in ../shared/vectors/kex (next to the package root) at run time;
// they are not copied into the repository. KEX_VECTORS_DIR overrides the place.
import Foundation
import Ratchet

enum KexVectors {
    static let packageRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static let directory: URL = {
        if let dir = ProcessInfo.processInfo.environment["KEX_VECTORS_DIR"] { return URL(fileURLWithPath: dir) }
        return packageRoot.deletingLastPathComponent().appendingPathComponent("shared/vectors/kex")
    }()

    static func exists(_ name: String) -> Bool {
        FileManager.default.isReadableFile(atPath: directory.appendingPathComponent(name).path)
    }

    static func text(_ name: String) throws -> String {
        try String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8)
    }

    /// JSON, tolerating the trailing commas of swift-crypto's KAT files.
    static func json(_ name: String) throws -> Any {
        let raw = try text(name)
        let cleaned = raw.replacingOccurrences(of: #",(\s*[}\]])"#, with: "$1", options: .regularExpression)
        return try JSONSerialization.jsonObject(with: Data(cleaned.utf8))
    }

    static func objects(_ name: String) throws -> [[String: Any]] {
        guard let list = try json(name) as? [[String: Any]] else { throw VectorError("\(name): not a list of objects") }
        return list
    }

    static func skipMessage(_ name: String) -> Comment {
        Comment(rawValue: "\(name) not found in \(directory.path) (set KEX_VECTORS_DIR): skipped")
    }
}

struct VectorError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

func hex(_ s: String) throws -> [UInt8] {
    guard let b = [UInt8](hex: s) else { throw VectorError("bad hex: \(s.prefix(20))") }
    return b
}

func hexField(_ o: [String: Any], _ key: String) throws -> [UInt8] {
    guard let s = o[key] as? String else { throw VectorError("missing \(key)") }
    return try hex(s)
}

import Testing
