// Public value types of the APNs client: where to connect, how to authenticate, what to send.
import Basics
import FoundationEssentials
internal import OpenSSLSupport

public enum APNsEnvironment: Sendable, Equatable {
    case production, sandbox
    /// Any base URL, e.g. "https://127.0.0.1:2197" for mock-apns. An `http://` URL speaks
    /// HTTP/2 with prior knowledge (h2c), useful only against a mock.
    case custom(url: String)

    public var baseURL: String {
        switch self {
        case .production: "https://api.push.apple.com"
        case .sandbox: "https://api.sandbox.push.apple.com"
        case .custom(let url): url.hasSuffix("/") ? String(url.dropLast()) : url
        }
    }
}

public enum PushClientError: Error, Equatable, CustomStringConvertible {
    /// The .p8 key could not be read or is not a P-256 private key.
    case invalidKey(String)
    /// A configuration value is out of range; the message names the field.
    case invalidConfiguration(String)
    /// OpenSSL could not set up TLS; carries OpenSSL's message.
    case tls(String)
    /// Resolving or connecting failed (surfaces as `.transportFailure` of the pushes concerned).
    case transport(String)
    /// OpenSSL failed while signing; carries OpenSSL's message.
    case crypto(String)
    /// An `apns-id` or session identifier given as text is not a UUID; the message names the
    /// field and what is wrong (never the whole text).
    case invalidIdentifier(String)

    public var description: String {
        switch self {
        case .invalidKey(let m): "invalid APNs signing key: \(m)"
        case .invalidConfiguration(let m): "invalid push client configuration: \(m)"
        case .tls(let m): "TLS: \(m)"
        case .transport(let m): m
        case .crypto(let m): "OpenSSL: \(m)"
        case .invalidIdentifier(let m): m
        }
    }
}

/// An APNs auth key (.p8, PKCS#8 PEM of a P-256 private key) with its key ID and team ID.
public struct TokenKey: Sendable {
    public let keyID: String
    public let teamID: String
    let signingKey: AsymmetricKey
    /// SHA-256 of the .p8 text: TokenRegistry shares a token only between identical keys.
    let fingerprint: [UInt8]

    public init(p8PEM: String, keyID: String, teamID: String) throws {
        try Self.checkIdentifier(keyID, field: "keyID")
        try Self.checkIdentifier(teamID, field: "teamID")
        self.keyID = keyID
        self.teamID = teamID
        self.signingKey = try ProviderToken.signingKey(pem: p8PEM)
        self.fingerprint = SHA256.hash(Array(p8PEM.utf8))
    }

    public init(p8Path: String, keyID: String, teamID: String) throws {
        let pem: String
        do { pem = try String(contentsOfFile: p8Path, encoding: .utf8) } catch {
            throw PushClientError.invalidKey("cannot read \(p8Path): \(error)")
        }
        try self.init(p8PEM: pem, keyID: keyID, teamID: teamID)
    }

    /// Key and team IDs go verbatim into JSON: Apple's are 10 alphanumerics; we accept any
    /// non-empty alphanumeric string so mocks can use their own.
    private static func checkIdentifier(_ s: String, field: String) throws {
        guard !s.isEmpty, s.count <= 64, s.unicodeScalars.allSatisfy({ $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0)) }) else {
            throw PushClientError.invalidKey("\(field) must be 1...64 ASCII letters or digits")
        }
    }
}

public enum APNsCredentials: Sendable {
    case token(TokenKey)
    /// PEM certificate (chain) and key files; `passphrase` unlocks an encrypted key. A
    /// `certificatePath` ending in `.p12`/`.pfx` is read as PKCS#12 (certificate, key and chain
    /// in one file, as Keychain Access exports them): `privateKeyPath` is then ignored and
    /// `passphrase` is the file's password (empty when nil).
    case certificate(certificatePath: String, privateKeyPath: String, passphrase: String?)
}

/// Where time comes from, so token refresh can be tested without waiting 50 minutes.
public protocol PushClock: Sendable {
    func now() -> Date
}

public struct SystemPushClock: PushClock {
    public init() {}
    public func now() -> Date { Date() }
}

public struct PushClientConfiguration: Sendable {
    public var environment: APNsEnvironment
    public var credentials: APNsCredentials
    /// PEM bundle of CAs to trust instead of the system store (mock-apns writes one).
    public var caFile: String?
    /// Number of HTTP/2 connections; each is owned by its own thread (docs/pushclient.md).
    public var connections: Int
    /// Time a request may wait for its response, counted from when it is written to a
    /// connection (time queued for a connection or a free stream does not count).
    public var requestTimeout: Duration
    /// Longest a written request waits for its answer while its connection is alive (answers
    /// PING). At `requestTimeout` the connection is PINGed (again every `requestTimeout`); the
    /// push fails only if a PING goes unanswered (connection dead) or at this cap. Failing a
    /// request APNs received makes the caller's retry a duplicate, so a slow APNs is waited
    /// for. Must be at least `requestTimeout` (equal: fail at `requestTimeout`, no wait).
    public var answerWaitCap: Duration
    /// Longest a push may wait in the client before any of it is written (queued for a
    /// connection the pacer holds back, or for a stream on a slow, one-stream connection).
    /// It then fails as "not sent", which a caller may retry without risk of a duplicate.
    public var queueWaitCap: Duration
    public var connectTimeout: Duration
    /// A connection idle this long gets an HTTP/2 PING; no ACK within min(max(pingInterval, 1 s), 10 s)
    /// and it is replaced.
    public var pingInterval: Duration
    /// Back-off and rate limit for opening connections (docs/pushclient.md, "Connection discipline").
    public var connectionPacing: ConnectionPacing
    public var clock: any PushClock
    /// Where token credentials get their provider token. nil: a registry of this client's own
    /// (tests); the relay passes `TokenRegistry.shared` so apps of one team share one token.
    public var tokenRegistry: TokenRegistry?

    public init(environment: APNsEnvironment, credentials: APNsCredentials, caFile: String? = nil,
                connections: Int = 2, requestTimeout: Duration = .seconds(10),
                connectTimeout: Duration = .seconds(5), pingInterval: Duration = .seconds(60),
                connectionPacing: ConnectionPacing = ConnectionPacing(), clock: any PushClock = SystemPushClock(),
                answerWaitCap: Duration = .seconds(120), queueWaitCap: Duration = .seconds(30)) {
        self.environment = environment
        self.credentials = credentials
        self.caFile = caFile
        self.connections = connections
        self.requestTimeout = requestTimeout
        self.answerWaitCap = answerWaitCap
        self.queueWaitCap = queueWaitCap
        self.connectTimeout = connectTimeout
        self.pingInterval = pingInterval
        self.connectionPacing = connectionPacing
        self.clock = clock
    }
}

/// The `aps` dictionary of an accessory push, exactly as Apple documents it.
public struct AccessoryPayload: Sendable, Equatable {
    public var encryptedData: [UInt8]
    public var sessionIdentifier: SessionIdentifier
    public var keyID: [UInt8]
    public var messageIndex: UInt32

    /// With the session identifier as checked text (`SessionIdentifier("...")`): what the relay
    /// uses, its rows keep the identifier as text.
    public init(encryptedData: [UInt8], sessionIdentifier: SessionIdentifier, keyID: [UInt8], messageIndex: UInt32) {
        self.encryptedData = encryptedData
        self.sessionIdentifier = sessionIdentifier
        self.keyID = keyID
        self.messageIndex = messageIndex
    }

    public init(encryptedData: [UInt8], sessionIdentifier: UUID, keyID: [UInt8], messageIndex: UInt32) {
        self.init(encryptedData: encryptedData, sessionIdentifier: SessionIdentifier(sessionIdentifier),
                  keyID: keyID, messageIndex: messageIndex)
    }

    /// `{"aps":{"encryptedData":"<base64>","sessionIdentifier":"<UUID>","keyID":"<base64>","messageIndex":"<decimal>"}}`
    /// Built by hand: every value is base64, a UUID or digits, so nothing needs JSON escaping,
    /// and the key order is fixed (byte-identical bodies make logs and tests comparable).
    /// sessionIdentifier is `SessionIdentifier.text`: Foundation's canonical (uppercase) UUID
    /// form, as the iPhone's `UUID.uuidString` would give it.
    /// Written straight into one byte buffer (no Foundation Data/base64 Strings, no
    /// interpolation): this runs once per push.
    public func jsonBody() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(120 + (encryptedData.count + keyID.count) * 4 / 3)
        out.append(contentsOf: #"{"aps":{"encryptedData":""#.utf8)
        Base64.append(encryptedData, to: &out)
        out.append(contentsOf: #"","sessionIdentifier":""#.utf8)
        out.append(contentsOf: sessionIdentifier.text.utf8)
        out.append(contentsOf: #"","keyID":""#.utf8)
        Base64.append(keyID, to: &out)
        out.append(contentsOf: #"","messageIndex":""#.utf8)
        out.append(contentsOf: String(messageIndex).utf8)
        out.append(contentsOf: #""}}"#.utf8)
        return out
    }
}

public struct PushRequest: Sendable {
    /// Lowercase hex of the device's push token (length is not fixed by Apple).
    public var deviceToken: String
    /// The companion app's bundle ID; the topic sent is `bundleID + ".push-type.accessory"`.
    public var bundleID: String
    /// Sent as `apns-id` (lowercase text); APNs echoes it back.
    public var apnsID: APNsID
    public var payload: AccessoryPayload
    /// `apns-expiration` (UNIX seconds, 0 = deliver once); omitted when nil.
    public var expiration: Int?
    /// `apns-priority`, sent on every push (10, 5 or 1; anything else is refused locally with
    /// 400 BadPriority, as APNs would). Default 10, `immediatePriority` (docs/pushclient.md).
    public var priority: Int

    /// With the apns-id as checked text (`APNsID("...")`): what the relay uses, its outbox row
    /// ids are the apns-ids, kept as text.
    public init(deviceToken: String, bundleID: String, apnsID: APNsID, payload: AccessoryPayload,
                expiration: Int? = nil, priority: Int = PushRequest.immediatePriority) {
        self.deviceToken = deviceToken
        self.bundleID = bundleID
        self.apnsID = apnsID
        self.payload = payload
        self.expiration = expiration
        self.priority = priority
    }

    public init(deviceToken: String, bundleID: String, apnsID: UUID = UUID(), payload: AccessoryPayload,
                expiration: Int? = nil, priority: Int = PushRequest.immediatePriority) {
        self.init(deviceToken: deviceToken, bundleID: bundleID, apnsID: APNsID(apnsID), payload: payload,
                  expiration: expiration, priority: priority)
    }

    /// Apple: 10 sends the notification immediately, 5 "based on power considerations" (may be
    /// grouped, delayed or throttled), 1 "prioritizes the device's power considerations over all
    /// other factors"; APNs assumes 10 when the header is absent. An accessory response is a
    /// person's answer to a notification (a quick reply, an action) that the phone should act on
    /// now, so 10, written out rather than left to APNs' default.
    public static let immediatePriority = 10

    public var topic: String { bundleID + ".push-type.accessory" }
    /// The `apns-id` header's value: `apnsID.text`.
    public var apnsIDString: String { apnsID.text }
}

/// APNs' documented payload limit for everything except VoIP.
public let apnsMaximumPayloadBytes = 4096
