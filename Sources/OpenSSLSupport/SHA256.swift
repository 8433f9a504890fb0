// SHA-256 through the shim's one-shot cossl_sha256 (see its comment for why not EVP_Digest).
internal import COpenSSL

package enum SHA256 {
    package static let length = 32

    /// RelayCore's ingest path hashes every request's bearer straight from the header bytes.
    package static func hash(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: length) { out, count in
            cossl_sha256(bytes.baseAddress, bytes.count, out.baseAddress)
            count = length
        }
    }

    /// Inlinable so callers' collections are specialised (no witness-table walk per call).
    @inlinable package static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        if let digest = bytes.withContiguousStorageIfAvailable({ hash(UnsafeRawBufferPointer($0)) }) { return digest }
        return Array(bytes).withUnsafeBytes { hash($0) }
    }
}
