import Foundation
import POSIXThreads
@testable import RelayCore
import Testing

@Suite struct TimeFormatTests {
    @Test func iso8601UTCMatchesFoundationsFormatter() {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        formatter.timeZone = TimeZone(identifier: "UTC")
        // Epoch, leap day, end of a year, far future, a millisecond before the epoch.
        for ms: Int64 in [0, 1, 999, 1_709_164_800_123, 1_798_761_599_999, 4_102_444_800_000, -1] {
            let expected = formatter.string(from: Date(timeIntervalSince1970: Double(ms) / 1000))
            #expect(iso8601UTC(millis: ms) == expected, "\(ms)")
        }
        #expect(iso8601UTC(millis: 1_709_164_800_123) == "2024-02-29T00:00:00.123Z")
        #expect(iso8601UTC(millis: -1) == "1969-12-31T23:59:59.999Z")
    }
}

@Suite struct POSIXThreadsTests {
    @Test func threadRunsItsBodyAndConditionWakesTheWaiter() {
        let condition = Condition()
        let state = Box()
        let thread = OSThread {
            condition.withLock { state.value = 42; condition.broadcast() }
        }
        thread.name = "test-thread"
        condition.lock()
        thread.start()
        let deadline = Date().addingTimeInterval(10)
        while state.value == 0 && Date() < deadline { condition.wait(until: deadline) }
        condition.unlock()
        #expect(state.value == 42)
    }

    @Test func timedWaitReturnsFalseAtItsDeadline() {
        let condition = Condition()
        let deadline = Date().addingTimeInterval(0.05)
        // Nobody signals, so only the deadline ends the loop (a spurious wake-up returns true
        // and waits again); the bound on rounds keeps a broken wait from spinning forever.
        var rounds = 0
        condition.lock()
        while rounds < 1000, condition.wait(until: deadline) { rounds += 1 }
        condition.unlock()
        #expect(rounds < 1000)
        #expect(Date() >= deadline.addingTimeInterval(-0.002))
        // A deadline in the past returns at once instead of waiting forever.
        condition.withLock { #expect(!condition.wait(until: Date(timeIntervalSince1970: 0))) }
    }

    /// Written and read only under the test's condition lock.
    final class Box: @unchecked Sendable { var value = 0 }
}
