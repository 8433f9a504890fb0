import Foundation
import Synchronization
import Testing
@testable import RelayCore

@Suite struct DispatchChannelTests {
    func row(_ n: Int) -> OutboxRow {
        OutboxRow(id: "id-\(n)", app: "a", pushToken: "ab", sessionIdentifier: "S", keyID: [1, 2, 3, 4], messageIndex: UInt32(n),
                  encryptedData: [0], credentialID: "c", state: .inflight, attempts: 0, nextAttemptAt: 0, createdAt: 0, expiresAt: 1,
                  lastStatus: nil, lastReason: nil, updatedAt: 0)
    }

    func push(_ n: Int) -> FinishedPush {
        FinishedPush(row: row(n), answer: PushAnswer(status: 200, reason: nil, classification: .done), at: 1, latencyMicros: 1, random: 0)
    }

    @Test func roomIsOfferedOnlyWhileTheDispatcherRunsAndUpToItsCapacity() {
        let ch = DispatchChannel()
        #expect(ch.roomForDueRows == 0)   // not started: every row is inserted queued
        ch.open(capacity: 2)
        #expect(ch.roomForDueRows == 2)
        ch.occupy(1)                      // a claimed row
        #expect(ch.roomForDueRows == 1 && ch.take(waitingMillis: 0).freeSlots == 1)
        // A handed-off row takes its slot (now in flight) until it is answered.
        ch.committed(OutboxCommit(handedOff: [row(1)]))
        #expect(ch.roomForDueRows == 0 && ch.inflightCount == 2)
        ch.answered(push(1))
        #expect(ch.inflightCount == 1 && ch.roomForDueRows == 1)
        let inbox = ch.take(waitingMillis: 0)
        #expect(inbox.rows == [row(1)] && inbox.answers.count == 1 && inbox.freeSlots == 1)
        #expect(ch.requestStop())
        #expect(ch.roomForDueRows == 0)   // stopping: no new hand-offs
        #expect(!ch.requestStop())        // once
    }

    @Test func answersDuringTheStopAreMarkedAndNothingIsKeptAfterTheThreadExited() {
        let ch = DispatchChannel()
        ch.open(capacity: 4)
        ch.occupy(2)
        ch.answered(push(1))
        #expect(ch.requestStop())
        ch.answered(push(2))
        let inbox = ch.take(waitingMillis: 0)
        #expect(inbox.stopRequested && inbox.answers.map(\.duringStop) == [false, true])
        ch.endGrace()
        #expect(ch.take(waitingMillis: 0).graceOver)
        ch.finish()
        #expect(!ch.isRunning)
        // Late answers and rows committed after exit are dropped (the rows stay inflight in the
        // database and are requeued at the next start).
        ch.answered(push(3))
        ch.committed(OutboxCommit(handedOff: [row(4)], queuedDue: true))
        #expect(ch.take(waitingMillis: 0).isEmpty)
    }

    @Test func aWaitingTakeReturnsAsSoonAsSomethingIsPosted() {
        let ch = DispatchChannel()
        ch.open(capacity: 4)
        let got = Mutex<DispatchInbox?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            got.withLock { $0 = ch.take(waitingMillis: nil) }
            done.signal()
        }
        usleep(20_000)
        ch.wake()
        #expect(done.wait(timeout: .now() + 30) == .success)
        #expect(got.withLock { $0?.mayHaveDue } == true)
    }
}
