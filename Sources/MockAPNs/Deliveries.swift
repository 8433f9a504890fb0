// Accepted pushes: kept in memory (for GET /deliveries and in-process tests) and appended as
// JSON lines to a file. The file is written on the recorder's own serial queue so the HTTP
// loop thread never waits on the disk.
import Foundation
import Synchronization

/// What decrypting an accessory push as the iPhone would gave.
public struct DeliveryVerification: Sendable, Equatable {
    /// true = decrypted and decoded; false = failed (see `error`); nil = no root secret for its keyID.
    public var verified: Bool?
    public var error: String?
    public var notificationIdentifier: String?
    public var sourceIdentifier: String?
    public var actionIdentifier: String?
    public var userText: String?

    public static let notApplicable = DeliveryVerification()
    public init(verified: Bool? = nil, error: String? = nil) {
        self.verified = verified
        self.error = error
    }
}

public struct MockDelivery: Sendable, Equatable {
    public var push: AcceptedPush
    public var verification: DeliveryVerification
    public var receivedAt: Date
    public var connectionID: UInt64
    public var streamID: Int32

    public var apnsID: String { push.apnsID }
    public var deviceToken: String { push.deviceToken }
    public var verified: Bool? { verification.verified }

    /// The JSON object served by GET /deliveries and written to the log.
    public func jsonObject() -> [String: Any] {
        var o: [String: Any] = [
            "apnsId": push.apnsID,
            "deviceToken": push.deviceToken,
            "topic": push.topic,
            "pushType": push.pushType,
            "payload": (try? JSONSerialization.jsonObject(with: Data(push.payload))) ?? String(decoding: push.payload, as: UTF8.self),
            "verified": verification.verified.map { $0 as Any } ?? NSNull(),
            "receivedAt": iso8601(receivedAt),
            "connectionId": connectionID,
            "streamId": Int(streamID),
        ]
        if let p = push.priority { o["priority"] = p }
        if let e = push.expiration { o["expiration"] = e }
        if let c = push.collapseID { o["collapseId"] = c }
        if let claims = push.claims { o["keyId"] = claims.keyID; o["teamId"] = claims.teamID; o["iat"] = claims.issuedAt }
        if let a = push.accessory {
            o["messageIndex"] = Int(a.messageIndex)
            o["ratchetKeyId"] = Data(a.keyID).base64EncodedString()
            o["sessionIdentifier"] = lowercaseString(a.sessionIdentifier)
            o["encryptedBytes"] = a.encryptedData.count
        }
        if let error = verification.error { o["verifyError"] = error }
        if verification.verified == true {
            var response: [String: Any] = [:]
            response["notificationIdentifier"] = verification.notificationIdentifier
            response["sourceIdentifier"] = verification.sourceIdentifier
            response["actionIdentifier"] = verification.actionIdentifier
            response["userText"] = verification.userText ?? NSNull()
            o["response"] = response
        }
        return o
    }
}

func iso8601(_ date: Date) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    return formatter.string(from: date)
}

func jsonData(_ object: Any) -> Data {
    (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("null".utf8)
}

/// Thread-safe store of deliveries plus the optional JSON-lines file.
public final class DeliveryRecorder: Sendable {
    private struct State {
        var deliveries: [MockDelivery] = []
        var dropped = 0
    }
    private let state = Mutex(State())
    private let file: FileHandle?
    private let queue = DispatchQueue(label: "mock-apns.deliveries-log")
    /// Memory keeps at least the newest `memoryLimit` deliveries (at most 25% more); older ones
    /// are dropped from memory (the log file keeps everything).
    public let memoryLimit: Int

    public init(logPath: String?, memoryLimit: Int = 100_000) throws {
        self.memoryLimit = memoryLimit
        if let logPath {
            if !FileManager.default.fileExists(atPath: logPath) {
                guard FileManager.default.createFile(atPath: logPath, contents: nil) else {
                    throw MockConfigurationError("--deliveries-log: cannot create \(logPath)")
                }
            }
            guard let handle = FileHandle(forWritingAtPath: logPath) else {
                throw MockConfigurationError("--deliveries-log: cannot open \(logPath) for writing")
            }
            handle.seekToEndOfFile()
            file = handle
        } else {
            file = nil
        }
    }

    deinit { try? file?.close() }

    public func record(_ delivery: MockDelivery) {
        state.withLock { s in
            s.deliveries.append(delivery)
            // Trim in chunks of a quarter of the limit: removing one element per push would
            // shift the whole array every time (O(n) per request; it collapsed throughput).
            if s.deliveries.count > memoryLimit + max(1, memoryLimit / 4) {
                let excess = s.deliveries.count - memoryLimit
                s.deliveries.removeFirst(excess)
                s.dropped += excess
            }
        }
        if let file {
            // Encoding happens on the writer's queue too: the loop thread only appends.
            queue.async {
                var line = jsonData(delivery.jsonObject())
                line.append(0x0A)
                file.write(line)
            }
        }
    }

    public var deliveries: [MockDelivery] { state.withLock { $0.deliveries } }
    public var droppedFromMemory: Int { state.withLock { $0.dropped } }

    /// Clears memory (the log file is left alone: it is the run's history).
    public func reset() { state.withLock { $0 = State() } }

    /// Waits until queued log lines are written.
    public func flush() {
        queue.sync { try? file?.synchronize() }
    }
}

/// Counters for GET /stats.
public struct MockStats: Sendable, Equatable {
    public var requests = 0
    public var accepted = 0
    public var stalled = 0
    public var aborted = 0
    /// "200", "400 BadDeviceToken", ...
    public var byStatusReason: [String: Int] = [:]
    public var connectionsSeen = 0
    public var goAwaysSent = 0
    public var connectionsClosed = 0
    public var verified = 0
    public var verifyFailed = 0

    public func jsonObject() -> [String: Any] {
        [
            "requests": requests, "accepted": accepted, "stalled": stalled, "aborted": aborted,
            "byStatusReason": byStatusReason, "connections": connectionsSeen,
            "goAwaysSent": goAwaysSent, "connectionsClosedByFault": connectionsClosed,
            "verified": verified, "verifyFailed": verifyFailed,
        ]
    }
}
