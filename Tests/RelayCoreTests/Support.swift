import Foundation
import Synchronization
@testable import RelayCore

extension APIRequest {
    /// Tests spell requests with a header dictionary (lowercased names); only authorization and
    /// content-type reach the services.
    init(method: String, path: String, headers: [String: String], body: [UInt8], requestID: String,
         remoteAddress: String = "") {
        self.init(method: method, path: path, authorization: headers["authorization"], contentType: headers["content-type"],
                  body: body, requestID: requestID, remoteAddress: remoteAddress)
    }
}

final class TestClock: RelayClock {
    private let now: Mutex<Int64>
    init(_ start: Int64 = 1_800_000_000_000) { now = Mutex(start) }
    func nowMillis() -> Int64 { now.withLock { $0 } }
    func advance(_ ms: Int64) { now.withLock { $0 += ms } }
}

struct FixedRandom: RandomSource {
    var value: Double
    func unit() -> Double { value }
}

/// A fresh temporary directory removed when the value dies.
final class TempDir {
    let path: String
    init() {
        path = NSTemporaryDirectory() + "relaycore-" + UUID().uuidString
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
    var db: String { path + "/relay.db" }
}

func sample(token: String = String(repeating: "ab", count: 32), index: UInt32 = 1, app: String? = nil) -> NewResponse {
    NewResponse(app: app, pushToken: token, sessionIdentifier: "6F9619FF-8B86-D011-B42D-00C04FC964FF",
                keyID: [1, 2, 3, 4], messageIndex: index, encryptedData: [UInt8](repeating: 5, count: 40))
}

extension OutboxStore {
    /// Blocking ingest for tests.
    func ingestNow(_ r: NewResponse, secret: String, apps: Set<String> = ["com.example.app"], ttl: Int64 = 86_400_000, maxPending: Int = 1000,
                   quarantine: Int64 = 3_600_000, badDeviceTokenHold: Int64 = 3_600_000) throws -> IngestOutcome {
        let slot = ResultBox<Result<IngestOutcome, StoreError>>()
        let done = DispatchSemaphore(value: 0)
        ingestSettings = IngestStoreSettings(configuredApps: apps, ttlMillis: ttl, maxPending: maxPending,
                                             unregisteredQuarantineMillis: quarantine, badDeviceTokenHoldMillis: badDeviceTokenHold)
        submit(IngestRequest(response: r, credentialHash: Credentials.hash(secret: secret))) {
            slot.value = $0
            done.signal()
        }
        done.wait()
        return try slot.value!.get()
    }
}

final class Counter: Sendable {
    private let n = Mutex(0)
    func add() { n.withLock { $0 += 1 } }
    var value: Int { n.withLock { $0 } }
}
