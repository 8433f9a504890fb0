/// HKDF with SHA-256 (RFC 5869), computed by OpenSSL's EVP_KDF "HKDF".
public enum HKDF {
    /// Largest output HKDF-SHA256 can produce: 255 * HashLen.
    public static let maximumOutputLength = 255 * 32

    /// HKDF-Extract: PRK = HMAC-SHA256(salt, IKM). An empty salt means HashLen zero bytes.
    public static func extract(salt: [UInt8], ikm: [UInt8]) -> [UInt8] {
        var prk = [UInt8](repeating: 0, count: 32)
        do {
            try salt.withUnsafeBytes { s in
                try ikm.withUnsafeBytes { k in
                    try prk.withUnsafeMutableBytes { try LibCrypto.hkdfExtract(salt: s, ikm: k, output: $0) }
                }
            }
        } catch {
            // Only reachable if OpenSSL itself fails (allocation); inputs cannot make extract fail.
            fatalError("HKDF-Extract: \(error)")
        }
        return prk
    }

    /// HKDF-Expand: `length` bytes (1...8160) from PRK and info.
    public static func expand(prk: [UInt8], info: [UInt8], length: Int) throws -> [UInt8] {
        guard (1...maximumOutputLength).contains(length) else { throw RatchetError.invalidOutputLength(length) }
        var okm = [UInt8](repeating: 0, count: length)
        try prk.withUnsafeBytes { p in
            try info.withUnsafeBytes { i in
                try okm.withUnsafeMutableBytes { try LibCrypto.hkdfExpand(prk: p, info: i, output: $0) }
            }
        }
        return okm
    }
}
