import Ratchet
internal import OpenSSLSupport

/// Apple's accessory key exchange (AccessoryNotifications / AccessoryTransportSecurity), as the
/// reference pages in shared/reference describe it. The accessory is the HPKE recipient; the
/// iPhone encapsulates to its public key. Every textual part Apple leaves open is a parameter
/// here, with the reference page's reading as the default (docs/key-exchange.md lists them).
public enum AccessoryCiphersuite: String, CaseIterable, Sendable {
    case xWing = "xwing"
    case p256 = "p256"

    /// keyMaterial.ciphersuite.description on the reference page: "XWing" or "P256".
    public var defaultName: String { self == .xWing ? "XWing" : "P256" }

    public var hpke: HPKE.Ciphersuite { self == .xWing ? .xWingSHA256AES256GCM : .p256SHA256AES256GCM }
}

/// protocolInfo = "<ciphersuite>-<version>-<identifier>" as UTF-8, the HPKE info.
public struct ProtocolInfo: Sendable, Equatable {
    public var ciphersuite: String
    public var version: String
    public var identifier: String

    public static let defaultVersion = "v1"

    public init(ciphersuite: String, version: String = defaultVersion, identifier: String) {
        self.ciphersuite = ciphersuite; self.version = version; self.identifier = identifier
    }

    public var text: String { "\(ciphersuite)-\(version)-\(identifier)" }
    public var bytes: [UInt8] { Array(text.utf8) }
}

/// How to read Apple's `"\(protocolInfo)-AccessoryToHost-\(featureID)"` where protocolInfo is a
/// Data: `.text` puts protocolInfo's text there (what is most likely meant); `.dataDescription`
/// is what Swift actually prints for a Data, "<N> bytes".
public enum BluetoothContextReading: String, CaseIterable, Sendable {
    case text
    case dataDescription = "data-description"
}

/// The accessory's private key for either ciphersuite.
public enum AccessoryPrivateKey: Sendable {
    case xWing(XWing.PrivateKey)
    case p256(P256PrivateKey)

    public var ciphersuite: AccessoryCiphersuite { if case .xWing = self { return .xWing } else { return .p256 } }

    /// What the accessory stores: the X-Wing seed (32 bytes) or the P-256 raw scalar (32 bytes).
    public var privateKeyBytes: SecretKey {
        switch self {
        case let .xWing(k): return k.seed
        case let .p256(k): return k.rawRepresentation
        }
    }

    /// publicKey.rawRepresentation: X-Wing 1216 bytes, P-256 x || y (64 bytes).
    public var publicKeyRaw: [UInt8] { hpke.rawPublicKey }

    var hpke: HPKE.PrivateKey {
        switch self {
        case let .xWing(k): return .xWing(k)
        case let .p256(k): return .p256(k)
        }
    }

    public static func generate(_ suite: AccessoryCiphersuite) -> AccessoryPrivateKey {
        suite == .xWing ? .xWing(.generate()) : .p256(.generate())
    }

    /// From stored bytes: X-Wing seed (and, when given, the public key it must derive);
    /// P-256 raw scalar (and, when given, its 64- or 65-byte public key).
    public init(_ suite: AccessoryCiphersuite, privateKey: [UInt8], publicKey: [UInt8]? = nil) throws(KeyExchangeError) {
        switch suite {
        case .xWing:
            if let publicKey {
                self = .xWing(try XWing.PrivateKey(seed: privateKey, publicKey: publicKey))
            } else {
                self = .xWing(try XWing.PrivateKey(seed: privateKey))
            }
        case .p256:
            let key = try P256PrivateKey(rawRepresentation: privateKey)
            if let publicKey {
                let given = try P256Curve.uncompressed(publicKey, field: "publicKey")
                guard constantTimeEqual(given, key.publicKeyX963) else { throw .publicKeyMismatch }
            }
            self = .p256(key)
        }
    }
}

/// The accessory side of one pairing: its HPKE recipient context and everything derived from it.
public struct AccessorySession: Sendable {
    public let ciphersuite: AccessoryCiphersuite
    public let protocolInfo: ProtocolInfo
    /// The HPKE recipient (Bluetooth responses export from it per response).
    public let recipient: HPKE.Context
    /// SHA-384(public key raw representation)[0..<4].
    public let keyID: [UInt8]

    /// HPKE.Recipient(privateKey:, ciphersuite:, info: protocolInfo, encapsulatedKey:).
    public init(privateKey: AccessoryPrivateKey, protocolInfo: ProtocolInfo, encapsulatedKey: [UInt8]) throws(KeyExchangeError) {
        ciphersuite = privateKey.ciphersuite
        self.protocolInfo = protocolInfo
        recipient = try HPKE.setupBaseRecipient(suite: privateKey.ciphersuite.hpke, privateKey: privateKey.hpke,
                                                encapsulatedKey: encapsulatedKey, info: protocolInfo.bytes)
        keyID = Ratchet.keyID(publicKey: privateKey.publicKeyRaw)
    }

    /// The iPhone's side: encapsulates to the accessory's raw public key (X-Wing 1216 bytes;
    /// P-256 64 raw or 65 uncompressed) and returns the encapsulated key with the sender context.
    public static func hostEncapsulate(ciphersuite: AccessoryCiphersuite, accessoryPublicKey: [UInt8], protocolInfo: ProtocolInfo,
                                       ephemeral: HPKE.EphemeralInput? = nil) throws(KeyExchangeError) -> (encapsulatedKey: [UInt8], sender: HPKE.Context) {
        let (enc, context) = try HPKE.setupBaseSender(suite: ciphersuite.hpke, recipientPublicKey: accessoryPublicKey,
                                                      info: protocolInfo.bytes, ephemeral: ephemeral)
        return (enc, context)
    }

    public static func internetContext(_ direction: Direction, bluetoothIdentifier: String) -> [UInt8] {
        Array("AccessoryInternetKey-\(direction.rawValue)-\(bluetoothIdentifier)".utf8)
    }

    public enum Direction: String, Sendable {
        case hostToAccessory = "HostToAccessory"
        case accessoryToHost = "AccessoryToHost"
    }

    /// The internet ratchet root for one direction: exportSecret(context:
    /// "AccessoryInternetKey-<direction>-<bluetooth identifier>", outputByteCount: 32).
    public func internetRoot(_ direction: Direction, bluetoothIdentifier: String) -> SecretKey {
        // 32 is within HKDF's range, so export cannot fail.
        try! recipient.exportSecret(context: Self.internetContext(direction, bluetoothIdentifier: bluetoothIdentifier), outputByteCount: 32)
    }

    /// The context bytes of a Bluetooth response's export.
    public static func bluetoothContext(protocolInfo: ProtocolInfo, featureID: String, reading: BluetoothContextReading = .text) -> [UInt8] {
        let info = reading == .text ? protocolInfo.text : "\(protocolInfo.bytes.count) bytes"
        return Array("\(info)-AccessoryToHost-\(featureID)".utf8)
    }

    /// One Bluetooth response's key: exportSecret(context: "\(protocolInfo)-AccessoryToHost-\(featureID)", 32).
    public func bluetoothResponseSecret(featureID: String, reading: BluetoothContextReading = .text) -> SecretKey {
        try! recipient.exportSecret(context: Self.bluetoothContext(protocolInfo: protocolInfo, featureID: featureID, reading: reading), outputByteCount: 32)
    }
}
