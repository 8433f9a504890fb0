// The ingest API as plain values: request in, response out through a completion. The HTTP
// server glue (HTTPGlue.swift) only converts types, so this file is the whole API and is unit
// tested without sockets. Order of checks for POST /v1/responses (docs/api.md):
//   401 (no/malformed/unknown/revoked bearer, from CredentialCache; 429 instead once the
//   address spent its failure budget) -> 429 credential -> 415/413/400 body -> 429 push token
//   (per app, charged only when the credential may send for the app) -> in one store
//   transaction: 401 revoked since (defence in depth), 400 unknown/ambiguous app, 403 scope,
//   200 duplicate, 410 unregistered / 400 bad_device_token marked token, 503 outbox bound, 202 after COMMIT.
import Basics
import FoundationEssentials
import Glibc
import HTTPServer
import POSIXThreads
import Synchronization

public struct IngestSettings: Sendable {
    public var limits = IngestLimits()
    public var perCredential = RateLimit(perSecond: 1000, burst: 2000)
    /// Per (app, push token): another app's traffic naming the token never spends this app's.
    public var perPushToken = RateLimit(perSecond: 10, burst: 20)
    /// Failed authentications (401) per client address (IPv4 address or IPv6 /64): once the
    /// bucket is empty, requests from there that fail authentication get 429 instead of 401
    /// until it refills. Requests that authenticate are never charged nor refused.
    public var authFailuresPerAddress = RateLimit(perSecond: 1, burst: 20)
    /// The same for an IPv6 /48 as a whole; nil: 16 times `authFailuresPerAddress`.
    public var authFailuresPerIPv6Slash48: RateLimit?
    /// Addresses (and /48s) whose failure budgets are remembered; past it the least recently
    /// charged is forgotten.
    public var authFailureAddresses = 100_000
    /// How long an in-memory copy of the credentials is trusted: a revocation by any process
    /// or node is refused within this time.
    public var credentialMaxAgeMicros: Int64 = 1_000_000
    /// Retry-After (seconds) sent with 503.
    public var unavailableRetryAfterSeconds = 5
    public init() {}
}

/// The push-token bucket's key.
struct AppPushToken: Hashable, Sendable {
    var app: String
    var pushToken: String

    // The token alone spreads the keys (hashing the app too is work for nothing); a token has
    // one key per app it is sent for, told apart by ==.
    func hash(into hasher: inout Hasher) { hasher.combine(pushToken) }
}

public final class IngestService: Sendable {
    private let store: any OutboxStore
    private let settings: IngestSettings
    // The credential's bucket is its own, the address budgets charge failed authentications
    // only; the push token is the one key several tenants can name, so its bucket is per app.
    private let credentialLimiter: RateLimiter<String>
    private let tokenLimiter: RateLimiter<AppPushToken>
    private let authFailureLimiter: RateLimiter<String>
    private let slash48AuthFailureLimiter: RateLimiter<String>
    private let credentials: CredentialCache
    let metrics: RelayMetrics
    let logger: RelayLogger
    private let workers: WorkerPool
    let feed: EventFeed

    public init(store: any OutboxStore, settings: IngestSettings, metrics: RelayMetrics, logger: RelayLogger,
                workers: WorkerPool) {
        self.store = store
        self.settings = settings
        self.credentialLimiter = RateLimiter(limit: settings.perCredential)
        self.tokenLimiter = RateLimiter(limit: settings.perPushToken)
        let perAddress = settings.authFailuresPerAddress
        self.authFailureLimiter = RateLimiter(limit: perAddress, maxKeys: settings.authFailureAddresses)
        self.slash48AuthFailureLimiter = RateLimiter(
            limit: settings.authFailuresPerIPv6Slash48 ?? RateLimit(perSecond: perAddress.perSecond * 16, burst: perAddress.burst * 16),
            maxKeys: settings.authFailureAddresses)
        self.credentials = CredentialCache(store: store, workers: workers, maxAgeMicros: settings.credentialMaxAgeMicros)
        self.metrics = metrics
        self.logger = logger
        self.workers = workers
        // Only PostgreSQL has other processes committing events (other nodes) to poll for.
        let feed = EventFeed(store: store, workers: workers, pollMillis: store is SQLiteOutboxStore ? nil : 1000)
        self.feed = feed
        store.addCommitObserver(feed)
        feed.prepare()
        credentials.prime()
    }

    /// A request in, a response out. Never blocks: `respond` runs once, on the caller's thread
    /// or, after storage work, on the store's writer or a worker thread.
    public func handle(_ request: APIRequest, respond: @escaping @Sendable (APIAnswer) -> Void) {
        let finish = Exchange(service: self, request: request, start: monotonicMicros(), respond: respond)
        if request.path == "/v1/responses" {
            guard request.method == "POST" else {
                return finish(APIReply(status: 405, headers: [("allow", "POST")], body: ClientError(status: 405, code: "method_not_allowed", field: nil, message: "use POST").jsonBody), nil)
            }
            post(request, finish)
        } else if request.path.hasPrefix("/v1/responses/") {
            guard request.method == "GET" || request.method == "HEAD" else {
                return finish(APIReply(status: 405, headers: [("allow", "GET, HEAD")], body: ClientError(status: 405, code: "method_not_allowed", field: nil, message: "use GET").jsonBody), nil)
            }
            get(request, id: String(request.path.dropFirst("/v1/responses/".count)), finish)
        } else if request.path == "/v1/events" {
            guard request.method == "GET" || request.method == "HEAD" else {
                return finish(APIReply(status: 405, headers: [("allow", "GET, HEAD")], body: ClientError(status: 405, code: "method_not_allowed", field: nil, message: "use GET").jsonBody), nil)
            }
            events(request, finish)
        } else {
            finish(.error(ClientError(status: 404, code: "not_found", field: nil, message: "no such endpoint")), nil)
        }
    }

    /// The rate-limit key of a peer address given as text: `PeerKey.text` (the IPv4 address,
    /// also IPv4-mapped, or the IPv6 /64), or the text itself when it is no address. Requests
    /// from HTTPServer carry the key already (`APIRequest.clientKey`).
    static func clientKey(_ remoteAddress: String) -> String {
        PeerKey(address: remoteAddress)?.text ?? remoteAddress
    }

    /// Where authentication left a request.
    private enum AuthenticationVerdict {
        case admitted(credentialID: String, apps: [String])
        /// Answered (401 or 429).
        case refused
        /// Wait for a credential read (`CredentialCache.afterRead`), then `resumed`; `charged`:
        /// one failure was taken from the address's budget, to be refunded if it authenticates.
        case pending(charged: Bool)
    }

    /// Authentication, before any other check or bucket: from memory in the usual case.
    private func admit(_ hash: [UInt8]?, _ finish: Exchange) -> AuthenticationVerdict {
        guard let hash else {
            refuseAuthentication(finish, "no bearer")
            return .refused
        }
        switch credentials.verdict(hash) {
        case .valid(let id, let apps):
            return .admitted(credentialID: id, apps: apps)
        case .invalid, .unavailable:
            refuseAuthentication(finish, "unknown or revoked")
            return .refused
        case .pending(let knownValid):
            // Charged on admission (refunded if it authenticates), so requests waiting together
            // cannot overrun the budget. With the budget spent a credential still waits for the
            // read (one created since the copy was read may not be locked out by its address's
            // failures), unless a read begun within the revocation bound already found its hash
            // unknown: repeated guesses of one secret cost no reads. Reads are coalesced, so
            // guesses of many secrets cost one read at a time, not one each.
            let charge = chargeAuthFailure(finish.clientKey)
            guard charge.allowed || knownValid || !credentials.recentlyAbsent(hash) else {
                tooManyAuthFailures(finish, retryAfterSeconds: charge.retryAfterSeconds)
                return .refused
            }
            return .pending(charged: charge.allowed)
        }
    }

    /// After the credential read a pending request waited for: the credential's id and apps, or
    /// nil when the request was answered.
    private func resumed(_ verdict: CredentialCache.Verdict, charged: Bool, _ finish: Exchange) -> (id: String, apps: [String])? {
        switch verdict {
        case .valid(let id, let apps):
            if charged { refundAuthFailure(finish.clientKey) }
            return (id, apps)
        case .invalid, .pending:
            if charged {
                finish(.error(Self.unauthorized, headers: Self.authenticateHeaders), "unknown or revoked")
            } else {
                refuseAuthentication(finish, "unknown or revoked")
            }
        case .unavailable:
            if charged { refundAuthFailure(finish.clientKey) }
            logger.limited(.error, "storage error reading credentials", ["request_id": finish.requestID])
            finish(.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "credentials could not be read; retry later"),
                          headers: [("retry-after", String(settings.unavailableRetryAfterSeconds))]), "storage")
        }
        return nil
    }

    /// 401, charged to the address's budget; 429 when that was already spent.
    private func refuseAuthentication(_ finish: Exchange, _ note: String) {
        let charge = chargeAuthFailure(finish.clientKey)
        guard charge.allowed else { return tooManyAuthFailures(finish, retryAfterSeconds: charge.retryAfterSeconds) }
        finish(.error(Self.unauthorized, headers: Self.authenticateHeaders), note)
    }

    private func tooManyAuthFailures(_ finish: Exchange, retryAfterSeconds: Int) {
        metrics.rateLimited(scope: "auth_failures")
        finish(.error(ClientError(status: 429, code: "too_many_auth_failures", field: "authorization",
                                  message: "too many failed authentications from this address"),
                      headers: [("retry-after", String(retryAfterSeconds))]), "auth failure rate")
    }

    /// Takes one failure from the address's budget and, for IPv6, from its /48's; not allowed
    /// (nothing taken) when either is spent.
    private func chargeAuthFailure(_ clientKey: String) -> (allowed: Bool, retryAfterSeconds: Int) {
        guard authFailureLimiter.limit.perSecond > 0 else { return (true, 0) }
        let now = monotonicMicros()
        let address = authFailureLimiter.take(clientKey, nowMicros: now)
        guard address.allowed, let site = PeerKey.slash48Text(ofKeyText: clientKey) else { return address }
        let wide = slash48AuthFailureLimiter.take(site, nowMicros: now)
        if !wide.allowed { authFailureLimiter.refund(clientKey) }
        return wide
    }

    private func refundAuthFailure(_ clientKey: String) {
        guard authFailureLimiter.limit.perSecond > 0 else { return }
        authFailureLimiter.refund(clientKey)
        if let site = PeerKey.slash48Text(ofKeyText: clientKey) { slash48AuthFailureLimiter.refund(site) }
    }

    static let authenticateHeaders = [("www-authenticate", "Bearer")]

    /// `{"id":"<id>","state":"queued"}` in one allocation, as the bytes that are sent (no
    /// String concatenation, no copy from a String into an array).
    static func queuedBody(id: String) -> [UInt8] {
        var id = id
        return id.withUTF8 { idBytes in
            let prefix: StaticString = #"{"id":""#
            let suffix: StaticString = #"","state":"queued"}"#
            let count = prefix.utf8CodeUnitCount + idBytes.count + suffix.utf8CodeUnitCount
            return [UInt8](unsafeUninitializedCapacity: count) { out, initialized in
                let o = out.baseAddress!
                o.initialize(from: prefix.utf8Start, count: prefix.utf8CodeUnitCount)
                if let id = idBytes.baseAddress { (o + prefix.utf8CodeUnitCount).initialize(from: id, count: idBytes.count) }
                (o + prefix.utf8CodeUnitCount + idBytes.count).initialize(from: suffix.utf8Start, count: suffix.utf8CodeUnitCount)
                initialized = count
            }
        }
    }

    static let unauthorized = ClientError(status: 401, code: "unauthorized", field: "authorization", message: "a valid bearer credential is required")

    /// Takes one request from the bucket of the credential whose bearer hashes to `hash`;
    /// false when it was empty and `finish` got the 429. The key is only built when the limit is on.
    private func withinCredentialRate(_ hash: [UInt8], _ finish: Exchange) -> Bool {
        guard credentialLimiter.limit.perSecond > 0 else { return true }
        let c = credentialLimiter.take(Hex.encode(hash.prefix(16)))
        guard !c.allowed else { return true }
        metrics.rateLimited(scope: "credential")
        finish(.error(ClientError(status: 429, code: "rate_limited", field: "authorization", message: "too many requests for this credential"),
                      headers: [("retry-after", String(c.retryAfterSeconds))]), "credential rate")
        return false
    }

    /// `Expect: 100-continue` on `POST /v1/responses`: completes with nil when the body is
    /// welcome (the credential is valid and its bucket has room), else with the final answer
    /// the request would get (401, 429 or 503), so a client learns it before sending the body.
    /// The bucket is looked at, not charged: the request itself takes its token.
    public func continueCheck(_ request: APIRequest, _ done: @escaping @Sendable (APIReply?) -> Void) {
        guard request.method == "POST", request.path == "/v1/responses" else { return done(nil) }
        let finish = Exchange(service: self, request: request, start: monotonicMicros()) { done($0.reply) }
        let hash = Self.bearerHash(request.authorization)
        switch admit(hash, finish) {
        case .refused: return
        case .admitted: credentialBucketVerdict(hash!, finish, done)
        case .pending(let charged):
            credentials.afterRead(hash!) { [self] verdict in
                guard resumed(verdict, charged: charged, finish) != nil else { return }
                credentialBucketVerdict(hash!, finish, done)
            }
        }
    }

    private func credentialBucketVerdict(_ hash: [UInt8], _ finish: Exchange, _ done: @Sendable (APIReply?) -> Void) {
        guard credentialLimiter.limit.perSecond > 0 else { return done(nil) }
        let c = credentialLimiter.peek(Hex.encode(hash.prefix(16)))
        guard !c.allowed else { return done(nil) }
        metrics.rateLimited(scope: "credential")
        finish(.error(ClientError(status: 429, code: "rate_limited", field: "authorization", message: "too many requests for this credential"),
                      headers: [("retry-after", String(c.retryAfterSeconds))]), "credential rate")
    }

    private func post(_ request: APIRequest, _ finish: Exchange) {
        let hash = Self.bearerHash(request.authorization)
        switch admit(hash, finish) {
        case .refused: return
        case .admitted(_, let apps): authenticatedPost(request, hash!, apps, finish)
        case .pending(let charged):
            credentials.afterRead(hash!) { [self] verdict in
                guard let credential = resumed(verdict, charged: charged, finish) else { return }
                authenticatedPost(request, hash!, credential.apps, finish)
            }
        }
    }

    /// `apps`: the credential's, from the cache (the store checks them again in its transaction).
    private func authenticatedPost(_ request: APIRequest, _ hash: [UInt8], _ apps: [String], _ finish: Exchange) {
        guard withinCredentialRate(hash, finish) else { return }
        // The IngestRequest is built where the validated value is bound: a local in between
        // costs two copies of the Result and one of the request per POST.
        let ingest: IngestRequest
        switch IngestValidation.validate(contentType: request.contentType, body: request.body, limits: settings.limits) {
        case .failure(let e): return finish(.error(e), e.code)
        case .success(let response):
            ingest = IngestRequest(response: response, credentialHash: hash)
        }
        // A request the store will refuse (400 unknown_app or app_required, 403) charges no
        // bucket: it cannot spend the bucket of the app it names.
        if tokenLimiter.limit.perSecond > 0,
           case .app(let app) = StoreRules.app(credentialApps: apps, requestedApp: ingest.response.app,
                                               configuredApps: store.ingestSettings.configuredApps) {
            let t = tokenLimiter.take(AppPushToken(app: app, pushToken: ingest.response.pushToken))
            guard t.allowed else {
                metrics.rateLimited(scope: "push_token")
                return finish(.error(ClientError(status: 429, code: "rate_limited", field: "pushToken", message: "too many requests for this push token"),
                                     headers: [("retry-after", String(t.retryAfterSeconds))]), "token rate")
            }
        }
        finish.ingest = ingest
        // Captures only the exchange (see Exchange).
        store.submit(ingest) { [finish] result in finish.stored(result) }
    }

    /// The answer to a stored (or refused) ingest, built by `Exchange.makeReply` where the
    /// reply is written, and its log note.
    func storedReply(_ result: Result<IngestOutcome, StoreError>, _ finish: Exchange) -> (APIReply, String?) {
        let retryAfterSeconds = settings.unavailableRetryAfterSeconds
        switch result {
        case .failure(let error):
            logger.limited(.error, "storage error on ingest", ["request_id": finish.requestID, "error": "\(error)"])
            return (.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "the response was not stored; retry later"), headers: [("retry-after", String(retryAfterSeconds))]), "storage")
        case .success(let outcome):
            switch outcome {
            case .accepted(let id):
                return (APIReply(status: 202, bodyBytes: Self.queuedBody(id: id)), id)
            case .duplicate(let id, let state):
                return (APIReply(status: 200, body: "{\"id\":\"\(id)\",\"state\":\"\(state.rawValue)\"}"), "duplicate \(id)")
            case .conflict:
                metrics.storeRefusal("conflict")
                return (.error(ClientError(status: 409, code: "conflict", field: "messageIndex", message: "another credential already sent this messageIndex for this push token, session and key")), "conflict")
            case .indexReused(let id):
                metrics.storeRefusal("index_reused")
                return (.error(ClientError(status: 409, code: "index_reused", field: "messageIndex",
                                          message: "this messageIndex was already sent with other encryptedData (response \(id)); an index is used once: a second sealed box means a reused message key or an accessory state restored from a copy",
                                          responseID: id)), "index reused \(id)")
            case .unauthorized:
                // Revoked between the cache's read and this transaction.
                _ = chargeAuthFailure(finish.clientKey)
                return (.error(Self.unauthorized, headers: Self.authenticateHeaders), "revoked")
            case .forbidden(let app):
                return (.error(ClientError(status: 403, code: "forbidden", field: "app", message: "this credential may not send for \(app)")), nil)
            case .appRequired:
                return (.error(ClientError(status: 400, code: "app_required", field: "app", message: "this credential may use several apps: name one in \"app\"")), nil)
            case .unknownApp(let app):
                return (.error(ClientError(status: 400, code: "unknown_app", field: "app", message: "\(app) is not configured in this relay")), nil)
            case .unregistered:
                return (.error(ClientError(status: 410, code: "push_token_unregistered", field: "pushToken", message: "APNs reported this push token unregistered")), nil)
            case .badDeviceToken:
                return (.error(ClientError(status: 400, code: "bad_device_token", field: "pushToken",
                                          message: "APNs answered BadDeviceToken for this push token: it is not a token of this app's APNs environment (often a sandbox token sent to the production endpoint, or the reverse); refused for a while, then one response is tried again")), nil)
            case .overCapacity:
                return (.error(ClientError(status: 503, code: "outbox_full", field: nil, message: "the outbox is over its configured bound; retry later"), headers: [("retry-after", String(retryAfterSeconds))]), "outbox full")
            case .storageFull:
                metrics.storeRefusal("storage_full")
                return (.error(ClientError(status: 503, code: "storage_full", field: nil, message: "the relay's disk is below its free-space floor; the response was not stored; retry later"), headers: [("retry-after", String(retryAfterSeconds))]), "storage full")
            }
        }
    }

    private func get(_ request: APIRequest, id: String, _ finish: Exchange) {
        let hash = Self.bearerHash(request.authorization)
        switch admit(hash, finish) {
        case .refused: return
        case .admitted(let credentialID, _): authenticatedGet(hash!, credentialID: credentialID, id: id, finish)
        case .pending(let charged):
            credentials.afterRead(hash!) { [self] verdict in
                guard let credential = resumed(verdict, charged: charged, finish) else { return }
                authenticatedGet(hash!, credentialID: credential.id, id: id, finish)
            }
        }
    }

    private func authenticatedGet(_ hash: [UInt8], credentialID: String, id: String, _ finish: Exchange) {
        // Reads share the credential's bucket with its POSTs (a database read on a worker each):
        // a looping status poller cannot take the workers from everyone else.
        guard withinCredentialRate(hash, finish) else { return }
        let notFound = ClientError(status: 404, code: "not_found", field: "id", message: "no response with this id for this credential")
        guard UUIDText.parse(id) != nil else { return finish(.error(notFound), nil) }
        workers.submit({ [store, logger] in
            do {
                // Another credential's row is reported as absent, not forbidden: ids do not leak.
                guard let row = try store.response(id: id), row.credentialID == credentialID else { return finish(.error(notFound), nil) }
                let attempts = try store.attempts(responseID: row.id)
                finish(APIReply(status: 200, body: Self.render(row, attempts)), nil)
            } catch {
                logger.limited(.error, "storage error on read", ["request_id": finish.requestID, "error": "\(error)"])
                finish(.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "retry later"), headers: [("retry-after", "1")]), "storage")
            }
        }, whenFull: {
            finish(.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "too many reads waiting; retry later"), headers: [("retry-after", "1")]), "readers full")
        })
    }

    /// GET /v1/events: authenticated first (as GET /v1/responses/<id>), then the query.
    private func events(_ request: APIRequest, _ finish: Exchange) {
        let hash = Self.bearerHash(request.authorization)
        switch admit(hash, finish) {
        case .refused: return
        case .admitted(let credentialID, _): authenticatedEvents(hash!, credentialID: credentialID, query: request.query, finish)
        case .pending(let charged):
            credentials.afterRead(hash!) { [self] verdict in
                guard let credential = resumed(verdict, charged: charged, finish) else { return }
                authenticatedEvents(hash!, credentialID: credential.id, query: request.query, finish)
            }
        }
    }

    private func authenticatedEvents(_ hash: [UInt8], credentialID: String, query: String, _ finish: Exchange) {
        guard withinCredentialRate(hash, finish) else { return }
        guard let cursor = feed.cursor() else {
            return finish(.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "retry later"), headers: [("retry-after", "1")]), "storage")
        }
        let q: EventFeedQuery
        switch EventFeedQuery.parse(query, cursor: cursor, credentialID: credentialID) {
        case .failure(let e): return finish(.error(e), nil)
        case .success(let parsed): q = parsed
        }
        let deadline = monotonicMicros() + Int64(q.waitSeconds) * 1_000_000
        feed.serve(credentialID: credentialID, query: q, deadlineMicros: deadline) { [logger] result in
            switch result {
            case .success(let page)?:
                finish(APIReply(status: 200, bodyBytes: EventFeed.render(page, next: cursor.seal(page.next, credentialID: credentialID))), nil)
            case .failure(let error)?:
                logger.error("storage error on events read", ["request_id": finish.requestID, "error": "\(error)"])
                finish(.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "retry later"), headers: [("retry-after", "1")]), "storage")
            case nil:
                finish(.error(ClientError(status: 503, code: "storage_unavailable", field: nil, message: "too many reads waiting; retry later"), headers: [("retry-after", "1")]), "readers full")
            }
        }
    }
}
