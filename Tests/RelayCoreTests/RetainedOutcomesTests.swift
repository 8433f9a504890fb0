// The outcomes a PostgreSQL node keeps after a failed write (PostgresOutboxStore+RetainedOutcomes):
// one per row and lease epoch, in order, bounded, retried with back-off, and only for failures
// that may pass.
import Testing
@testable import RelayCore

@Suite struct RetainedOutcomesTests {
    func update(_ id: String, epoch: Int64?) -> DeliveryUpdate {
        DeliveryUpdate(id: id, pushToken: "ab", outcome: .delivered, attempt: nil, leaseEpoch: epoch)
    }

    @Test func keepsOnePerRowAndEpochInOrder() {
        var r = RetainedOutcomes()
        #expect(r.isEmpty)
        _ = r.keep([update("a", epoch: 1), update("b", epoch: 1)], nowMonotonicMillis: 0)
        // The same answer again (a write that carried it failed too) is not doubled; another
        // lease of the same row is its own outcome.
        _ = r.keep([update("a", epoch: 1), update("a", epoch: 2)], nowMonotonicMillis: 0)
        #expect(r.updates.map { "\($0.id)/\($0.leaseEpoch ?? -1)" } == ["a/1", "b/1", "a/2"])
        let taken = r.take()
        #expect(taken.count == 3 && r.isEmpty)
        _ = r.keep([update("a", epoch: 1)], nowMonotonicMillis: 0)
        #expect(r.updates.count == 1, "taken outcomes are forgotten: a failed write keeps them again")
    }

    @Test func theBoundDropsTheOldest() {
        var r = RetainedOutcomes()
        let n = RetainedOutcomes.limit + 3
        let dropped = r.keep((0..<n).map { update("r\($0)", epoch: 1) }, nowMonotonicMillis: 0)
        #expect(dropped == 3)
        #expect(r.updates.count == RetainedOutcomes.limit)
        #expect(r.updates.first?.id == "r3" && r.updates.last?.id == "r\(n - 1)")
        _ = r.keep([update("r0", epoch: 1)], nowMonotonicMillis: 0)
        #expect(r.updates.last?.id == "r0", "a dropped key may be kept again")
    }

    @Test func retriesBackOffFrom100MsTo2sAndStartOverAfterAWrite() {
        var r = RetainedOutcomes()
        var waits: [Int64] = []
        for _ in 0..<7 {
            _ = r.keep([update("a", epoch: 1)], nowMonotonicMillis: 1_000)
            waits.append(r.retryAt - 1_000)
            _ = r.take()
        }
        #expect(waits == [100, 200, 400, 800, 1_600, 2_000, 2_000])
        r.written()
        _ = r.keep([update("a", epoch: 1)], nowMonotonicMillis: 1_000)
        #expect(r.retryAt == 1_100)
    }

    @Test func onlyFailuresThatMayPassAreKept() {
        #expect(RetainedOutcomes.worthKeeping(after: StoreError.unavailable("PostgreSQL connection lost")))
        for state in ["08006", "57P01", "57014", "53100", "40001", "25006"] {
            #expect(RetainedOutcomes.worthKeeping(after: StoreError.postgres(sqlState: state, message: "", context: "")), "\(state)")
        }
        for state in ["23505", "22P02", "42P01"] {
            #expect(!RetainedOutcomes.worthKeeping(after: StoreError.postgres(sqlState: state, message: "", context: "")), "\(state)")
        }
        #expect(!RetainedOutcomes.worthKeeping(after: StoreError.closed))
        #expect(!RetainedOutcomes.worthKeeping(after: StoreError.invalid("x")))
    }
}
