// The store boundary. relay-server, relayctl and tests talk to an `OutboxStore`, on SQLite
// (SQLiteOutboxStore) or PostgreSQL (PostgresOutboxStore).
// All times are integer milliseconds since 1970 (UTC), so both backends store plain integers.
import POSIXThreads
import FoundationEssentials

/// Lifecycle of one accepted response. queued -> inflight -> delivered | failed, with
/// inflight -> retry (scheduled at next_attempt_at) -> inflight ... on retryable answers.
public enum ResponseState: String, Sendable, CaseIterable, Codable {
    case queued, inflight, retry, delivered, failed

    public var isTerminal: Bool { self == .delivered || self == .failed }
}

/// A validated response about to be stored. Fields are already canonical: lowercase hex
/// token, uppercase UUID string, raw key ID and ciphertext bytes.
public struct NewResponse: Sendable, Equatable {
    public var app: String?
    public var pushToken: String
    public var sessionIdentifier: String
    public var keyID: [UInt8]
    public var messageIndex: UInt32
    public var encryptedData: [UInt8]

    public init(app: String?, pushToken: String, sessionIdentifier: String, keyID: [UInt8], messageIndex: UInt32, encryptedData: [UInt8]) {
        self.app = app
        self.pushToken = pushToken
        self.sessionIdentifier = sessionIdentifier
        self.keyID = keyID
        self.messageIndex = messageIndex
        self.encryptedData = encryptedData
    }
}

/// One ingest: the response and the bearer it came with. The store checks it in the same
/// transaction as the insert (credential, app scope, unregistered token, outbox bound) against
/// its `IngestStoreSettings`.
///
/// A class: the submitter and the store share one reference, and whoever lets go last frees
/// the request's buffers (IngestService keeps it so that this happens on the HTTP loop that
/// allocated them, not on the store's thread: SQLiteOutboxStore.IngestJob lets go first).
public final class IngestRequest: Sendable {
    public let response: NewResponse
    /// SHA-256 of the presented bearer secret.
    public let credentialHash: [UInt8]

    public init(response: NewResponse, credentialHash: [UInt8]) {
        self.response = response
        self.credentialHash = credentialHash
    }
}

/// What every ingest is checked against, from the configuration: given to the store once at
/// start (RelayService), not carried by each request. SIGHUP does not change these (a restart
/// does).
public struct IngestStoreSettings: Sendable, Equatable {
    /// Apps configured in this relay (`apps[].bundleID`); an app outside it is `unknownApp`.
    public var configuredApps: Set<String>
    /// `ingest.ttlSeconds` in ms: time to live from acceptance; after it the row fails with
    /// reason "expired".
    public var ttlMillis: Int64
    /// `store.maxPending`: non-terminal rows above which ingest answers 503.
    public var maxPending: Int
    /// `dispatch.unregisteredQuarantineSeconds` in ms: how long a 410-marked token is refused
    /// before one response goes through as a probe (StoreRules.markAdmission); 0 = refused until
    /// `relayctl tokens forget`.
    public var unregisteredQuarantineMillis: Int64 = 3_600_000
    /// `dispatch.badDeviceTokenHoldSeconds` in ms: the same for a BadDeviceToken mark; 0 = none
    /// are recorded (and old ones do not hold).
    public var badDeviceTokenHoldMillis: Int64 = 3_600_000

    /// No app configured: every ingest is `unknownApp` until the settings are given.
    public init(configuredApps: Set<String> = [], ttlMillis: Int64 = 86_400_000, maxPending: Int = 1_000_000,
                unregisteredQuarantineMillis: Int64 = 3_600_000, badDeviceTokenHoldMillis: Int64 = 3_600_000) {
        self.configuredApps = configuredApps
        self.ttlMillis = ttlMillis
        self.maxPending = maxPending
        self.unregisteredQuarantineMillis = unregisteredQuarantineMillis
        self.badDeviceTokenHoldMillis = badDeviceTokenHoldMillis
    }
}

public enum IngestOutcome: Sendable, Equatable {
    case accepted(id: String)
    /// The credential's own earlier request with the same key: its row's id and state.
    case duplicate(id: String, state: ResponseState)
    /// The same key was stored by another credential (nothing of that row is revealed).
    case conflict
    /// The credential's own row holds the key with another sealed box: the message index was
    /// used twice (StoreRules.dedupe). Nothing is stored; `id` is that row's.
    case indexReused(id: String)
    case unauthorized
    case forbidden(app: String)
    /// The credential may use several apps and the body named none.
    case appRequired
    case unknownApp(String)
    /// The token is marked by a 410 (StoreRules.markAdmission).
    case unregistered
    /// The token is marked by a 400 BadDeviceToken.
    case badDeviceToken
    case overCapacity
    /// The database's filesystem is below store.minFreeBytes (FreeSpaceGuard); nothing stored.
    case storageFull
}

public struct OutboxRow: Sendable, Equatable {
    public var id: String
    public var app: String
    public var pushToken: String
    public var sessionIdentifier: String
    public var keyID: [UInt8]
    public var messageIndex: UInt32
    public var encryptedData: [UInt8]
    public var credentialID: String
    public var state: ResponseState
    public var attempts: Int
    public var nextAttemptAt: Int64
    public var createdAt: Int64
    public var expiresAt: Int64
    public var lastStatus: Int?
    public var lastReason: String?
    public var updatedAt: Int64
    /// The claim that leased this row (PostgreSQL's lease_epoch, bumped at every claim); its
    /// outcome is written only while the row still carries this lease. Set on rows a claim
    /// returns; 0 on SQLite (no leases) and on rows read otherwise (list, response).
    public var leaseEpoch: Int64 = 0
}

/// One APNs answer (or transport failure) for one response.
public struct AttemptRecord: Sendable, Equatable {
    public var responseID: String
    public var attemptedAt: Int64
    /// HTTP status from APNs; nil for a transport failure.
    public var status: Int?
    public var reason: String?
    /// APNs' timestamp (410 only), milliseconds.
    public var apnsTimestamp: Int64?
    public var latencyMicros: Int64?

    public init(responseID: String, attemptedAt: Int64, status: Int?, reason: String?, apnsTimestamp: Int64? = nil, latencyMicros: Int64? = nil) {
        self.responseID = responseID
        self.attemptedAt = attemptedAt
        self.status = status
        self.reason = reason
        self.apnsTimestamp = apnsTimestamp
        self.latencyMicros = latencyMicros
    }
}

/// What the dispatcher decided for one inflight row.
public enum DeliveryOutcome: Sendable, Equatable {
    case delivered
    case failed(reason: String)
    /// Failed, and its token marked (unregistered_tokens) with `reason` at APNs' timestamp: 410
    /// Unregistered / ExpiredToken, or 400 BadDeviceToken (timestamp: the answer's time) while
    /// dispatch.badDeviceTokenHoldSeconds > 0. Rows covered by the mark fail at their claim.
    case unregistered(reason: String, apnsTimestamp: Int64)
    /// Try again at `at`. With `paceTokenUntil` every queued row of that token waits too.
    case retry(at: Int64, paceTokenUntil: Int64?)
    /// Not attempted (shutdown): back to queued, attempts unchanged.
    case requeue
    /// Not counted as an attempt (its app is paused: docs/pushclient.md "Paused apps"): back to
    /// queued, due at `at`, attempts and last status/reason unchanged, no attempt recorded.
    case release(at: Int64)
}

public struct DeliveryUpdate: Sendable, Equatable {
    public var id: String
    public var pushToken: String
    public var outcome: DeliveryOutcome
    public var attempt: AttemptRecord?
    /// The lease the answer belongs to (the claimed row's `leaseEpoch`): PostgreSQL writes the
    /// outcome only while the row is still leased to this node under this epoch, so a push that
    /// outlived its lease never lands on a newer claim of the same row. nil: the owner alone
    /// decides (tools and tests writing outcomes by hand).
    public var leaseEpoch: Int64?

    public init(id: String, pushToken: String, outcome: DeliveryOutcome, attempt: AttemptRecord?, leaseEpoch: Int64? = nil) {
        self.id = id
        self.pushToken = pushToken
        self.outcome = outcome
        self.attempt = attempt
        self.leaseEpoch = leaseEpoch
    }
}

public struct CredentialRecord: Sendable, Equatable {
    public var id: String
    public var name: String
    public var apps: [String]
    public var createdAt: Int64
    public var lastUsedAt: Int64?
    public var revokedAt: Int64?

    public var isRevoked: Bool { revokedAt != nil }
}

/// What ingest authenticates a bearer against before any other work (IngestService's
/// credential cache), and the apps that key its push-token buckets: no name or times.
public struct CredentialKey: Sendable, Equatable {
    public var id: String
    /// SHA-256 of the secret.
    public var hash: [UInt8]
    public var revoked: Bool
    /// Fixed at creation (no command changes them), so a cached copy is exact.
    public var apps: [String]

    public init(id: String, hash: [UInt8], revoked: Bool, apps: [String] = []) {
        self.id = id
        self.hash = hash
        self.revoked = revoked
        self.apps = apps
    }
}

/// The credentials table's change counter (`credential_generation`), bumped by triggers in the
/// transaction of every insert, delete or change of a row's id, hash, apps or revoked_at,
/// whoever makes it: equal generations mean the same credentials, so a cached copy read at
/// one generation is current while the counter has not moved. (Not last_used_at, which ingest
/// writes.)
public struct CredentialGeneration: Sendable, Equatable {
    public var value: Int64

    public init(_ value: Int64) {
        self.value = value
    }
}

/// Returned once by `createCredential`: the only time the secret exists outside the client.
public struct CreatedCredential: Sendable {
    public var record: CredentialRecord
    public var secret: String
}

/// A token mark (StoreRules "token marks").
public struct UnregisteredToken: Sendable, Equatable {
    public var token: String
    /// The cutoff: rows of the token accepted up to it are covered (StoreRules.markCutoff).
    public var apnsTimestamp: Int64
    /// When the hold last started: the answer recorded, or a probe let through.
    public var recordedAt: Int64
    /// APNs' reason: Unregistered, ExpiredToken (410) or BadDeviceToken (400).
    public var reason: String = StoreRules.unregisteredReason
}

public struct OutboxCounts: Sendable, Equatable {
    public var byState: [ResponseState: Int]
    /// created_at of the oldest queued or retry row.
    public var oldestPendingCreatedAt: Int64?

    public var pending: Int { (byState[.queued] ?? 0) + (byState[.inflight] ?? 0) + (byState[.retry] ?? 0) }
}

public struct OutboxFilter: Sendable {
    public var state: ResponseState?
    public var app: String?
    public var tokenPrefix: String?
    public var createdSince: Int64?
    public var limit: Int

    public init(state: ResponseState? = nil, app: String? = nil, tokenPrefix: String? = nil, createdSince: Int64? = nil, limit: Int = 100) {
        self.state = state
        self.app = app
        self.tokenPrefix = tokenPrefix
        self.createdSince = createdSince
        self.limit = limit
    }
}

/// The storage boundary. Implementations are thread-safe. Blocking methods must be called from
/// a thread the caller owns (never an event loop or Swift's cooperative pool); `submit` never
/// blocks and completes after the transaction committed.
public protocol OutboxStore: EventStore {
    // MARK: ingest (hot path)
    /// Completes once, after the transaction that stored (or refused) the request committed,
    /// on a thread of the store's own (the SQLite writer, a PostgreSQL ingest thread), or at
    /// once on the caller's thread when the request is refused before it is queued. Where the
    /// answer is written is the caller's business (HTTPServer moves it to its loop).
    func submit(_ request: IngestRequest,
                completion: @escaping @Sendable (Result<IngestOutcome, StoreError>) -> Void)
    /// What `submit` checks every request against; read once per batch.
    var ingestSettings: IngestStoreSettings { get set }

    // MARK: commits
    /// `observer` is told after each COMMIT of this process that handed it rows, stored rows
    /// waiting for a claim, or wrote events, never after a rollback (OutboxCommit.swift). Held
    /// weakly: it listens while its owner keeps it.
    func addCommitObserver(_ observer: any OutboxCommitObserver)

    // MARK: dispatcher
    /// Rows left inflight by a crash go back to queued (same id). Returns how many.
    func recoverInflight() throws -> Int
    /// Moves up to `limit` due rows (queued/retry, next_attempt_at <= now) to inflight and returns
    /// them. Rows past their TTL are failed with reason "expired" instead.
    func claimDue(limit: Int) throws -> [OutboxRow]
    /// Earliest next_attempt_at among queued/retry rows.
    func nextDueAt() throws -> Int64?
    /// The app's queued rows due later (released while it was paused) become due now: after a
    /// reload they need not wait for the next probe time. Returns how many.
    func hastenQueued(app: String) throws -> Int
    func apply(_ updates: [DeliveryUpdate]) throws
    /// `apply` without waiting for it: `completion` runs once it committed (nil) or failed, on
    /// a thread of the store's. Updates given later are applied after these.
    func apply(_ updates: [DeliveryUpdate], completion: @escaping @Sendable (StoreError?) -> Void)

    // MARK: queries (relayctl, GET /v1/responses/<id>, metrics)
    func response(id: String) throws -> OutboxRow?
    func attempts(responseID: String) throws -> [AttemptRecord]
    func list(_ filter: OutboxFilter) throws -> [OutboxRow]
    func counts() throws -> OutboxCounts
    /// Counts of terminal rows updated since `since`, keyed by state and last reason.
    func recentOutcomes(since: Int64) throws -> [(state: ResponseState, reason: String?, count: Int)]

    // MARK: operator actions (relayctl); never touch inflight rows
    func requeue(ids: [String]) throws -> Int
    func requeueFailed(reason: String?) throws -> Int
    /// Every `state` (delivered or failed) row last updated before `olderThan`, with its
    /// attempts; not dry: in PurgeBatches of small transactions. Returns how many rows.
    func purge(state: ResponseState, olderThan: Int64, dryRun: Bool) throws -> Int
    /// Deletes up to `limit` such rows (oldest first) and their attempts in one transaction.
    func purgeBatch(state: ResponseState, olderThan: Int64, limit: Int) throws -> Int
    /// Deletes up to `limit` token_pacing rows whose pacing ended before `before` (a pacing that
    /// is over changes no claim, StoreRules.claimVerdict): the retention sweep keeps the table,
    /// and SQLite's in-memory set of watched tokens, from growing with every token APNs ever
    /// answered TooManyRequests for. Returns how many.
    func pruneEndedPacing(before: Int64, limit: Int) throws -> Int
    /// Deletes up to `limit` token marks that no longer change anything at `now`
    /// (StoreRules.markIsStale, with `ingestSettings`): the retention sweep keeps
    /// unregistered_tokens from holding every token APNs ever refused. Returns how many.
    func pruneStaleMarks(now: Int64, limit: Int) throws -> Int
    func unregisteredTokens() throws -> [UnregisteredToken]
    func forgetToken(_ token: String) throws -> Bool

    // MARK: credentials
    func createCredential(name: String, apps: [String]) throws -> CreatedCredential
    func credentials() throws -> [CredentialRecord]
    func revokeCredential(id: String) throws -> Bool
    /// The live (not revoked) credential for a presented secret, or nil.
    func authenticate(secret: String) throws -> CredentialRecord?
    /// The credentials table's generation, and every credential's key when it differs from
    /// `known` (nil keys: unchanged). A read, not a transaction; ingest calls it a few times a
    /// second per node at most.
    func credentialKeys(unlessAt known: CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?)

    // MARK: health
    /// True when a write transaction can be taken (readyz).
    func checkWritable() -> Bool
    /// The store.minFreeBytes guard on this store's filesystem (SQLite), or nil.
    var freeSpaceGuard: FreeSpaceGuard? { get }
    func close()
}

extension OutboxStore {
    public var freeSpaceGuard: FreeSpaceGuard? { nil }

    /// A store without a write queue of its own applies at once, on the caller's thread.
    public func apply(_ updates: [DeliveryUpdate], completion: @escaping @Sendable (StoreError?) -> Void) {
        do {
            try apply(updates)
            completion(nil)
        } catch {
            completion((error as? StoreError) ?? .invalid("\(error)"))
        }
    }
}
