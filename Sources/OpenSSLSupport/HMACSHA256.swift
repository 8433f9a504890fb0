// HMAC-SHA256 (RFC 2104) over the shim's one-shot SHA-256: the webhook signatures (Standard
// Webhooks `v1`), one per webhook attempt. Not OpenSSL's one-shot HMAC(): in OpenSSL 3 it goes
// through EVP_Q_mac, which fetches the MAC and digest implementations on every call; two
// SHA-256 calls do the same work for a fraction.
package enum HMACSHA256 {
    package static let length = 32
    private static let blockSize = 64

    package static func mac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        // K0: the key hashed when longer than a block, then zero-padded to the block (RFC 2104).
        var k0 = key.count > blockSize ? SHA256.hash(key) : key
        k0.append(contentsOf: repeatElement(0, count: blockSize - k0.count))
        var inner = [UInt8](), outer = [UInt8]()
        // Key material (and the message's keyed block) is not left in freed memory.
        defer { wipe(&k0); wipe(&inner); wipe(&outer) }
        inner.reserveCapacity(blockSize + message.count)
        for b in k0 { inner.append(b ^ 0x36) }
        inner.append(contentsOf: message)
        outer.reserveCapacity(blockSize + length)
        for b in k0 { outer.append(b ^ 0x5c) }
        outer.append(contentsOf: SHA256.hash(inner))
        return SHA256.hash(outer)
    }
}
