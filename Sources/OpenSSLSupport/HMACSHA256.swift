// HMAC-SHA256 (RFC 2104) over the shim's low-level SHA-256: the webhook signatures (Standard
// Webhooks `v1`), one per webhook attempt. Not OpenSSL's one-shot HMAC(): in OpenSSL 3 it goes
// through EVP_Q_mac, which fetches the MAC and digest implementations on every call; two
// SHA-256 calls do the same work for a fraction.
// A `Key` keeps its two padded blocks hashed, so a MAC hashes only the message and the inner
// digest.
internal import COpenSSL

package enum HMACSHA256 {
    package static let length = 32
    private static let blockSize = 64

    package static func mac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        Key(key).mac(message)
    }

    /// A key with its two padded blocks (K0 ^ ipad, K0 ^ opad) already hashed: each MAC then
    /// hashes only the message and the inner digest. One per webhook secret, used by every attempt.
    // @unchecked Sendable: the two contexts are written only in init and only read (copied by
    // the shim) after; they live in allocated memory, so concurrent MACs (a test receiver's
    // threads) make no overlapping Swift accesses.
    package final class Key: @unchecked Sendable {
        private let contexts: UnsafeMutablePointer<SHA256_CTX>
        private var inner: UnsafeMutablePointer<SHA256_CTX> { contexts }
        private var outer: UnsafeMutablePointer<SHA256_CTX> { contexts + 1 }

        package init(_ key: [UInt8]) {
            // K0: the key hashed when longer than a block, then zero-padded to the block (RFC 2104).
            var k0 = key.count > blockSize ? SHA256.hash(key) : key
            k0.append(contentsOf: repeatElement(0, count: blockSize - k0.count))
            contexts = .allocate(capacity: 2)
            contexts.initialize(repeating: SHA256_CTX(), count: 2)
            var block = [UInt8](repeating: 0, count: blockSize)
            // Key material is not left in freed memory.
            defer { wipe(&k0); wipe(&block) }
            for i in 0..<blockSize { block[i] = k0[i] ^ 0x36 }
            cossl_sha256_begin(inner, block)
            for i in 0..<blockSize { block[i] = k0[i] ^ 0x5c }
            cossl_sha256_begin(outer, block)
        }

        deinit {
            cossl_sha256_cleanse(inner)
            cossl_sha256_cleanse(outer)
            contexts.deallocate()
        }

        package func mac(_ message: [UInt8]) -> [UInt8] {
            var innerDigest = [UInt8](repeating: 0, count: length)
            defer { wipe(&innerDigest) }
            message.withUnsafeBytes { m in cossl_sha256_continue(inner, m.baseAddress, m.count, &innerDigest) }
            return [UInt8](unsafeUninitializedCapacity: length) { out, count in
                cossl_sha256_continue(outer, innerDigest, length, out.baseAddress)
                count = length
            }
        }
    }
}
