// Helpers for the relayctl integration tests: find and run the built binary, and seed a
// temporary outbox database (through RelayCore's real store API) with rows in every state.
import Foundation
import RelayCore
import Testing

enum Relayctl {
    static let repoRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The directory holding the built executables: beside the test bundle (`.build/debug`).
    static let binDirectory: URL = {
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for candidate in [bundle, bundle.deletingLastPathComponent(), repoRoot.appendingPathComponent(".build/debug")]
        where FileManager.default.isExecutableFile(atPath: candidate.appendingPathComponent("relayctl").path) {
            return candidate
        }
        return repoRoot.appendingPathComponent(".build/debug")
    }()

    static var path: String { binDirectory.appendingPathComponent("relayctl").path }

    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    /// Runs relayctl (or `executable`) to completion. Every command here is local and quick; stdout and stderr are
    /// drained on their own threads so a large output cannot block the child.
    @discardableResult
    static func run(_ arguments: [String], environment: [String: String] = [:], executable: String? = nil) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable ?? path)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let box = OutputBox()
        let group = DispatchGroup()
        for (pipe, isOut) in [(out, true), (err, false)] {
            group.enter()
            DispatchQueue.global().async {
                let data = pipe.fileHandleForReading.readDataToEndOfFile()
                box.set(isOut, data)
                group.leave()
            }
        }
        group.wait()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, stdout: box.text(true), stderr: box.text(false))
    }

    /// A JSON document from stdout, or a recorded test issue.
    static func json(_ result: Result) throws -> Any {
        try JSONSerialization.jsonObject(with: Data(result.stdout.utf8), options: [.fragmentsAllowed])
    }
}

/// @unchecked Sendable: both fields are only touched under `lock`.
private final class OutputBox: @unchecked Sendable {
    private let lock = NSLock()
    private var out = Data(), err = Data()
    func set(_ isOut: Bool, _ data: Data) { lock.lock(); if isOut { out = data } else { err = data }; lock.unlock() }
    func text(_ isOut: Bool) -> String { lock.lock(); defer { lock.unlock() }; return String(decoding: isOut ? out : err, as: UTF8.self) }
}

/// A clock the seeding code moves by hand, so rows get ages without sleeping.
/// @unchecked Sendable: `millis` is only touched under `lock`.
final class SeedClock: RelayClock, @unchecked Sendable {
    private let lock = NSLock()
    private var millis: Int64
    init(_ millis: Int64) { self.millis = millis }
    func nowMillis() -> Int64 { lock.lock(); defer { lock.unlock() }; return millis }
    func set(_ value: Int64) { lock.lock(); millis = value; lock.unlock() }
}

/// A temporary database with rows in every state, created through the real store.
struct SeededDatabase {
    let directory: URL
    let path: String
    /// id per role, e.g. "delivered-old", "failed-baddevice", "inflight", "queued-1".
    var ids: [String: String] = [:]
    var tokens: [String: String] = [:]
    var credentialSecret = ""
    var credentialID = ""
    /// Events of the seed's outcomes (oldest first); the first is dead for webhook "backend".
    var eventIDs: [String] = []
    /// Wall-clock milliseconds the seed's "now" was taken at: its rows are two hours and ten
    /// minutes older than this.
    var seededAtMillis: Int64 = 0
    static let app = "com.example.companion"

    static func make() async throws -> SeededDatabase {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        var seeded = SeededDatabase(directory: dir, path: dir.appendingPathComponent("relay.db").path)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let clock = SeedClock(now - 2 * 3_600_000)  // two hours ago
        seeded.seededAtMillis = now
        let store = try SQLiteOutboxStore(path: seeded.path, clock: clock)
        defer { store.close() }
        store.eventSettings = EventStoreSettings(webhooks: [WebhookSubscription(name: "backend")])
        let credential = try store.createCredential(name: "fleet-test", apps: [app])
        seeded.credentialSecret = credential.secret
        seeded.credentialID = credential.record.id

        // Two hours ago: eight responses, six of which reach APNs.
        let oldRoles = ["delivered-old", "failed-baddevice", "failed-unregistered", "retry", "failed-expired", "inflight", "queued-1", "queued-2"]
        for (i, role) in oldRoles.enumerated() {
            let token = String(format: "%02x", i + 0xa0) + String(repeating: "5e", count: 31)
            seeded.tokens[role] = token
            seeded.ids[role] = try await ingest(store, token: token, index: UInt32(i), secret: credential.secret)
        }
        let claimed = try store.claimDue(limit: 6)
        let byToken = Dictionary(uniqueKeysWithValues: claimed.map { ($0.pushToken, $0) })
        func update(_ role: String, _ outcome: DeliveryOutcome, status: Int?, reason: String?, apnsTimestamp: Int64? = nil) throws -> DeliveryUpdate {
            let row = try #require(byToken[seeded.tokens[role]!], "\(role) was not claimed")
            return DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: outcome,
                                  attempt: AttemptRecord(responseID: row.id, attemptedAt: clock.nowMillis(), status: status, reason: reason,
                                                         apnsTimestamp: apnsTimestamp, latencyMicros: 1500))
        }
        // Hold back the queued ones: only the first six roles were ingested before the claim...
        // claimDue takes the oldest due rows, all equal here, so check which six it took.
        let claimedRoles = Set(oldRoles.filter { role in byToken[seeded.tokens[role]!] != nil })
        try #require(claimedRoles.count == 6)
        var roleFor: [String: String] = [:]
        // Assign outcome roles to whichever six rows were claimed, keeping role -> id consistent.
        let outcomeRoles = ["delivered-old", "failed-baddevice", "failed-unregistered", "retry", "failed-expired", "inflight"]
        let claimedInOrder = oldRoles.filter { claimedRoles.contains($0) }
        let unclaimed = oldRoles.filter { !claimedRoles.contains($0) }
        for (role, actual) in zip(outcomeRoles, claimedInOrder) { roleFor[role] = actual }
        for (role, actual) in zip(["queued-1", "queued-2"], unclaimed) { roleFor[role] = actual }
        let originalIDs = seeded.ids, originalTokens = seeded.tokens
        for (role, actual) in roleFor { seeded.ids[role] = originalIDs[actual]; seeded.tokens[role] = originalTokens[actual] }

        try store.apply([
            try update("delivered-old", .delivered, status: 200, reason: nil),
            try update("failed-baddevice", .failed(reason: "BadDeviceToken"), status: 400, reason: "BadDeviceToken"),
            try update("failed-unregistered", .unregistered(reason: "Unregistered", apnsTimestamp: clock.nowMillis() + 1000),
                       status: 410, reason: "Unregistered", apnsTimestamp: clock.nowMillis() + 1000),
            try update("retry", .retry(at: now + 3_600_000, paceTokenUntil: nil), status: 503, reason: "ServiceUnavailable"),
            try update("failed-expired", .failed(reason: "expired"), status: nil, reason: "transport"),
        ])

        // Ten minutes ago: two more, one delivered, one refused for its topic.
        clock.set(now - 10 * 60_000)
        for (i, role) in ["delivered-recent", "failed-topic"].enumerated() {
            let token = String(format: "%02x", i + 0xc0) + String(repeating: "7a", count: 31)
            seeded.tokens[role] = token
            seeded.ids[role] = try await ingest(store, token: token, index: UInt32(100 + i), secret: credential.secret)
        }
        let recent = try store.claimDue(limit: 10)
        let recentByToken = Dictionary(uniqueKeysWithValues: recent.map { ($0.pushToken, $0) })
        try #require(recentByToken[seeded.tokens["delivered-recent"]!] != nil && recentByToken[seeded.tokens["failed-topic"]!] != nil)
        // Anything else claimed here (the two queued rows) goes back, untouched.
        var updates: [DeliveryUpdate] = []
        for row in recent {
            switch row.pushToken {
            case seeded.tokens["delivered-recent"]!:
                updates.append(DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .delivered,
                                              attempt: AttemptRecord(responseID: row.id, attemptedAt: clock.nowMillis(), status: 200, reason: nil, latencyMicros: 900)))
            case seeded.tokens["failed-topic"]!:
                updates.append(DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .failed(reason: "TopicDisallowed"),
                                              attempt: AttemptRecord(responseID: row.id, attemptedAt: clock.nowMillis(), status: 400, reason: "TopicDisallowed")))
            default:
                updates.append(DeliveryUpdate(id: row.id, pushToken: row.pushToken, outcome: .requeue, attempt: nil))
            }
        }
        try store.apply(updates)
        let first = try store.recordAndClaimWebhookDeliveries(webhook: "backend", results: [], cursor: nil, now: clock.nowMillis(),
                                                              leaseUntil: clock.nowMillis() + 1000, limit: 100)
        let deliveries = first.claimed
        seeded.eventIDs = deliveries.map(\.event.id)
        // The first dead (its retry row), the cursor just past it: the others stay pending.
        _ = try store.recordAndClaimWebhookDeliveries(webhook: "backend", results: [WebhookAttemptRecord(deliveries[0], .dead(attemptedAt: clock.nowMillis(), error: "status 500"))],
                                                      cursor: first.cursor.map { WebhookCursorPosition(epoch: $0.epoch, through: deliveries[0].sequence) },
                                                      now: clock.nowMillis(), leaseUntil: clock.nowMillis() + 1000, limit: 0, releaseCursor: true)
        return seeded
    }

    private static func ingest(_ store: SQLiteOutboxStore, token: String, index: UInt32, secret: String) async throws -> String {
        store.ingestSettings = IngestStoreSettings(configuredApps: [app], ttlMillis: 86_400_000, maxPending: 1000)
        let request = IngestRequest(
            response: NewResponse(app: nil, pushToken: token, sessionIdentifier: "6F1C5E0A-6C4B-4E59-9C3A-2D2B7C9B8E11",
                                  keyID: [1, 2, 3, 4], messageIndex: index, encryptedData: [UInt8](repeating: 0x42, count: 40)),
            credentialHash: Credentials.hash(secret: secret))
        let outcome: IngestOutcome = try await withCheckedThrowingContinuation { continuation in
            store.submit(request) { continuation.resume(with: $0) }
        }
        guard case .accepted(let id) = outcome else { throw SeedError(message: "ingest refused: \(outcome)") }
        return id
    }

    /// RELAYCTL_TEST_KEEP=1 keeps the databases for looking at by hand.
    func remove() {
        if ProcessInfo.processInfo.environment["RELAYCTL_TEST_KEEP"] == nil { try? FileManager.default.removeItem(at: directory) }
    }
}

struct SeedError: Error { var message: String }
