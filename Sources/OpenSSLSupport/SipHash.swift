// SipHash-2-4 under a 16-byte key through the shim's cossl_siphash (OpenSSL's EVP_MAC
// "SIPHASH"): a keyed 64-bit hash for tables whose keys clients choose (RelayCore's dedupe index).
internal import COpenSSL

/// One context, keyed once and re-initialised per hash (no allocation per call), so used by
/// one thread at a time.
package final class SipHash {
    private let ctx: OpaquePointer

    /// nil when OpenSSL has no SIPHASH MAC or the key is not 16 bytes.
    package init?(key: [UInt8]) {
        guard key.count == 16, let ctx = key.withUnsafeBufferPointer({ cossl_siphash_new($0.baseAddress) }) else { return nil }
        self.ctx = ctx
    }

    deinit { EVP_MAC_CTX_free(ctx) }

    /// The tag as SipHash's little-endian 64-bit word. OpenSSL failing on a keyed context is an
    /// allocation failure: trap rather than hash everything to one value.
    package func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var ok: Int32 = 0
        let v = cossl_siphash(ctx, bytes.baseAddress, bytes.count, &ok)
        precondition(ok == 1, "EVP_MAC SIPHASH failed")
        return v
    }

    package func hash(_ bytes: [UInt8]) -> UInt64 { bytes.withUnsafeBytes { hash($0) } }
}
