// Reading the configuration file: one function per section, each naming the key it refuses
// (docs/configuration.md lists every key and its range).
import Basics
import FoundationEssentials
import Glibc
import HTTPServer

extension RelayConfig {
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
        if var l = try r.child("listen") { try parseListen(&l, into: &c) }
        if var a = try r.child("admin") { try parseAdmin(&a, into: &c) }
        if var s = try r.child("store") {
            try parseStore(&s, root: r, into: &c)
        } else {
            c.store.path = r.resolve(c.store.path)
        }
        if var i = try r.child("ingest") { try parseIngest(&i, into: &c) }
        if var d = try r.child("dispatch") { try parseDispatch(&d, into: &c) }
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
        for var a in apps { c.apps.append(try parseApp(&a, seen: &seen)) }
        if var l = try r.child("log") { try parseLog(&l, into: &c) }
        c.watchdog = try r.bool("watchdog") ?? true
        if var e = try r.child("events") { try parseEvents(&e, into: &c) }
        if c.listen.proxyProtocol && c.ingest.trustedProxies.isEmpty {
            throw ConfigError(key: "ingest.trustedProxies", message: "required when listen.proxyProtocol is true: the load balancers' addresses (CIDR)")
        }
        if !c.listen.proxyProtocol && !c.ingest.trustedProxies.isEmpty {
            throw ConfigError(key: "ingest.trustedProxies", message: "only used with listen.proxyProtocol: true (client addresses are taken from PROXY headers only)")
        }
        return c
    }

    private static func parseListen(_ l: inout ConfigReader, into c: inout RelayConfig) throws {
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

    private static func parseAdmin(_ a: inout ConfigReader, into c: inout RelayConfig) throws {
            try a.object(allowed: ["host", "port", "enabled"])
            c.admin.host = try a.string("host") ?? c.admin.host
            c.admin.port = try a.int("port", 0...65535) ?? c.admin.port
            c.adminEnabled = try a.bool("enabled") ?? true
    }

    private static func parseStore(_ s: inout ConfigReader, root r: ConfigReader, into c: inout RelayConfig) throws {
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
                try parsePostgres(&s, sqliteOnly: sqliteOnly, into: &c)
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
                // At most 1 PiB: config numbers are read as doubles, exact up to 2^53.
                c.store.minFreeBytes = try s.nonNegative("minFreeBytes", max: 1 << 50) ?? c.store.minFreeBytes
            } else {
                c.store.minFreeBytes = 0
            }
    }

    /// The PostgreSQL half of `store` (docs/postgres.md): url, node, lease, clock bound, deadlines.
    private static func parsePostgres(_ s: inout ConfigReader, sqliteOnly: [String], into c: inout RelayConfig) throws {
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
    }

    private static func parseIngest(_ i: inout ConfigReader, into c: inout RelayConfig) throws {
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

    private static func parseDispatch(_ d: inout ConfigReader, into c: inout RelayConfig) throws {
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

    private static func parseApp(_ a: inout ConfigReader, seen: inout Set<String>) throws -> App {
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
        let creds = try parseCredentials(&a)
        return App(bundleID: bundle, environment: env, caFile: ca, credentials: creds, allowInsecureTransport: allowInsecure)
    }

    /// `token` (a .p8 key) or `certificate` (PEM or PKCS#12), exactly one.
    private static func parseCredentials(_ a: inout ConfigReader) throws -> Credentials {
        switch (try a.child("token"), try a.child("certificate")) {
        case (var t?, nil):
            try t.object(allowed: ["p8Path", "keyID", "teamID"])
            guard let p8 = try t.path("p8Path") else { throw ConfigError(key: t.key("p8Path"), message: "required") }
            guard let kid = try t.string("keyID"), kid.count == 10 else { throw ConfigError(key: t.key("keyID"), message: "required: the 10-character APNs key ID") }
            guard let team = try t.string("teamID"), team.count == 10 else { throw ConfigError(key: t.key("teamID"), message: "required: the 10-character team ID") }
            return .token(p8Path: p8, keyID: kid, teamID: team)
        case (nil, var cert?):
            try cert.object(allowed: ["certificatePath", "privateKeyPath", "passphraseFile"])
            guard let cp = try cert.path("certificatePath") else { throw ConfigError(key: cert.key("certificatePath"), message: "required") }
            // A .p12/.pfx certificatePath holds the key too (PushClient reads it as PKCS#12).
            let pkcs12 = cp.lowercased().hasSuffix(".p12") || cp.lowercased().hasSuffix(".pfx")
            let kp = try cert.path("privateKeyPath")
            guard kp != nil || pkcs12 else {
                throw ConfigError(key: cert.key("privateKeyPath"), message: "required (unless certificatePath is a .p12/.pfx file)")
            }
            return .certificate(certificatePath: cp, privateKeyPath: kp ?? cp, passphraseFile: try cert.path("passphraseFile"))
        case (nil, nil): throw ConfigError(key: a.key("token"), message: "an app needs \"token\" or \"certificate\" credentials")
        default: throw ConfigError(key: a.key("certificate"), message: "give either \"token\" or \"certificate\", not both")
        }
    }

    private static func parseLog(_ l: inout ConfigReader, into c: inout RelayConfig) throws {
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

    private static func parseEvents(_ e: inout ConfigReader, into c: inout RelayConfig) throws {
            try e.object(allowed: ["webhooks", "maxBacklogPerWebhook", "senderNiceness"])
            c.events.webhooks = try Self.parseWebhooks(try e.array("webhooks") ?? [], apps: Set(c.apps.map(\.bundleID)))
            if let n = try e.nonNegative("maxBacklogPerWebhook", max: 1_000_000_000) {
                guard n > 0 else { throw ConfigError(key: "events.maxBacklogPerWebhook", message: "must be at least 1") }
                c.events.maxBacklogPerWebhook = Int(n)
            }
            if let n = try e.nonNegative("senderNiceness", max: 19) { c.events.senderNiceness = Int(n) }
    }
}
