import Foundation
import Synchronization
import Testing
@testable import RelayCore

/// The reader pool refuses client reads past `maxQueued` waiting (the API answers 503
/// storage_unavailable with Retry-After) instead of queueing them without end; internal work
/// (`submit(_:)`) still queues.
@Suite struct WorkerPoolBoundTests {
    @Test func readsPastTheBoundAreRefused() {
        let pool = WorkerPool(name: "test-reader", threads: 1, maxQueued: 3)
        defer { pool.close() }
        let gate = DispatchSemaphore(value: 0)
        let entered = DispatchSemaphore(value: 0)
        pool.submit { entered.signal(); gate.wait() }
        entered.wait()
        let ran = Atomic<Int>(0)
        var refused = 0
        for _ in 0..<5 { pool.submit({ ran.add(1, ordering: .relaxed) }, whenFull: { refused += 1 }) }
        #expect(refused == 2)
        let internalRan = DispatchSemaphore(value: 0)
        pool.submit { internalRan.signal() }   // past the bound: still queued
        gate.signal()
        #expect(internalRan.wait(timeout: .now() + 30) == .success)
        #expect(ran.load(ordering: .relaxed) == 3)
    }
}
