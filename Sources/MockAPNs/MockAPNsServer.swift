// The running mock: an HTTP/2 (TLS or h2c) server answering like APNs, and an HTTP/1.1 control
// server on loopback. Per request: validate -> faults -> verify -> record -> answer.
import Foundation
import HTTPServer
import POSIXThreads
import Synchronization

/// Per-connection bookkeeping (APNs binds auth state and stream limits to the connection).
struct ConnectionState {
    var auth = ConnectionAuthState()
    var streams = 0
    var streamsGranted = false
    /// Error answers other than 410 (APNs drops connections that produce too many).
    var errors = 0
    /// A GOAWAY was already requested on this connection (one frame per connection is sent).
    var goAwaySent = false
}

/// The request path, shared by every loop thread. All mutable state sits behind Mutexes.
final class MockCore: Sendable {
    let configuration: MockAPNsConfiguration
    let recorder: DeliveryRecorder
    let verifier: TrafficVerifier
    private let baseValidator: RequestValidator
    private let tokenAuth: Bool
    private let faults: Mutex<FaultPlan>
    private let connections = Mutex<[UInt64: ConnectionState]>([:])
    private let stats = Mutex(MockStats())
    private let tokenCache = Mutex<[String: Result<ProviderTokenClaims, ProviderTokenFailure>]>([:])
    /// Serial on purpose: a labelled serial queue targets libdispatch's overcommitting pool, which
    /// adds a thread when its threads block; a concurrent one shares the ncpu-wide pool, where a
    /// busy process (the test runner on 2 cores) held delayed answers back by seconds.
    private let delayQueue = DispatchQueue(label: "mock-apns.latency")

    init(configuration: MockAPNsConfiguration) throws {
        self.configuration = configuration
        recorder = try DeliveryRecorder(logPath: configuration.deliveriesLogPath)
        verifier = TrafficVerifier(rootSecrets: configuration.rootSecrets)
        tokenAuth = !configuration.tokenKeys.isEmpty
        var validator = RequestValidator(allowedBundleIDs: Set(configuration.allowedBundleIDs),
                                         tokenVerifier: tokenAuth ? ProviderTokenVerifier(keys: configuration.tokenKeys) : nil)
        validator.tokenUpdateInterval = configuration.tokenUpdateInterval
        baseValidator = validator
        faults = Mutex(configuration.faults)
    }

    /// APNs grants one stream until a request with a valid token succeeded.
    var initialMaxConcurrentStreams: UInt32 { tokenAuth ? configuration.initialMaxConcurrentStreams : configuration.maxConcurrentStreams }

    var faultPlan: FaultPlan {
        get { faults.withLock { $0 } }
    }

    func setFaults(_ plan: FaultPlan) { faults.withLock { $0 = plan } }

    func reset() {
        recorder.reset()
        verifier.reset()
        stats.withLock { $0 = MockStats() }
    }

    var statsSnapshot: MockStats { stats.withLock { $0 } }

    /// Connection-start faults, asked by the server for every accepted connection.
    func admission() -> HTTPAdmission {
        switch faultPlan.connectionStart(random: configuration.random) {
        case .none: return .serve
        case .refuse:
            stats.withLock { $0.connectionsRefused += 1 }
            return .close
        case .stallHandshake:
            stats.withLock { $0.handshakesStalled += 1 }
            return .stall
        case .goAwayBeforeFirstStream:
            stats.withLock { $0.goAwaysBeforeFirstStream += 1 }
            return .goAwayAtStart
        }
    }

    // MARK: The APNs request path

    func handle(_ request: HTTPRequest, _ writer: HTTPReplyWriter) {
        guard request.version == .http2 else {
            refuseHTTP1(writer)
            return
        }
        let now = configuration.clock()
        let plan = faultPlan
        let seen = validate(request, plan: plan, now: now)
        let (response, decision, accepted) = answer(to: seen.result, plan: plan, now: now)
        if let push = accepted { record(push, request, now: now) }
        let connectionFault = account(request, response, decision, plan: plan, seen: seen)
        if configuration.verbose {
            log("\(request.method) \(request.path) conn=\(request.connectionID) stream=\(request.streamID) -> "
                + (decision.stall ? "stall" : decision.abort ? "abort" : "\(response.status) \(reasonOf(response))"))
        }
        send(response, decision, connectionFault, grantStreams: seen.grantStreams, writer)
    }

    /// APNs is HTTP/2 only; a client that works here over HTTP/1.1 would fail there.
    private func refuseHTTP1(_ writer: HTTPReplyWriter) {
        let rejection = Rejection(status: 505, reason: "HTTPVersionNotSupported", detail: "APNs speaks HTTP/2 only")
        stats.withLock { $0.requests += 1; $0.byStatusReason["505 HTTPVersionNotSupported", default: 0] += 1 }
        writer.respond(HTTPReply(status: 505, headers: HTTPHeaders([("content-type", "application/json")]),
                                       body: rejection.body()), then: .goAway)
    }

    /// What validation said about one request, with the connection facts it changed.
    private struct Validated {
        var result: ValidationResult
        var streamNumber: Int
        var grantStreams: Bool
        var isNewConnection: Bool
    }

    /// Validation and per-connection state change together under the connection lock.
    private func validate(_ request: HTTPRequest, plan: FaultPlan, now: Date) -> Validated {
        let nowSeconds = Int64(now.timeIntervalSince1970.rounded(.down))
        var validator = baseValidator
        validator.expireTokensIssuedBefore = plan.expireTokensIssuedBefore
        let tokenVerifier = validator.tokenVerifier
        validator.checkTokenShape = { [self] token in cachedTokenShape(token, tokenVerifier) }
        return connections.withLock { all in
            let isNew = all[request.connectionID] == nil
            var state = all[request.connectionID] ?? ConnectionState()
            let headers = request.headers.map { ($0.name, $0.value) }
            let result = validator.validate(method: request.method, path: request.path, headers: headers,
                                            body: request.body, connection: &state.auth, now: nowSeconds,
                                            clientCertificateSubject: request.tls?.peerCertificateSubject)
            state.streams += 1
            var grant = false
            if case .accepted = result, !state.streamsGranted {
                state.streamsGranted = true
                grant = tokenAuth && configuration.initialMaxConcurrentStreams < configuration.maxConcurrentStreams
            }
            all[request.connectionID] = state
            if isNew, all.count > 20_000 {
                // No close callback: forget the oldest half (connection IDs only grow).
                let cutoff = all.keys.sorted()[all.count / 2]
                all = all.filter { $0.key >= cutoff }
            }
            return Validated(result: result, streamNumber: state.streams, grantStreams: grant, isNewConnection: isNew)
        }
    }

    /// The response APNs would give, after the fault plan had its say; the push when accepted.
    private func answer(to result: ValidationResult, plan: FaultPlan, now: Date)
        -> (HTTPReply, FaultDecision, AcceptedPush?) {
        switch result {
        case .rejected(let rejection, let apnsID):
            return (errorResponse(rejection, apnsID: apnsID), .none, nil)
        case .accepted(let push):
            let decision = plan.decide(deviceToken: push.deviceToken, nowMs: Int64(now.timeIntervalSince1970 * 1000),
                                       random: configuration.random)
            if let rejection = decision.rejection {
                return (errorResponse(rejection, apnsID: push.apnsID), decision, nil)
            }
            if decision.stall || decision.abort {
                return (HTTPReply(status: 0), decision, nil)  // never sent; such a push is not recorded either
            }
            var headers = HTTPHeaders([("apns-id", push.apnsID)])
            if configuration.sandbox { headers.add("apns-unique-id", lowercaseString(randomUUID())) }
            return (HTTPReply(status: 200, headers: headers), decision, push)
        }
    }

    /// An accepted push: decrypted as the iPhone would, recorded, counted.
    private func record(_ push: AcceptedPush, _ request: HTTPRequest, now: Date) {
        let verification = push.accessory.map(verifier.verify) ?? .notApplicable
        recorder.record(MockDelivery(push: push, verification: verification, receivedAt: now,
                                     connectionID: request.connectionID, streamID: request.streamID))
        stats.withLock { s in
            s.accepted += 1
            if verification.verified == true { s.verified += 1 }
            if verification.verified == false { s.verifyFailed += 1 }
        }
    }

    /// Counts the request and decides the connection-level fault that follows it.
    private func account(_ request: HTTPRequest, _ response: HTTPReply, _ decision: FaultDecision, plan: FaultPlan,
                         seen: Validated) -> ConnectionFault {
        var errorNumber = 0
        if plan.countsErrors, !decision.stall, !decision.abort, response.status >= 400, response.status != 410 {
            errorNumber = connections.withLock { all in
                all[request.connectionID]?.errors += 1
                return all[request.connectionID]?.errors ?? 0
            }
        }
        let connectionFault = plan.connectionFault(afterStream: seen.streamNumber, errors: errorNumber)
        let firstGoAway = connectionFault == .goAway && connections.withLock { all in
            let first = all[request.connectionID].map { !$0.goAwaySent } ?? false
            all[request.connectionID]?.goAwaySent = true
            return first
        }
        stats.withLock { s in
            s.requests += 1
            if seen.isNewConnection { s.connectionsSeen += 1 }
            if decision.stall {
                s.stalled += 1
            } else if decision.abort {
                s.aborted += 1
            } else {
                let reason = response.status == 200 ? "200" : "\(response.status) \(reasonOf(response))"
                s.byStatusReason[reason, default: 0] += 1
                if firstGoAway { s.goAwaysSent += 1 }
                if connectionFault == .close { s.connectionsClosed += 1 }
            }
        }
        return connectionFault
    }

    /// Answers now or after the injected latency; a stalled stream is never answered, and
    /// GOAWAY/close faults still apply to later streams.
    private func send(_ response: HTTPReply, _ decision: FaultDecision, _ connectionFault: ConnectionFault,
                      grantStreams: Bool, _ writer: HTTPReplyWriter) {
        if decision.stall { return }
        if decision.abort {
            writer.abortConnection()
            return
        }
        let action: ConnectionAction = switch connectionFault {
        case .none: .keep
        case .goAway: .goAway
        case .close: .close
        }
        // APNs raises MAX_CONCURRENT_STREAMS after the first success, so the SETTINGS frame
        // follows the response.
        let raiseTo: UInt32? = grantStreams ? configuration.maxConcurrentStreams : nil
        if decision.latencyMs > 0 {
            delayQueue.asyncAfter(deadline: .now() + .milliseconds(decision.latencyMs)) {
                writer.respond(response, then: action)
                if let raiseTo { writer.setMaxConcurrentStreams(raiseTo) }
            }
        } else {
            writer.respond(response, then: action)
            if let raiseTo { writer.setMaxConcurrentStreams(raiseTo) }
        }
    }

    /// Signature checks cost ~100 µs; clients reuse one token for up to an hour.
    private func cachedTokenShape(_ token: String, _ verifier: ProviderTokenVerifier?) -> Result<ProviderTokenClaims, ProviderTokenFailure> {
        if let cached = tokenCache.withLock({ $0[token] }) { return cached }
        let result = verifier?.verifySignatureAndShape(token: token) ?? .failure(.invalid("token auth off"))
        tokenCache.withLock { cache in
            if cache.count >= 4096 { cache.removeAll() }  // bounded; tokens live an hour at most
            cache[token] = result
        }
        return result
    }

    private func errorResponse(_ rejection: Rejection, apnsID: String) -> HTTPReply {
        HTTPReply(status: rejection.status,
                     headers: HTTPHeaders([("apns-id", apnsID), ("content-type", "application/json")]),
                     body: rejection.body())
    }

    private func reasonOf(_ response: HTTPReply) -> String {
        guard response.status != 200,
              let object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any],
              let reason = object["reason"] as? String else { return "" }
        return reason
    }
}

func log(_ message: String) {
    let line = "mock-apns: \(message)\n"
    FileHandle.standardError.write(Data(line.utf8))
}

/// The in-process mock. Start it, point a client at `https://127.0.0.1:<port>` with
/// `caCertificatePath` as its CA, read `deliveries`, shut it down.
public final class MockAPNsServer: Lifecycle {
    private let core: MockCore
    private let apns: HTTPServer
    private let control: HTTPServer?
    private let temporaryDirectory: String?
    /// The CA to trust (generated TLS only): the configured `caOutputPath`, or a temp file.
    public let caCertificatePath: String?

    public init(configuration: MockAPNsConfiguration) throws {
        let core = try MockCore(configuration: configuration)
        self.core = core

        var tls: TLSConfiguration?
        var temporary: String?
        var caPath: String?
        switch configuration.tls {
        case .cleartextH2:
            tls = nil
        case .files(let cert, let key):
            tls = TLSConfiguration(certificatePath: cert, privateKeyPath: key, clientCAPath: configuration.clientCAPath, alpn: ["h2"])
        case .generate(let caOutputPath):
            let client = configuration.generatedClientCertificate
            let material = try GeneratedTLSMaterial.generate(fault: configuration.tlsFault, clientBundleID: client?.bundleID)
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("mock-apns-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            temporary = dir
            let certPath = dir + "/server.pem", keyPath = dir + "/server.key"
            try write(material.serverCertificatePEM, to: certPath, mode: 0o644)
            try write(material.serverPrivateKeyPEM, to: keyPath, mode: 0o600)
            caPath = caOutputPath ?? dir + "/ca.pem"
            try write(material.caCertificatePEM, to: caPath!, mode: 0o644)
            if let client, let cert = material.clientCertificatePEM, let key = material.clientPrivateKeyPEM {
                try write(cert, to: client.certificatePath, mode: 0o644)
                try write(key, to: client.privateKeyPath, mode: 0o600)
            }
            // Clients without a certificate are still welcome (token auth): request, not require.
            tls = TLSConfiguration(certificatePath: certPath, privateKeyPath: keyPath,
                                   clientCAPath: client != nil ? caPath : configuration.clientCAPath, alpn: ["h2"])
        }
        temporaryDirectory = temporary
        caCertificatePath = caPath

        var http2 = HTTP2Settings()
        http2.maxConcurrentStreams = core.initialMaxConcurrentStreams
        // Every stream the mock grants may wait for a late answer (latency faults): refusing
        // them past HTTPServer's default of 100 unanswered would be a limit APNs does not have.
        http2.maxUnansweredRequests = Int(max(configuration.maxConcurrentStreams, core.initialMaxConcurrentStreams))
        var limits = HTTPLimits()
        // Bodies up to 64 KiB reach the validator, so oversize pushes get APNs' 413 PayloadTooLarge.
        limits.maxBodyBytes = 64 * 1024
        limits.maxRequestsPerConnection = Int.max
        limits.idleTimeout = .seconds(3600)
        var apnsConfiguration = HTTPServerConfiguration(host: configuration.host, port: configuration.port, tls: tls,
                                                        cleartextHTTP2: true, http2: http2, limits: limits,
                                                        loopThreads: configuration.loopThreads)
        apnsConfiguration.admission = { core.admission() }
        let apnsServer = try HTTPServer(configuration: apnsConfiguration) { request, writer in
            core.handle(request, writer)
        }
        apns = apnsServer
        if let controlPort = configuration.controlPort {
            let api = ControlAPI(core: core, metrics: { apnsServer.metrics })
            control = try HTTPServer(configuration: HTTPServerConfiguration(host: configuration.controlHost, port: controlPort,
                                                                            tls: nil, cleartextHTTP2: false)) { request, writer in
                api.handle(request, writer)
            }
        } else {
            control = nil
        }
    }

    public func start() throws {
        try apns.start()
        do { try control?.start() } catch {
            apns.stop(grace: .zero)
            throw error
        }
    }

    public var port: Int { apns.localPort }
    /// 0 when the control server is off.
    public var controlPort: Int { control?.localPort ?? 0 }
    public var deliveries: [MockDelivery] { core.recorder.deliveries }
    public var stats: MockStats { core.statsSnapshot }
    /// TCP connections accepted so far, whatever became of them (TLS failures included).
    public var connectionsAccepted: Int { apns.metrics.connectionsTotal }
    public var tlsHandshakeFailures: Int { apns.metrics.tlsHandshakeFailures }
    public var faults: FaultPlan {
        get { core.faultPlan }
    }
    public func setFaults(_ plan: FaultPlan) { core.setFaults(plan) }
    /// Clears deliveries, counters and receiving ratchets (faults stay).
    public func reset() { core.reset() }

    /// Stops both servers (stalled streams are cut after `grace`), flushes the log, and
    /// removes generated key material (and the CA, unless it was written to `caOutputPath`).
    public func stop(grace: Duration = .seconds(1)) {
        control?.stop(grace: .zero)
        apns.stop(grace: grace)
        core.recorder.flush()
        if let temporaryDirectory { try? FileManager.default.removeItem(atPath: temporaryDirectory) }
    }
}

private func write(_ text: String, to path: String, mode: Int) throws {
    // Created with its final mode (the private key is never world-readable, even briefly).
    try? FileManager.default.removeItem(atPath: path)
    guard FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: mode]) else {
        throw MockConfigurationError("cannot write \(path)")
    }
}
