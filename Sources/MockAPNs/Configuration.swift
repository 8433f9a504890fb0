// mock-apns configuration: the in-process struct, the JSON config file and the command line.
// The file and the flags share one schema (`MockAPNsOptions`); flags override scalar settings
// of the file and add to its lists.
import Basics
import Foundation
import KeyExchange
import Ratchet

public struct MockConfigurationError: Error, CustomStringConvertible, Equatable {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

public enum MockTLSMode: Sendable {
    /// Throwaway CA + server certificate; the CA PEM is written to `caOutputPath` (if given) for clients.
    case generate(caOutputPath: String?)
    case files(cert: String, key: String)
    /// HTTP/2 with prior knowledge over cleartext TCP (h2c).
    case cleartextH2
}

/// A client certificate mock-apns issues from its throwaway CA, for testing certificate auth.
public struct GeneratedClientCertificate: Sendable, Equatable {
    /// Written as the subject's UID, as in Apple's push certificates: the topic it may push to.
    public var bundleID: String
    public var certificatePath: String
    public var privateKeyPath: String

    public init(bundleID: String, certificatePath: String, privateKeyPath: String) {
        self.bundleID = bundleID
        self.certificatePath = certificatePath
        self.privateKeyPath = privateKeyPath
    }
}

/// An accessory-to-host root secret and the keyID (4 bytes) pushes carry for it.
public struct MockRootSecret: Sendable {
    public var keyID: [UInt8]
    public var rootSecret: SecretKey
    public init(keyID: [UInt8], rootSecret: SecretKey) {
        self.keyID = keyID
        self.rootSecret = rootSecret
    }
}

public struct MockAPNsConfiguration: Sendable {
    public var host = "127.0.0.1"
    /// 0 = ephemeral.
    public var port = 0
    public var tls: MockTLSMode = .generate(caOutputPath: nil)
    public var controlHost = "127.0.0.1"
    /// 0 = ephemeral; nil = no control server.
    public var controlPort: Int? = 0
    /// Provider-token keys. Empty = token auth off (authorization is not checked).
    public var tokenKeys: [MockTokenKey] = []
    /// Empty = any bundle ID.
    public var allowedBundleIDs: [String] = []
    /// Granted after the first request with a valid token succeeds (1 before that, like APNs).
    public var maxConcurrentStreams: UInt32 = 1000
    /// SETTINGS_MAX_CONCURRENT_STREAMS before that first success (APNs: 1). Load generators that
    /// open many streams before reading SETTINGS (h2load) see refused streams with 1.
    public var initialMaxConcurrentStreams: UInt32 = 1
    public var rootSecrets: [MockRootSecret] = []
    public var deliveriesLogPath: String?
    public var faults = FaultPlan()
    /// Sandbox answers carry `apns-unique-id`; production ones do not.
    public var sandbox = true
    /// Seconds between token changes on one connection before 429 TooManyProviderTokenUpdates. 0 = off.
    public var tokenUpdateInterval: Int64 = 20 * 60
    /// Log one line per request to stderr.
    public var verbose = false
    /// Generated TLS only: serve a certificate that verifying clients must refuse.
    public var tlsFault: TLSCertificateFault?
    /// Event-loop threads of the APNs port.
    public var loopThreads = 1
    /// Certificate auth: ask each client for a certificate and accept those this CA (PEM file)
    /// signed. A connection that presents one needs no provider token, and may push only to
    /// the bundle ID in its certificate's UID (as with Apple's push certificates). Clients
    /// without a certificate still use token auth. With generated TLS and
    /// `generatedClientCertificate`, the throwaway CA is trusted instead.
    public var clientCAPath: String?
    /// Generated TLS only: also issue a client certificate for this bundle ID (UID), signed by
    /// the throwaway CA, written to these paths, and accept certificates that CA signed.
    public var generatedClientCertificate: GeneratedClientCertificate?
    /// The executable writes {"port":..,"controlPort":..,"caPath":..} here once listening.
    public var readyFilePath: String?
    /// The mock's clock (tests driving a client with an injected clock pass the same one).
    public var clock: @Sendable () -> Date = { Date() }
    /// Random source for fault fractions.
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }

    public init() {}
}

/// The JSON config file schema, and what the flags fill in. Every key is optional.
public struct MockAPNsOptions: Codable, Sendable, Equatable {
    public struct TokenKeyOption: Codable, Sendable, Equatable {
        public var keyID: String
        public var teamID: String
        /// `.p8` private key or PEM public key.
        public var path: String
    }
    public struct RootSecretOption: Codable, Sendable, Equatable {
        /// base64 of the 4-byte keyID.
        public var keyID: String
        /// 64 hex digits (32 bytes).
        public var secret: String
    }

    public var listen: String?
    public var control: String?
    public var generateTLS: Bool?
    public var caOut: String?
    public var tlsCert: String?
    public var tlsKey: String?
    public var h2c: Bool?
    public var tokenKeys: [TokenKeyOption]?
    public var bundleIDs: [String]?
    public var rootSecrets: [RootSecretOption]?
    /// Accessory state files (relayctl accessory pair): root secrets derived from key material.
    public var accessories: [String]?
    public var deliveriesLog: String?
    public var faults: [FaultRule]?
    public var maxConcurrentStreams: UInt32?
    public var initialMaxConcurrentStreams: UInt32?
    public var production: Bool?
    public var tokenUpdateIntervalSeconds: Int64?
    public var verbose: Bool?
    public var threads: Int?
    public var readyFile: String?
    public var tlsFault: String?
    public var clientCA: String?
    /// "BUNDLEID:CERTPATH:KEYPATH"
    public var generateClientCert: String?

    public init() {}

    static let knownKeys: Set<String> = [
        "listen", "control", "generateTLS", "caOut", "tlsCert", "tlsKey", "h2c", "tokenKeys", "bundleIDs",
        "rootSecrets", "accessories", "deliveriesLog", "faults", "maxConcurrentStreams", "initialMaxConcurrentStreams", "production",
        "tokenUpdateIntervalSeconds", "verbose", "threads", "readyFile", "tlsFault", "clientCA", "generateClientCert",
    ]

    /// Reads a JSON config file; unknown keys are errors (typos must not pass silently).
    public static func load(path: String) throws -> MockAPNsOptions {
        let data: Data
        do { data = try Data(contentsOf: URL(fileURLWithPath: path)) } catch {
            throw MockConfigurationError("config \(path): cannot read: \(error.localizedDescription)")
        }
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw MockConfigurationError("config \(path): not a JSON object")
        }
        if let unknown = Set(object.keys).subtracting(knownKeys).sorted().first {
            throw MockConfigurationError("config \(path): unknown key \"\(unknown)\"")
        }
        do { return try JSONDecoder().decode(MockAPNsOptions.self, from: data) } catch let DecodingError.typeMismatch(_, context) {
            throw MockConfigurationError("config \(path): \(context.codingPath.map(\.stringValue).joined(separator: ".")): wrong type")
        } catch let DecodingError.keyNotFound(key, context) {
            throw MockConfigurationError("config \(path): \((context.codingPath + [key]).map(\.stringValue).joined(separator: ".")) missing")
        } catch {
            throw MockConfigurationError("config \(path): \(error)")
        }
    }

    /// `other`'s scalars win; lists are concatenated.
    public func merged(with other: MockAPNsOptions) -> MockAPNsOptions {
        var m = self
        m.listen = other.listen ?? listen
        m.control = other.control ?? control
        m.generateTLS = other.generateTLS ?? generateTLS
        m.caOut = other.caOut ?? caOut
        m.tlsCert = other.tlsCert ?? tlsCert
        m.tlsKey = other.tlsKey ?? tlsKey
        m.h2c = other.h2c ?? h2c
        m.tokenKeys = concat(tokenKeys, other.tokenKeys)
        m.bundleIDs = concat(bundleIDs, other.bundleIDs)
        m.rootSecrets = concat(rootSecrets, other.rootSecrets)
        m.accessories = concat(accessories, other.accessories)
        m.deliveriesLog = other.deliveriesLog ?? deliveriesLog
        m.faults = concat(faults, other.faults)
        m.maxConcurrentStreams = other.maxConcurrentStreams ?? maxConcurrentStreams
        m.initialMaxConcurrentStreams = other.initialMaxConcurrentStreams ?? initialMaxConcurrentStreams
        m.production = other.production ?? production
        m.tokenUpdateIntervalSeconds = other.tokenUpdateIntervalSeconds ?? tokenUpdateIntervalSeconds
        m.verbose = other.verbose ?? verbose
        m.threads = other.threads ?? threads
        m.readyFile = other.readyFile ?? readyFile
        m.tlsFault = other.tlsFault ?? tlsFault
        m.clientCA = other.clientCA ?? clientCA
        m.generateClientCert = other.generateClientCert ?? generateClientCert
        return m
    }

    /// Checks everything and loads the keys.
    public func makeConfiguration() throws -> MockAPNsConfiguration {
        var c = MockAPNsConfiguration()
        (c.host, c.port) = try parseHostPort(listen ?? "127.0.0.1:2197", what: "--listen")
        if let control, control == "off" {
            c.controlPort = nil
        } else {
            let (h, p) = try parseHostPort(control ?? "127.0.0.1:2198", what: "--control")
            guard h == "127.0.0.1" || h == "::1" || h == "localhost" else {
                throw MockConfigurationError("--control: the control port is cleartext and unauthenticated; it listens on loopback only")
            }
            c.controlHost = h == "localhost" ? "127.0.0.1" : h
            c.controlPort = p
        }
        let modes = [h2c == true, tlsCert != nil || tlsKey != nil, generateTLS == true].filter { $0 }.count
        guard modes <= 1 else { throw MockConfigurationError("choose one of --h2c, --tls-cert/--tls-key, --generate-tls") }
        if h2c == true {
            c.tls = .cleartextH2
            if caOut != nil { throw MockConfigurationError("--ca-out needs TLS (not --h2c)") }
        } else if tlsCert != nil || tlsKey != nil {
            guard let tlsCert, let tlsKey else { throw MockConfigurationError("--tls-cert and --tls-key go together") }
            c.tls = .files(cert: tlsCert, key: tlsKey)
            if caOut != nil { throw MockConfigurationError("--ca-out only applies to --generate-tls") }
        } else {
            c.tls = .generate(caOutputPath: caOut)
        }
        c.tokenKeys = try (tokenKeys ?? []).map { try MockTokenKey(keyID: $0.keyID, teamID: $0.teamID, pemPath: $0.path) }
        var seenKeys = Set<String>()
        for key in c.tokenKeys where !seenKeys.insert(key.keyID).inserted {
            throw MockConfigurationError("--token-key: key ID \(key.keyID) given twice")
        }
        c.allowedBundleIDs = bundleIDs ?? []
        for id in c.allowedBundleIDs where id.isEmpty || id.contains(where: { $0 == " " || $0 == "/" }) {
            throw MockConfigurationError("--bundle-id: \"\(id)\" is not a bundle ID")
        }
        c.rootSecrets = try (rootSecrets ?? []).map { option in
            guard let keyID = Data(base64Encoded: option.keyID), keyID.count == 4 else {
                throw MockConfigurationError("--root-secret: keyID \"\(option.keyID)\" is not base64 of 4 bytes")
            }
            guard let secret = Hex.decode(option.secret), secret.count == 32 else {
                throw MockConfigurationError("--root-secret: secret for keyID \(option.keyID) is not 64 hex digits")
            }
            return MockRootSecret(keyID: Array(keyID), rootSecret: SecretKey(bytes: secret))
        }
        for path in accessories ?? [] {
            c.rootSecrets.append(try accessoryRootSecret(path))
        }
        c.deliveriesLogPath = deliveriesLog
        c.faults = FaultPlan(rules: try (faults ?? []).map { try $0.validated() })
        if let n = maxConcurrentStreams {
            guard n >= 1 else { throw MockConfigurationError("--max-concurrent-streams must be >= 1") }
            c.maxConcurrentStreams = n
        }
        if let n = initialMaxConcurrentStreams {
            guard n >= 1, n <= c.maxConcurrentStreams else {
                throw MockConfigurationError("--initial-max-concurrent-streams must be within 1...--max-concurrent-streams")
            }
            c.initialMaxConcurrentStreams = n
        }
        c.sandbox = !(production ?? false)
        if let t = tokenUpdateIntervalSeconds {
            guard t >= 0 else { throw MockConfigurationError("--token-update-interval must be >= 0") }
            c.tokenUpdateInterval = t
        }
        c.verbose = verbose ?? false
        if let threads {
            guard (1...64).contains(threads) else { throw MockConfigurationError("--threads must be within 1...64") }
            c.loopThreads = threads
        }
        c.readyFilePath = readyFile
        if let tlsFault {
            guard let fault = TLSCertificateFault(rawValue: tlsFault) else {
                throw MockConfigurationError("--tls-fault must be one of \(TLSCertificateFault.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            guard case .generate = c.tls else { throw MockConfigurationError("--tls-fault needs --generate-tls") }
            c.tlsFault = fault
        }
        if let clientCA {
            if case .cleartextH2 = c.tls { throw MockConfigurationError("--client-ca needs TLS (not --h2c)") }
            guard FileManager.default.isReadableFile(atPath: clientCA) else {
                throw MockConfigurationError("--client-ca: cannot read \(clientCA)")
            }
            c.clientCAPath = clientCA
        }
        if let generateClientCert {
            let parts = generateClientCert.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
            guard parts.count == 3, parts.allSatisfy({ !$0.isEmpty }) else {
                throw MockConfigurationError("--generate-client-cert: \"\(generateClientCert)\" is not BUNDLEID:CERTPATH:KEYPATH")
            }
            guard case .generate = c.tls else { throw MockConfigurationError("--generate-client-cert needs --generate-tls") }
            guard clientCA == nil else { throw MockConfigurationError("choose one of --client-ca, --generate-client-cert") }
            c.generatedClientCertificate = GeneratedClientCertificate(bundleID: parts[0], certificatePath: parts[1], privateKeyPath: parts[2])
        }
        return c
    }
}

private func concat<T>(_ a: [T]?, _ b: [T]?) -> [T]? {
    if a == nil && b == nil { return nil }
    return (a ?? []) + (b ?? [])
}

/// "127.0.0.1:2197", "[::1]:2197", "localhost:0".
func parseHostPort(_ text: String, what: String) throws -> (String, Int) {
    var host: Substring
    var portText: Substring
    if text.hasPrefix("[") {
        guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
            throw MockConfigurationError("\(what): \"\(text)\" is not [IPv6]:PORT")
        }
        host = text[text.index(after: text.startIndex)..<close]
        portText = text[text.index(close, offsetBy: 2)...]
    } else {
        guard let colon = text.lastIndex(of: ":") else { throw MockConfigurationError("\(what): \"\(text)\" is not HOST:PORT") }
        host = text[..<colon]
        portText = text[text.index(after: colon)...]
    }
    guard !host.isEmpty, let port = Int(portText), (0...65535).contains(port) else {
        throw MockConfigurationError("\(what): \"\(text)\" is not HOST:PORT with PORT 0...65535")
    }
    return (String(host), port)
}

/// The `mock-apns` command line.
public enum MockAPNsCommandLine {
    public enum Outcome: Sendable {
        case run(MockAPNsConfiguration)
        case help
    }

    public static let usage = """
    mock-apns: an APNs look-alike for tests. HTTP/2 over TLS (or h2c), validates requests like
    APNs, records accepted pushes, decrypts accessory payloads, injects faults.

    USAGE: mock-apns [options]

    Listening:
      --listen HOST:PORT            APNs port (default 127.0.0.1:2197; port 0 = ephemeral)
      --control HOST:PORT|off       HTTP/1.1 control port, loopback only (default 127.0.0.1:2198):
                                    GET /deliveries, GET /stats, POST /reset, POST /faults, DELETE /faults
      --generate-tls                throwaway CA + server cert (default), SAN 127.0.0.1, ::1, localhost
      --ca-out PATH                 write the generated CA certificate (PEM) here for clients
      --tls-cert PATH --tls-key PATH  serve this certificate instead
      --h2c                         cleartext HTTP/2 with prior knowledge instead of TLS
      --client-ca PATH              certificate auth: accept client certificates this CA signed; such a
                                    connection needs no token and may push to its certificate's UID only
      --generate-client-cert BUNDLEID:CERT:KEY  with --generate-tls: issue a client certificate
                                    (UID=BUNDLEID) from the throwaway CA, write it and its key there
      --tls-fault expired|wrong-host|untrusted  generated certificate that clients must refuse
                                    (expired, SAN without 127.0.0.1/localhost, or signed by a
                                    CA other than the one written to --ca-out)
      --max-concurrent-streams N    granted after the first request with a valid token (default 1000;
                                    1 before that, like APNs)
      --initial-max-concurrent-streams N  the "before" value (default 1); raise it for load
                                    generators such as h2load that open streams before reading
                                    SETTINGS (they see REFUSED_STREAM otherwise)

    Validation:
      --token-key KEYID:TEAMID:PATH  a provider-token key (.p8 or PEM public key); repeatable.
                                    Without any, token auth is off (authorization is not checked).
      --bundle-id ID                allowed bundle ID (topic = ID + push-type suffix); repeatable.
                                    Without any, every bundle ID is allowed.
      --token-update-interval SEC   min seconds between token changes on one connection before
                                    429 TooManyProviderTokenUpdates (default 1200; 0 = off)
      --production                  answer like production (no apns-unique-id); default sandbox

    Recording and verification:
      --deliveries-log PATH         append one JSON line per accepted push
      --root-secret KEYIDB64:HEX    accessory-to-host root secret (32 bytes hex) for the base64
                                    4-byte keyID; pushes with that keyID are decrypted; repeatable
      --accessory STATE.json        an accessory state file (relayctl accessory pair): its
                                    accessory-to-host root is derived from the key material
                                    (HPKE recipient + export), its keyID from the public key;
                                    repeatable

    Faults (repeatable, comma-separated key=value; same fields as POST /faults JSON):
      --fault status=410,reason=Unregistered,token=HEX   fixed answer for one device token
      --fault status=503,fraction=0.1                    fixed answer for 10% of requests
      --fault latency=50                                 add 50 ms to every answer
      --fault stall,fraction=0.01                        never answer 1% of requests
      --fault abort,token=HEX                            drop the connection instead of answering
      --fault goaway-after=100                           GOAWAY after 100 streams per connection
      --fault close-after=10                             drop the TCP connection after 10 streams
      --fault goaway-after-errors=5                      GOAWAY after 5 error answers (410 excluded)
      --fault expire-tokens-before=UNIXSECONDS           403 ExpiredProviderToken for older tokens
      --fault refuse-connections                         close each new connection at accept
      --fault stall-handshake                            accept new connections, never read them
      --fault goaway-before-first-stream                 SETTINGS, then GOAWAY before any stream
      keys: token, fraction, status, reason, timestamp (410, ms), latency (ms), stall, abort,
            goaway-after, close-after, goaway-after-errors, expire-tokens-before,
            refuse-connections, stall-handshake, goaway-before-first-stream

    Other:
      --config PATH                 JSON file with the same settings (keys: listen, control,
                                    generateTLS, caOut, tlsCert, tlsKey, h2c, tokenKeys
                                    [{keyID,teamID,path}], bundleIDs, rootSecrets [{keyID,secret}],
                                    accessories [paths],
                                    deliveriesLog, faults [rules], maxConcurrentStreams,
                                    initialMaxConcurrentStreams, production,
                                    tokenUpdateIntervalSeconds, tlsFault, threads, readyFile,
                                    verbose). Flags override scalars and add to lists.
      --threads N                   event-loop threads for the APNs port (default 1)
      --ready-file PATH             once listening, write {"port","controlPort","caPath"} JSON here
      --verbose                     one stderr line per request
      --version                     the version and git commit, alone (handled by main.swift)
      -h, --help                    this text

    Logs go to stderr. SIGTERM/SIGINT shut down cleanly. Exit codes: 0 ok, 64 usage, 1 runtime.
    """

    public static func parse(_ arguments: [String]) throws -> Outcome {
        var cli = MockAPNsOptions()
        var configPath: String?
        var i = 0
        func value(_ flag: String) throws -> String {
            i += 1
            guard i < arguments.count else { throw MockConfigurationError("\(flag) needs a value") }
            return arguments[i]
        }
        while i < arguments.count {
            let flag = arguments[i]
            switch flag {
            case "-h", "--help": return .help
            case "--listen": cli.listen = try value(flag)
            case "--control": cli.control = try value(flag)
            case "--generate-tls": cli.generateTLS = true
            case "--ca-out": cli.caOut = try value(flag)
            case "--tls-cert": cli.tlsCert = try value(flag)
            case "--tls-key": cli.tlsKey = try value(flag)
            case "--h2c": cli.h2c = true
            case "--max-concurrent-streams":
                let v = try value(flag)
                guard let n = UInt32(v) else { throw MockConfigurationError("\(flag): \"\(v)\" is not a number") }
                cli.maxConcurrentStreams = n
            case "--initial-max-concurrent-streams":
                let v = try value(flag)
                guard let n = UInt32(v) else { throw MockConfigurationError("\(flag): \"\(v)\" is not a number") }
                cli.initialMaxConcurrentStreams = n
            case "--token-key":
                let v = try value(flag)
                let parts = v.split(separator: ":", maxSplits: 2).map(String.init)
                guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty, !parts[2].isEmpty else {
                    throw MockConfigurationError("--token-key: \"\(v)\" is not KEYID:TEAMID:PATH")
                }
                cli.tokenKeys = (cli.tokenKeys ?? []) + [.init(keyID: parts[0], teamID: parts[1], path: parts[2])]
            case "--bundle-id": cli.bundleIDs = (cli.bundleIDs ?? []) + [try value(flag)]
            case "--root-secret":
                let v = try value(flag)
                guard let colon = v.lastIndex(of: ":") else {
                    throw MockConfigurationError("--root-secret: expected KEYIDB64:HEX")
                }
                cli.rootSecrets = (cli.rootSecrets ?? []) + [.init(keyID: String(v[..<colon]), secret: String(v[v.index(after: colon)...]))]
            case "--accessory": cli.accessories = (cli.accessories ?? []) + [try value(flag)]
            case "--deliveries-log": cli.deliveriesLog = try value(flag)
            case "--fault": cli.faults = (cli.faults ?? []) + [try FaultRule(commandLine: try value(flag))]
            case "--production": cli.production = true
            case "--token-update-interval":
                let v = try value(flag)
                guard let n = Int64(v) else { throw MockConfigurationError("\(flag): \"\(v)\" is not a number") }
                cli.tokenUpdateIntervalSeconds = n
            case "--verbose": cli.verbose = true
            case "--threads":
                let v = try value(flag)
                guard let n = Int(v) else { throw MockConfigurationError("\(flag): \"\(v)\" is not a number") }
                cli.threads = n
            case "--ready-file": cli.readyFile = try value(flag)
            case "--tls-fault": cli.tlsFault = try value(flag)
            case "--client-ca": cli.clientCA = try value(flag)
            case "--generate-client-cert": cli.generateClientCert = try value(flag)
            case "--config": configPath = try value(flag)
            default: throw MockConfigurationError("unknown option \(flag) (see --help)")
            }
            i += 1
        }
        let file = try configPath.map(MockAPNsOptions.load(path:)) ?? MockAPNsOptions()
        return .run(try file.merged(with: cli).makeConfiguration())
    }
}

/// The iPhone's receiving root for a paired accessory, derived from its state file's key
/// material (KeyExchange: HPKE recipient, export "AccessoryInternetKey-AccessoryToHost-<uuid>").
func accessoryRootSecret(_ path: String) throws -> MockRootSecret {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw MockConfigurationError("--accessory: cannot read \(path)")
    }
    let state: AccessoryStateFile
    do { state = try JSONDecoder().decode(AccessoryStateFile.self, from: data) } catch {
        throw MockConfigurationError("--accessory: \(path) is not an accessory state file (relayctl accessory pair): \(error)")
    }
    do {
        let session = try state.session()
        return MockRootSecret(keyID: session.keyID, rootSecret: session.internetRoot(.accessoryToHost, bluetoothIdentifier: state.bluetoothUUID))
    } catch {
        throw MockConfigurationError("--accessory: \(path): \(error)")
    }
}
