// The feed's cursor (GET /v1/events `after` / `next`): a store position sealed for one
// credential. The position is a global sequence, so in the clear it would tell a tenant how
// many events others got between its own; sealed, it tells only whether it moved (the stores
// move it past others' events only in stretches of 10,000, SQLiteOutboxStore.feedScanRows).
// The position is masked, and a tag over it and the credential refuses a tampered cursor or
// another credential's. The key is the database's (feed_cursor_key), so a cursor survives a
// restart and works on every PostgreSQL node.
import Basics
internal import OpenSSLSupport

struct FeedCursor: Sendable {
    static let keyLength = 32
    private static let tagLength = 8
    /// base64url of tag (8) + masked position (8), unpadded.
    static let textLength = 22

    private let maskKey: [UInt8]
    private let tagKey: [UInt8]

    /// `key`: feedCursorKey(); one subkey tags, the other masks.
    init(key: [UInt8]) {
        maskKey = HMACSHA256.mac(key: key, message: Array("relay feed cursor mask".utf8))
        tagKey = HMACSHA256.mac(key: key, message: Array("relay feed cursor tag".utf8))
    }

    /// Deterministic (the tag is the mask's IV, as in SIV): an unchanged position gives the same
    /// cursor, so a reader sees that nothing moved, and nothing more.
    func seal(_ position: Int64, credentialID: String) -> String {
        let plain = Self.bytes(UInt64(bitPattern: position))
        let t = tag(plain, credentialID)
        return Basics.Base64.encode(t + zip(plain, mask(t)).map { $0 ^ $1 }, alphabet: .url, padding: false)
    }

    /// The position, or nil: not a cursor this database sealed for this credential.
    func open(_ text: String, credentialID: String) -> Int64? {
        guard text.utf8.count == Self.textLength, let b = Basics.Base64.decode(text, alphabet: .url, padding: false),
              b.count == Self.tagLength + 8 else { return nil }
        let t = Array(b[0..<Self.tagLength])
        let plain = zip(b[Self.tagLength...], mask(t)).map { $0 ^ $1 }
        guard RelayCrypto.constantTimeEqual(t, tag(plain, credentialID)) else { return nil }
        let v = plain.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        guard v <= UInt64(Int64.max) else { return nil }
        return Int64(v)
    }

    private static func bytes(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64($0))) } }

    private func tag(_ plain: [UInt8], _ credentialID: String) -> [UInt8] {
        Array(HMACSHA256.mac(key: tagKey, message: plain + Array(credentialID.utf8)).prefix(Self.tagLength))
    }

    private func mask(_ tag: [UInt8]) -> ArraySlice<UInt8> {
        HMACSHA256.mac(key: maskKey, message: tag).prefix(8)
    }
}
