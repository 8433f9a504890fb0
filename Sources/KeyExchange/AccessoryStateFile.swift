import Ratchet

/// The accessory state file `relayctl accessory pair` writes and `accessory send` and mock-apns
/// `--accessory` read: the key material an accessory persists after pairing, the derived roots
/// (checked, never trusted), and what the simulator sends with (push token, session, the sending
/// ratchet's position). Hex for bytes, base64 for keyID (as the APNs payload carries it).
public struct AccessoryStateFile: Codable, Sendable {
    public struct Info: Codable, Sendable {
        public var ciphersuite: String
        public var version: String
        public var identifier: String
    }
    public var format = 1
    public var ciphersuite: String
    public var protocolInfo: Info
    public var deviceUUID: String
    public var bluetoothUUID: String
    public var uuidCase: String
    public var privateKey: String
    public var publicKey: String
    public var encapsulatedKey: String
    public var keyID: String
    public var hostToAccessoryRoot: String
    public var accessoryToHostRoot: String
    public var pushToken: String
    public var sessionIdentifier: String
    public var sending: SendingRatchetState

    public init(ciphersuite: AccessoryCiphersuite, protocolInfo: ProtocolInfo, deviceUUID: String, bluetoothUUID: String, uuidCase: String,
                privateKey: [UInt8], publicKey: [UInt8], encapsulatedKey: [UInt8], keyID: String,
                hostToAccessoryRoot: [UInt8], accessoryToHostRoot: [UInt8], pushToken: String, sessionIdentifier: String,
                sending: SendingRatchetState) {
        self.ciphersuite = ciphersuite.rawValue
        self.protocolInfo = Info(ciphersuite: protocolInfo.ciphersuite, version: protocolInfo.version, identifier: protocolInfo.identifier)
        self.deviceUUID = deviceUUID; self.bluetoothUUID = bluetoothUUID; self.uuidCase = uuidCase
        self.privateKey = privateKey.hexString; self.publicKey = publicKey.hexString; self.encapsulatedKey = encapsulatedKey.hexString
        self.keyID = keyID
        self.hostToAccessoryRoot = hostToAccessoryRoot.hexString; self.accessoryToHostRoot = accessoryToHostRoot.hexString
        self.pushToken = pushToken; self.sessionIdentifier = sessionIdentifier; self.sending = sending
    }

    public var info: ProtocolInfo { ProtocolInfo(ciphersuite: protocolInfo.ciphersuite, version: protocolInfo.version, identifier: protocolInfo.identifier) }

    /// What the file's key material gives, derived again (the stored roots are checked against
    /// it, never trusted). Errors name the state file's field.
    public func keyMaterial() throws(KeyExchangeError) -> AccessoryKeyMaterial {
        guard let suite = AccessoryCiphersuite(rawValue: ciphersuite) else { throw .unknownValue(field: "ciphersuite", value: ciphersuite) }
        func bytes(_ name: String, _ text: String) throws(KeyExchangeError) -> [UInt8] {
            guard let b = [UInt8](hex: text) else { throw .notHexadecimal(field: name) }
            return b
        }
        let key = try AccessoryPrivateKey(suite, privateKey: try bytes("privateKey", privateKey), publicKey: try bytes("publicKey", publicKey))
        let encapsulated = try bytes("encapsulatedKey", encapsulatedKey)
        let session = try AccessorySession(privateKey: key, protocolInfo: info, encapsulatedKey: encapsulated)
        guard session.internetRoot(.accessoryToHost, bluetoothIdentifier: bluetoothUUID).exportedBytes.hexString == accessoryToHostRoot.lowercased(),
              session.internetRoot(.hostToAccessory, bluetoothIdentifier: bluetoothUUID).exportedBytes.hexString == hostToAccessoryRoot.lowercased() else {
            throw .storedRootsMismatch
        }
        return AccessoryKeyMaterial(suite: suite, key: key, encapsulatedKey: encapsulated, session: session)
    }

    /// The accessory session from the key material (`keyMaterial()`).
    public func session() throws(KeyExchangeError) -> AccessorySession { try keyMaterial().session }
}

/// A state file's key material, checked (`AccessoryStateFile.keyMaterial()`).
public struct AccessoryKeyMaterial: Sendable {
    public var suite: AccessoryCiphersuite
    public var key: AccessoryPrivateKey
    public var encapsulatedKey: [UInt8]
    public var session: AccessorySession
}
