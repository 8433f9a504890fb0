import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// The group-commit writer's queue is bounded for ingest jobs: a load the disk cannot follow
/// used to grow it (and the relay's memory, each job holding a request) without end. Past
/// `maxQueuedJobs` waiting jobs an ingest is refused at once with `.unavailable`, which the API
/// answers 503 storage_unavailable with Retry-After; the dispatcher's jobs still queue.
@Suite struct WriterQueueBoundTests {
    let dir = TempDir()

    @Test func ingestsPastTheBoundAreRefusedAndTheRestCommit() throws {
        let s = try SQLiteOutboxStore(path: dir.db)
        defer { s.close() }
        let c = try s.createCredential(name: "c", apps: ["com.example.app"])
        let writer = try #require(s.writer)
        let bound = writer.maxQueuedJobs
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        writer.enqueue({ _ in entered.signal(); gate.wait() }, completion: { _ in })
        entered.wait()
        let done = DispatchGroup()
        let accepted = Atomic<Int>(0)
        let refused = Atomic<Int>(0)
        s.ingestSettings = IngestStoreSettings(configuredApps: ["com.example.app"], ttlMillis: 60_000, maxPending: 100_000)
        for i in 0..<(bound + 5) {
            done.enter()
            s.submit(IngestRequest(response: sample(index: UInt32(i)), credentialHash: Credentials.hash(secret: c.secret))) { r in
                switch r {
                case .success(.accepted): accepted.add(1, ordering: .relaxed)
                case .failure(.unavailable): refused.add(1, ordering: .relaxed)
                default: break
                }
                done.leave()
            }
        }
        // The five past the bound were refused before the writer ran again.
        #expect(refused.load(ordering: .relaxed) == 5)
        // Work that is not an ingest still queues past the bound.
        let closureRan = DispatchSemaphore(value: 0)
        writer.enqueue({ _ in }, completion: { _ in closureRan.signal() })
        gate.signal()
        done.wait()
        #expect(closureRan.wait(timeout: .now() + 60) == .success)
        #expect(accepted.load(ordering: .relaxed) == bound)
    }
}
