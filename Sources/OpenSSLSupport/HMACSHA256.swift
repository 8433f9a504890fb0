// HMAC-SHA256 (RFC 2104) through OpenSSL's one-shot HMAC(): the webhook signatures (Standard
// Webhooks `v1`). Not on a hot path: one call per webhook attempt.
internal import COpenSSL

package enum HMACSHA256 {
    package static let length = 32

    package static func mac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: length)
        var outLength: UInt32 = 0
        // A non-null pointer even for an empty key or message: OpenSSL 3 refuses a null key.
        let keyBuffer = key.isEmpty ? [0] : key, messageBuffer = message.isEmpty ? [0] : message
        let ok = keyBuffer.withUnsafeBytes { k in messageBuffer.withUnsafeBytes { m in out.withUnsafeMutableBytes { o in
            HMAC(EVP_sha256(), k.baseAddress, Int32(key.count),
                 m.baseAddress!.assumingMemoryBound(to: UInt8.self), message.count,
                 o.baseAddress!.assumingMemoryBound(to: UInt8.self), &outLength) != nil
        } } }
        // HMAC fails only when OpenSSL cannot allocate or fetch SHA-256: nothing a caller could fix.
        guard ok, outLength == UInt32(length) else { fatalError("HMAC-SHA256 failed: \(OpenSSLErrors.drain())") }
        return out
    }
}
