// Assembles the data path from a RelayConfig:
//   HTTPServer (ingest) -> IngestService (validate, rate limit) -> SQLiteOutboxStore (group
//   commit) -> Dispatcher -> PushTransport (PushClient) -> APNs
// plus the admin listener, systemd notifications, the graceful drain on SIGTERM/SIGINT and the
// certificate reload on SIGHUP.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads
import Synchronization
import HTTPServer

public final class RelayService: @unchecked Sendable {
    // @unchecked Sendable: the optional components are set once in start() before any other
    // thread can see them and never cleared; stop() runs once (guarded by stopLock).
    public let config: RelayConfig
    public let logger: RelayLogger
    public let metrics = RelayMetrics()
    public let webhookMetrics: WebhookMetrics
    private let makeTransport: @Sendable (RelayConfig.App, RelayConfig) throws -> any PushTransport

    public private(set) var store: (any OutboxStore)?
    private var dispatcher: Dispatcher?
    private var ingestServer: HTTPServer?
    private var adminServer: HTTPServer?
    private var retention: RetentionSweeper?
    /// Every part start() started, in order, and stop() stops in reverse: the store, the
    /// dispatcher, retention, the reader pool, the ingest listener, the admin pool and
    /// listener, the watchdog. So the drain ends the watchdog and the admin listener (/readyz
    /// fails) first, then ingest (its requests finish), then the dispatcher (pushes in flight),
    /// and closes the database last.
    private let running = LifecycleList()
    private let stopLock = Condition()
    private var stopped = false
    private let startedAt = monotonicMicros()
    /// SIGHUP certificate reloads, for /metrics (a failed one needs the operator).
    private let tlsReloads = Mutex<(ok: Int, failed: Int)>((0, 0))
    private let apnsReloads = Mutex<(ok: Int, failed: Int)>((0, 0))
    /// Per app (config order): its transport and the hash of the key files it was built from.
    /// Written in start() and reload(), both under stopLock or before any signal is handled.
    private var appTransports: [(transport: SwappableTransport, fingerprint: [UInt8]?)] = []

    public init(config: RelayConfig, logger: RelayLogger,
                makeTransport: @escaping @Sendable (RelayConfig.App, RelayConfig) throws -> any PushTransport) {
        self.config = config
        self.logger = logger
        self.makeTransport = makeTransport
        webhookMetrics = WebhookMetrics(webhooks: config.events.webhooks.map(\.name))
    }

    public var ingestPort: Int { ingestServer?.localPort ?? 0 }
    public var adminPort: Int { adminServer?.localPort ?? 0 }

    /// Opens the store (migrating it), requeues rows a crash left inflight, loads APNs
    /// credentials, starts the dispatcher and both listeners, then tells systemd READY=1.
    public func start() throws {
        let c = config
        let store = try openStore(c)
        let credentialsLoaded = try startDelivery(c, store: store)
        try startIngest(c, store: store)
        try startAdmin(c, store: store, credentialsLoaded: credentialsLoaded)
        if c.watchdog, let watchdog = WatchdogPinger(healthy: { [weak dispatcher = self.dispatcher, weak store] in
            (dispatcher?.isRunning ?? false) && store != nil
        }) {
            try running.start(watchdog)
        }
        let elapsedMs = Double(monotonicMicros() - startedAt) / 1000
        logger.info("relay-server ready", ["ingest": "\(c.listen.host):\(ingestPort)", "admin": c.adminEnabled ? "\(c.admin.host):\(adminPort)" : "disabled",
                                           "db": OutboxStores.describe(c.store), "apps": c.apps.count, "startup_ms": elapsedMs])
        SystemdNotifier.notify("READY=1\nSTATUS=accepting responses on \(c.listen.host):\(ingestPort)")
    }

    /// The store, migrated, with the settings ingest and events read; a second relay-server on
    /// the same SQLite file stops here.
    private func openStore(_ c: RelayConfig) throws -> any OutboxStore {
        // SQLite or PostgreSQL, as configured (docs/postgres.md).
        // A schema migration can take a while (the v3 rebuild: ~16 s per million rows): keep
        // systemd's start timeout moving (EXTEND_TIMEOUT_USEC, systemd >= 236) and say so in
        // the log every 10 s, instead of being killed and rolled back mid-way.
        let slowStartLog = Mutex<Int64>(0)
        let store = try naming("store") { try OutboxStores.open(c.store, exclusiveNode: true, logger: logger, onSlowStart: { [logger] stage in
            SystemdNotifier.notify("EXTEND_TIMEOUT_USEC=15000000\nSTATUS=\(stage)")
            let now = monotonicMicros()
            if slowStartLog.withLock({ last in
                guard now - last >= 10_000_000 else { return false }
                last = now
                return true
            }) { logger.info("still starting", ["stage": stage]) }
        }) }
        self.store = store
        store.ingestSettings = IngestStoreSettings(configuredApps: Set(c.apps.map(\.bundleID)), ttlMillis: Int64(c.ingest.ttlSeconds) * 1000,
                                                   maxPending: c.store.maxPending,
                                                   unregisteredQuarantineMillis: Int64(c.dispatch.unregisteredQuarantineSeconds) * 1000,
                                                   badDeviceTokenHoldMillis: Int64(c.dispatch.badDeviceTokenHoldSeconds) * 1000)
        // Before the dispatcher's first outcome. The subscriptions are the sender's
        // `events.webhooks` (names, types, apps); none means events are kept for the feed only.
        store.eventSettings = EventStoreSettings(webhooks: c.events.subscriptions, maxBacklogPerWebhook: c.events.maxBacklogPerWebhook)
        running.adopt(StopAction { [logger] _ in
            let counts = try? store.counts()
            store.close()
            logger.info("stopped", ["queued": counts?.byState[.queued] ?? -1, "retry": counts?.byState[.retry] ?? -1,
                                    "inflight": counts?.byState[.inflight] ?? -1])
        })
        // The SQLite store's ingest lock and dedupe tail: a second relay-server on the same
        // file stops here, naming the lock.
        if let s = store as? SQLiteOutboxStore { try naming("store") { try s.prepareIngest() } }
        return store
    }

    /// One transport per app, the dispatcher, retention and the webhook sender. Returns whether
    /// every app's APNs credentials loaded.
    private func startDelivery(_ c: RelayConfig, store: any OutboxStore) throws -> Bool {
        var transports: [String: any PushTransport] = [:]
        for (i, app) in c.apps.enumerated() {
            let transport = SwappableTransport(try naming("apps[\(i)] (\(app.bundleID))") { try makeTransport(app, c) })
            transports[app.bundleID] = transport
            appTransports.append((transport, Self.credentialFingerprint(app)))
        }
        var policy = DeliveryPolicy(backoffBaseMillis: Int64(c.dispatch.backoffBaseMillis), backoffCapMillis: Int64(c.dispatch.backoffCapMillis),
                                    tooManyRequestsDelayMillis: Int64(c.dispatch.tooManyRequestsDelayMillis))
        policy.marksBadDeviceTokens = c.dispatch.badDeviceTokenHoldSeconds > 0
        // The store's one way to the dispatcher: told of each commit (rows handed off, queued
        // rows to claim), before the dispatcher starts and ingest opens.
        let channel = DispatchChannel()
        store.addCommitObserver(channel)
        let dispatcher = Dispatcher(store: store, transports: transports,
                                    options: DispatcherOptions(maxInflight: c.dispatch.maxInflight, claimBatch: c.dispatch.claimBatch, policy: policy,
                                                               pause: PauseSchedule(baseMillis: Int64(c.dispatch.pauseProbeBaseMillis),
                                                                                    capMillis: Int64(c.dispatch.pauseProbeCapMillis))),
                                    channel: channel, metrics: metrics, logger: logger)
        let grace = Duration.milliseconds(c.dispatch.shutdownGraceMillis)
        try running.start(dispatcher, grace: grace)
        self.dispatcher = dispatcher
        let retention = RetentionSweeper(store: store, policy: c.store.retention, logger: logger)
        try running.start(retention)
        self.retention = retention
        // Delivery events to the configured webhooks (docs/events.md): the sender's own thread,
        // stopped before the store closes; woken by each commit that wrote events (its idle poll
        // finds other nodes' events).
        if !c.events.webhooks.isEmpty {
            // Secret file errors name their key (events.webhooks[i].secretFile) already.
            let sender = try WebhookSender(configuration: c, outbox: store, metrics: webhookMetrics, logger: logger)
            store.addCommitObserver(sender)
            try naming("events.webhooks") { try running.start(sender, grace: .seconds(2)) }
        }
        return transports.count == c.apps.count
    }

    /// The ingest listener and its service.
    private func startIngest(_ c: RelayConfig, store: any OutboxStore) throws {
        let workers = WorkerPool(name: "relay-reader", threads: 2)
        running.adopt(StopAction { _ in workers.close() })

        var settings = IngestSettings()
        settings.limits = IngestLimits(maxBodyBytes: c.ingest.maxBodyBytes)
        settings.perCredential = c.ingest.perCredential
        settings.perPushToken = c.ingest.perPushToken
        settings.authFailuresPerAddress = c.ingest.authFailuresPerAddress
        let ingest = IngestService(store: store, settings: settings, metrics: metrics, logger: logger, workers: workers)

        var limits = HTTPLimits()
        // Twice the ingest limit: bodies just over it get the API's JSON 413 naming the field;
        // far larger ones are cut off by the server before being buffered.
        limits.maxBodyBytes = c.ingest.maxBodyBytes * 2
        // Below the open-file limit, so the admin listener, APNs and the database keep working
        // when ingest is full (OpenFileLimit.swift).
        let openFiles = OpenFileLimit.raiseToHard()
        let reserved = OpenFileLimit.reserved(loopThreads: c.ingest.loopThreads, apnsConnections: c.dispatch.connectionsPerApp * c.apps.count)
        limits.maxConnections = OpenFileLimit.ingestConnections(configured: c.ingest.maxConnections, limit: openFiles, reserved: reserved)
        limits.maxConnectionsPerAddress = c.ingest.maxConnectionsPerAddress
        // Answers are small: a fixed kernel send buffer (128 KiB once doubled) instead of
        // autotuning up to 4 MiB per connection whose peer does not read (docs/threat_model.md).
        limits.socketSendBufferBytes = 64 << 10
        if limits.maxConnections < c.ingest.maxConnections {
            logger.warning("open-file limit below ingest.maxConnections: accepting fewer connections",
                           ["ingest.maxConnections": c.ingest.maxConnections, "open_file_limit": openFiles ?? 0,
                            "accepting": limits.maxConnections, "reserved": reserved,
                            "fix": "raise LimitNOFILE (ulimit -n) above ingest.maxConnections + \(reserved), or lower ingest.maxConnections"])
        }
        // With a client CA every client must present a certificate it issued (no optional mode:
        // docs/configuration.md, listen.tls.clientCA).
        let tls = c.listen.tls.map {
            TLSConfiguration(certificatePath: $0.certificatePath, privateKeyPath: $0.privateKeyPath,
                             clientCAPath: $0.clientCAPath, requireClientCertificate: $0.clientCAPath != nil)
        }
        var serverConfig = HTTPServerConfiguration(host: c.listen.host, port: c.listen.port, tls: tls)
        serverConfig.limits = limits
        if c.listen.proxyProtocol {
            // RelayConfig checked every entry and that there is at least one.
            serverConfig.proxyProtocol = ProxyProtocolConfiguration(trustedProxies: c.ingest.trustedProxies.compactMap(IPNetwork.init))
        }
        serverConfig.loopThreads = c.ingest.loopThreads
        serverConfig.errorResponse = HTTPGlue.errorResponse(maxBodyBytes: c.ingest.maxBodyBytes)
        // Authentication and the credential's bucket before `100 Continue` invites the body.
        serverConfig.continueCheck = HTTPGlue.continueCheck { ingest.continueCheck($0, $1) }
        serverConfig.onAcceptError = { [logger] message in logger.error("ingest listener: \(message)") }
        let ingestServer = try naming("listen") { try HTTPServer(configuration: serverConfig, handler: HTTPGlue.handler { ingest.handle($0, respond: $1) }) }
        try naming("listen") { try running.start(ingestServer, grace: .milliseconds(c.dispatch.shutdownGraceMillis)) }
        self.ingestServer = ingestServer
    }

    /// The admin listener (/readyz, /metrics) on its own thread.
    private func startAdmin(_ c: RelayConfig, store: any OutboxStore, credentialsLoaded: Bool) throws {
        guard c.adminEnabled else { return }
        // The admin listener's own thread for /readyz and /metrics (never the ingest readers).
        let adminWorkers = WorkerPool(name: "relay-admin", threads: 1)
        running.adopt(StopAction { _ in adminWorkers.close() })
        let admin = AdminService(
            store: store, metrics: metrics, workers: adminWorkers,
            readiness: { [weak dispatcher = self.dispatcher] in
                ["dispatcher_running": dispatcher?.isRunning ?? false, "apns_credentials_loaded": credentialsLoaded]
            },
            paused: { [weak dispatcher = self.dispatcher] in dispatcher?.paused ?? [:] },
            extraMetrics: { [weak self] r in self?.collectMetrics(into: &r) })
        var adminConfig = HTTPServerConfiguration(host: c.admin.host, port: c.admin.port)
        adminConfig.limits.maxBodyBytes = 1024
        adminConfig.limits.maxConnections = OpenFileLimit.adminConnections
        adminConfig.errorResponse = HTTPGlue.errorResponse(maxBodyBytes: 1024)
        adminConfig.onAcceptError = { [logger] message in logger.error("admin listener: \(message)") }
        let adminServer = try naming("admin") { try HTTPServer(configuration: adminConfig, handler: HTTPGlue.handler { request, respond in admin.handle(request) { respond(.now($0)) } }) }
        try naming("admin") { try running.start(adminServer, grace: .seconds(1)) }
        self.adminServer = adminServer
    }

    /// A start-up failure, prefixed with the config key it comes from: "admin: libuv bind
    /// 127.0.0.1:9090: Address already in use" tells the operator which listener (or store, or
    /// app) to look at.
    struct StartupError: Error, CustomStringConvertible {
        var key: String
        var underlying: any Error
        var description: String { "\(key): \(underlying)" }
    }

    private func naming<T>(_ key: String, _ body: () throws -> T) throws -> T {
        do { return try body() } catch { throw StartupError(key: key, underlying: error) }
    }

    private func collectMetrics(into r: inout PrometheusRegistry) {
        var listeners: [(name: String, metrics: HTTPServerMetrics)] = []
        if let s = ingestServer { listeners.append(("ingest", s.metrics)) }
        if let s = adminServer { listeners.append(("admin", s.metrics)) }
        r.collectHTTP(listeners)
        webhookMetrics.collect(into: &r)
        let created = store?.eventsCreated.counts ?? [:]
        r.declare("relay_events_created_total", .counter,
                  help: "Delivery events this process committed with their outcomes, by type (docs/events.md); every type exported, zeros included.")
        for type in EventType.allCases { r.sample("relay_events_created_total", ["type": type.rawValue], created[type] ?? 0) }
        // Exported without TLS too (zeros), so one alert rule covers every node.
        let t = tlsReloads.withLock { $0 }
        r.declare("relay_tls_reloads_total", .counter,
                  help: "SIGHUP reloads of the ingest certificate, by result (failed: the previous one is still served).")
        r.sample("relay_tls_reloads_total", ["result": "ok"], t.ok)
        r.sample("relay_tls_reloads_total", ["result": "failed"], t.failed)
        let a = apnsReloads.withLock { $0 }
        r.declare("relay_apns_credential_reloads_total", .counter,
                  help: "SIGHUP reloads of an app's changed APNs key files, by result (failed: the previous client is still used).")
        r.sample("relay_apns_credential_reloads_total", ["result": "ok"], a.ok)
        r.sample("relay_apns_credential_reloads_total", ["result": "failed"], a.failed)
        r.counter("relay_log_dropped_total",
                  help: "Log lines dropped because stderr did not keep up (the queue to it held 4 MiB or 16,384 lines); the log says how many at each gap.",
                  logger.droppedLines)
        PushClientTransport.collectTokenMetrics(into: &r)
        PushClientTransport.collectAnswerWaitMetrics(into: &r)
        dispatcher?.collectPauseMetrics(into: &r)
        if let store, let w = OutboxStores.writerStats(store) {
            r.counter("relay_store_commits_total", help: "Group-commit transactions committed.", w.batches)
            r.counter("relay_store_jobs_total", help: "Jobs (ingests and dispatcher writes) committed.", w.jobs)
        }
        if let store { OutboxStores.collectDiskMetrics(store, retention: retention, into: &r) }
        if let p = store as? PostgresOutboxStore {
            r.gauge("relay_postgres_clock_offset_seconds",
                    help: "The database's clock minus this node's, last measured (at connect and at each claim); past store.maxClockOffsetSeconds the node claims nothing.",
                    p.clockOffsetSeconds)
        }
        if let s = store as? SQLiteOutboxStore {
            // Against wall-clock time: the share of it the single writer spends in transactions.
            r.counter("relay_store_transaction_seconds_total",
                      help: "Time the SQLite writer spent in transactions, BEGIN to the end of COMMIT (its fsync included).",
                      Double(s.writerTransactionMicros) / 1e6)
            s.collectCheckpointMetrics(into: &r)
        }
    }

    /// The drain: stop taking requests (in-flight HTTP requests still complete, and their rows
    /// commit before their 202), then let in-flight pushes finish or return to queued, then
    /// close the database, then write out the log queue (at most 2 s). Safe to call more than once.
    public func stop() {
        stopLock.lock()
        defer { stopLock.unlock() }
        guard !stopped else { return }
        stopped = true
        SystemdNotifier.notify("STOPPING=1\nSTATUS=draining")
        logger.info("draining")
        running.stopAll()
        // The last lines ("stopped") reach stderr before the process exits; a stderr nobody
        // reads gets 2 s, not a hung stop.
        logger.flush(timeout: .seconds(2))
    }

    /// SIGHUP: re-reads the ingest certificate, private key and client CA, and each app's APNs
    /// key files (.p8, or certificate, key and passphrase) and caFile, from the paths the config named at
    /// start. New ingest connections get the new certificate; open ones keep theirs. An app whose
    /// files changed gets a new APNs client (new connections, a new JWT); the old one finishes
    /// what it has in flight. If a file does not load, the running certificate or client stays
    /// and the log says why. Other config changes (key IDs included) still need a restart.
    public func reload() {
        stopLock.lock()
        defer { stopLock.unlock() }
        guard !stopped, let server = ingestServer else { return }
        SystemdNotifier.notify("RELOADING=1\nMONOTONIC_USEC=\(monotonicMicros())\nSTATUS=reloading certificates and keys")
        reloadAPNsCredentials()
        do {
            if let cert = try server.reloadTLS() {
                tlsReloads.withLock { $0.ok += 1 }
                logger.info("TLS certificate reloaded", ["subject": cert.subject, "not_after": cert.notAfter])
            } else {
                logger.info("reload: the ingest listener has no TLS, nothing to reload")
            }
        } catch {
            tlsReloads.withLock { $0.failed += 1 }
            logger.error("TLS reload failed: still serving the previous certificate", ["error": "\(error)"])
        }
        SystemdNotifier.notify("READY=1\nSTATUS=accepting responses on \(config.listen.host):\(ingestPort)")
    }

    /// Rebuilds the APNs client of each app whose key files changed since they were loaded.
    /// Unchanged files leave the app's connections alone (a HUP for the ingest certificate
    /// must not reconnect to APNs). Under stopLock.
    private func reloadAPNsCredentials() {
        for (i, app) in config.apps.enumerated() {
            let fingerprint = Self.credentialFingerprint(app)
            guard fingerprint == nil || fingerprint != appTransports[i].fingerprint else { continue }
            do {
                let fresh = try makeTransport(app, config)
                let old = appTransports[i].transport.replace(with: fresh)
                appTransports[i].fingerprint = fingerprint
                // Pushes still in the old client get its shutdown grace (at most 2 s), then
                // complete as transport failures and are retried through the new one.
                old.shutdown()
                apnsReloads.withLock { $0.ok += 1 }
                logger.info("APNs credentials reloaded", ["app": app.bundleID])
                // New key files: a pause for the old ones ends now (the first answer re-pauses
                // if they are still refused).
                dispatcher?.resume(app: app.bundleID)
            } catch {
                apnsReloads.withLock { $0.failed += 1 }
                logger.error("APNs credentials reload failed: still using the previous ones",
                             ["app": app.bundleID, "key": "apps[\(i)]", "error": "\(error)"])
            }
        }
    }

    /// SHA-256 over the app's credential files' contents, nil if one cannot be read.
    static func credentialFingerprint(_ app: RelayConfig.App) -> [UInt8]? {
        var paths: [String]
        switch app.credentials {
        case .token(let p8, _, _): paths = [p8]
        case .certificate(let cert, let key, let passphrase): paths = [cert, key] + (passphrase.map { [$0] } ?? [])
        }
        if let ca = app.caFile { paths.append(ca) }
        var all: [UInt8] = []
        for p in paths {
            guard let data = FileManager.default.contents(atPath: p) else { return nil }
            all += RelayCrypto.sha256(data)
        }
        return RelayCrypto.sha256(all)
    }

    /// Blocks the calling thread until SIGTERM or SIGINT, then drains; SIGHUP reloads the
    /// certificate (`reload()`) and keeps running. Returns the exit status.
    public func runUntilSignal() -> Int32 {
        let received = DispatchSemaphore(value: 0)
        let queue = DispatchQueue(label: "relay-signals")
        var sources: [DispatchSourceSignal] = []
        for (sig, name) in [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT"), (SIGHUP, "SIGHUP")] {
            signal(sig, SIG_IGN)  // let the dispatch source see it instead of the default action
            let s = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            s.setEventHandler { [logger, weak self] in
                logger.info("signal received", ["signal": name])
                if sig == SIGHUP { self?.reload() } else { received.signal() }
            }
            s.resume()
            sources.append(s)
        }
        received.wait()
        stop()
        for s in sources { s.cancel() }
        return 0
    }
}

/// The dispatcher's start (recover inflight rows, start its thread) and stop(grace:) (drain)
/// are the lifecycle's.
extension Dispatcher: Lifecycle {}

/// One app's APNs transport behind a lock, so a reload can swap in a client built from renewed
/// key files while the dispatcher keeps its reference. A push that raced the swap and reached
/// the old client after its shutdown completes as a transport failure and is retried.
final class SwappableTransport: PushTransport {
    private let current: Mutex<any PushTransport>

    init(_ transport: any PushTransport) { current = Mutex(transport) }

    func send(_ row: OutboxRow, completion: @escaping @Sendable (PushAnswer) -> Void) {
        current.withLock { $0 }.send(row, completion: completion)
    }

    func shutdown() { current.withLock { $0 }.shutdown() }

    /// Returns the transport it replaced (still running: the caller shuts it down).
    func replace(with transport: any PushTransport) -> any PushTransport {
        current.withLock { t in
            let old = t
            t = transport
            return old
        }
    }
}
