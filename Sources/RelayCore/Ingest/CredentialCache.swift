// Authentication before any other work, without a database read per request: an in-memory copy
// of every credential's hash and revocation, re-read when the table's generation changes
// (OutboxStore.credentialKeys). A copy is trusted for at most `maxAgeMicros` from the moment its
// read began, so a revocation committed by any process or node is refused within that time; a
// hash the copy does not know (perhaps created since) waits for a read begun after it arrived.
// Reads are coalesced: at most one runs at a time, whatever the number of waiting requests.
import POSIXThreads
import Synchronization

final class CredentialCache: Sendable {
    /// A credential hash as four words.
    struct Key: Hashable {
        let a, b, c, d: UInt64

        /// All four words, without an early exit: the time of a match does not depend on how
        /// many leading words agree (docs/threat_model.md, "Forged or replayed submissions").
        static func == (l: Key, r: Key) -> Bool {
            ((l.a ^ r.a) | (l.b ^ r.b) | (l.c ^ r.c) | (l.d ^ r.d)) == 0
        }

        init?(_ hash: [UInt8]) {
            guard hash.count == 32 else { return nil }
            (a, b, c, d) = hash.withUnsafeBytes {
                ($0.loadUnaligned(fromByteOffset: 0, as: UInt64.self), $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self),
                 $0.loadUnaligned(fromByteOffset: 16, as: UInt64.self), $0.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
            }
        }
    }

    /// The copy's credentials by hash: open addressing on the hash's first word (SHA-256 output
    /// is uniform, so it needs no hashing of its own); a Dictionary would run SipHash on every
    /// lookup, half of a verdict's cost. The probe's length depends on
    /// the presented hash and on which slots are taken: that tells a prober about SHA-256
    /// outputs, never about a secret (a preimage of a 256-bit random value).
    struct Table {
        private var slots: [(key: Key, id: String, revoked: Bool, apps: [String])?]
        private let mask: Int

        init(_ keys: [CredentialKey]) {
            var size = 8
            while size < keys.count * 2 { size <<= 1 }
            slots = Array(repeating: nil, count: size)
            mask = size - 1
            for k in keys {
                guard let key = Key(k.hash) else { continue }
                var i = Int(truncatingIfNeeded: key.a) & mask
                while let s = slots[i], s.key != key { i = (i + 1) & mask }
                slots[i] = (key, k.id, k.revoked, k.apps)
            }
        }

        func find(_ key: Key) -> (id: String, revoked: Bool, apps: [String])? {
            var i = Int(truncatingIfNeeded: key.a) & mask
            while let s = slots[i] {
                if s.key == key { return (s.id, s.revoked, s.apps) }
                i = (i + 1) & mask
            }
            return nil
        }
    }

    enum Verdict: Sendable, Equatable {
        /// `apps`: what the credential may send for (StoreRules.app decides the request's).
        case valid(id: String, apps: [String])
        /// Unknown or revoked as of a read at most `maxAgeMicros` old (or begun after the request).
        case invalid
        /// The copy is too old, or does not know the hash: wait for a read (`afterRead`).
        /// `knownValid`: the old copy has it as a live credential.
        case pending(knownValid: Bool)
        /// The read failed (database down).
        case unavailable
    }

    private struct Copy {
        var generation: CredentialGeneration
        var byKey: Table
        /// monotonicMicros when its read began.
        var readAt: Int64
    }

    private struct State {
        var copy: Copy?
        var reading = false
        /// Hashes a read found unknown, with when that read began: a request whose address
        /// has no failure budget left may wait for a read (it may hold a credential created
        /// since), but not twice within `maxAgeMicros` for the same hash.
        var absent = RecentMap<Key, Int64>(capacity: 65_536)
        var waiters: [(since: Int64, key: Key?, resume: @Sendable (Verdict) -> Void)] = []
    }

    /// How long a copy may be trusted: the revocation bound.
    let maxAgeMicros: Int64
    /// Past this age a request starts a read in the background so steady traffic never waits.
    let refreshAfterMicros: Int64
    private let load: @Sendable (CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?)
    private let run: @Sendable (@escaping @Sendable () -> Void) -> Void
    private let now: @Sendable () -> Int64
    private let state = Mutex(State())

    /// `run` starts a read on a thread that may block (a WorkerPool); `now` is monotonic micros.
    init(maxAgeMicros: Int64 = 1_000_000,
         load: @escaping @Sendable (CredentialGeneration?) throws -> (generation: CredentialGeneration, keys: [CredentialKey]?),
         run: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void,
         now: @escaping @Sendable () -> Int64 = { monotonicMicros() }) {
        self.maxAgeMicros = maxAgeMicros
        refreshAfterMicros = maxAgeMicros / 2
        self.load = load
        self.run = run
        self.now = now
    }

    convenience init(store: any OutboxStore, workers: WorkerPool, maxAgeMicros: Int64 = 1_000_000) {
        self.init(maxAgeMicros: maxAgeMicros, load: { [store] in try store.credentialKeys(unlessAt: $0) },
                  run: { [workers] in workers.submit($0) })
    }

    /// The verdict from memory, without blocking. `.pending` asks the caller to `afterRead`.
    func verdict(_ hash: [UInt8]) -> Verdict {
        guard let key = Key(hash) else { return .invalid }
        let t = now()
        let (verdict, startRead) = state.withLock { s -> (Verdict, Bool) in
            guard let copy = s.copy else { return (.pending(knownValid: false), false) }
            let entry = copy.byKey.find(key)
            let age = t - copy.readAt
            guard age < maxAgeMicros else { return (.pending(knownValid: entry.map { !$0.revoked } ?? false), false) }
            let refresh = age >= refreshAfterMicros && !s.reading
            if refresh { s.reading = true }
            // Revoked stays revoked; an unknown hash may be a credential created since the read.
            guard let entry else { return (.pending(knownValid: false), refresh) }
            return (entry.revoked ? .invalid : .valid(id: entry.id, apps: entry.apps), refresh)
        }
        if startRead { run { [self] in read(startedAt: t) } }
        return verdict
    }

    /// Calls `resume` (on the reading thread) with the verdict for `hash` from a read that
    /// began at or after this call, or `.unavailable` if that read failed.
    func afterRead(_ hash: [UInt8], _ resume: @escaping @Sendable (Verdict) -> Void) {
        let t = now()
        let startRead = state.withLock { s -> Bool in
            s.waiters.append((t, Key(hash), resume))
            guard !s.reading else { return false }
            s.reading = true
            return true
        }
        if startRead { run { [self] in read(startedAt: t) } }
    }

    /// Whether a read begun less than `maxAgeMicros` ago found `hash` unknown.
    func recentlyAbsent(_ hash: [UInt8]) -> Bool {
        guard let key = Key(hash) else { return true }
        let t = now()
        return state.withLock { s in s.absent.value(key).map { t - $0 < maxAgeMicros } ?? false }
    }

    /// Starts a read now (at start-up, so the first requests find a copy).
    func prime() {
        let t = now()
        let startRead = state.withLock { s -> Bool in
            guard !s.reading else { return false }
            s.reading = true
            return true
        }
        if startRead { run { [self] in read(startedAt: t) } }
    }

    /// One read; then the waiters it serves (those that arrived before it began) are resumed,
    /// and if others arrived meanwhile the next read starts. A failed read serves every waiter,
    /// also those that arrived while it ran, with `.unavailable`: the database did not answer
    /// (or missed the deadline), and a waiter sent on to the next read would wait out a second
    /// `store.requestTimeoutMs` against a stalled server (10 s instead of 5 in the PostgreSQL
    /// stall scenario). Refusing admits no one, so the revocation bound is unaffected.
    private func read(startedAt: Int64) {
        let known = state.withLock { $0.copy?.generation }
        let result = Result { try load(known) }
        var next: Int64?
        let served = state.withLock { s -> [(Verdict, @Sendable (Verdict) -> Void)] in
            var fresh: Copy?
            switch result {
            case .success(let r):
                if let keys = r.keys {
                    s.copy = Copy(generation: r.generation, byKey: Table(keys), readAt: startedAt)
                } else {
                    s.copy?.readAt = startedAt
                }
                fresh = s.copy
            case .failure:
                break
            }
            var out: [(Verdict, @Sendable (Verdict) -> Void)] = []
            s.waiters.removeAll { w in
                guard w.since <= startedAt || fresh == nil else { return false }
                let v: Verdict
                if let fresh {
                    if let key = w.key, let e = fresh.byKey.find(key) {
                        v = e.revoked ? .invalid : .valid(id: e.id, apps: e.apps)
                    } else {
                        v = .invalid
                        if let key = w.key { s.absent.update(key, new: startedAt) { $0 = startedAt } }
                    }
                } else {
                    v = .unavailable
                }
                out.append((v, w.resume))
                return true
            }
            if s.waiters.isEmpty {
                s.reading = false
            } else {
                next = now()
            }
            return out
        }
        for (v, resume) in served { resume(v) }
        if let next { run { [self] in read(startedAt: next) } }
    }
}
