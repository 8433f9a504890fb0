// The CSPRNG, constant-time comparison and zeroing, for key material and credentials.
internal import COpenSSL

package enum SecureRandom {
    /// Fills `buffer` from RAND_bytes; throws when the CSPRNG fails, for callers whose API
    /// reports errors (Ratchet's seal).
    package static func fillChecked(_ buffer: UnsafeMutableRawBufferPointer) throws(OpenSSLFailure) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        guard buffer.count <= Int(Int32.max) else { throw OpenSSLFailure(operation: "RAND_bytes", detail: "request too large") }
        guard RAND_bytes(base.assumingMemoryBound(to: UInt8.self), Int32(buffer.count)) == 1 else {
            throw .drained("RAND_bytes")
        }
    }

    /// Fills `buffer`, trapping when the CSPRNG fails: carrying on would hand out guessable
    /// keys, credentials or nonces, and nothing a caller could do would fix the system RNG.
    package static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        do { try fillChecked(buffer) } catch { fatalError("OpenSSL RNG failed: \(error)") }
    }

    /// `count` random bytes (traps like `fill`).
    package static func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBytes { fill($0) }
        return out
    }
}

/// Equal bytes, in a time that does not depend on where they differ (CRYPTO_memcmp); lengths are
/// public, so unequal lengths return false at once.
package func constantTimeEqual(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    guard a.count == b.count else { return false }
    guard a.count > 0, let pa = a.baseAddress, let pb = b.baseAddress else { return true }
    return CRYPTO_memcmp(pa, pb, a.count) == 0
}

package func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in constantTimeEqual(pa, pb) } }
}

/// Overwrites the bytes with zeros (OPENSSL_cleanse: not optimised away).
package func wipe(_ buffer: UnsafeMutableRawBufferPointer) {
    guard let base = buffer.baseAddress, buffer.count > 0 else { return }
    OPENSSL_cleanse(base, buffer.count)
}

/// Overwrites the array's elements (bytes, ML-KEM coefficients) with zeros.
package func wipe<T: BitwiseCopyable>(_ values: inout [T]) {
    values.withUnsafeMutableBytes { wipe($0) }
}
