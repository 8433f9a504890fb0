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
    /// sender's configuration and the store's fan-out; the store reads the backlog bound.
    public struct Events: Sendable, Equatable {
        public var webhooks: [Webhook] = []
        public var subscriptions: [WebhookSubscription] { webhooks.map(\.subscription) }
        /// `events.maxBacklogPerWebhook`: pending deliveries a webhook may have before the oldest
        /// are dropped (counted in relay_webhook_backlog_dropped_total, logged as an error).
        public var maxBacklogPerWebhook = EventStoreSettings.defaultMaxBacklogPerWebhook
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

    /// Relative file paths in the config are resolved against `baseDirectory` (the config
    /// file's directory), so a config works no matter where the server starts.
    public static func parse(_ bytes: [UInt8], baseDirectory: String = "") throws -> RelayConfig {
        let root: ConfigJSON
        do { root = try JSONDecoder().decode(ConfigJSON.self, from: Data(bytes)) } catch {
            throw ConfigError(key: "", message: "config is not valid JSON: \(Self.describe(error))")
        }
        if let key = firstDuplicateKey(bytes) {
            throw ConfigError(key: key, message: "given twice in the same object (only the last would count): remove one")
        }
        var r = ConfigReader(root, path: "", base: baseDirectory)
        var c = RelayConfig()
        try r.object(allowed: ["listen", "admin", "store", "ingest", "dispatch", "apps", "log", "watchdog", "events"])
        if var l = try r.child("listen") {
            try l.object(allowed: ["host", "port", "tls", "proxyProtocol"])
            c.listen.host = try l.string("host") ?? c.listen.host
            c.listen.port = try l.int("port", 0...65535) ?? c.listen.port
            c.listen.proxyProtocol = try l.bool("proxyProtocol") ?? false
            if var t = try l.child("tls") {
                try t.object(allowed: ["certificate", "privateKey", "clientCA"])
                guard let cert = try t.path("certificate"), let key = try t.path("privateKey") else {
                    throw ConfigError(key: "listen.tls", message: "needs certificate and privateKey")
                }
                c.listen.tls = TLS(certificatePath: cert, privateKeyPath: key, clientCAPath: try t.path("clientCA"))
            }
        }
        if var a = try r.child("admin") {
            try a.object(allowed: ["host", "port", "enabled"])
            c.admin.host = try a.string("host") ?? c.admin.host
            c.admin.port = try a.int("port", 0...65535) ?? c.admin.port
            c.adminEnabled = try a.bool("enabled") ?? true
        }
        if var s = try r.child("store") {
            let postgresOnly = ["url", "nodeId", "leaseSeconds", "maxClockOffsetSeconds", "requestTimeoutMs", "statementTimeoutMs", "lockTimeoutMs",
                                "idleInTransactionTimeoutMs", "tcpUserTimeoutMs"]
            try s.object(allowed: Set(["kind", "path", "synchronous", "busyTimeoutMs", "maxPending", "retention", "minFreeBytes"]).union(postgresOnly))
            c.store.kind = try s.string("kind") ?? "sqlite"
            let sqliteOnly = ["path", "synchronous", "busyTimeoutMs", "minFreeBytes"]
            switch c.store.kind {
            case "sqlite":
                if let k = postgresOnly.first(where: { s.raw($0) != nil }) {
                    throw ConfigError(key: s.key(k), message: "only allowed with store.kind \"postgres\"")
                }
            case "postgres":
                if let k = sqliteOnly.first(where: { s.raw($0) != nil }) {
                    throw ConfigError(key: s.key(k), message: "only allowed with store.kind \"sqlite\"")
                }
                guard let url = try s.string("url"), url.hasPrefix("postgresql://") || url.hasPrefix("postgres://") || url.contains("=") else {
                    throw ConfigError(key: "store.url", message: "required with store.kind \"postgres\": a libpq URI such as postgresql://relay@db.internal:5432/relay")
                }
                if let problem = postgresURLProblem(url) { throw ConfigError(key: "store.url", message: problem) }
                c.store.url = url
                if let node = try s.string("nodeId") {
                    guard !node.isEmpty, node.count <= 200 else { throw ConfigError(key: "store.nodeId", message: "must be 1 to 200 characters") }
                    c.store.nodeID = node
                }
                c.store.leaseSeconds = try s.int("leaseSeconds", 5...86_400) ?? c.store.leaseSeconds
                c.store.maxClockOffsetSeconds = try s.int("maxClockOffsetSeconds", 1...3_600) ?? c.store.maxClockOffsetSeconds
                var t = c.store.timeouts
                t.requestMillis = Int64(try s.int("requestTimeoutMs", 100...600_000) ?? Int(t.requestMillis))
                t.statementMillis = Int64(try s.int("statementTimeoutMs", 0...3_600_000) ?? Int(t.statementMillis))
                t.lockMillis = Int64(try s.int("lockTimeoutMs", 0...3_600_000) ?? Int(t.lockMillis))
                t.idleInTransactionMillis = Int64(try s.int("idleInTransactionTimeoutMs", 0...3_600_000) ?? Int(t.idleInTransactionMillis))
                t.tcpUserMillis = Int64(try s.int("tcpUserTimeoutMs", 0...3_600_000) ?? Int(t.tcpUserMillis))
                // The server's limits end a statement before the relay gives up on it, so the
                // connection usually survives (57014 / 55P03 arrive, nothing is abandoned). Left
                // out, they follow a shorter requestTimeoutMs.
                if s.raw("statementTimeoutMs") == nil { t.statementMillis = min(t.statementMillis, t.requestMillis * 4 / 5) }
                if s.raw("lockTimeoutMs") == nil { t.lockMillis = min(t.lockMillis, t.requestMillis * 2 / 5) }
                if t.statementMillis > t.requestMillis {
                    throw ConfigError(key: "store.statementTimeoutMs", message: "must not exceed store.requestTimeoutMs (\(t.requestMillis) ms); 0 turns it off")
                }
                if t.lockMillis > t.requestMillis {
                    throw ConfigError(key: "store.lockTimeoutMs", message: "must not exceed store.requestTimeoutMs (\(t.requestMillis) ms); 0 turns it off")
                }
                c.store.timeouts = t
            default:
                throw ConfigError(key: "store.kind", message: "must be \"sqlite\" or \"postgres\"")
            }
            c.store.path = try s.path("path") ?? r.resolve(c.store.path)
            if let sync = try s.string("synchronous") {
                guard let v = SQLiteStoreOptions.Synchronous(rawValue: sync.uppercased()) else {
                    throw ConfigError(key: "store.synchronous", message: "must be \"FULL\" or \"NORMAL\"")
                }
                c.store.synchronous = v
            }
            c.store.busyTimeoutMillis = try s.int("busyTimeoutMs", 0...600_000) ?? c.store.busyTimeoutMillis
            c.store.maxPending = try s.int("maxPending", 1...1_000_000_000) ?? c.store.maxPending
            if var t = try s.child("retention") {
                try t.object(allowed: ["deliveredSeconds", "failedSeconds"])
                // Up to 100 years: the cutoff in milliseconds stays far from overflow.
                c.store.retention.deliveredSeconds = try t.nonNegative("deliveredSeconds", max: 3_153_600_000) ?? c.store.retention.deliveredSeconds
                c.store.retention.failedSeconds = try t.nonNegative("failedSeconds", max: 3_153_600_000) ?? c.store.retention.failedSeconds
            }
            if c.store.kind == "sqlite" {
                c.store.minFreeBytes = try s.nonNegative("minFreeBytes", max: Int64.max / 2) ?? c.store.minFreeBytes
            } else {
                c.store.minFreeBytes = 0
            }
        } else {
            c.store.path = r.resolve(c.store.path)
        }
        if var i = try r.child("ingest") {
            try i.object(allowed: ["maxBodyBytes", "ttlSeconds", "rateLimits", "maxConnections", "maxConnectionsPerAddress", "loopThreads", "trustedProxies"])
            for entry in try i.array("trustedProxies") ?? [] {
                guard case .string(let text) = entry.value, IPNetwork(text) != nil else {
                    throw ConfigError(key: entry.path, message: "must be an IP address or CIDR block (\"10.0.0.0/8\", \"2001:db8::/32\")")
                }
                c.ingest.trustedProxies.append(text)
            }
            c.ingest.maxBodyBytes = try i.int("maxBodyBytes", 1024...1_048_576) ?? c.ingest.maxBodyBytes
            c.ingest.ttlSeconds = try i.int("ttlSeconds", 1...(30 * 86_400)) ?? c.ingest.ttlSeconds
            c.ingest.maxConnections = try i.int("maxConnections", 1...1_000_000) ?? c.ingest.maxConnections
            c.ingest.maxConnectionsPerAddress = try i.int("maxConnectionsPerAddress", 0...1_000_000) ?? c.ingest.maxConnectionsPerAddress
            c.ingest.loopThreads = try i.int("loopThreads", 1...64) ?? c.ingest.loopThreads
            if var rl = try i.child("rateLimits") {
                try rl.object(allowed: ["perCredential", "perPushToken", "authFailuresPerAddress"])
                for (key, keyPath) in [("perCredential", \Ingest.perCredential), ("perPushToken", \Ingest.perPushToken),
                                       ("authFailuresPerAddress", \Ingest.authFailuresPerAddress)] {
                    if var x = try rl.child(key) {
                        try x.object(allowed: ["perSecond", "burst"])
                        let perSecond = try x.double("perSecond", 0...1_000_000) ?? c.ingest[keyPath: keyPath].perSecond
                        let burst = try x.double("burst", 1...10_000_000) ?? c.ingest[keyPath: keyPath].burst
                        c.ingest[keyPath: keyPath] = RateLimit(perSecond: perSecond, burst: burst)
                    }
                }
            }
        }
        if var d = try r.child("dispatch") {
            try d.object(allowed: ["maxInflight", "claimBatch", "backoffBaseMs", "backoffCapMs", "tooManyRequestsDelayMs",
                                   "pauseProbeBaseMs", "pauseProbeCapMs", "connectionsPerApp", "maxNewConnectionsPerMinute", "requestTimeoutMs", "maxAnswerWaitMs", "maxQueueWaitMs", "shutdownGraceMs",
                                   "unregisteredQuarantineSeconds", "badDeviceTokenHoldSeconds"])
            c.dispatch.maxInflight = try d.int("maxInflight", 1...100_000) ?? c.dispatch.maxInflight
            c.dispatch.claimBatch = try d.int("claimBatch", 1...10_000) ?? c.dispatch.claimBatch
            c.dispatch.backoffBaseMillis = try d.int("backoffBaseMs", 1...3_600_000) ?? c.dispatch.backoffBaseMillis
            c.dispatch.backoffCapMillis = try d.int("backoffCapMs", 1...86_400_000) ?? c.dispatch.backoffCapMillis
            c.dispatch.tooManyRequestsDelayMillis = try d.int("tooManyRequestsDelayMs", 0...86_400_000) ?? c.dispatch.tooManyRequestsDelayMillis
            c.dispatch.pauseProbeBaseMillis = try d.int("pauseProbeBaseMs", 10...3_600_000) ?? c.dispatch.pauseProbeBaseMillis
            c.dispatch.pauseProbeCapMillis = try d.int("pauseProbeCapMs", 10...3_600_000) ?? c.dispatch.pauseProbeCapMillis
            c.dispatch.connectionsPerApp = try d.int("connectionsPerApp", 1...64) ?? c.dispatch.connectionsPerApp
            c.dispatch.maxNewConnectionsPerMinute = try d.int("maxNewConnectionsPerMinute", 1...600) ?? c.dispatch.maxNewConnectionsPerMinute
            c.dispatch.requestTimeoutMillis = try d.int("requestTimeoutMs", 100...600_000) ?? c.dispatch.requestTimeoutMillis
            c.dispatch.maxAnswerWaitMillis = try d.int("maxAnswerWaitMs", 100...3_600_000) ?? c.dispatch.maxAnswerWaitMillis
            c.dispatch.maxQueueWaitMillis = try d.int("maxQueueWaitMs", 100...3_600_000) ?? c.dispatch.maxQueueWaitMillis
            c.dispatch.shutdownGraceMillis = try d.int("shutdownGraceMs", 0...600_000) ?? c.dispatch.shutdownGraceMillis
            c.dispatch.unregisteredQuarantineSeconds = try d.int("unregisteredQuarantineSeconds", 0...31_536_000) ?? c.dispatch.unregisteredQuarantineSeconds
            c.dispatch.badDeviceTokenHoldSeconds = try d.int("badDeviceTokenHoldSeconds", 0...2_592_000) ?? c.dispatch.badDeviceTokenHoldSeconds
            guard c.dispatch.backoffCapMillis >= c.dispatch.backoffBaseMillis else {
                throw ConfigError(key: "dispatch.backoffCapMs", message: "must be at least dispatch.backoffBaseMs")
            }
            guard c.dispatch.pauseProbeCapMillis >= c.dispatch.pauseProbeBaseMillis else {
                throw ConfigError(key: "dispatch.pauseProbeCapMs", message: "must be at least dispatch.pauseProbeBaseMs")
            }
            guard c.dispatch.maxAnswerWaitMillis >= c.dispatch.requestTimeoutMillis else {
                throw ConfigError(key: "dispatch.maxAnswerWaitMs", message: "must be at least dispatch.requestTimeoutMs (\(c.dispatch.requestTimeoutMillis) ms)")
            }
        }
        // A lease that ends while the client still holds the push (queued, or waiting for a slow
        // APNs' answer) lets another node claim and send it again.
        let held = c.dispatch.maxQueueWaitMillis + c.dispatch.maxAnswerWaitMillis + Store.leaseMarginMillis
        if c.store.kind == "postgres", c.store.leaseSeconds * 1000 <= held {
            throw ConfigError(key: "store.leaseSeconds", message: "must be longer than dispatch.maxQueueWaitMs + dispatch.maxAnswerWaitMs + 1 s ("
                              + "\(c.dispatch.maxQueueWaitMillis) + \(c.dispatch.maxAnswerWaitMillis) + \(Store.leaseMarginMillis) ms)")
        }
        guard let apps = try r.array("apps"), !apps.isEmpty else {
            throw ConfigError(key: "apps", message: "at least one app is required")
        }
        var seen = Set<String>()
        for var a in apps {
            try a.object(allowed: ["bundleID", "environment", "url", "caFile", "token", "certificate", "allowInsecureTransport"])
            guard let bundle = try a.string("bundleID"), !bundle.isEmpty, !bundle.contains(",") else {
                throw ConfigError(key: a.key("bundleID"), message: "required: the companion app's bundle ID")
            }
            // Apple's bundle ID alphabet; anything else makes every push fail (the topic is built from it).
            guard bundle.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || $0 == 0x2D || $0 == 0x2E }) else {
                throw ConfigError(key: a.key("bundleID"), message: "\(bundle) is not a bundle ID (letters, digits, '-' and '.' only)")
            }
            guard seen.insert(bundle).inserted else { throw ConfigError(key: a.key("bundleID"), message: "\(bundle) is configured twice") }
            let env: Environment
            switch try a.string("environment") ?? "production" {
            case "production": env = .production
            case "sandbox": env = .sandbox
            case "custom":
                guard let url = try a.string("url"), url.hasPrefix("https://") || url.hasPrefix("http://") else {
                    throw ConfigError(key: a.key("url"), message: "environment \"custom\" needs an http(s) url")
                }
                env = .custom(url: url)
            default: throw ConfigError(key: a.key("environment"), message: "must be \"production\", \"sandbox\" or \"custom\"")
            }
            let allowInsecure = try a.bool("allowInsecureTransport") ?? false
            if case .custom(let url) = env {
                // Cleartext carries the provider JWT (which any host on the path could replay for
                // up to an hour) and every push: only to this host, or when the operator says so.
                if url.hasPrefix("http://"), !allowInsecure, !Self.isLoopbackHost(Self.urlHost(url)) {
                    throw ConfigError(key: a.key("url"), message: "\(url) is cleartext to a host other than loopback: the APNs token and every push would cross the network unencrypted; use https://, or set \"allowInsecureTransport\": true in this app")
                }
            } else {
                if try a.string("url") != nil { throw ConfigError(key: a.key("url"), message: "only allowed with environment \"custom\"") }
                if a.raw("allowInsecureTransport") != nil {
                    throw ConfigError(key: a.key("allowInsecureTransport"), message: "only allowed with environment \"custom\"")
                }
            }
            let ca = try a.path("caFile")
            let creds: Credentials
            switch (try a.child("token"), try a.child("certificate")) {
            case (var t?, nil):
                try t.object(allowed: ["p8Path", "keyID", "teamID"])
                guard let p8 = try t.path("p8Path") else { throw ConfigError(key: t.key("p8Path"), message: "required") }
                guard let kid = try t.string("keyID"), kid.count == 10 else { throw ConfigError(key: t.key("keyID"), message: "required: the 10-character APNs key ID") }
                guard let team = try t.string("teamID"), team.count == 10 else { throw ConfigError(key: t.key("teamID"), message: "required: the 10-character team ID") }
                creds = .token(p8Path: p8, keyID: kid, teamID: team)
            case (nil, var cert?):
                try cert.object(allowed: ["certificatePath", "privateKeyPath", "passphraseFile"])
                guard let cp = try cert.path("certificatePath") else { throw ConfigError(key: cert.key("certificatePath"), message: "required") }
                // A .p12/.pfx certificatePath holds the key too (PushClient reads it as PKCS#12).
                let pkcs12 = cp.lowercased().hasSuffix(".p12") || cp.lowercased().hasSuffix(".pfx")
                let kp = try cert.path("privateKeyPath")
                guard kp != nil || pkcs12 else {
                    throw ConfigError(key: cert.key("privateKeyPath"), message: "required (unless certificatePath is a .p12/.pfx file)")
                }
                creds = .certificate(certificatePath: cp, privateKeyPath: kp ?? cp, passphraseFile: try cert.path("passphraseFile"))
            case (nil, nil): throw ConfigError(key: a.key("token"), message: "an app needs \"token\" or \"certificate\" credentials")
            default: throw ConfigError(key: a.key("certificate"), message: "give either \"token\" or \"certificate\", not both")
            }
            c.apps.append(App(bundleID: bundle, environment: env, caFile: ca, credentials: creds, allowInsecureTransport: allowInsecure))
        }
        if var l = try r.child("log") {
            try l.object(allowed: ["format", "level"])
            if let f = try l.string("format") {
                guard let v = RelayLogger.Format(rawValue: f) else { throw ConfigError(key: "log.format", message: "must be \"json\" or \"text\"") }
                c.log.format = v
            }
            if let lv = try l.string("level") {
                guard let v = RelayLogger.Level(name: lv) else { throw ConfigError(key: "log.level", message: "must be debug, info, warning or error") }
                c.log.level = v
            }
        }
        c.watchdog = try r.bool("watchdog") ?? true
        if var e = try r.child("events") {
            try e.object(allowed: ["webhooks", "maxBacklogPerWebhook"])
            c.events.webhooks = try Self.parseWebhooks(try e.array("webhooks") ?? [], apps: Set(c.apps.map(\.bundleID)))
            if let n = try e.nonNegative("maxBacklogPerWebhook", max: 1_000_000_000) {
                guard n > 0 else { throw ConfigError(key: "events.maxBacklogPerWebhook", message: "must be at least 1") }
                c.events.maxBacklogPerWebhook = Int(n)
            }
        }
        if c.listen.proxyProtocol && c.ingest.trustedProxies.isEmpty {
            throw ConfigError(key: "ingest.trustedProxies", message: "required when listen.proxyProtocol is true: the load balancers' addresses (CIDR)")
        }
        if !c.listen.proxyProtocol && !c.ingest.trustedProxies.isEmpty {
            throw ConfigError(key: "ingest.trustedProxies", message: "only used with listen.proxyProtocol: true (client addresses are taken from PROXY headers only)")
        }
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
