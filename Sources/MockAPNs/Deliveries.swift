// Accepted pushes: kept in memory (for GET /deliveries and in-process tests) and appended as
// JSON lines to a file. A push's line is written (write(2), O_APPEND) before its 200 is sent:
// a mock-apns killed with -9 has logged every push it answered, since the page cache outlives
// the process. Lines are encoded by hand (~1-2 us), not through JSONSerialization: when they
// were encoded and written on a background queue, a relay draining a backlog at ~20k pushes/s
// outran that queue, and a kill -9 lost thousands of answered pushes' lines.
import Basics
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

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
            "receivedAt": iso8601Millis(receivedAt),
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
    /// The log's descriptor (O_APPEND), -1 without a log.
    private let fd: Int32
    /// Held around each line's write, so concurrent loops never interleave parts of lines.
    private let writing = Mutex(())
    /// Memory keeps at least the newest `memoryLimit` deliveries (at most 25% more); older ones
    /// are dropped from memory (the log file keeps everything).
    public let memoryLimit: Int

    public init(logPath: String?, memoryLimit: Int = 100_000) throws {
        self.memoryLimit = memoryLimit
        if let logPath {
            let fd = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            guard fd >= 0 else {
                throw MockConfigurationError("--deliveries-log: cannot open \(logPath) for appending: \(String(cString: strerror(errno)))")
            }
            self.fd = fd
        } else {
            fd = -1
        }
    }

    deinit { if fd >= 0 { close(fd) } }

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
        guard fd >= 0 else { return }
        let line = delivery.logLine()
        writing.withLock { _ in
            // Disk full or the file gone: the push is still answered; say so once per failure.
            if let e = line.withUnsafeBytes({ FileDescriptor.writeAll(fd, $0) }) {
                FileHandle.standardError.write(Data("mock-apns: --deliveries-log write failed: \(String(cString: strerror(e)))\n".utf8))
            }
        }
    }

    public var deliveries: [MockDelivery] { state.withLock { $0.deliveries } }
    public var droppedFromMemory: Int { state.withLock { $0.dropped } }

    /// Clears memory (the log file is left alone: it is the run's history).
    public func reset() { state.withLock { $0 = State() } }

    /// Syncs the log to disk (lines are already written when `record` returns).
    public func flush() {
        if fd >= 0 { writing.withLock { _ in _ = fdatasync(fd) } }
    }
}

/// `2026-11-30T13:19:35.123Z`: what ISO8601DateFormatter gives with fractional seconds, without
/// creating a formatter per call (rounded to the millisecond, as the formatter does).
func iso8601Millis(_ date: Date) -> String {
    iso8601UTC(millis: Int64((date.timeIntervalSince1970 * 1000).rounded()))
}

extension MockDelivery {
    /// `jsonObject()` as one JSON line (keys sorted, as JSONSerialization's `.sortedKeys` wrote
    /// them), encoded by hand. The payload, a JSON object mock-apns validated, is copied as it
    /// came unless it holds control bytes (which may sit in strings): then it is re-encoded.
    func logLine() -> [UInt8] {
        var o: [UInt8] = []
        o.reserveCapacity(512 + push.payload.count)
        var first = true
        func key(_ k: String) {
            o.append(first ? UInt8(ascii: "{") : UInt8(ascii: ","))
            first = false
            JSONString.append(k, to: &o)
            o.append(UInt8(ascii: ":"))
        }
        func string(_ k: String, _ v: String) { key(k); JSONString.append(v, to: &o) }
        func number<N: BinaryInteger>(_ k: String, _ v: N) { key(k); o.append(contentsOf: String(v).utf8) }
        string("apnsId", push.apnsID)
        if let c = push.collapseID { string("collapseId", c) }
        number("connectionId", connectionID)
        string("deviceToken", push.deviceToken)
        if let a = push.accessory { number("encryptedBytes", a.encryptedData.count) }
        if let e = push.expiration { number("expiration", e) }
        if let c = push.claims { number("iat", c.issuedAt); string("keyId", c.keyID) }
        if let a = push.accessory { number("messageIndex", a.messageIndex) }
        key("payload")
        if push.payload.allSatisfy({ $0 >= 0x20 }) {
            o.append(contentsOf: push.payload)
        } else if let object = try? JSONSerialization.jsonObject(with: Data(push.payload)),
                  let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
            o.append(contentsOf: data)
        } else {
            JSONString.append(String(decoding: push.payload, as: UTF8.self), to: &o)
        }
        if let p = push.priority { number("priority", p) }
        string("pushType", push.pushType)
        if let a = push.accessory { string("ratchetKeyId", Data(a.keyID).base64EncodedString()) }
        string("receivedAt", iso8601Millis(receivedAt))
        if verification.verified == true {
            key("response")
            var fields: [(String, String?)] = [("actionIdentifier", verification.actionIdentifier),
                                               ("notificationIdentifier", verification.notificationIdentifier),
                                               ("sourceIdentifier", verification.sourceIdentifier)]
            fields.append(("userText", verification.userText))
            var firstField = true
            o.append(UInt8(ascii: "{"))
            for (k, v) in fields {
                // jsonObject() leaves out nil identifiers but writes userText: null.
                guard v != nil || k == "userText" else { continue }
                if !firstField { o.append(UInt8(ascii: ",")) }
                firstField = false
                JSONString.append(k, to: &o)
                o.append(UInt8(ascii: ":"))
                if let v { JSONString.append(v, to: &o) } else { o.append(contentsOf: "null".utf8) }
            }
            o.append(UInt8(ascii: "}"))
        }
        if let a = push.accessory { string("sessionIdentifier", lowercaseString(a.sessionIdentifier)) }
        number("streamId", Int(streamID))
        if let c = push.claims { string("teamId", c.teamID) }
        string("topic", push.topic)
        key("verified")
        switch verification.verified {
        case .some(true): o.append(contentsOf: "true".utf8)
        case .some(false): o.append(contentsOf: "false".utf8)
        case .none: o.append(contentsOf: "null".utf8)
        }
        if let e = verification.error { string("verifyError", e) }
        o.append(UInt8(ascii: "}"))
        o.append(0x0A)
        return o
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
    /// Connections closed at accept, never read, or sent GOAWAY before any stream (faults).
    public var connectionsRefused = 0
    public var handshakesStalled = 0
    public var goAwaysBeforeFirstStream = 0
    public var verified = 0
    public var verifyFailed = 0

    public func jsonObject() -> [String: Any] {
        [
            "requests": requests, "accepted": accepted, "stalled": stalled, "aborted": aborted,
            "byStatusReason": byStatusReason, "connections": connectionsSeen,
            "goAwaysSent": goAwaysSent, "connectionsClosedByFault": connectionsClosed,
            "connectionsRefused": connectionsRefused, "handshakesStalled": handshakesStalled,
            "goAwaysBeforeFirstStream": goAwaysBeforeFirstStream,
            "verified": verified, "verifyFailed": verifyFailed,
        ]
    }
}
