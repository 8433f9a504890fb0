internal import OpenSSLSupport

/// Opaque symmetric key bytes, in the spirit of CryptoKit's `SymmetricKey`.
///
/// The bytes live in memory this object owns and are overwritten with zeros (OPENSSL_cleanse)
/// when the object is freed. `==` takes time that depends only on the lengths. `description`
/// never shows the bytes, so a key that ends up in a log line leaks nothing.
public final class SecretKey: @unchecked Sendable, Equatable, CustomStringConvertible {
    // @unchecked Sendable: `storage` is allocated and filled in `init` and never written again
    // (there is no mutating API); `deinit` runs with exclusive access. Concurrent readers only
    // ever read immutable bytes.
    private let storage: UnsafeMutableRawBufferPointer

    /// Copies `bytes` into zero-on-free storage.
    public init(bytes: some Collection<UInt8>) {
        storage = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 16)
        storage.copyBytes(from: bytes)
    }

    /// `count` bytes from OpenSSL's CSPRNG (RAND_bytes). A failing system RNG is not something a
    /// caller can recover from, so it stops the process rather than returning a weak key.
    public init(random count: Int = 32) {
        precondition(count >= 0, "SecretKey(random:) needs a non-negative count")
        storage = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 16)
        SecureRandom.fill(storage)
    }

    /// Takes ownership of bytes already written into `storage` (used by derivations that write
    /// straight into key memory).
    init(adopting storage: UnsafeMutableRawBufferPointer) {
        self.storage = storage
    }

    deinit {
        wipe(storage)
        storage.deallocate()
    }

    public var count: Int { storage.count }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(storage))
    }

    public static func == (lhs: SecretKey, rhs: SecretKey) -> Bool {
        constantTimeEqual(UnsafeRawBufferPointer(lhs.storage), UnsafeRawBufferPointer(rhs.storage))
    }

    public var description: String { "SecretKey(\(count) bytes)" }

    /// A plain copy of the bytes, for callers that must export the key (state files, the CLI).
    /// The copy is not zeroed on free: keep its lifetime short.
    public var exportedBytes: [UInt8] { [UInt8](UnsafeRawBufferPointer(storage)) }
}
