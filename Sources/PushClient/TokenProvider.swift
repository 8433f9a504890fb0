// Token authentication: one provider token per (team, key) in the process, shared by every
// client and connection that signs with that key, and kept across a reload that leaves the key
// unchanged (Apple: one token per team, at most one new token per 20 minutes).
import FoundationEssentials
internal import OpenSSLSupport
import Synchronization

/// The one shared provider token of a key: TokenPolicy decides, this signs and caches.
public final class TokenProvider: Sendable {
    private let key: TokenKey
    private struct State {
        var policy = TokenPolicy()
        var jwt: String?
        var jwtGeneration = 0
        var minted = 0
        var nextConnection = 0
        var clients = 0
    }
    private let state = Mutex(State())

    init(key: TokenKey) { self.key = key }

    public var teamID: String { key.teamID }
    /// JWTs signed so far.
    public var minted: Int { state.withLock { $0.minted } }

    /// `count` connection ids no other client of this provider uses (TokenPolicy tells
    /// connections apart by id); returns the first.
    func reserveConnections(_ count: Int) -> Int {
        state.withLock { s in
            defer { s.nextConnection += count }
            s.clients += 1
            return s.nextConnection
        }
    }

    /// A client shut down: its connections no longer hold a token.
    func releaseConnections(first: Int, count: Int) {
        state.withLock { s in
            s.clients -= 1
            for c in first..<(first + count) { s.policy.connectionReset(connection: c) }
        }
    }

    /// Clients using this provider now, and when its token was issued (for pruning).
    var usage: (clients: Int, issuedAt: Date?) { state.withLock { ($0.clients, $0.policy.current?.issuedAt) } }

    /// The token for the next request on connection `slot`, and whether that connection must
    /// reconnect first.
    func token(slot: Int, now: Date) throws -> (jwt: String, generation: Int, freshConnection: Bool) {
        try state.withLock { s in
            let use = s.policy.tokenForRequest(connection: slot, now: now)
            if s.jwt == nil || s.jwtGeneration != use.token.generation {
                // Signing takes ~50 us and happens about once per 50 minutes: fine under the lock.
                s.jwt = try ProviderToken.make(key: key, issuedAt: use.token.issuedAt)
                s.jwtGeneration = use.token.generation
                s.minted += 1
            }
            return (s.jwt!, use.token.generation, use.freshConnection)
        }
    }

    /// See TokenPolicy.expired: false when the dead token stays (retrying would be refused again).
    func expired(generation: Int, now: Date) -> Bool { state.withLock { $0.policy.expired(generation: generation, now: now) } }
    func requestRefresh(now: Date) { state.withLock { _ = $0.policy.requestRefresh(now: now) } }
    func connectionReset(slot: Int) { state.withLock { $0.policy.connectionReset(connection: slot) } }
    func connectionOpened(slot: Int, generation: Int, now: Date) {
        state.withLock { $0.policy.connectionOpened(connection: slot, generation: generation, now: now) }
    }
}

/// Token providers by (team ID, key ID, SHA-256 of the .p8 text). The relay uses `shared`, so
/// every app of a team and every client rebuilt by a reload sign with one token; tests give
/// each client its own registry so they do not share tokens across suites.
public final class TokenRegistry: Sendable {
    public static let shared = TokenRegistry()

    private struct Key: Hashable {
        var team: String
        var keyID: String
        var fingerprint: [UInt8]
    }
    private struct State {
        var providers: [Key: TokenProvider] = [:]
        /// Mints of providers already dropped, so the per-team count never goes down.
        var droppedMints: [String: Int] = [:]
    }
    private let state = Mutex(State())

    public init() {}

    /// The provider of `key`, created on first use. Providers no client uses whose token is
    /// past APNs' 60 minutes are dropped here (a replaced key must not stay forever).
    public func provider(for key: TokenKey, now: Date = Date()) -> TokenProvider {
        let k = Key(team: key.teamID, keyID: key.keyID, fingerprint: key.fingerprint)
        return state.withLock { s in
            if let p = s.providers[k] { return p }
            for (old, p) in s.providers {
                let u = p.usage
                if u.clients == 0 && (u.issuedAt.map { now.timeIntervalSince($0) >= 3600 } ?? true) {
                    s.droppedMints[p.teamID, default: 0] += p.minted
                    s.providers[old] = nil
                }
            }
            let p = TokenProvider(key: key)
            s.providers[k] = p
            return p
        }
    }

    /// JWTs minted per team ID since start (summed over that team's keys).
    public func mintedByTeam() -> [String: Int] {
        let (live, dropped) = state.withLock { (Array($0.providers.values), $0.droppedMints) }
        return live.reduce(into: dropped) { $0[$1.teamID, default: 0] += $1.minted }
    }
}
