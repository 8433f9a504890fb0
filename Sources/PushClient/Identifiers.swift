// The two UUIDs a push carries, held as the text that goes on the wire. The relay keeps both as
// text (the outbox row's id and session identifier), so it hands them over as text and they are
// checked once here, instead of being parsed into `UUID`s only to be formatted back per push.
import Basics
import FoundationEssentials

/// A push's `apns-id`: a UUID held as its canonical lowercase text, the form it is sent in
/// (PROTOCOL.md: "lowercase UUID") and that APNs echoes back.
public struct APNsID: Sendable, Hashable, CustomStringConvertible {
    /// 36 characters: 8-4-4-4-12 lowercase hex digits.
    public let text: String

    public init(_ uuid: UUID) {
        text = uuidText(uuid, uppercase: false)
    }

    /// Checks `text` is an 8-4-4-4-12 hex UUID (either case, as stored or typed) and keeps it
    /// lowercased; already-lowercase text is kept as it is, without a copy.
    /// Throws `PushClientError.invalidIdentifier` naming the first thing wrong.
    public init(_ text: String) throws(PushClientError) {
        self.text = try canonicalUUIDText(text, uppercase: false, field: "apns-id")
    }

    public var description: String { text }
}

/// An accessory session's identifier as its canonical uppercase text: the payload's
/// `sessionIdentifier`, in the form the iPhone's `UUID.uuidString` gives it.
public struct SessionIdentifier: Sendable, Hashable, CustomStringConvertible {
    /// 36 characters: 8-4-4-4-12 uppercase hex digits.
    public let text: String

    public init(_ uuid: UUID) {
        text = uuidText(uuid, uppercase: true)
    }

    /// Checks `text` is an 8-4-4-4-12 hex UUID (either case) and keeps it uppercased;
    /// already-uppercase text is kept as it is, without a copy.
    /// Throws `PushClientError.invalidIdentifier` naming the first thing wrong.
    public init(_ text: String) throws(PushClientError) {
        self.text = try canonicalUUIDText(text, uppercase: true, field: "sessionIdentifier")
    }

    public var description: String { text }
}

/// `uuid` as 8-4-4-4-12 hex text.
func uuidText(_ uuid: UUID, uppercase: Bool) -> String {
    withUnsafeBytes(of: uuid.uuid) { UUIDText.format(bytes: $0, uppercase: uppercase) }
}

/// What a pass over a candidate UUID text found.
private enum UUIDTextScan {
    case canonical          // valid and already in the wanted case
    case needsRecasing      // valid, some hex letters in the other case
    case wrongLength(Int)
    case notDash(at: Int, byte: UInt8)
    case notHex(at: Int, byte: UInt8)
    case malformed          // refused by the fast pass, no single byte to blame (not expected)
}

/// `text` when it is an 8-4-4-4-12 hex UUID already in the wanted case (the relay's rows are:
/// ids lowercase, session identifiers uppercase), so the common case neither allocates nor
/// copies; a valid text in the other or mixed case comes back recased; anything else throws.
// Stays here rather than in Basics.UUIDText: this branch-free pass runs twice per push and keeps
// the text uncopied in the common case (docs/benchmarks.md, PushClient).
func canonicalUUIDText(_ text: String, uppercase: Bool, field: String) throws(PushClientError) -> String {
    var text = text
    let scan = text.withUTF8 { u -> UUIDTextScan in
        guard u.count == 36 else { return .wrongLength(u.count) }
        // One pass without a branch per byte (LLVM vectorises it; it runs twice per push):
        // valid = every byte a hex digit or '-', exactly four '-', and those at 8, 13, 18 and 23.
        let wantedA: UInt8 = uppercase ? 0x41 : 0x61, otherA: UInt8 = uppercase ? 0x61 : 0x41
        var invalid: UInt8 = 0, dashes: UInt8 = 0, otherCase: UInt8 = 0
        for i in 0..<36 {
            let b = u[i]
            let digit: UInt8 = b &- 0x30 < 10 ? 1 : 0
            let wanted: UInt8 = b &- wantedA < 6 ? 1 : 0
            let other: UInt8 = b &- otherA < 6 ? 1 : 0
            let dash: UInt8 = b == 0x2D ? 1 : 0
            invalid |= 1 &- (digit | wanted | other | dash)
            dashes &+= dash
            otherCase |= other
        }
        if invalid == 0 && dashes == 4 && u[8] == 0x2D && u[13] == 0x2D && u[18] == 0x2D && u[23] == 0x2D {
            return otherCase == 0 ? .canonical : .needsRecasing
        }
        return firstProblem(u)
    }
    switch scan {
    case .canonical:
        return text
    case .needsRecasing:
        return text.withUTF8 { u in
            String(unsafeUninitializedCapacity: 36) { out in
                for i in 0..<36 {
                    let b = u[i]
                    // Only hex letters get here as letters; bit 0x20 is ASCII's case bit.
                    out[i] = b >= 0x41 ? (uppercase ? b & ~0x20 : b | 0x20) : b
                }
                return 36
            }
        }
    case .wrongLength(let n):
        throw .invalidIdentifier("\(field) must be a UUID, 36 characters 8-4-4-4-12 hex; got \(n) bytes")
    case .notDash(let i, let b):
        throw .invalidIdentifier("\(field) must be a UUID, 8-4-4-4-12 hex; byte \(i + 1) is \(describe(b)), not '-'")
    case .notHex(let i, let b):
        throw .invalidIdentifier("\(field) must be a UUID, 8-4-4-4-12 hex; byte \(i + 1) is \(describe(b)), not a hex digit")
    case .malformed:
        throw .invalidIdentifier("\(field) must be a UUID, 8-4-4-4-12 hex")
    }
}

/// The first byte of a 36-byte text that breaks the 8-4-4-4-12 form, for the error message
/// (called once the fast pass has refused the text, so there should be one; IdentifierTests
/// check both passes agree on every byte at every position).
private func firstProblem(_ u: UnsafeBufferPointer<UInt8>) -> UUIDTextScan {
    for i in 0..<36 {
        let b = u[i]
        if i == 8 || i == 13 || i == 18 || i == 23 {
            if b != 0x2D { return .notDash(at: i, byte: b) }
        } else if !(b &- 0x30 < 10 || (b | 0x20) &- 0x61 < 6) {
            return .notHex(at: i, byte: b)
        }
    }
    return .malformed
}

/// A byte for an error message: printable ASCII quoted, anything else in hex (the text may be
/// any bytes at all, and is not echoed whole).
private func describe(_ b: UInt8) -> String {
    if b >= 0x21 && b <= 0x7E { return "'\(Character(Unicode.Scalar(b)))'" }
    let digits: [Character] = Array("0123456789ABCDEF")
    return "0x" + String([digits[Int(b >> 4)], digits[Int(b & 0x0F)]])
}
