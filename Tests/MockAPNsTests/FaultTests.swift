import Foundation
import Testing
@testable import MockAPNs

@Suite struct FaultPlanTests {
    @Test func tokenRuleHitsOnlyThatToken() throws {
        let plan = FaultPlan(rules: [try FaultRule(commandLine: "status=410,reason=Unregistered,token=ABCD,timestamp=1234")])
        let hit = plan.decide(deviceToken: "abcd", nowMs: 99, random: { 0.5 })
        #expect(hit.rejection == Rejection(status: 410, reason: "Unregistered", detail: "injected fault", timestampMs: 1234))
        #expect(plan.decide(deviceToken: "abce", nowMs: 99, random: { 0.5 }) == .none)
    }

    @Test func fractionUsesTheInjectedRandom() throws {
        let plan = FaultPlan(rules: [try FaultRule(commandLine: "status=503,fraction=0.25")])
        #expect(plan.decide(deviceToken: "00", nowMs: 0, random: { 0.2499 }).rejection?.reason == "ServiceUnavailable")
        #expect(plan.decide(deviceToken: "00", nowMs: 0, random: { 0.25 }).rejection == nil)
        // Over a fixed sequence, exactly the rolls below the fraction are hit.
        var rolls = (0..<100).map { Double($0) / 100 }.makeIterator()
        let hits = (0..<100).filter { _ in plan.decide(deviceToken: "00", nowMs: 0, random: { rolls.next()! }).rejection != nil }.count
        #expect(hits == 25)
    }

    @Test func firstStatusOrStallWinsAndLatenciesAdd() throws {
        let plan = FaultPlan(rules: [
            try FaultRule(commandLine: "latency=20"),
            try FaultRule(commandLine: "stall,token=aa"),
            try FaultRule(commandLine: "status=429"),
            try FaultRule(commandLine: "latency=5,token=aa"),
        ])
        let aa = plan.decide(deviceToken: "aa", nowMs: 0, random: { 0 })
        #expect(aa.stall && aa.rejection == nil && aa.latencyMs == 25)
        let aborting = FaultPlan(rules: [try FaultRule(commandLine: "abort,fraction=0.5"), try FaultRule(commandLine: "status=500")])
        #expect(aborting.decide(deviceToken: "aa", nowMs: 0, random: { 0.1 }) == FaultDecision(rejection: nil, stall: false, abort: true, latencyMs: 0))
        #expect(aborting.decide(deviceToken: "aa", nowMs: 0, random: { 0.9 }).rejection?.status == 500)
        let bb = plan.decide(deviceToken: "bb", nowMs: 0, random: { 0 })
        #expect(!bb.stall && bb.rejection?.status == 429 && bb.rejection?.reason == "TooManyRequests" && bb.latencyMs == 20)
        // 410 without an explicit timestamp carries "now".
        let gone = FaultPlan(rules: [try FaultRule(commandLine: "status=410")]).decide(deviceToken: "aa", nowMs: 777, random: { 0 })
        #expect(gone.rejection?.timestampMs == 777 && gone.rejection?.reason == "Unregistered")
    }

    @Test func connectionFaultsCountStreams() throws {
        let plan = FaultPlan(rules: [try FaultRule(commandLine: "goaway-after=3"), try FaultRule(commandLine: "close-after=5")])
        #expect(plan.connectionFault(afterStream: 2) == .none)
        #expect(plan.connectionFault(afterStream: 3) == .goAway)
        #expect(plan.connectionFault(afterStream: 5) == .close)
        #expect(FaultPlan().connectionFault(afterStream: 1_000_000) == .none)
        let errors = FaultPlan(rules: [try FaultRule(commandLine: "goaway-after-errors=2")])
        #expect(errors.countsErrors && !plan.countsErrors)
        #expect(errors.connectionFault(afterStream: 9, errors: 1) == .none)
        #expect(errors.connectionFault(afterStream: 9, errors: 2) == .goAway)
    }

    @Test func connectionStartFaultsDecideEachNewConnection() throws {
        #expect(FaultPlan().connectionStart(random: { 0 }) == .none)
        #expect(FaultPlan(rules: [try FaultRule(commandLine: "refuse-connections")]).connectionStart(random: { 0.9 }) == .refuse)
        #expect(FaultPlan(rules: [try FaultRule(commandLine: "stall-handshake")]).connectionStart(random: { 0 }) == .stallHandshake)
        let goAway = FaultPlan(rules: [try FaultRule(commandLine: "status=500"), try FaultRule(commandLine: "goaway-before-first-stream")])
        #expect(goAway.connectionStart(random: { 0 }) == .goAwayBeforeFirstStream)
        // Request rules ignore it and it ignores them.
        #expect(goAway.decide(deviceToken: "aa", nowMs: 0, random: { 0 }).rejection?.status == 500)
        #expect(FaultPlan(rules: [try FaultRule(commandLine: "goaway-before-first-stream")]).decide(deviceToken: "aa", nowMs: 0, random: { 0 }) == .none)
        let half = FaultPlan(rules: [try FaultRule(commandLine: "refuse,fraction=0.5")])
        #expect(half.connectionStart(random: { 0.4 }) == .refuse)
        #expect(half.connectionStart(random: { 0.6 }) == .none)
        let json = #"{"refuseConnections":true,"fraction":0.5}"#
        #expect(try JSONDecoder().decode(FaultRule.self, from: Data(json.utf8)) == (try FaultRule(commandLine: "refuse-connections,fraction=0.5")))
    }

    @Test func badRulesAreRefused() {
        for text in ["status=200", "fraction=2,status=500", "reason=Unregistered", "goaway-after=0", "token=xyz,status=410", "bogus=1", "fraction=0.5", "latency=abc", "refuse,token=ab", "stall-handshake,token=ab"] {
            #expect(throws: MockConfigurationError.self, "\(text)") { try FaultRule(commandLine: text) }
        }
    }

    @Test func jsonAndCommandLineAgree() throws {
        let json = #"{"status":410,"reason":"ExpiredToken","deviceToken":"ab","fraction":0.5}"#
        let decoded = try JSONDecoder().decode(FaultRule.self, from: Data(json.utf8))
        #expect(decoded == (try FaultRule(commandLine: "status=410,reason=ExpiredToken,token=ab,fraction=0.5")))
        #expect(FaultPlan(rules: [try FaultRule(commandLine: "expire-tokens-before=100"), try FaultRule(commandLine: "expire-tokens-before=200")]).expireTokensIssuedBefore == 200)
    }
}
