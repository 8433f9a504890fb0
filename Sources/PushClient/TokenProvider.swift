// Token authentication: one provider token per key, shared by every slot of a client.
import FoundationEssentials
import Synchronization

/// The one shared provider token of a key: TokenPolicy decides, this signs and caches.
final class TokenProvider: Sendable {
    private let key: TokenKey
    private struct State {
        var policy = TokenPolicy()
        var jwt: String?
        var jwtGeneration = 0
    }
    private let state = Mutex(State())

    init(key: TokenKey) { self.key = key }

    /// The token for the next request on `slot`, and whether that slot must reconnect first.
    func token(slot: Int, now: Date) throws -> (jwt: String, generation: Int, freshConnection: Bool) {
        try state.withLock { s in
            let use = s.policy.tokenForRequest(connection: slot, now: now)
            if s.jwt == nil || s.jwtGeneration != use.token.generation {
                // Signing takes ~50 us and happens once per 50 minutes: fine under the lock.
                s.jwt = try ProviderToken.make(key: key, issuedAt: use.token.issuedAt)
                s.jwtGeneration = use.token.generation
            }
            return (s.jwt!, use.token.generation, use.freshConnection)
        }
    }

    func expired(generation: Int, now: Date) { state.withLock { $0.policy.expired(generation: generation, now: now) } }
    func requestRefresh(now: Date) { state.withLock { _ = $0.policy.requestRefresh(now: now) } }
    func connectionReset(slot: Int) { state.withLock { $0.policy.connectionReset(connection: slot) } }
    func connectionOpened(slot: Int, generation: Int, now: Date) {
        state.withLock { $0.policy.connectionOpened(connection: slot, generation: generation, now: now) }
    }
}
