import Ratchet
internal import OpenSSLSupport

/// ML-KEM-768 (FIPS 203): key generation from (d, z), encapsulation from m, decapsulation with
/// implicit rejection. Polynomials are 256 coefficients in [0, q), reduced with Barrett
/// arithmetic and conditional subtractions built from masks: no branch or table index depends on
/// a secret (the NTT tables are indexed by loop counters; rejection sampling of the matrix only
/// sees the public seed rho). Secret intermediates are overwritten before they are freed.
public enum MLKEM768 {
    public static let encapsulationKeyLength = 1184
    public static let decapsulationKeyLength = 2400
    public static let ciphertextLength = 1088
    public static let sharedSecretLength = 32

    static let k = 3
    static let eta1 = 2
    static let eta2 = 2
    static let du = 10
    static let dv = 4
    static let polyBytes = 384  // ByteEncode_12 of one polynomial

    /// KeyGen_internal(d, z) (FIPS 203 Algorithm 16): the encapsulation key and the 2400-byte
    /// decapsulation key dk_PKE || ek || H(ek) || z.
    public static func generateKeyPair(d: [UInt8], z: [UInt8]) throws(KeyExchangeError) -> (encapsulationKey: [UInt8], decapsulationKey: SecretKey) {
        try checkLength(d, 32, "d")
        try checkLength(z, 32, "z")
        var g = Keccak.sha3_512(d, [UInt8(k)])
        let rho = Array(g[0..<32])
        var sigma = Array(g[32..<64])
        wipe(&g)
        let a = matrix(rho)
        var n: UInt8 = 0
        var s = (0..<k).map { _ in let p = cbd(prf(sigma, &n, eta1), eta1); return p }
        var e = (0..<k).map { _ in let p = cbd(prf(sigma, &n, eta1), eta1); return p }
        wipe(&sigma)
        for i in 0..<k { ntt(&s[i]); ntt(&e[i]) }
        var ek = [UInt8]()
        ek.reserveCapacity(encapsulationKeyLength)
        for i in 0..<k {
            var t = e[i]
            for j in 0..<k { multiplyAdd(&t, a[i][j], s[j]) }
            byteEncode(t, 12, into: &ek)
        }
        ek += rho
        var dk = [UInt8]()
        dk.reserveCapacity(decapsulationKeyLength)
        for i in 0..<k { byteEncode(s[i], 12, into: &dk) }
        dk += ek
        dk += Keccak.sha3_256(ek)
        dk += z
        for i in 0..<k { wipe(&s[i]); wipe(&e[i]) }
        let key = SecretKey(bytes: dk)
        wipe(&dk)
        return (ek, key)
    }

    /// Encaps_internal(ek, m) (Algorithm 17) after the FIPS 203 7.2 input checks (length, and
    /// every coefficient of ek below q).
    public static func encapsulate(encapsulationKey ek: [UInt8], m: [UInt8]) throws(KeyExchangeError) -> (sharedSecret: SecretKey, ciphertext: [UInt8]) {
        try checkLength(ek, encapsulationKeyLength, "encapsulationKey")
        try checkLength(m, 32, "m")
        try checkModulus(ek)
        var kr = Keccak.sha3_512(m, Keccak.sha3_256(ek))
        let c = encrypt(ek: ek, m: m, r: Array(kr[32..<64]))
        let key = SecretKey(bytes: kr[0..<32])
        wipe(&kr)
        return (key, c)
    }

    /// Encapsulation with fresh randomness.
    public static func encapsulate(encapsulationKey ek: [UInt8]) throws(KeyExchangeError) -> (sharedSecret: SecretKey, ciphertext: [UInt8]) {
        var m = SecureRandom.bytes(32)
        defer { wipe(&m) }
        return try encapsulate(encapsulationKey: ek, m: m)
    }

    /// Decaps_internal(dk, c) (Algorithm 18) after the 7.3 checks on lengths and H(ek). A
    /// ciphertext that does not re-encrypt to itself yields J(z || c) instead of the real key,
    /// chosen with a constant-time compare and select.
    public static func decapsulate(decapsulationKey: SecretKey, ciphertext c: [UInt8]) throws(KeyExchangeError) -> SecretKey {
        try checkLength(c, ciphertextLength, "ciphertext")
        guard decapsulationKey.count == decapsulationKeyLength else {
            throw .invalidLength(field: "decapsulationKey", expected: decapsulationKeyLength, actual: decapsulationKey.count)
        }
        var dk = decapsulationKey.exportedBytes
        defer { wipe(&dk) }
        let ekStart = k * polyBytes
        let ek = Array(dk[ekStart..<(ekStart + encapsulationKeyLength)])
        let h = Array(dk[(ekStart + encapsulationKeyLength)..<(ekStart + encapsulationKeyLength + 32)])
        var z = Array(dk[(ekStart + encapsulationKeyLength + 32)...])
        defer { wipe(&z) }
        guard constantTimeEqual(Keccak.sha3_256(ek), h) else { throw .invalidDecapsulationKey }
        var mPrime = decrypt(dkPKE: Array(dk[0..<ekStart]), c: c)
        var kr = Keccak.sha3_512(mPrime, h)
        var kBar = Keccak.shake256(z, c, count: 32)
        let cPrime = encrypt(ek: ek, m: mPrime, r: Array(kr[32..<64]))
        // mask = 0xff when c == c', else 0: K = (K' & mask) | (K_bar & ~mask).
        var diff: UInt8 = 0
        for i in 0..<ciphertextLength { diff |= c[i] ^ cPrime[i] }
        let mask = UInt8(truncatingIfNeeded: (Int32(diff) - 1) >> 8)
        var out = [UInt8](repeating: 0, count: 32)
        for i in 0..<32 { out[i] = (kr[i] & mask) | (kBar[i] & ~mask) }
        let key = SecretKey(bytes: out)
        wipe(&out); wipe(&kr); wipe(&kBar); wipe(&mPrime)
        return key
    }

    /// The encapsulation key inside a decapsulation key.
    public static func encapsulationKey(of decapsulationKey: SecretKey) -> [UInt8] {
        decapsulationKey.withUnsafeBytes { Array($0[(k * polyBytes)..<(k * polyBytes + encapsulationKeyLength)]) }
    }

    static func checkModulus(_ ek: [UInt8]) throws(KeyExchangeError) {
        for i in 0..<k {
            let p = byteDecode(ek, offset: i * polyBytes, 12)
            // ek is public: a plain branch is fine here.
            for c in p where c >= q { throw .invalidEncapsulationKey }
        }
    }

    // MARK: K-PKE (Algorithms 14 and 15)

    static func encrypt(ek: [UInt8], m: [UInt8], r: [UInt8]) -> [UInt8] {
        var r = r
        defer { wipe(&r) }
        let t = (0..<k).map { byteDecode(ek, offset: $0 * polyBytes, 12) }
        let a = matrix(Array(ek[(k * polyBytes)...]))
        var n: UInt8 = 0
        var y = (0..<k).map { _ in cbd(prf(r, &n, eta1), eta1) }
        var e1 = (0..<k).map { _ in cbd(prf(r, &n, eta2), eta2) }
        var e2 = cbd(prf(r, &n, eta2), eta2)
        for i in 0..<k { ntt(&y[i]) }
        var c = [UInt8]()
        c.reserveCapacity(ciphertextLength)
        for i in 0..<k {
            var u = [UInt16](repeating: 0, count: 256)
            for j in 0..<k { multiplyAdd(&u, a[j][i], y[j]) }
            inverseNTT(&u)
            add(&u, e1[i])
            compress(&u, du)
            byteEncode(u, du, into: &c)
        }
        var v = [UInt16](repeating: 0, count: 256)
        for j in 0..<k { multiplyAdd(&v, t[j], y[j]) }
        inverseNTT(&v)
        add(&v, e2)
        var mu = byteDecode(m, offset: 0, 1)
        decompress(&mu, 1)
        add(&v, mu)
        compress(&v, dv)
        byteEncode(v, dv, into: &c)
        for i in 0..<k { wipe(&y[i]); wipe(&e1[i]) }
        wipe(&e2); wipe(&mu); wipe(&v)
        return c
    }

    static func decrypt(dkPKE: [UInt8], c: [UInt8]) -> [UInt8] {
        var dkPKE = dkPKE
        defer { wipe(&dkPKE) }
        var w = byteDecode(c, offset: k * 32 * du, dv)
        decompress(&w, dv)
        var acc = [UInt16](repeating: 0, count: 256)
        for i in 0..<k {
            var u = byteDecode(c, offset: i * 32 * du, du)
            decompress(&u, du)
            ntt(&u)
            var s = byteDecode(dkPKE, offset: i * polyBytes, 12)
            multiplyAdd(&acc, s, u)
            wipe(&s)
        }
        inverseNTT(&acc)
        for i in 0..<256 { w[i] = UInt16(truncatingIfNeeded: subq(UInt32(w[i]), UInt32(acc[i]))) }
        compress(&w, 1)
        var m = [UInt8]()
        byteEncode(w, 1, into: &m)
        wipe(&w); wipe(&acc)
        return m
    }

    // MARK: Sampling (Algorithms 7 and 8) and the PRF

    /// Â[i][j] = SampleNTT(rho || j || i).
    static func matrix(_ rho: [UInt8]) -> [[[UInt16]]] {
        (0..<k).map { i in (0..<k).map { j in sampleNTT(rho, UInt8(j), UInt8(i)) } }
    }

    /// Rejection sampling from SHAKE128(rho || b0 || b1). OpenSSL 3.0 squeezes once, so this asks
    /// for 5 blocks (enough in all but ~1e-30 of cases) and, if they run out, for twice as many
    /// (an XOF's longer output starts with its shorter one, so the result is the same).
    static func sampleNTT(_ rho: [UInt8], _ b0: UInt8, _ b1: UInt8) -> [UInt16] {
        var length = 168 * 5
        while true {
            let stream = Keccak.shake128(rho, [b0, b1], count: length)
            var a = [UInt16](repeating: 0, count: 256)
            var j = 0, i = 0
            while j < 256 && i + 3 <= stream.count {
                let d1 = UInt16(truncatingIfNeeded: stream[i]) | (UInt16(truncatingIfNeeded: stream[i + 1] & 0x0f) << 8)
                let d2 = UInt16(truncatingIfNeeded: stream[i + 1] >> 4) | (UInt16(truncatingIfNeeded: stream[i + 2]) << 4)
                i += 3
                if d1 < q { a[j] = d1; j += 1 }
                if d2 < q && j < 256 { a[j] = d2; j += 1 }
            }
            if j == 256 { return a }
            length *= 2
        }
    }

    /// PRF_eta(s, N) = SHAKE256(s || N, 64 * eta); increments N.
    static func prf(_ s: [UInt8], _ n: inout UInt8, _ eta: Int) -> [UInt8] {
        defer { n &+= 1 }
        return Keccak.shake256(s, [n], count: 64 * eta)
    }

    /// SamplePolyCBD_2 (eta = 2 for both of ML-KEM-768's distributions): each coefficient is
    /// (b0 + b1) - (b2 + b3) from one nibble, mod q, with no branch.
    static func cbd(_ input: [UInt8], _ eta: Int) -> [UInt16] {
        precondition(eta == 2 && input.count == 128)
        var input = input
        defer { wipe(&input) }
        var f = [UInt16](repeating: 0, count: 256)
        for i in 0..<256 {
            let nibble = UInt32(input[i >> 1] >> UInt8(4 * (i & 1))) & 0x0f
            let x = (nibble & 1) + ((nibble >> 1) & 1)
            let y = ((nibble >> 2) & 1) + ((nibble >> 3) & 1)
            f[i] = UInt16(truncatingIfNeeded: subq(x, y))
        }
        return f
    }

    // MARK: Arithmetic mod q

    static let q: UInt16 = 3329
    static let q32: UInt32 = 3329

    /// a mod q for a < 2q, by a masked subtraction.
    @inline(__always) static func csubq(_ a: UInt32) -> UInt32 {
        let r = a &- q32
        return r &+ (q32 & (0 &- (r >> 31)))
    }

    /// a mod q for any a < 2^32 (Barrett: floor(2^32 / q) = 1290167 leaves a remainder < 2q).
    @inline(__always) static func reduce(_ a: UInt32) -> UInt32 {
        let t = UInt32(truncatingIfNeeded: (UInt64(a) &* 1_290_167) >> 32)
        return csubq(a &- t &* q32)
    }

    @inline(__always) static func addq(_ a: UInt32, _ b: UInt32) -> UInt32 { csubq(a &+ b) }
    @inline(__always) static func subq(_ a: UInt32, _ b: UInt32) -> UInt32 { csubq(a &+ q32 &- b) }
    @inline(__always) static func mulq(_ a: UInt32, _ b: UInt32) -> UInt32 { reduce(a &* b) }

    /// floor(y / q) for y < 2^28 without a division instruction (whose latency can depend on
    /// its operands): multiply by ceil(2^40 / q) and shift. Checked exhaustively in the tests.
    @inline(__always) static func divq(_ y: UInt32) -> UInt32 {
        UInt32(truncatingIfNeeded: (UInt64(y) &* 330_282_857) >> 40)
    }

    /// Compress_d(x) = round(2^d * x / q) mod 2^d.
    static func compress(_ f: inout [UInt16], _ d: Int) {
        let mask: UInt32 = (1 << d) - 1
        for i in 0..<256 { f[i] = UInt16(truncatingIfNeeded: divq((UInt32(f[i]) << d) &+ 1664) & mask) }
    }

    /// Decompress_d(y) = round(q * y / 2^d).
    static func decompress(_ f: inout [UInt16], _ d: Int) {
        for i in 0..<256 { f[i] = UInt16(truncatingIfNeeded: (UInt32(f[i]) &* q32 &+ (1 << (d - 1))) >> d) }
    }

    static func add(_ f: inout [UInt16], _ g: [UInt16]) {
        for i in 0..<256 { f[i] = UInt16(truncatingIfNeeded: addq(UInt32(f[i]), UInt32(g[i]))) }
    }

    // MARK: NTT (Algorithms 9-12)

    static func bitReverse7(_ i: Int) -> Int {
        var r = 0
        for b in 0..<7 where i & (1 << b) != 0 { r |= 1 << (6 - b) }
        return r
    }

    static func power17(_ e: Int) -> UInt32 {
        var r: UInt32 = 1
        for _ in 0..<e { r = mulq(r, 17) }
        return r
    }

    /// zeta^BitRev7(i) for i in 0..<128.
    static let zetas: [UInt32] = (0..<128).map { power17(bitReverse7($0)) }
    /// zeta^(2 BitRev7(i) + 1) for the base-case multiplications.
    static let gammas: [UInt32] = (0..<128).map { power17(2 * bitReverse7($0) + 1) }

    static func ntt(_ f: inout [UInt16]) {
        var i = 1
        var len = 128
        let zetas = Self.zetas  // one swift_once check per call, not per butterfly
        f.withUnsafeMutableBufferPointer { f in
            while len >= 2 {
                var start = 0
                while start < 256 {
                    let zeta = zetas[i]
                    i += 1
                    for j in start..<(start + len) {
                        let t = mulq(zeta, UInt32(f[j + len]))
                        f[j + len] = UInt16(truncatingIfNeeded: subq(UInt32(f[j]), t))
                        f[j] = UInt16(truncatingIfNeeded: addq(UInt32(f[j]), t))
                    }
                    start += 2 * len
                }
                len >>= 1
            }
        }
    }

    static func inverseNTT(_ f: inout [UInt16]) {
        var i = 127
        var len = 2
        let zetas = Self.zetas
        f.withUnsafeMutableBufferPointer { f in
            while len <= 128 {
                var start = 0
                while start < 256 {
                    let zeta = zetas[i]
                    i -= 1
                    for j in start..<(start + len) {
                        let t = UInt32(f[j])
                        f[j] = UInt16(truncatingIfNeeded: addq(t, UInt32(f[j + len])))
                        f[j + len] = UInt16(truncatingIfNeeded: mulq(zeta, subq(UInt32(f[j + len]), t)))
                    }
                    start += 2 * len
                }
                len <<= 1
            }
            for j in 0..<256 { f[j] = UInt16(truncatingIfNeeded: mulq(UInt32(f[j]), 3303)) }  // 3303 = 128^-1 mod q
        }
    }

    /// acc += f * g in the NTT domain (MultiplyNTTs, Algorithm 11, with BaseCaseMultiply).
    static func multiplyAdd(_ acc: inout [UInt16], _ f: [UInt16], _ g: [UInt16]) {
        let gammas = Self.gammas
        for i in 0..<128 {
            let a0 = UInt32(f[2 * i]), a1 = UInt32(f[2 * i + 1])
            let b0 = UInt32(g[2 * i]), b1 = UInt32(g[2 * i + 1])
            let c0 = addq(mulq(a0, b0), mulq(mulq(a1, b1), gammas[i]))
            let c1 = addq(mulq(a0, b1), mulq(a1, b0))
            acc[2 * i] = UInt16(truncatingIfNeeded: addq(UInt32(acc[2 * i]), c0))
            acc[2 * i + 1] = UInt16(truncatingIfNeeded: addq(UInt32(acc[2 * i + 1]), c1))
        }
    }

    // MARK: ByteEncode_d / ByteDecode_d (Algorithms 5 and 6): little-endian bit packing

    static func byteEncode(_ f: [UInt16], _ d: Int, into out: inout [UInt8]) {
        var acc: UInt64 = 0
        var bits = 0
        for i in 0..<256 {
            acc |= UInt64(f[i]) << UInt64(bits)
            bits += d
            while bits >= 8 {
                out.append(UInt8(truncatingIfNeeded: acc))
                acc >>= 8
                bits -= 8
            }
        }
    }

    /// Decodes 32 * d bytes at `offset`; for d = 12 the values are mod 2^12 (callers check < q).
    static func byteDecode(_ bytes: [UInt8], offset: Int, _ d: Int) -> [UInt16] {
        var f = [UInt16](repeating: 0, count: 256)
        var acc: UInt64 = 0
        var bits = 0
        var p = offset
        let mask: UInt64 = (1 << UInt64(d)) - 1
        for i in 0..<256 {
            while bits < d {
                acc |= UInt64(bytes[p]) << UInt64(bits)
                p += 1
                bits += 8
            }
            f[i] = UInt16(truncatingIfNeeded: acc & mask)
            acc >>= UInt64(d)
            bits -= d
        }
        return f
    }
}
