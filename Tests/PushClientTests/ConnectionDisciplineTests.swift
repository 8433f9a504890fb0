// How PushClient treats APNs' connections when APNs is slow or refuses them, against mock-apns
// with scaled timings: a slow server keeps its connection and gets no duplicate, and failing
// connection set-ups (untrusted certificate, refused, stalled handshake, GOAWAY before any
// stream) are retried no faster than the pacing allows. Assertions are counts.
import Foundation
import MockAPNs
import Synchronization
import Testing
@testable import PushClient

@Suite(.serialized) struct ConnectionDisciplineTests {
    /// Production's shape (doubling, capped), scaled: 100 ms doubling to 800 ms. The window cap
    /// is out of the way here: ConnectionPacerTests covers it.
    static let pacing = ConnectionPacing(backoffBase: .milliseconds(100), backoffCap: .milliseconds(800),
                                         maxNewConnections: 10_000)

    /// Most connection attempts `pacing` allows within `window` when every attempt fails: one
    /// per slot at once, then each at least half its back-off ceiling after the previous one.
    static func attemptBound(_ pacing: ConnectionPacing, slots: Int, within window: Duration) -> Int {
        let pacer = ConnectionPacer(pacing)
        var t = Duration.zero
        var n = 1
        while t + pacer.ceiling(failures: n) / 2 <= window {
            t += pacer.ceiling(failures: n) / 2
            n += 1
        }
        return n + slots - 1
    }

    /// Sends one push every `every` for `duration` without retrying (a steady backlog), then
    /// returns the results of all of them once each completed (bounded wait).
    static func steadyLoad(_ client: PushClient, for duration: Duration, every: Duration = .milliseconds(20),
                           settle: Double = 20) -> [PushResult?] {
        let box = Mutex<[String: PushResult]>([:])
        var requests: [PushRequest] = []
        let end = ContinuousClock.now + duration
        while ContinuousClock.now < end {
            let r = push(index: UInt32(requests.count))
            requests.append(r)
            client.send(r) { result in box.withLock { $0[r.apnsIDString] = result } }
            Thread.sleep(forTimeInterval: Double(every.components.attoseconds) / 1e18 + Double(every.components.seconds))
        }
        _ = eventually(upTo: settle) { box.withLock { $0.count } == requests.count }
        let byID = box.withLock { $0 }
        return requests.map { byID[$0.apnsIDString] }
    }

    /// Answers take 2 s, the request timeout is 300 ms: every push outlives its timeout. The
    /// mock still answers PING, so each slot keeps its one connection (the old client opened a
    /// new one after every timeout) and every push is waited for and delivered, none written
    /// twice. (Before answerWaitCap, all 20 failed with a timeout here, and a caller's retry of
    /// each was a duplicate.)
    @Test func slowServerKeepsItsConnectionsAndGetsNoDuplicate() throws {
        let rig = try MockRig(faults: [FaultRule(latencyMs: 2000)])
        let client = try rig.client(connections: 2, requestTimeout: .milliseconds(300), pacing: Self.pacing,
                                    answerWaitCap: .seconds(20))
        defer { client.shutdown() }
        let results = Self.steadyLoad(client, for: .seconds(1), every: .milliseconds(50), settle: 40)
        #expect(results.allSatisfy { $0.map(isDelivered) == true }, "\(results.filter { $0.map(isDelivered) != true })")
        let stats = client.engineStats
        #expect(stats.connectionsOpened == 2)
        #expect(rig.mock.connectionsAccepted == 2)
        #expect(stats.deadConnections == 0)
        #expect(stats.timeoutPings >= 2 && stats.pingAcks >= 2)
        #expect(stats.answersAwaitedPastTimeout == results.count && stats.lateAnswers == results.count)
        // Every push reached the mock exactly once: nothing written twice.
        let ids = rig.mock.deliveries.map(\.apnsID)
        #expect(ids.count == results.count)
        #expect(Set(ids).count == ids.count)
        print("slow server: \(results.count) pushes, \(stats.connectionsOpened) connections, \(stats.timeoutPings) timeout PINGs, "
              + "\(stats.lateAnswers) answered late, \(ids.count - Set(ids).count) duplicates")
    }

    /// While an answer is overdue its connection stays on probation: a push sent meanwhile waits
    /// for that answer instead of joining a server that is not answering (the mock allows 100
    /// streams from the start here, so only probation holds it back).
    @Test func overdueAnswerKeepsTheConnectionOnProbation() throws {
        let rig = try MockRig(faults: [FaultRule(deviceToken: "5100", latencyMs: 3000)], streams: (initial: 100, max: 100))
        let client = try rig.client(connections: 1, requestTimeout: .milliseconds(300), pacing: Self.pacing,
                                    answerWaitCap: .seconds(20))
        defer { client.shutdown() }
        #expect(sendAll(client, [push()])[0].map(isDelivered) == true)
        let order = Mutex<[String]>([])
        let slow = push("5100")
        client.send(slow) { r in order.withLock { $0.append(isDelivered(r) ? "slow" : "slow failed: \(r)") } }
        #expect(eventually(upTo: 10) { client.engineStats.answersAwaitedPastTimeout == 1 })
        let fast = (0..<3).map { push(index: UInt32($0)) }
        for r in fast { client.send(r) { r in order.withLock { $0.append(isDelivered(r) ? "fast" : "fast failed: \(r)") } } }
        #expect(eventually(upTo: 20) { order.withLock { $0.count } == 4 })
        #expect(order.withLock { $0 } == ["slow", "fast", "fast", "fast"])
        #expect(client.engineStats.connectionsOpened == 1 && client.engineStats.lateAnswers == 1)
    }

    /// A connection that stops answering PING while an answer is overdue is dead: the push
    /// fails then (a transport failure, the caller may retry: a possible duplicate, the bound
    /// of this design), well before answerWaitCap, and the next push goes out on a new connection.
    @Test func unansweredPingFailsAnOverdueAnswer() throws {
        let rig = try MockRig(faults: [FaultRule(deviceToken: "5100", latencyMs: 60_000)])
        let proxy = try FreezableProxy(targetPort: rig.mock.port)
        defer { proxy.close() }
        // pingTimeout = max(pingInterval, 1 s): 1 s here.
        let client = try rig.client(requestTimeout: .milliseconds(300), pingInterval: .seconds(1), pacing: Self.pacing,
                                    url: "https://127.0.0.1:\(proxy.port)", answerWaitCap: .seconds(60))
        defer { client.shutdown() }
        #expect(sendAll(client, [push()])[0].map(isDelivered) == true)
        let slow = push("5100")
        let box = Mutex<PushResult?>(nil)
        client.send(slow) { r in box.withLock { $0 = r } }
        #expect(eventually(upTo: 10) { client.engineStats.answersAwaitedPastTimeout == 1 })
        proxy.freezeExisting()
        #expect(eventually(upTo: 20) { box.withLock { $0 } != nil })
        let result = box.withLock { $0 }
        guard case .transportFailure(let m)? = result else { Issue.record("expected a transport failure, got \(String(describing: result))"); return }
        #expect(m.contains("PING"), "\(m)")
        let stats = client.engineStats
        #expect(stats.deadConnections == 1 && stats.answerWaitsCapped == 0 && stats.lateAnswers == 0)
        #expect(sendAll(client, [push()])[0].map(isDelivered) == true)
        #expect(proxy.connectionCount == 2)
    }

    /// Pushes queued behind a slow connection (one stream at a time until the first answer)
    /// fail as not sent after queueWaitCap: nothing of them was written, so the caller's retry
    /// is no duplicate. The written one is waited for and delivered.
    @Test func queuedPushesFailAsNotSentAfterQueueWaitCap() throws {
        let rig = try MockRig(faults: [FaultRule(latencyMs: 2000)])
        let client = try rig.client(connections: 1, requestTimeout: .milliseconds(300), pacing: Self.pacing,
                                    answerWaitCap: .seconds(20), queueWaitCap: .milliseconds(500))
        defer { client.shutdown() }
        let requests = (0..<5).map { push(index: UInt32($0)) }
        let results = sendAll(client, requests, upTo: 20)
        let delivered = results.filter { $0.map(isDelivered) == true }.count
        let notSent = results.filter { if case .transportFailure(let m)? = $0 { m.hasPrefix("not sent") } else { false } }.count
        #expect(delivered == 1 && notSent == 4, "\(results)")
        #expect(client.engineStats.notSent == 4)
        #expect(rig.mock.deliveries.count == 1)
    }

    /// A server that answers one stream at a time in 50 ms, with a 3 s request timeout and
    /// 100 pushes at once (5 s of queue): time spent queued does not count, so every push gets
    /// its full budget and is answered. (The budget is 60x the latency so a loaded 2-core CI
    /// machine stays inside it; counted from `send`, the last 40 of the queue cannot.)
    /// A caller that retries transport failures (as the dispatcher does) sends nothing twice,
    /// and one connection carries everything.
    @Test func queuedTimeDoesNotCountAgainstTheRequest() throws {
        let rig = try MockRig(faults: [FaultRule(latencyMs: 50)], streams: (initial: 1, max: 1))
        let client = try rig.client(connections: 1, requestTimeout: .milliseconds(3_000), pacing: Self.pacing)
        defer { client.shutdown() }
        let requests = (0..<100).map { push(index: UInt32($0)) }
        let done = Mutex<[String: PushResult]>([:])
        let tries = Mutex(0)
        @Sendable func attempt(_ r: PushRequest, _ left: Int) {
            tries.withLock { $0 += 1 }
            client.send(r) { result in
                if case .transportFailure = result, left > 0 { return attempt(r, left - 1) }
                done.withLock { $0[r.apnsIDString] = result }
            }
        }
        for r in requests { attempt(r, 3) }
        #expect(eventually(upTo: 90) { done.withLock { $0.count } == requests.count })
        let results = done.withLock { $0 }
        #expect(results.values.allSatisfy(isDelivered), "\(results.values.filter { !isDelivered($0) })")
        #expect(tries.withLock { $0 } == requests.count)
        let ids = rig.mock.deliveries.map(\.apnsID)
        #expect(ids.count == requests.count)
        #expect(Set(ids) == Set(requests.map(\.apnsIDString)))
        #expect(rig.mock.connectionsAccepted == 1)
        #expect(client.engineStats.timeoutPings == 0)
    }

    /// APNs' "the connection is going away" answers: the push gets its answer, the pushes
    /// already in flight on that connection finish on it, and the next ones go to a new
    /// connection. A 500 concerns one request only: the connection stays.
    @Test(arguments: [(503, "Shutdown", true), (400, "IdleTimeout", true), (500, "InternalServerError", false)])
    func connectionLevelAnswersRetireTheConnection(status: Int, reason: String, retires: Bool) throws {
        let rig = try MockRig(faults: [FaultRule(deviceToken: "5100", latencyMs: 300),
                                       FaultRule(deviceToken: "dead", status: status, reason: reason)])
        let client = try rig.client(connections: 1, pacing: Self.pacing)
        defer { client.shutdown() }
        #expect(sendAll(client, [push()])[0].map(isDelivered) == true)   // unlocks the stream limit
        let slow = (0..<5).map { push("5100", index: UInt32($0)) }
        let box = Mutex<[String: PushResult]>([:])
        for r in slow { client.send(r) { result in box.withLock { $0[r.apnsIDString] = result } } }
        let answer = sendAll(client, [push("dead")])[0]
        #expect(answer == .rejected(status: status, reason: APNsReason(rawValue: reason), timestamp: nil))
        #expect(eventually(upTo: 10) { box.withLock { $0.count } == slow.count })
        #expect(box.withLock { $0.values.allSatisfy(isDelivered) })
        let later = sendAll(client, (0..<5).map { push(index: UInt32(10 + $0)) })
        #expect(later.allSatisfy { $0.map(isDelivered) == true })
        let byConnection = Dictionary(grouping: rig.mock.deliveries, by: \.connectionID)
        #expect(byConnection.count == (retires ? 2 : 1))
        // The slow pushes finished on the first connection, after the answer that retired it.
        let first = try #require(byConnection.keys.min())
        #expect(Set(slow.map(\.apnsIDString)).isSubset(of: Set(byConnection[first, default: []].map(\.apnsID))))
        #expect(client.engineStats.connectionsOpened == (retires ? 2 : 1))
    }

    enum SetupFault: String, CaseIterable, Sendable {
        case untrustedCertificate, refused, stalledHandshake, goAwayBeforeFirstStream
    }

    /// Every connection set-up fails for 3 s under a steady backlog (50 pushes/s): attempts
    /// follow the back-off schedule (at most ~10 here; the old client made one per failure
    /// with no delay, ~126/s against an untrusted certificate). Every push completes with a
    /// transport failure, none delivered; once the fault is gone the next push is delivered.
    @Test(arguments: SetupFault.allCases)
    func failingSetupIsRetriedOnTheBackoffSchedule(fault: SetupFault) throws {
        let rig: MockRig
        switch fault {
        case .untrustedCertificate: rig = try MockRig(tlsFault: .untrusted)
        case .refused: rig = try MockRig(faults: [FaultRule(refuseConnections: true)])
        case .stalledHandshake: rig = try MockRig(faults: [FaultRule(stallHandshake: true)])
        case .goAwayBeforeFirstStream: rig = try MockRig(faults: [FaultRule(goAwayBeforeFirstStream: true)])
        }
        let client = try rig.client(connections: 2, requestTimeout: .seconds(2), connectTimeout: .milliseconds(150),
                                    pacing: Self.pacing)
        defer { client.shutdown() }
        let window = Duration.seconds(3)
        let results = Self.steadyLoad(client, for: window, settle: 5)
        let serverCount: Int = switch fault {
        case .untrustedCertificate: rig.mock.tlsHandshakeFailures
        case .refused: rig.mock.stats.connectionsRefused
        case .stalledHandshake: rig.mock.stats.handshakesStalled
        case .goAwayBeforeFirstStream: rig.mock.stats.goAwaysBeforeFirstStream
        }
        let opened = client.engineStats.connectionsOpened
        // The last attempts may still be in progress when the load stops: allow the settle time.
        let bound = Self.attemptBound(Self.pacing, slots: 2, within: window + .seconds(1))
        print("\(fault): \(results.count) pushes, \(opened) connections opened, \(serverCount) seen failing by the mock, bound \(bound)")
        #expect(opened <= bound)
        #expect(serverCount <= opened)
        #expect(serverCount >= 3)   // it keeps trying
        #expect(rig.mock.deliveries.isEmpty)
        #expect(results.allSatisfy { if case .transportFailure? = $0 { true } else { false } })
        guard fault != .untrustedCertificate else { return }
        rig.mock.setFaults(FaultPlan())
        let after = sendAll(client, [push()], upTo: 10)
        #expect(after[0].map(isDelivered) == true, "\(String(describing: after[0]))")
    }
}
