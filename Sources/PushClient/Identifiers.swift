// The two UUIDs a push carries, held as the text that goes on the wire. The relay keeps both as
// text (the outbox row's id and session identifier), so it hands them over as text and they are
// checked once here, instead of being parsed into `UUID`s only to be formatted back per push.
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
    String(unsafeUninitializedCapacity: 36) { writeUUIDText(uuid, uppercase: uppercase, into: $0); return 36 }
}

/// The 36 bytes of `uuid`'s 8-4-4-4-12 hex form written to `out` (at least 36 bytes long): the
/// one UUID formatter in PushClient. By hand because `UUID.uuidString` goes through snprintf
/// (~10k instructions) and a push built from `UUID`s formats two.
func writeUUIDText(_ uuid: UUID, uppercase: Bool, into out: UnsafeMutableBufferPointer<UInt8>) {
    let hex: StaticString = uppercase ? "0123456789ABCDEF" : "0123456789abcdef"
    let h = hex.utf8Start
    withUnsafeBytes(of: uuid.uuid) { u in
        var o = 0
        for i in 0..<16 {
            if i == 4 || i == 6 || i == 8 || i == 10 { out[o] = UInt8(ascii: "-"); o += 1 }
            out[o] = h[Int(u[i] >> 4)]
            out[o + 1] = h[Int(u[i] & 0x0F)]
            o += 2
        }
    }
}

/// What one pass over a candidate UUID text found.
private enum UUIDTextScan {
    case canonical          // valid and already in the wanted case
    case needsRecasing      // valid, some hex letters in the other case
    case wrongLength(Int)
    case notDash(at: Int, byte: UInt8)
    case notHex(at: Int, byte: UInt8)
}

/// `text` when it is an 8-4-4-4-12 hex UUID already in the wanted case (the relay's rows are:
/// ids lowercase, session identifiers uppercase), so the common case neither allocates nor
/// copies; a valid text in the other or mixed case comes back recased; anything else throws.
func canonicalUUIDText(_ text: String, uppercase: Bool, field: String) throws(PushClientError) -> String {
    var text = text
    // Hex letters of the case we do not want: 'a'...'f' when uppercase is wanted, else 'A'...'F'.
    let otherCaseA: UInt8 = uppercase ? 0x61 : 0x41
    let scan = text.withUTF8 { u -> UUIDTextScan in
        guard u.count == 36 else { return .wrongLength(u.count) }
        var recase = false
        for i in 0..<36 {
            let b = u[i]
            if i == 8 || i == 13 || i == 18 || i == 23 {
                if b != UInt8(ascii: "-") { return .notDash(at: i, byte: b) }
            } else if b &- 0x30 < 10 {
                continue
            } else if (b | 0x20) &- 0x61 < 6 {
                if b &- otherCaseA < 6 { recase = true }
            } else {
                return .notHex(at: i, byte: b)
            }
        }
        return recase ? .needsRecasing : .canonical
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
    }
}

/// A byte for an error message: printable ASCII quoted, anything else in hex (the text may be
/// any bytes at all, and is not echoed whole).
private func describe(_ b: UInt8) -> String {
    if b >= 0x21 && b <= 0x7E { return "'\(Character(Unicode.Scalar(b)))'" }
    let digits: [Character] = Array("0123456789ABCDEF")
    return "0x" + String([digits[Int(b >> 4)], digits[Int(b & 0x0F)]])
}
