import COpenSSL
import Testing
import Basics

/// SipHash-2-4: the paper's vectors, and OpenSSL's SIPHASH MAC as the oracle (the dedupe
/// index's stored hashes were made by OpenSSL before this implementation replaced it).
@Suite struct SipHashTests {
    static let paperKey = (0..<16).map { UInt8($0) }

    @Test func matchesTheReferenceVectors() throws {
        // Key 00..0f, message 00..(n-1): the reference implementation's vectors.h, as words.
        let h = try #require(SipHash24(key: Self.paperKey))
        #expect(h.hash([]) == 0x726f_db47_dd0e_0e31)
        #expect(h.hash([0]) == 0x74f8_39c5_93dc_67fd)
        #expect(h.hash((0..<15).map { UInt8($0) }) == 0xa129_ca61_49be_45e5)
    }

    @Test func refusesAKeyThatIsNot16Bytes() {
        #expect(SipHash24(key: []) == nil)
        #expect(SipHash24(key: [UInt8](repeating: 1, count: 15)) == nil)
        #expect(SipHash24(key: [UInt8](repeating: 1, count: 17)) == nil)
    }

    @Test func agreesWithOpenSSLOnRandomKeysAndEveryLengthUpTo200() throws {
        var rng = SystemRandomNumberGenerator()
        for length in 0...200 {
            for _ in 0..<8 {
                let key = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
                let message = (0..<length).map { _ in UInt8.random(in: 0...255, using: &rng) }
                let ours = try #require(SipHash24(key: key)).hash(message)
                let ctx = try #require(key.withUnsafeBufferPointer { cossl_siphash_new($0.baseAddress) })
                defer { EVP_MAC_CTX_free(ctx) }
                var ok: Int32 = 0
                let theirs = message.withUnsafeBytes { cossl_siphash(ctx, $0.baseAddress, $0.count, &ok) }
                #expect(ok == 1)
                #expect(ours == theirs, "key \(key) length \(length)")
            }
        }
    }

    @Test func hashesAnUnalignedSliceLikeACopy() throws {
        let h = try #require(SipHash24(key: Self.paperKey))
        let bytes = (0..<64).map { UInt8($0 * 7 & 0xff) }
        let sliced = bytes.withUnsafeBytes { h.hash(UnsafeRawBufferPointer(rebasing: $0[3..<40])) }
        #expect(sliced == h.hash(Array(bytes[3..<40])))
    }
}
