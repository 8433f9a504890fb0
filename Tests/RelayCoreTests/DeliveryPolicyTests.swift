import Testing
@testable import RelayCore

private func row(attempts: Int = 0, expiresAt: Int64 = 10_000_000) -> OutboxRow {
    OutboxRow(id: "id", app: "a", pushToken: "ab", sessionIdentifier: "s", keyID: [1, 2, 3, 4], messageIndex: 1, encryptedData: [],
              credentialID: "c", state: .inflight, attempts: attempts, nextAttemptAt: 0, createdAt: 0, expiresAt: expiresAt,
              lastStatus: nil, lastReason: nil, updatedAt: 0)
}

@Suite struct DeliveryPolicyTests {
    let policy = DeliveryPolicy(backoffBaseMillis: 1000, backoffCapMillis: 60_000, tooManyRequestsDelayMillis: 30_000)

    @Test func doneIsDelivered() {
        #expect(policy.decide(PushAnswer(status: 200, reason: nil, classification: .done), row: row(), now: 5, random: 0.5) == .delivered)
    }

    @Test func terminalFailsWithReason() {
        let a = PushAnswer(status: 413, reason: "PayloadTooLarge", classification: .terminal("PayloadTooLarge"))
        #expect(policy.decide(a, row: row(), now: 5, random: 0.5) == .failed(reason: "PayloadTooLarge"))
    }

    /// BadDeviceToken marks its token (at the answer's time) unless dispatch.badDeviceTokenHoldSeconds is 0.
    @Test func badDeviceTokenMarksTheTokenUnlessTheHoldIsOff() {
        let a = PushAnswer(status: 400, reason: "BadDeviceToken", classification: .terminal("BadDeviceToken"))
        #expect(policy.decide(a, row: row(), now: 5, random: 0.5) == .unregistered(reason: "BadDeviceToken", apnsTimestamp: 5))
        var off = policy
        off.marksBadDeviceTokens = false
        #expect(off.decide(a, row: row(), now: 5, random: 0.5) == .failed(reason: "BadDeviceToken"))
    }

    @Test func gone410RecordsApnsTimestamp() {
        let a = PushAnswer(status: 410, reason: "Unregistered", apnsTimestamp: 1234, classification: .terminal("Unregistered"))
        #expect(policy.decide(a, row: row(), now: 5, random: 0.5) == .unregistered(reason: "Unregistered", apnsTimestamp: 1234))
        let b = PushAnswer(status: 410, reason: "ExpiredToken", classification: .terminal("ExpiredToken"))
        #expect(policy.decide(b, row: row(), now: 77, random: 0.5) == .unregistered(reason: "ExpiredToken", apnsTimestamp: 77))
    }

    @Test func tooManyRequestsPacesTheToken() {
        let a = PushAnswer(status: 429, reason: "TooManyRequests", classification: .retryAfterDelay)
        #expect(policy.decide(a, row: row(), now: 100, random: 0.9) == .retry(at: 30_100, paceTokenUntil: 30_100))
    }

    @Test func tooManyProviderTokenUpdatesBacksOffWithoutPacing() {
        let a = PushAnswer(status: 429, reason: "TooManyProviderTokenUpdates", classification: .retryAfterDelay)
        #expect(policy.decide(a, row: row(attempts: 0), now: 100, random: 0.5) == .retry(at: 600, paceTokenUntil: nil))
    }

    @Test func expiredProviderTokenRetriesAtOnceThenBacksOff() {
        let a = PushAnswer(status: 403, reason: "ExpiredProviderToken", classification: .refreshTokenAndReconnect)
        #expect(policy.decide(a, row: row(), now: 100, random: 0.5) == .retry(at: 100, paceTokenUntil: nil))
        // The refreshed token was refused too: no tight loop.
        var again = row(attempts: 1)
        again.lastReason = "ExpiredProviderToken"
        #expect(policy.decide(a, row: again, now: 100, random: 0.5) == .retry(at: 1100, paceTokenUntil: nil))
        // After some other answer, the first ExpiredProviderToken is again retried at once.
        var other = row(attempts: 3)
        other.lastReason = "ServiceUnavailable"
        #expect(policy.decide(a, row: other, now: 100, random: 0.5) == .retry(at: 100, paceTokenUntil: nil))
    }

    @Test func backoffIsFullJitterDoublingUpToTheCap() {
        #expect(policy.backoffCeiling(priorAttempts: 0) == 1000)
        #expect(policy.backoffCeiling(priorAttempts: 1) == 2000)
        #expect(policy.backoffCeiling(priorAttempts: 5) == 32_000)
        #expect(policy.backoffCeiling(priorAttempts: 6) == 60_000)
        #expect(policy.backoffCeiling(priorAttempts: 500) == 60_000)
        #expect(policy.backoffDelay(priorAttempts: 3, random: 0) == 1)
        #expect(policy.backoffDelay(priorAttempts: 3, random: 0.5) == 4000)
        #expect(policy.backoffDelay(priorAttempts: 3, random: 0.999_999) == 7999)
        let a = PushAnswer(status: 503, reason: "ServiceUnavailable", classification: .backOff)
        #expect(policy.decide(a, row: row(attempts: 2), now: 1000, random: 0.25) == .retry(at: 2000, paceTokenUntil: nil))
        let t = PushAnswer(status: nil, reason: "connection reset", classification: .backOff)
        #expect(policy.decide(t, row: row(attempts: 0), now: 0, random: 1) == .retry(at: 1000, paceTokenUntil: nil))
    }

    @Test func retryPastExpiryFailsAsExpired() {
        let a = PushAnswer(status: 500, reason: "InternalServerError", classification: .backOff)
        #expect(policy.decide(a, row: row(attempts: 10, expiresAt: 2000), now: 1000, random: 0.5) == .failed(reason: "expired"))
        let b = PushAnswer(status: 429, reason: "TooManyRequests", classification: .retryAfterDelay)
        #expect(policy.decide(b, row: row(expiresAt: 20_000), now: 0, random: 0.5) == .failed(reason: "expired"))
    }
}

@Suite struct RateLimitTests {
    @Test func bucketRefillsAtTheConfiguredRate() {
        let limit = RateLimit(perSecond: 2, burst: 3)
        var b = TokenBucket(limit: limit, nowMicros: 0)
        #expect(b.take(limit: limit, nowMicros: 0).allowed)
        #expect(b.take(limit: limit, nowMicros: 0).allowed)
        #expect(b.take(limit: limit, nowMicros: 0).allowed)
        let refused = b.take(limit: limit, nowMicros: 0)
        #expect(!refused.allowed && refused.retryAfterSeconds == 1)
        #expect(b.take(limit: limit, nowMicros: 500_000).allowed)  // one token after 0.5 s at 2/s
        #expect(!b.take(limit: limit, nowMicros: 500_000).allowed)
    }

    @Test func slowLimitsAskForLongerRetryAfter() {
        let limit = RateLimit(perSecond: 0.1, burst: 1)
        var b = TokenBucket(limit: limit, nowMicros: 0)
        #expect(b.take(limit: limit, nowMicros: 0).allowed)
        #expect(b.take(limit: limit, nowMicros: 0).retryAfterSeconds == 10)
    }

    @Test func limiterKeysAreIndependentAndZeroDisables() {
        let l = RateLimiter<String>(limit: RateLimit(perSecond: 1, burst: 1))
        #expect(l.take("a", nowMicros: 0).allowed)
        #expect(!l.take("a", nowMicros: 0).allowed)
        #expect(l.take("b", nowMicros: 0).allowed)
        let off = RateLimiter<String>(limit: RateLimit(perSecond: 0, burst: 1))
        for _ in 0..<10 { #expect(off.take("a", nowMicros: 0).allowed) }
    }
}
