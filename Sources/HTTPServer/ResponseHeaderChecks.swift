// What a handler may put in a response head: header names that are tokens, values without CR,
// LF or NUL, and the headers the server writes itself. Checked by words where the common case
// allows, byte by byte otherwise, so the verdict is always the byte loop's.

/// RFC 9110 token characters as a 128-bit set (bit n = ASCII n): `!#$%&'*+-.^_`|~`, digits,
/// letters. Literals, not computed globals, so the hot loop has no lazy-initialisation check.
private let tokenLow: UInt64 = 0x03ff_6cfa_0000_0000
private let tokenHigh: UInt64 = 0x57ff_ffff_c7ff_fffe

@inline(__always)
private func isTokenByte(_ b: UInt8) -> Bool {
    b < 64 ? (tokenLow >> UInt64(b)) & 1 == 1 : b < 128 && (tokenHigh >> UInt64(b - 64)) & 1 == 1
}

/// Response header names must be tokens and values free of CR, LF and NUL, or a handler could
/// split the response.
func isSafeHeader(name: String, value: String) -> Bool {
    var name = name
    return name.withUTF8 { scanHeaderName($0).isToken } && isSafeHeaderValue(value)
}

/// Whether a name is a non-empty token, and whether it has ASCII capitals (to lowercase).
/// Pointer loops (callers use `withUTF8`), not the UTF8View iterator. Whole words of
/// lowercase letters and '-' (what handlers write) pass eight bytes at a time; the rest, from
/// the first word that may not, goes through the byte loop, so the verdict is the byte loop's.
@inline(__always)
func scanHeaderName(_ u: UnsafeBufferPointer<UInt8>) -> (isToken: Bool, hasUpper: Bool) {
    guard let p = u.baseAddress, !u.isEmpty else { return (false, false) }
    let n = u.count
    var i = 0
    if n >= 8 {
        let raw = UnsafeRawPointer(p)
        while i + 8 <= n && isLowercaseNameWord(raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)) { i += 8 }
        // The last word may overlap the one before it.
        if i < n && i + 8 > n && isLowercaseNameWord(raw.loadUnaligned(fromByteOffset: n - 8, as: UInt64.self)) { i = n }
    }
    var upper = false
    while i < n {
        let b = p[i]
        if !isTokenByte(b) { return (false, upper) }
        if b &- 0x41 < 26 { upper = true }
        i += 1
    }
    return (true, upper)
}

/// No CR, LF or NUL.
@inline(__always)
func isSafeHeaderValue(_ value: String) -> Bool {
    var value = value
    return value.withUTF8 { isSafeHeaderValue(bytes: $0) }
}

/// No CR, LF or NUL. Words without any byte below 0x20 pass eight bytes at a time; a word that
/// has one, and what follows it, goes through
/// the byte loop, so the verdict is the byte loop's.
@inline(__always)
func isSafeHeaderValue(bytes u: UnsafeBufferPointer<UInt8>) -> Bool {
    guard let p = u.baseAddress else { return true }
    let n = u.count
    var i = 0
    let raw = UnsafeRawPointer(p)
    while i + 8 <= n && hasNoControlByte(raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)) { i += 8 }
    // The last word may overlap the one before it.
    if i < n && n >= 8 && i + 8 > n && hasNoControlByte(raw.loadUnaligned(fromByteOffset: n - 8, as: UInt64.self)) { return true }
    while i < n {
        let b = p[i]
        if b < 32 && (b == 13 || b == 10 || b == 0) { return false }
        i += 1
    }
    return true
}

private let wordOnes: UInt64 = 0x0101_0101_0101_0101
private let wordHighs: UInt64 = 0x8080_8080_8080_8080

/// All eight bytes of `w` are lowercase ASCII letters or '-', exactly.
@inline(__always)
func isLowercaseNameWord(_ w: UInt64) -> Bool {
    guard w & wordHighs == 0 else { return false }
    // With each byte's high bit set, subtracting c <= 0x80 leaves that bit set iff the byte is
    // >= c, and no byte borrows from its neighbour: an exact comparison of every byte.
    let set = w | wordHighs
    let letters = (set &- wordOnes &* 0x61) & ~(set &- wordOnes &* 0x7B) & wordHighs
    // The zero bytes of w ^ "--------", exactly: the low seven bits add without carrying out.
    let x = w ^ (wordOnes &* 0x2D)
    let dashes = ~(((x & ~wordHighs) &+ ~wordHighs) | x) & wordHighs
    return letters | dashes == wordHighs
}

/// No byte of `w` is below 0x20 (exact for the word as a whole: a borrow only starts at such
/// a byte, and bytes >= 0x80 never set the flag).
@inline(__always)
func hasNoControlByte(_ w: UInt64) -> Bool {
    (w &- wordOnes &* 0x20) & ~w & wordHighs == 0
}

/// Headers the server writes itself (framing, hop-by-hop) or fills in when absent.
enum ReservedHeader { case none, framing, date, server }

@inline(__always)
func classifyResponseHeader(_ name: String) -> ReservedHeader {
    // Cheap length/first-byte filter before any string comparison.
    let u = name.utf8
    switch u.count {
    case 4: return name == "date" ? .date : .none
    case 6: return name == "server" ? .server : .none
    case 7: return name == "upgrade" ? .framing : .none
    case 10: return name == "connection" || name == "keep-alive" ? .framing : .none
    case 14: return name == "content-length" ? .framing : .none
    case 16: return name == "proxy-connection" ? .framing : .none
    case 17: return name == "transfer-encoding" ? .framing : .none
    default: return .none
    }
}

func responseIsSafe(_ r: HTTPReply) -> Bool {
    r.status >= 100 && r.status <= 599 && !r.headers.hasUnsafeField
}

let invalidResponse = HTTPReply.json(500, #"{"error":"invalid_response"}"#)
