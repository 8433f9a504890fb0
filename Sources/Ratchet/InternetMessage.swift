/// The internet-transport message from host to accessory, as Apple documents it:
/// keyID (4) || messageIndex (UInt32 little-endian, 4) || sealed box (nonce 12 || ct || tag 16).
public struct InternetMessage: Equatable, Sendable {
    public static let keyIDLength = 4
    /// Shortest valid message: keyID + index + an empty sealed box.
    public static let minimumLength = keyIDLength + 4 + AESGCM.overhead

    public var keyID: [UInt8]
    public var messageIndex: UInt32
    public var sealed: [UInt8]

    public init(keyID: [UInt8], messageIndex: UInt32, sealed: [UInt8]) {
        self.keyID = keyID
        self.messageIndex = messageIndex
        self.sealed = sealed
    }

    public func encoded() throws -> [UInt8] {
        guard keyID.count == Self.keyIDLength else { throw RatchetError.invalidKeyIDLength(keyID.count) }
        guard sealed.count >= AESGCM.overhead else { throw RatchetError.sealedBoxTooShort(sealed.count) }
        var out = keyID
        appendLE(&out, UInt64(messageIndex), bytes: 4)
        return out + sealed
    }

    public init(decoding bytes: [UInt8]) throws {
        guard bytes.count >= Self.minimumLength else { throw RatchetError.messageTooShort(bytes.count) }
        var reader = ByteReader(bytes)
        keyID = Array(reader.take(Self.keyIDLength)!)
        messageIndex = UInt32(reader.le(4)!)
        sealed = Array(reader.take(reader.remaining)!)
    }
}
