// The only file of this module that calls OpenSSL directly: SHA-3/SHAKE (EVP), X25519 (EVP_PKEY)
// and P-256 point arithmetic (EC_POINT). HKDF and the AEADs come from the Ratchet module; error
// text, the CSPRNG, wiping, constant-time comparison and the P-256 group from OpenSSLSupport.
internal import COpenSSL
internal import OpenSSLSupport
import Ratchet

/// Owns one fetched EVP_MD.
/// @unchecked Sendable: immutable after init; OpenSSL documents fetched algorithms as shareable across threads.
private final class FetchedDigest: @unchecked Sendable {
    let handle: OpaquePointer
    init(_ name: String) {
        guard let md = EVP_MD_fetch(nil, name, nil) else { fatalError("EVP_MD_fetch(\(name)) failed: OpenSSL lacks SHA-3") }
        handle = md
    }
    deinit { EVP_MD_free(handle) }
}

/// SHA3-256/512 and SHAKE128/256 (FIPS 202) over the concatenation of `parts`.
enum Keccak {
    private static let sha3_256MD = FetchedDigest("SHA3-256")
    private static let sha3_512MD = FetchedDigest("SHA3-512")
    private static let shake128MD = FetchedDigest("SHAKE128")
    private static let shake256MD = FetchedDigest("SHAKE256")

    static func sha3_256(_ parts: [UInt8]...) -> [UInt8] { digest(sha3_256MD, parts, 32, xof: false) }
    static func sha3_512(_ parts: [UInt8]...) -> [UInt8] { digest(sha3_512MD, parts, 64, xof: false) }
    static func shake128(_ parts: [UInt8]..., count: Int) -> [UInt8] { digest(shake128MD, parts, count, xof: true) }
    static func shake256(_ parts: [UInt8]..., count: Int) -> [UInt8] { digest(shake256MD, parts, count, xof: true) }

    // OpenSSL 3.0 squeezes an XOF once per context (EVP_DigestSqueeze is 3.3+), so callers ask for
    // all the output they need up front. Failures here are allocation failures inside OpenSSL:
    // nothing a caller could handle, and no input makes them happen.
    private static func digest(_ md: FetchedDigest, _ parts: [[UInt8]], _ count: Int, xof: Bool) -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new failed") }
        defer { EVP_MD_CTX_free(ctx) }  // EVP_MD_CTX_free cleanses the sponge state
        guard EVP_DigestInit_ex2(ctx, md.handle, nil) == 1 else { fatalError("EVP_DigestInit_ex2 failed") }
        for part in parts where !part.isEmpty {
            let ok = part.withUnsafeBytes { EVP_DigestUpdate(ctx, $0.baseAddress, $0.count) }
            guard ok == 1 else { fatalError("EVP_DigestUpdate failed") }
        }
        var out = [UInt8](repeating: 0, count: count)
        let ok = out.withUnsafeMutableBufferPointer { o -> Int32 in
            if xof { return EVP_DigestFinalXOF(ctx, o.baseAddress, count) }
            var length: UInt32 = 0
            return EVP_DigestFinal_ex(ctx, o.baseAddress, &length)
        }
        guard ok == 1 else { fatalError("EVP_DigestFinal failed") }
        return out
    }
}

private func openSSLError(_ operation: String) -> KeyExchangeError { .openSSL(OpenSSLFailure.drained(operation).description) }

// MARK: - X25519 (RFC 7748) through EVP_PKEY

/// An X25519 private key held as an EVP_PKEY. OpenSSL computes the public key when the key is
/// made (one scalar multiplication), so a key used twice is made once.
/// @unchecked Sendable: the EVP_PKEY is never modified after init; each derivation uses its own
/// EVP_PKEY_CTX, and OpenSSL documents concurrent read-only use of a key as safe.
final class X25519Key: @unchecked Sendable {
    static let length = 32
    private let pkey: OpaquePointer
    /// X25519(scalar, 9).
    let publicKey: [UInt8]

    init(privateKey: [UInt8]) throws(KeyExchangeError) {
        try checkLength(privateKey, Self.length, "x25519PrivateKey")
        guard let key = privateKey.withUnsafeBufferPointer({ EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nil, $0.baseAddress, Self.length) }) else {
            throw openSSLError("EVP_PKEY_new_raw_private_key(X25519)")
        }
        pkey = key
        var out = [UInt8](repeating: 0, count: Self.length)
        var length = Self.length
        guard out.withUnsafeMutableBufferPointer({ EVP_PKEY_get_raw_public_key(key, $0.baseAddress, &length) }) == 1,
              length == Self.length else {
            EVP_PKEY_free(key)
            throw openSSLError("EVP_PKEY_get_raw_public_key(X25519)")
        }
        publicKey = out
    }

    deinit { EVP_PKEY_free(pkey) }  // EVP_PKEY_free cleanses the private key

    /// X25519(privateKey, peer). OpenSSL refuses a result of all zeros (a peer point of small
    /// order): that comes back as `.invalidPublicKey(field: peerField)`.
    func sharedSecret(peer: [UInt8], peerField: String) throws(KeyExchangeError) -> [UInt8] {
        try checkLength(peer, Self.length, peerField)
        guard let theirs = peer.withUnsafeBufferPointer({ EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nil, $0.baseAddress, Self.length) }) else {
            throw openSSLError("EVP_PKEY_new_raw_public_key(X25519)")
        }
        defer { EVP_PKEY_free(theirs) }
        guard let ctx = EVP_PKEY_CTX_new_from_pkey(nil, pkey, nil) else { throw openSSLError("EVP_PKEY_CTX_new(X25519)") }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_derive_init(ctx) == 1 else { throw openSSLError("EVP_PKEY_derive_init(X25519)") }
        guard EVP_PKEY_derive_set_peer(ctx, theirs) == 1 else {
            OpenSSLErrors.clear()
            throw .invalidPublicKey(field: peerField)
        }
        var out = [UInt8](repeating: 0, count: Self.length)
        var length = Self.length
        guard out.withUnsafeMutableBufferPointer({ EVP_PKEY_derive(ctx, $0.baseAddress, &length) }) == 1, length == Self.length else {
            OpenSSLErrors.clear()  // the only input-driven failure is the all-zero result
            throw .invalidPublicKey(field: peerField)
        }
        return out
    }
}

// MARK: - P-256 (secp256r1) through EC_POINT

/// P-256 scalar multiplication for DHKEM(P-256) and CryptoKit's P256.KeyAgreement. OpenSSL's
/// EC_POINT_mul runs in constant time for the scalar (BN_FLG_CONSTTIME on our scalar too).
enum P256Curve {
    static let scalarLength = 32
    static let uncompressedLength = 65

    /// The group order n, big-endian.
    static let order: [UInt8] = [UInt8](hex: "ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551")!

    /// Is the big-endian scalar in 1...n-1? Used on secret scalars; branch-free comparison.
    static func isValidScalar(_ s: [UInt8]) -> Bool {
        guard s.count == scalarLength else { return false }
        // Borrow of s - n (s < n iff the subtraction borrows) and an OR of all bytes (s != 0).
        var borrow: Int32 = 0
        var any: UInt8 = 0
        for i in stride(from: scalarLength - 1, through: 0, by: -1) {
            let d = Int32(s[i]) - Int32(order[i]) - borrow
            borrow = (d >> 8) & 1
            any |= s[i]
        }
        let nonZero = (Int32(any) | -Int32(any)) >> 31 & 1
        return (borrow & nonZero) == 1
    }

    /// scalar * G as an uncompressed point (0x04 || x || y).
    static func publicKey(scalar: [UInt8]) throws(KeyExchangeError) -> [UInt8] {
        try multiply(scalar: scalar, point: nil, scalarField: "privateKey", pointField: "")
    }

    /// The x-coordinate of scalar * peer (the ECDH shared secret, SEC 1 / RFC 9180's DH()).
    static func sharedSecret(scalar: [UInt8], peer: [UInt8], peerField: String) throws(KeyExchangeError) -> [UInt8] {
        let point = try multiply(scalar: scalar, point: peer, scalarField: "privateKey", pointField: peerField)
        return Array(point[1..<33])
    }

    /// Parses an uncompressed (65-byte) or raw x||y (64-byte, CryptoKit's rawRepresentation) point,
    /// checking it is on the curve; returns it uncompressed.
    static func uncompressed(_ bytes: [UInt8], field: String) throws(KeyExchangeError) -> [UInt8] {
        let full: [UInt8]
        switch bytes.count {
        case 64: full = [0x04] + bytes
        case 65: full = bytes
        default: throw .invalidLength(field: field, expected: 65, actual: bytes.count)
        }
        guard full[0] == 0x04 else { throw .invalidPublicKey(field: field) }
        let group = try p256Group()
        guard let point = EC_POINT_new(group) else { throw openSSLError("EC_POINT_new") }
        defer { EC_POINT_free(point) }
        // oct2point checks that the point is on the curve.
        guard full.withUnsafeBufferPointer({ EC_POINT_oct2point(group, point, $0.baseAddress, 65, nil) }) == 1 else {
            OpenSSLErrors.clear()
            throw .invalidPublicKey(field: field)
        }
        return full
    }

    private static func p256Group() throws(KeyExchangeError) -> OpaquePointer {
        guard let group = P256Group.shared else { throw .openSSL("EC_GROUP_new_by_curve_name(P-256) failed") }
        return group.handle
    }

    private static func multiply(scalar: [UInt8], point: [UInt8]?, scalarField: String, pointField: String) throws(KeyExchangeError) -> [UInt8] {
        try checkLength(scalar, scalarLength, scalarField)
        guard isValidScalar(scalar) else { throw .invalidPrivateKey(field: scalarField) }
        let group = try p256Group()
        guard let bn = scalar.withUnsafeBufferPointer({ BN_bin2bn($0.baseAddress, Int32(scalarLength), nil) }) else { throw openSSLError("BN_bin2bn") }
        defer { BN_clear_free(bn) }
        BN_set_flags(bn, BN_FLG_CONSTTIME)
        guard let result = EC_POINT_new(group) else { throw openSSLError("EC_POINT_new") }
        defer { EC_POINT_free(result) }
        if let point {
            let full = try uncompressed(point, field: pointField)
            guard let peer = EC_POINT_new(group) else { throw openSSLError("EC_POINT_new") }
            defer { EC_POINT_free(peer) }
            guard full.withUnsafeBufferPointer({ EC_POINT_oct2point(group, peer, $0.baseAddress, 65, nil) }) == 1 else {
                OpenSSLErrors.clear()
                throw .invalidPublicKey(field: pointField)
            }
            guard EC_POINT_mul(group, result, nil, peer, bn, nil) == 1 else { throw openSSLError("EC_POINT_mul") }
        } else {
            guard EC_POINT_mul(group, result, bn, nil, nil, nil) == 1 else { throw openSSLError("EC_POINT_mul") }
        }
        guard EC_POINT_is_at_infinity(group, result) == 0 else { throw .invalidPublicKey(field: pointField) }
        var out = [UInt8](repeating: 0, count: uncompressedLength)
        let n = out.withUnsafeMutableBufferPointer {
            EC_POINT_point2oct(group, result, POINT_CONVERSION_UNCOMPRESSED, $0.baseAddress, uncompressedLength, nil)
        }
        guard n == uncompressedLength else { throw openSSLError("EC_POINT_point2oct") }
        return out
    }
}
