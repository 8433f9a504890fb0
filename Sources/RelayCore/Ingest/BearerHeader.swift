// The Authorization header of ingest requests, read in one pass over its bytes.
import Basics
import Glibc

extension IngestService {
    /// The SHA-256 of the bearer secret if the header is well-formed: `Bearer` (any case), one
    /// or more spaces, `rk_` + base64url characters (at most 128 bytes), optional trailing
    /// spaces/tabs. Hashed straight from the header's bytes in one pass: no String for the
    /// secret (with its UTF-8 check) and no `Array(secret.utf8)`.
    static func bearerHash(_ authorization: String?) -> [UInt8]? {
        guard var h = authorization else { return nil }
        return h.withUTF8 { u -> [UInt8]? in
            guard let r = bearerRange(u) else { return nil }
            return RelayCrypto.sha256(UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: u[r])))
        }
    }

    /// Where the secret is in an Authorization value, if the value is well-formed (see `bearerHash`).
    private static func bearerRange(_ u: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        let n = u.count
        var i = 0
        while i < n, u[i] == 0x20 { i += 1 }           // split(" ") drops leading spaces
        let scheme: StaticString = "bearer"
        let schemeCount = scheme.utf8CodeUnitCount
        guard n - i > schemeCount else { return nil }
        for k in 0..<schemeCount where u[i + k] | 0x20 != scheme.utf8Start[k] { return nil }
        i += schemeCount
        guard u[i] == 0x20 else { return nil }
        while i < n, u[i] == 0x20 || u[i] == 0x09 { i += 1 }
        var end = n
        while end > i, u[end - 1] == 0x20 || u[end - 1] == 0x09 { end -= 1 }
        let count = end - i
        guard count >= 3, count <= 128, u[i] == 0x72, u[i + 1] == 0x6B, u[i + 2] == 0x5F else { return nil }  // "rk_"
        for k in i..<end {
            let c = u[k]
            guard (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D || c == 0x5F
            else { return nil }
        }
        return i..<end
    }
}
