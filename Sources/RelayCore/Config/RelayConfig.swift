// relay-server's configuration: a JSON file (config/relay.example.json documents every key,
// docs/configuration.md has the table). Unknown keys and invalid values are startup errors that
// name the key path. Keys starting with "_" (e.g. "_comment") are ignored everywhere.
import Basics
import FoundationEssentials
import Glibc
import HTTPServer

public struct ConfigError: Error, Equatable, CustomStringConvertible {
    public var key: String
    public var message: String
    public var description: String { key.isEmpty ? message : "\(key): \(message)" }
}

public struct RelayConfig: Sendable, Equatable {
    public struct TLS: Sendable, Equatable {
        public var certificatePath: String
        public var privateKeyPath: String
        /// mTLS: every client must present a certificate issued by a CA in this PEM file
        /// (and still send its bearer credential: docs/configuration.md).
        public var clientCAPath: String?
    }
    public struct Listener: Sendable, Equatable {
        public var host: String
        public var port: Int
        public var tls: TLS?
        /// Every connection begins with a PROXY protocol header (v2 or v1) from one of
        /// `ingest.trustedProxies`, naming the client (ingest listener only).
        public var proxyProtocol = false
    }
    public struct Store: Sendable, Equatable {
        /// "sqlite" (one node, the default) or "postgres" (several nodes share one queue).
        public var kind = "sqlite"
        public var path = "relay.db"
        public var synchronous = SQLiteStoreOptions.Synchronous.full
        public var busyTimeoutMillis = 5000
        public var maxPending = 1_000_000
        /// postgres: libpq connection URI (docs/postgres.md).
        public var url: String?
        /// postgres: this node's lease owner name; nil = host-pid (new on every start).
        public var nodeID: String?
        /// postgres: how long a claimed row stays leased to this node. Must exceed the longest a
        /// push can be held by the APNs client (dispatch.maxQueueWaitMs + dispatch.maxAnswerWaitMs)
        /// plus `leaseMarginMillis`, so a live node's push is never claimed and sent by another.
        public var leaseSeconds = 180
        /// The store round trip and clock differences between nodes, on top of the client's hold.
        public static let leaseMarginMillis = 1_000
        /// postgres: past this offset from the database's clock a node claims nothing.
        public var maxClockOffsetSeconds = 10
        /// postgres: store.requestTimeoutMs, statementTimeoutMs, lockTimeoutMs,
        /// idleInTransactionTimeoutMs, tcpUserTimeoutMs (docs/postgres.md "Deadlines").
        public var timeouts = PostgresTimeouts()
        /// How long delivered and failed rows (with their attempts) are kept; 0 keeps them.
        public var retention = RetentionPolicy()
        /// sqlite: below this many free bytes on the database's filesystem ingest answers 503
        /// storage_full; 0 = off. PostgreSQL's disk belongs to the database server.
        public var minFreeBytes: Int64 = 1 << 30
    }
    public struct Ingest: Sendable, Equatable {
        public var maxBodyBytes = 16384
        public var ttlSeconds = 86_400
        public var perCredential = RateLimit(perSecond: 1000, burst: 2000)
        public var perPushToken = RateLimit(perSecond: 10, burst: 20)
        public var authFailuresPerAddress = RateLimit(perSecond: 1, burst: 20)
        public var maxConnections = 10_000
        /// 0 = no per-address limit (HTTPLimits.maxConnectionsPerAddress).
        public var maxConnectionsPerAddress = 0
        public var loopThreads = 1
        /// CIDR blocks (or addresses) of the load balancers allowed to connect when
        /// `listen.proxyProtocol` is on; required then, refused otherwise.
        public var trustedProxies: [String] = []
    }
    public struct Dispatch: Sendable, Equatable {
        public var maxInflight = 256
        public var claimBatch = 256
        public var backoffBaseMillis = 1000
        public var backoffCapMillis = 300_000
        public var tooManyRequestsDelayMillis = 60_000
        /// Probe waits of a paused app (PauseSchedule): base doubling to cap, equal jitter.
        public var pauseProbeBaseMillis = 1_000
        public var pauseProbeCapMillis = 300_000
        public var connectionsPerApp = 2
        /// New APNs connections an app may open per minute (PushClient's ConnectionPacing).
        public var maxNewConnectionsPerMinute = 10
        public var requestTimeoutMillis = 10_000
        /// How long a written push waits for APNs' answer while its connection answers PING
        /// (PushClient's answerWaitCap): failing it earlier makes its retry a duplicate.
        public var maxAnswerWaitMillis = 120_000
        /// How long a push may wait in the client before anything of it is written (PushClient's
        /// queueWaitCap); then it fails as not sent and retries with the back-off.
        public var maxQueueWaitMillis = 30_000
        public var shutdownGraceMillis = 5_000
        /// How long a token APNs answered 410 for is refused at ingest before one response goes
        /// through as a probe (StoreRules.markAdmission); 0 = refused until `relayctl tokens forget`.
        public var unregisteredQuarantineSeconds = 3_600
        /// The same for a 400 BadDeviceToken token; 0 = such answers mark nothing.
        public var badDeviceTokenHoldSeconds = 3_600
    }
    public enum Environment: Sendable, Equatable { case production, sandbox, custom(url: String) }
    public enum Credentials: Sendable, Equatable {
        case token(p8Path: String, keyID: String, teamID: String)
        case certificate(certificatePath: String, privateKeyPath: String, passphraseFile: String?)
    }
    public struct App: Sendable, Equatable {
        public var bundleID: String
        public var environment: Environment
        public var caFile: String?
        public var credentials: Credentials
        /// An `http://` custom URL to a host other than loopback is refused unless this is set.
        public var allowInsecureTransport = false
    }
    /// One `events.webhooks` entry (docs/events.md, "Webhooks").
    public struct Webhook: Sendable, Equatable {
        public var name: String
        public var url: String
        /// One or two lines `whsec_<base64>` (two while rotating: both sign every attempt).
        public var secretFile: String
        public var types: Set<EventType> = Set(EventType.allCases)
        /// nil: every app.
        public var apps: Set<String>?
        public var caFile: String?
        public var timeoutMillis = 10_000
        public var retryForSeconds = 86_400
        public var maxConcurrent = 8
        public var allowInsecureTransport = false

        /// What the store needs to fan events out to this webhook.
        public var subscription: WebhookSubscription { WebhookSubscription(name: name, types: types, apps: apps) }
    }
    /// `events`: delivery events (docs/events.md). The webhooks (`events.webhooks`) are the
    /// sender's configuration and the store's subscriptions (each webhook's cursor reads the events
    /// they receive); the store reads the backlog bound.
    public struct Events: Sendable, Equatable {
        public var webhooks: [Webhook] = []
        public var subscriptions: [WebhookSubscription] { webhooks.map(\.subscription) }
        /// `events.maxBacklogPerWebhook`: pending deliveries a webhook may have before the oldest
        /// are dropped (counted in relay_webhook_backlog_dropped_total, logged as an error).
        public var maxBacklogPerWebhook = EventStoreSettings.defaultMaxBacklogPerWebhook
        /// `events.senderNiceness`: the webhooks thread's nice value (0-19), below ingest and
        /// dispatch so a saturating load delays events instead of ingest.
        public var senderNiceness = Int(WebhookSender.defaultNiceness)
    }
    public struct Log: Sendable, Equatable {
        public var format = RelayLogger.Format.json
        public var level = RelayLogger.Level.info
    }

    public var listen = Listener(host: "127.0.0.1", port: 8080, tls: nil)
    public var admin = Listener(host: "127.0.0.1", port: 9090, tls: nil)
    public var adminEnabled = true
    public var store = Store()
    public var ingest = Ingest()
    public var dispatch = Dispatch()
    public var apps: [App] = []
    public var log = Log()
    public var events = Events()
    public var watchdog = true

    public init() {}

    /// Where relay-server and relayctl look without --config (deploy/systemd uses it too).
    public static let defaultPath = "/etc/accessory-relay/relay.json"

    // MARK: loading

    public static func load(path: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws -> RelayConfig {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigError(key: "", message: "cannot read config file \(path)")
        }
        let directory = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        var c = try parse(Array(data), baseDirectory: path.hasPrefix("/") && directory.isEmpty ? "/" : directory)
        try c.applyEnvironment(environment)
        return c
    }

    /// Environment overrides for secret paths (so a secrets manager can mount files anywhere):
    /// RELAY_DB_PATH, RELAY_DB_URL (postgres, may carry a password), RELAY_TLS_CERTIFICATE, RELAY_TLS_PRIVATE_KEY, and per app (index i from 0)
    /// RELAY_APP_<i>_P8_PATH, RELAY_APP_<i>_CERTIFICATE_PATH, RELAY_APP_<i>_PRIVATE_KEY_PATH.
    /// The first file the config names that this process cannot open for reading, as an error
    /// naming the key, the path and the system's reason ("apps[0].token.p8Path: cannot read
    /// /etc/accessory-relay/keys/k.p8: Permission denied"). relay-server checks this before
    /// starting (and with --check-config), so the message names the key instead of a
    /// library's error dump; relayctl check-config also checks the files' contents.
    public func unreadableFile() -> ConfigError? {
        var files: [(key: String, path: String)] = []
        if let tls = listen.tls {
            files += [("listen.tls.certificate", tls.certificatePath), ("listen.tls.privateKey", tls.privateKeyPath)]
            if let ca = tls.clientCAPath { files.append(("listen.tls.clientCA", ca)) }
        }
        for (i, webhook) in events.webhooks.enumerated() {
            files.append(("events.webhooks[\(i)].secretFile", webhook.secretFile))
            if let ca = webhook.caFile { files.append(("events.webhooks[\(i)].caFile", ca)) }
        }
        for (i, app) in apps.enumerated() {
            if let ca = app.caFile { files.append(("apps[\(i)].caFile", ca)) }
            switch app.credentials {
            case .token(let p8, _, _):
                files.append(("apps[\(i)].token.p8Path", p8))
            case .certificate(let certificate, let key, let passphrase):
                files += [("apps[\(i)].certificate.certificatePath", certificate), ("apps[\(i)].certificate.privateKeyPath", key)]
                if let passphrase { files.append(("apps[\(i)].certificate.passphraseFile", passphrase)) }
            }
        }
        for file in files {
            let fd = open(file.path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                return ConfigError(key: file.key, message: "cannot read \(file.path): \(String(cString: strerror(errno)))")
            }
            var info = stat()
            let isDirectory = fstat(fd, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
            close(fd)
            if isDirectory { return ConfigError(key: file.key, message: "\(file.path) is a directory, not a file") }
        }
        return nil
    }

    public mutating func applyEnvironment(_ env: [String: String]) throws {
        if let p = env["RELAY_DB_PATH"], !p.isEmpty { store.path = p }
        if let u = env["RELAY_DB_URL"], !u.isEmpty {
            guard store.kind == "postgres" else { throw ConfigError(key: "RELAY_DB_URL", message: "only used with store.kind \"postgres\"") }
            if let problem = postgresURLProblem(u) { throw ConfigError(key: "RELAY_DB_URL", message: problem) }
            store.url = u
        }
        if let cert = env["RELAY_TLS_CERTIFICATE"], let key = env["RELAY_TLS_PRIVATE_KEY"] {
            listen.tls = TLS(certificatePath: cert, privateKeyPath: key, clientCAPath: listen.tls?.clientCAPath)
        } else if env["RELAY_TLS_CERTIFICATE"] != nil || env["RELAY_TLS_PRIVATE_KEY"] != nil {
            throw ConfigError(key: "RELAY_TLS_CERTIFICATE", message: "set both RELAY_TLS_CERTIFICATE and RELAY_TLS_PRIVATE_KEY")
        }
        for i in apps.indices {
            switch apps[i].credentials {
            case .token(let p8, let kid, let team):
                if let v = env["RELAY_APP_\(i)_P8_PATH"], !v.isEmpty { apps[i].credentials = .token(p8Path: v, keyID: kid, teamID: team) } else { _ = p8 }
            case .certificate(let cp, let kp, let pass):
                let c = env["RELAY_APP_\(i)_CERTIFICATE_PATH"].flatMap { $0.isEmpty ? nil : $0 } ?? cp
                let k = env["RELAY_APP_\(i)_PRIVATE_KEY_PATH"].flatMap { $0.isEmpty ? nil : $0 } ?? kp
                apps[i].credentials = .certificate(certificatePath: c, privateKeyPath: k, passphraseFile: pass)
            }
        }
    }
}
