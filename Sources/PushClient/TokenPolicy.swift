// When to mint a provider token and when a connection may switch to it. Pure value: no I/O,
// no clock of its own; PushClient feeds it `now` from the injected PushClock.
//
// APNs' rules (PROTOCOL.md): a token older than 60 min is ExpiredProviderToken (403); a
// connection whose token changes more than once per 20 min gets TooManyProviderTokenUpdates
// (429). One token per key is shared by all connections.
//
// Our policy:
// - Mint when there is no token, when it is >= 50 min old, or when APNs called it expired.
//   Apple asks for at most one new token per 20 minutes: an ExpiredProviderToken for a token
//   >= 20 min old mints; for a younger one it mints once, and not again for 20 minutes (a
//   wrong host clock then costs one JWT per 20 minutes, not one per answer or per minute).
//   `requestRefresh` (e.g. after InvalidProviderToken) mints only if the token is >= 20 min old.
// - One policy serves every connection of every client using the key in this process
//   (TokenRegistry): connection ids are unique per provider, not per client.
// - Connections are identified by the client's connection slot (one thread holding one HTTP/2
//   connection at a time): the slot tells the policy when it replaces its connection
//   (`connectionReset`) and when a new connection first carries a token (`connectionOpened`).
// - A slot that first used its token >= 20 min ago switches to a newer token in place. A slot
//   that would switch sooner (it connected late in the old token's life) gets a fresh
//   connection instead: a new connection's first token is not an "update".
// - After ExpiredProviderToken every slot that used the dead token gets a fresh connection.
import FoundationEssentials

public struct TokenPolicy: Sendable, Equatable {
    public static let refreshAge: TimeInterval = 50 * 60
    public static let minimumTimeOnConnection: TimeInterval = 20 * 60
    /// After an early (< 20 min) mint for ExpiredProviderToken, the next early one waits this long.
    public static let minimumExpiredRemintInterval: TimeInterval = 20 * 60

    /// Identity of a minted token: bump-only generation and its `iat`.
    public struct Issued: Sendable, Equatable {
        public let generation: Int
        public let issuedAt: Date
    }

    /// What to put on the next request of a connection slot.
    public struct Use: Sendable, Equatable {
        public let token: Issued
        /// A new token must be signed (with `token.issuedAt` as iat) before this request.
        public let mint: Bool
        /// Open a new connection for this slot before sending (never swap too early).
        public let freshConnection: Bool
    }

    private struct Slot: Sendable, Equatable {
        var generation: Int
        var firstUse: Date
    }

    public private(set) var current: Issued?
    private var slots: [Int: Slot] = [:]
    private var mustMint = false
    private var lastExpiredMint: Date?
    private var freshNeeded: Set<Int> = []

    public init() {}

    public mutating func tokenForRequest(connection: Int, now: Date) -> Use {
        var minted = false
        if shouldMint(now: now) {
            current = Issued(generation: (current?.generation ?? 0) + 1, issuedAt: now)
            minted = true
            mustMint = false
        }
        let token = current!
        var fresh = freshNeeded.remove(connection) != nil
        if let slot = slots[connection], slot.generation != token.generation, !fresh,
           now.timeIntervalSince(slot.firstUse) < Self.minimumTimeOnConnection {
            fresh = true
        }
        if fresh || slots[connection]?.generation != token.generation {
            slots[connection] = Slot(generation: token.generation, firstUse: now)
        }
        return Use(token: token, mint: minted, freshConnection: fresh)
    }

    /// APNs answered ExpiredProviderToken for a request that carried `generation`.
    /// Returns whether the next request gets another token than `generation` (a retry is
    /// worth it); false when the guard keeps the dead one (the caller should pause, not retry).
    /// Stale reports (a newer token already exists) are ignored and return true.
    @discardableResult
    public mutating func expired(generation: Int, now: Date) -> Bool {
        guard let current, generation == current.generation else { return true }
        if mustMint { return true }
        let young = now.timeIntervalSince(current.issuedAt) < Self.minimumTimeOnConnection
        if young, let last = lastExpiredMint, now.timeIntervalSince(last) < Self.minimumExpiredRemintInterval { return false }
        lastExpiredMint = now
        mustMint = true
        for (id, slot) in slots where slot.generation == generation { freshNeeded.insert(id) }
        return true
    }

    /// Ask for a new token for another reason; honoured only if the current one is >= 20 min
    /// old. Returns whether the next request will mint.
    @discardableResult
    public mutating func requestRefresh(now: Date) -> Bool {
        guard let current else { return true }
        if now.timeIntervalSince(current.issuedAt) >= Self.minimumTimeOnConnection { mustMint = true }
        return mustMint
    }

    /// The slot's connection was replaced for another reason (timeout, error): its next token
    /// use is a first use.
    public mutating func connectionReset(connection: Int) {
        slots[connection] = nil
        freshNeeded.remove(connection)
    }

    /// The slot's new connection first carried a request with `generation` at `now`. Restart the slot's clock for that token (later is the safe
    /// side: it can only turn an in-place swap into a fresh connection).
    public mutating func connectionOpened(connection: Int, generation: Int, now: Date) {
        guard var slot = slots[connection], slot.generation == generation, slot.firstUse < now else { return }
        slot.firstUse = now
        slots[connection] = slot
    }

    /// When the slot started using its current token (nil if it has none yet).
    public func firstUse(connection: Int) -> Date? { slots[connection]?.firstUse }

    private func shouldMint(now: Date) -> Bool {
        guard let current else { return true }
        if mustMint { return true }
        let age = now.timeIntervalSince(current.issuedAt)
        // A clock that jumped backwards makes iat lie in the future, which APNs rejects.
        return age >= Self.refreshAge || age < -60
    }
}
