// RelayCore's crypto entry points over OpenSSLSupport: SHA-256 for credential hashes, the CSPRNG
// for credential secrets and response ids.
import Basics
import FoundationEssentials
import Synchronization
internal import OpenSSLSupport

public enum RelayCrypto {
    public static func sha256(_ bytes: some Collection<UInt8>) -> [UInt8] { SHA256.hash(bytes) }

    /// The ingest path hashes every request's bearer straight from the header bytes.
    public static func sha256(_ bytes: UnsafeRawBufferPointer) -> [UInt8] { SHA256.hash(bytes) }

    /// Cryptographically random bytes (RAND_bytes); traps if the CSPRNG is unavailable,
    /// because continuing would mint guessable credentials.
    public static func randomBytes(_ count: Int) -> [UInt8] { SecureRandom.bytes(count) }

    /// Random bytes for identifiers (response ids, request ids) from a 4 KiB buffer refilled
    /// by RAND_bytes: one RAND_bytes call per request pays the DRBG's locking and reseed checks
    /// each time. Same CSPRNG output, each byte handed out once.
    /// Secrets (credentials) keep using `randomBytes`, so they never sit in a shared buffer.
    static func idBytes(_ count: Int) -> [UInt8] {
        precondition(count <= IDPool.size)
        return idPool.withLock { pool in
            if pool.used + count > IDPool.size {
                pool.bytes.withUnsafeMutableBytes { SecureRandom.fill($0) }
                pool.used = 0
            }
            defer { pool.used += count }
            return Array(pool.bytes[pool.used..<(pool.used + count)])
        }
    }

    /// 16 lowercase hex digits from 8 pool bytes, formatted without an intermediate array.
    // Kept beside Basics.Hex.encode: formats under the pool lock with no array, once per request.
    static func requestID() -> String {
        let digits: StaticString = "0123456789abcdef"
        return idPool.withLock { pool in
            if pool.used + 8 > IDPool.size {
                pool.bytes.withUnsafeMutableBytes { SecureRandom.fill($0) }
                pool.used = 0
            }
            let start = pool.used
            pool.used += 8
            return String(unsafeUninitializedCapacity: 16) { out in
                let d = digits.utf8Start
                for k in 0..<8 {
                    let b = pool.bytes[start + k]
                    out[2 * k] = d[Int(b >> 4)]
                    out[2 * k + 1] = d[Int(b & 0x0f)]
                }
                return 16
            }
        }
    }

    struct IDPool {
        static let size = 4096
        var bytes = [UInt8](repeating: 0, count: size)
        var used = size   // empty: the first draw fills it
    }
    private static let idPool = Mutex(IDPool())

    /// Compares without an early exit so the time does not depend on where bytes differ.
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool { OpenSSLSupport.constantTimeEqual(a, b) }

    /// A random version-4 UUID, lowercase (APNs echoes apns-id lowercase).
    public static func uuidV4() -> String {
        var b = idBytes(16)
        b[6] = (b[6] & 0x0f) | 0x40
        b[8] = (b[8] & 0x3f) | 0x80
        return UUIDText.format(b)
    }
}

/// Response ids as UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, a 12-bit counter
/// (RFC 9562 6.2 method 1) and 62 random bits. Minted on the store's single writer thread, so
/// ids increase in insertion order and the outbox table, keyed by the id's high word since
/// schema v5, grows at its right edge instead of dirtying a random leaf page per row (random
/// v4 ids did that to the v3/v4 `id` index). Strictly increasing
/// within a process even when the clock stalls or steps back (the counter, then the timestamp,
/// moves on). The high 64 bits (timestamp, version, counter) are the SQLite rowid since schema
/// v5, so they are handed out with the text: two processes (or one restarted after the clock
/// stepped back) can mint the same high word, which the rowid refuses; the store then calls
/// `advance(pastHigh:)` and mints again (SQLiteOutboxStore.ingest).
/// The id reveals its creation millisecond to whoever holds it (the submitting accessory and APNs).
public struct TimeOrderedIDs: Sendable {
    private var lastMillis: Int64 = 0
    private var counter: UInt16 = 0

    public init() {}

    /// The next id and its high 64 bits as a signed bit pattern (`UUIDText.high64(id)`, the
    /// row's rowid), without formatting and parsing the text again.
    public mutating func mint(nowMillis: Int64) -> (id: String, high: Int64) {
        mint(nowMillis: nowMillis, random: RelayCrypto.idBytes(8))
    }

    /// `random` supplies the 8 low bytes (62 bits used); injectable for tests.
    public mutating func mint(nowMillis: Int64, random: [UInt8]) -> (id: String, high: Int64) {
        precondition(random.count == 8)
        if nowMillis > lastMillis {
            lastMillis = nowMillis
            counter = 0
        } else if counter < 0xfff {
            counter += 1
        } else {
            lastMillis += 1   // 4096 ids in one millisecond: borrow the next one
            counter = 0
        }
        let t = UInt64(lastMillis) & 0xffff_ffff_ffff
        // 16 bytes as two big-endian words, formatted straight into the String (no byte arrays).
        let high = t << 16 | 0x7000 | UInt64(counter)
        var low = UInt64(0x80 | (random[0] & 0x3f)) << 56
        for i in 1..<8 { low |= UInt64(random[i]) << (56 - 8 * UInt64(i)) }
        return (UUIDText.format(high: high, low: low), Int64(bitPattern: high))
    }

    /// Moves on so the next id's high word is above `high`, when `high` is a version-7 high
    /// word at or beyond the last one minted (an id another writer or an earlier process
    /// minted). Other values (v4 ids, older words) change nothing: they cannot be minted again.
    public mutating func advance(pastHigh high: Int64) {
        let h = UInt64(bitPattern: high)
        guard (h >> 12) & 0xf == 7 else { return }
        let millis = Int64(h >> 16)
        let count = UInt16(h & 0xfff)
        guard millis > lastMillis || (millis == lastMillis && count >= counter) else { return }
        lastMillis = millis
        counter = count
    }
}

extension Array where Element == UInt8 {
    /// base64url without padding (credential secrets travel in headers and shells).
    var base64URLString: String { Basics.Base64.encode(self, alphabet: .url, padding: false) }
}

/// The shared UUID text codec, under the name RelayCore's stores and tests use.
public typealias UUIDText = Basics.UUIDText

/// ASCII-only helpers for header values (Foundation's trimmingCharacters bridges to NSString).
enum ASCII {
    /// Without spaces, tabs, CR and LF at either end (files read for secrets end in a newline).
    static func trimLines(_ s: some StringProtocol) -> String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" || $0 == "\r\n" }
        return String(s.drop(while: isSpace).reversed().drop(while: isSpace).reversed())
    }

    static func trim(_ s: Substring) -> Substring {
        var a = s.startIndex, b = s.endIndex
        while a < b, s[a] == " " || s[a] == "\t" { a = s.index(after: a) }
        while b > a, s[s.index(before: b)] == " " || s[s.index(before: b)] == "\t" { b = s.index(before: b) }
        return s[a..<b]
    }

    static func lowercased(_ s: some StringProtocol) -> String {
        String(decoding: s.utf8.map { ($0 >= 0x41 && $0 <= 0x5A) ? $0 + 32 : $0 }, as: UTF8.self)
    }

    static func uppercased(_ s: some StringProtocol) -> String {
        String(decoding: s.utf8.map { ($0 >= 0x61 && $0 <= 0x7A) ? $0 - 32 : $0 }, as: UTF8.self)
    }
}
