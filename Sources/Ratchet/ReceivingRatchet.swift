/// The receiving side of the ratchet: what the iPhone does with the accessory's messages, and
/// what our mock APNs does to verify them.
///
/// It keeps the chain key for `nextIndex` (the lowest index never derived) and a cache of keys
/// for skipped indices. A message for index `i`:
/// - `i >= nextIndex`: derives forward, caching keys for `nextIndex..<i`; refused with
///   `.indexBeyondWindow` if that would skip more than `maximumSkippedKeys` keys at once.
/// - `i < nextIndex` and cached: the cached key is removed and returned (first use only).
/// - otherwise `.replayedIndex`, or `.indexTooOld` below the eviction floor.
/// The cache holds at most `maximumSkippedKeys` keys; when a skip overfills it the oldest
/// (lowest) indices are evicted first.
///
/// It is a value: `open(_:index:)` only commits its changes after the tag verified, and a caller
/// who uses `messageKey(for:)` directly can keep the previous value until decryption succeeds.
/// Persist `serialized()` after every successful decryption.
public struct ReceivingRatchet: Sendable, Equatable {
    public static let maximumSkippedKeys = 50_000

    private var chainKey: SecretKey
    /// Lowest index whose key was never derived (0...2^32).
    public private(set) var nextIndex: UInt64
    /// Indices below this that are not cached were used or evicted; at or above it, used.
    public private(set) var evictionFloor: UInt64
    private var skipped: [UInt32: SecretKey]
    /// Cached indices in insertion order, which is ascending; entries already used are skipped lazily.
    private var skipOrder: [UInt32]
    private var skipOrderHead: Int

    /// Starts at index 0 with chain key 0 = the 32-byte root secret exported from HPKE.
    public init(rootSecret: SecretKey) {
        self.init(chainKey: rootSecret, nextIndex: 0, evictionFloor: 0, skipped: [])
    }

    private init(chainKey: SecretKey, nextIndex: UInt64, evictionFloor: UInt64, skipped: [(UInt32, SecretKey)]) {
        self.chainKey = chainKey
        self.nextIndex = nextIndex
        self.evictionFloor = evictionFloor
        self.skipped = Dictionary(uniqueKeysWithValues: skipped)
        self.skipOrder = skipped.map(\.0)
        self.skipOrderHead = 0
    }

    /// Number of cached skipped keys.
    public var skippedKeyCount: Int { skipped.count }

    /// Indices whose keys are cached, ascending.
    public var skippedIndices: [UInt32] { skipOrder[skipOrderHead...].filter { skipped[$0] != nil } }

    // MARK: Lookups

    /// What taking the key for an index would change; computed without mutating.
    private struct Advance {
        var key: SecretKey
        var usesCached: Bool
        var index: UInt32
        var newSkipped: [(UInt32, SecretKey)] = []
        var newChainKey: SecretKey? = nil
    }

    private func prepare(_ index: UInt32) throws -> Advance {
        let i = UInt64(index)
        if i < nextIndex {
            if let key = skipped[index] { return Advance(key: key, usesCached: true, index: index) }
            throw i < evictionFloor ? RatchetError.indexTooOld(index) : RatchetError.replayedIndex(index)
        }
        let skipCount = i - nextIndex
        guard skipCount <= UInt64(Self.maximumSkippedKeys) else {
            let highest = min(nextIndex + UInt64(Self.maximumSkippedKeys), UInt64(UInt32.max))
            throw RatchetError.indexBeyondWindow(index: index, highestAcceptable: UInt32(highest))
        }
        var advance = Advance(key: chainKey, usesCached: false, index: index)
        var key = chainKey
        var j = nextIndex
        while j < i {
            let step = ratchetStep(chainKey: key, messageIndex: UInt32(j))
            advance.newSkipped.append((UInt32(j), step.messageKey))
            key = step.nextChainKey
            j += 1
        }
        let step = ratchetStep(chainKey: key, messageIndex: index)
        advance.key = step.messageKey
        advance.newChainKey = step.nextChainKey
        return advance
    }

    private mutating func apply(_ advance: Advance) {
        if advance.usesCached {
            skipped[advance.index] = nil
            compactSkipOrderIfNeeded()
            return
        }
        for (index, key) in advance.newSkipped {
            skipped[index] = key
            skipOrder.append(index)
        }
        chainKey = advance.newChainKey!
        nextIndex = UInt64(advance.index) + 1
        // Evict oldest first until the cache fits again.
        while skipped.count > Self.maximumSkippedKeys {
            let oldest = skipOrder[skipOrderHead]
            skipOrderHead += 1
            if skipped.removeValue(forKey: oldest) != nil {
                evictionFloor = max(evictionFloor, UInt64(oldest) + 1)
            }
        }
        compactSkipOrderIfNeeded()
    }

    private mutating func compactSkipOrderIfNeeded() {
        // Drop used entries from the front, and rebuild when most of the array is dead.
        while skipOrderHead < skipOrder.count, skipped[skipOrder[skipOrderHead]] == nil { skipOrderHead += 1 }
        if skipOrderHead > 1024, skipOrderHead * 2 > skipOrder.count {
            skipOrder.removeFirst(skipOrderHead)
            skipOrderHead = 0
        }
        if skipped.isEmpty {
            skipOrder.removeAll(keepingCapacity: true)
            skipOrderHead = 0
        }
    }

    /// Returns the message key for `index` and records that it was used. Prefer `open`, which
    /// commits only after the tag verified; with this method, keep the previous value of the
    /// ratchet until your decryption succeeded if forged messages must not burn indices.
    public mutating func messageKey(for index: UInt32) throws -> SecretKey {
        let advance = try prepare(index)
        apply(advance)
        return advance.key
    }

    /// Decrypts a sealed box for `index`. The ratchet changes only if the box authenticated, so
    /// a forged or corrupted message cannot consume (or skip past) a key.
    public mutating func open(_ sealed: [UInt8], index: UInt32, aad: [UInt8] = []) throws -> [UInt8] {
        let advance = try prepare(index)
        let plaintext = try AESGCM.open(sealed, key: advance.key, aad: aad)
        apply(advance)
        return plaintext
    }

    public static func == (lhs: ReceivingRatchet, rhs: ReceivingRatchet) -> Bool {
        lhs.chainKey == rhs.chainKey && lhs.nextIndex == rhs.nextIndex && lhs.evictionFloor == rhs.evictionFloor
            && lhs.skipped == rhs.skipped
    }

    // MARK: Persistence

    private static let magic: [UInt8] = Array("SKRR".utf8)
    private static let formatVersion: UInt8 = 1

    /// Binary state, little-endian throughout:
    /// "SKRR" | version 1 (1) | chain key length n (4) | chain key (n) | nextIndex (8)
    /// | evictionFloor (8) | count (4) | count x (index (4) | message key (32)), ascending index.
    /// It contains live keys: store it as carefully as the root secret.
    public func serialized() -> [UInt8] {
        let indices = skippedIndices
        var out = Self.magic
        out.reserveCapacity(4 + 5 + chainKey.count + 20 + indices.count * 36)
        out.append(Self.formatVersion)
        appendLE(&out, UInt64(chainKey.count), bytes: 4)
        out += chainKey.exportedBytes
        appendLE(&out, nextIndex, bytes: 8)
        appendLE(&out, evictionFloor, bytes: 8)
        appendLE(&out, UInt64(indices.count), bytes: 4)
        for index in indices {
            appendLE(&out, UInt64(index), bytes: 4)
            out += skipped[index]!.exportedBytes
        }
        return out
    }

    /// Restores `serialized()` output, checking every field; throws `.invalidState` naming the
    /// first problem.
    public init(serialized bytes: [UInt8]) throws {
        var reader = ByteReader(bytes)
        func fail(_ why: String) -> RatchetError { .invalidState(why) }
        guard let magic = reader.take(4), magic.elementsEqual(Self.magic) else { throw fail("not a receiving ratchet state (magic)") }
        guard let version = reader.take(1)?.first else { throw fail("truncated before version") }
        guard version == Self.formatVersion else { throw fail("unsupported version \(version)") }
        guard let keyLength = reader.le(4) else { throw fail("truncated before chain key length") }
        guard let chain = reader.take(Int(keyLength)) else { throw fail("truncated chain key") }
        guard let next = reader.le(8), let floor = reader.le(8), let count = reader.le(4) else { throw fail("truncated header") }
        guard next <= SendingRatchetState.exhaustedIndex else { throw fail("nextIndex past 2^32") }
        guard floor <= next else { throw fail("evictionFloor above nextIndex") }
        guard count <= UInt64(Self.maximumSkippedKeys) else { throw fail("more than \(Self.maximumSkippedKeys) skipped keys") }
        guard reader.remaining == Int(count) * 36 else { throw fail("skipped-key table length does not match count \(count)") }
        var entries: [(UInt32, SecretKey)] = []
        entries.reserveCapacity(Int(count))
        var previous: UInt64? = nil
        for _ in 0..<Int(count) {
            let index = reader.le(4)!
            let key = reader.take(32)!
            guard index >= floor, index < next else { throw fail("skipped index \(index) outside \(floor)..<\(next)") }
            if let previous, index <= previous { throw fail("skipped indices not strictly ascending") }
            previous = index
            entries.append((UInt32(index), SecretKey(bytes: key)))
        }
        self.init(chainKey: SecretKey(bytes: chain), nextIndex: next, evictionFloor: floor, skipped: entries)
    }
}

// MARK: - Little-endian helpers shared by the module's binary formats

func appendLE(_ out: inout [UInt8], _ value: UInt64, bytes: Int) {
    for shift in 0..<bytes { out.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(shift)))) }
}

struct ByteReader {
    private let bytes: [UInt8]
    private(set) var offset = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var remaining: Int { bytes.count - offset }
    mutating func take(_ n: Int) -> ArraySlice<UInt8>? {
        guard n >= 0, remaining >= n else { return nil }
        defer { offset += n }
        return bytes[offset..<(offset + n)]
    }
    mutating func le(_ n: Int) -> UInt64? {
        guard let slice = take(n) else { return nil }
        var value: UInt64 = 0
        for (shift, byte) in slice.enumerated() { value |= UInt64(byte) << (8 * UInt64(shift)) }
        return value
    }
    mutating func be(_ n: Int) -> UInt64? {
        guard let slice = take(n) else { return nil }
        return slice.reduce(0) { $0 << 8 | UInt64($1) }
    }
}
