// PushClient as the dispatcher's PushTransport: builds the APNs request for an outbox row
// (apns-id = the row id, so a retry after a crash reuses it) and sorts the answer with
// PushClient's own `classify`.
import FoundationEssentials
import PushClient

/// How PushClient words a transport failure caused by the signing key (Requests.swift).
let signingFailurePrefix = "cannot sign provider token"

public final class PushClientTransport: PushTransport {
    private let client: PushClient
    private let bundleID: String
    /// The key or certificate files, named when they turn out unusable (a pause's log line).
    private let credentialFiles: String

    public init(client: PushClient, bundleID: String, credentialFiles: String = "") {
        self.client = client
        self.bundleID = bundleID
        self.credentialFiles = credentialFiles
    }

    /// One PushClient (its own connections) per configured app; the provider token comes from
    /// `tokens` (process-wide by default: one JWT per team and key, kept across reloads).
    public static func make(app: RelayConfig.App, config: RelayConfig, tokens: TokenRegistry = .shared) throws -> any PushTransport {
        let env: APNsEnvironment
        switch app.environment {
        case .production: env = .production
        case .sandbox: env = .sandbox
        case .custom(let url): env = .custom(url: url)
        }
        let creds: APNsCredentials
        switch app.credentials {
        case .token(let p8, let keyID, let teamID):
            creds = .token(try TokenKey(p8Path: p8, keyID: keyID, teamID: teamID))
        case .certificate(let cert, let key, let passFile):
            var pass: String?
            if let passFile {
                guard let d = FileManager.default.contents(atPath: passFile) else {
                    throw ConfigError(key: "apps[\(app.bundleID)].certificate.passphraseFile", message: "cannot read \(passFile)")
                }
                pass = ASCII.trimLines(String(decoding: d, as: UTF8.self))
            }
            creds = .certificate(certificatePath: cert, privateKeyPath: key, passphrase: pass)
        }
        var pc = PushClientConfiguration(environment: env, credentials: creds)
        pc.caFile = app.caFile
        pc.connections = config.dispatch.connectionsPerApp
        pc.connectionPacing.maxNewConnections = config.dispatch.maxNewConnectionsPerMinute
        pc.requestTimeout = .milliseconds(config.dispatch.requestTimeoutMillis)
        pc.answerWaitCap = .milliseconds(config.dispatch.maxAnswerWaitMillis)
        pc.queueWaitCap = .milliseconds(config.dispatch.maxQueueWaitMillis)
        pc.tokenRegistry = tokens
        let files: String
        switch app.credentials {
        case .token(let p8, _, _): files = p8
        case .certificate(let cert, let key, _): files = cert == key ? cert : cert + ", " + key
        }
        return PushClientTransport(client: try PushClient(configuration: pc), bundleID: app.bundleID, credentialFiles: files)
    }

    /// relay_apns_provider_tokens_minted_total{team}: JWTs this process signed (docs/pushclient.md).
    static func collectTokenMetrics(into r: inout PrometheusRegistry, tokens: TokenRegistry = .shared) {
        r.declare("relay_apns_provider_tokens_minted_total", .counter,
                  help: "APNs provider tokens (JWTs) signed by this process, by team ID. Apple advises at most one per 20 minutes per team.")
        for (team, n) in tokens.mintedByTeam().sorted(by: { $0.key < $1.key }) {
            r.sample("relay_apns_provider_tokens_minted_total", ["team": team], n)
        }
    }

    /// How a slow APNs was waited for, process-wide (docs/operations.md): requests still
    /// unanswered at the request timeout on a live connection (awaited), answered after it
    /// (answered), failed at maxAnswerWaitMs (capped); and pushes failed unsent after maxQueueWaitMs.
    static func collectAnswerWaitMetrics(into r: inout PrometheusRegistry, counts: AnswerWaitCounts = .process) {
        r.declare("relay_apns_slow_answers_total", .counter,
                  help: "APNs requests still unanswered at dispatch.requestTimeoutMs on a connection that answers PING, by outcome: awaited (all of them), answered (the answer came later), capped (failed at dispatch.maxAnswerWaitMs).")
        r.sample("relay_apns_slow_answers_total", ["outcome": "awaited"], counts.awaitedPastTimeout)
        r.sample("relay_apns_slow_answers_total", ["outcome": "answered"], counts.answeredLate)
        r.sample("relay_apns_slow_answers_total", ["outcome": "capped"], counts.capped)
        r.counter("relay_apns_pushes_not_sent_total",
                  help: "Pushes that waited longer than dispatch.maxQueueWaitMs in the APNs client before any of them was written; retried with the back-off.",
                  counts.notSent)
    }

    /// TLS alerts a server sends about the client's certificate, as OpenSSL words them
    /// ("tlsv13 alert certificate required", "sslv3 alert certificate expired"). Only received
    /// alerts match: when we refuse the server's certificate OpenSSL says "certificate verify
    /// failed", which stays a transport failure (connection back-off).
    static let certificateAlerts = [" alert certificate required", " alert bad certificate", " alert certificate revoked",
                                    " alert certificate expired", " alert certificate unknown", " alert unknown ca",
                                    " alert unsupported certificate"]

    /// A transport failure that is about our credentials, not the network (pure; tested).
    static func isCredentialFailure(_ what: String) -> Bool {
        what.hasPrefix(signingFailurePrefix) || certificateAlerts.contains { what.contains($0) }
    }

    static func answer(_ result: PushResult, credentialFiles: String = "") -> PushAnswer {
        let cls: AnswerClass
        switch classify(result) {
        case .done: cls = .done
        case .terminal(let reason): cls = .terminal(reason.rawValue)
        case .refreshTokenAndReconnect: cls = .refreshTokenAndReconnect
        case .retryAfterDelay: cls = .retryAfterDelay
        case .backOff: cls = .backOff
        }
        switch result {
        case .delivered:
            return PushAnswer(status: 200, reason: nil, classification: cls)
        case .rejected(let status, let reason, let timestamp):
            return PushAnswer(status: status, reason: reason.rawValue,
                              apnsTimestamp: timestamp.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }, classification: cls)
        case .transportFailure(let what):
            // The key could not sign, or APNs refused our certificate in the handshake: a
            // credential problem no retry cures (PauseRule pauses the app, probes continue).
            if Self.isCredentialFailure(what) {
                return PushAnswer(status: nil, reason: "\(PauseRule.credentialFilePrefix): \(credentialFiles): \(what)", classification: cls)
            }
            return PushAnswer(status: nil, reason: what, classification: cls)
        }
    }

    public func send(_ row: OutboxRow, completion: @escaping @Sendable (PushAnswer) -> Void) {
        // The row's text goes to PushClient as it is (checked there, recased only if needed):
        // no UUID parse and format back per push.
        guard let session = try? SessionIdentifier(row.sessionIdentifier), let id = try? APNsID(row.id) else {
            completion(PushAnswer(status: nil, reason: "corrupt_row", classification: .terminal("corrupt_row")))
            return
        }
        let payload = AccessoryPayload(encryptedData: row.encryptedData, sessionIdentifier: session, keyID: row.keyID, messageIndex: row.messageIndex)
        // apns-expiration = the row's own expiry: APNs stops storing it when we would stop retrying.
        let request = PushRequest(deviceToken: row.pushToken, bundleID: bundleID, apnsID: id, payload: payload,
                                  expiration: Int(row.expiresAt / 1000))
        client.send(request) { [credentialFiles] in completion(Self.answer($0, credentialFiles: credentialFiles)) }
    }

    public func shutdown() { client.shutdown() }
}
