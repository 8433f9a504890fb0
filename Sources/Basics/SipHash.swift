// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012): a keyed 64-bit
// hash for tables whose keys clients choose (RelayCore's dedupe index). Plain Swift, because
// OpenSSL's EVP_MAC re-initialisation per call costs more than the hash itself. The tests check
// it against the paper's vectors and
// against OpenSSL's SIPHASH on random keys and inputs, so stored hashes stay valid.

/// SipHash-2-4 under one 16-byte key. A value type with no state between calls: any thread.
public struct SipHash24: Sendable {
    private let k0: UInt64
    private let k1: UInt64

    /// nil unless `key` has 16 bytes (read as two little-endian words, as the paper does).
    public init?(key: [UInt8]) {
        guard key.count == 16 else { return nil }
        var k0: UInt64 = 0, k1: UInt64 = 0
        for i in (0..<8).reversed() {
            k0 = k0 << 8 | UInt64(key[i])
            k1 = k1 << 8 | UInt64(key[i + 8])
        }
        self.k0 = k0
        self.k1 = k1
    }

    public func hash(_ bytes: [UInt8]) -> UInt64 { bytes.withUnsafeBytes { hash($0) } }

    /// The 64-bit tag (the word the paper's reference code stores little-endian).
    public func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var v0 = k0 ^ 0x736f_6d65_7073_6575
        var v1 = k1 ^ 0x646f_7261_6e64_6f6d
        var v2 = k0 ^ 0x6c79_6765_6e65_7261
        var v3 = k1 ^ 0x7465_6462_7974_6573

        @inline(__always) func round() {
            v0 &+= v1; v1 = v1.rotl(13); v1 ^= v0; v0 = v0.rotl(32)
            v2 &+= v3; v3 = v3.rotl(16); v3 ^= v2
            v0 &+= v3; v3 = v3.rotl(21); v3 ^= v0
            v2 &+= v1; v1 = v1.rotl(17); v1 ^= v2; v2 = v2.rotl(32)
        }

        let count = bytes.count
        let whole = count & ~7
        var i = 0
        while i < whole {
            let m = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self))
            v3 ^= m
            round(); round()
            v0 ^= m
            i += 8
        }
        // The last 0-7 bytes, with the length's low byte on top.
        var last = UInt64(truncatingIfNeeded: count) << 56
        var shift: UInt64 = 0
        while i < count {
            last |= UInt64(bytes[i]) << shift
            shift += 8
            i += 1
        }
        v3 ^= last
        round(); round()
        v0 ^= last
        v2 ^= 0xff
        round(); round(); round(); round()
        return v0 ^ v1 ^ v2 ^ v3
    }
}

extension UInt64 {
    @inline(__always) fileprivate func rotl(_ n: UInt64) -> UInt64 { self << n | self >> (64 - n) }
}
