import Testing
import Ratchet
import TestSupport

/// A sender's keys for indices 0..<count, derived straight from ratchetStep (not the receiver).
private func senderKeys(root: SecretKey, count: Int) -> [SecretKey] {
    var keys: [SecretKey] = []
    keys.reserveCapacity(count)
    var chainKey = root
    for i in 0..<count {
        let step = ratchetStep(chainKey: chainKey, messageIndex: UInt32(i))
        keys.append(step.messageKey)
        chainKey = step.nextChainKey
    }
    return keys
}

@Suite("Receiving ratchet")
struct ReceivingRatchetTests {
    static let window = ReceivingRatchet.maximumSkippedKeys

    @Test("out-of-order delivery across the whole 50,000 window, each key used once")
    func outOfOrderAcrossWindow() throws {
        let root = SecretKey(random: 32)
        let keys = senderKeys(root: root, count: Self.window + 1)
        var receiver = ReceivingRatchet(rootSecret: root)
        // The newest message first: the receiver derives and caches all 50,000 skipped keys.
        #expect(try receiver.messageKey(for: UInt32(Self.window)) == keys[Self.window])
        #expect(receiver.skippedKeyCount == Self.window)
        var rng = SeededGenerator(state: 50_000)
        for i in (0..<Self.window).shuffled(using: &rng) {
            #expect(try receiver.messageKey(for: UInt32(i)) == keys[i])
        }
        #expect(receiver.skippedKeyCount == 0)
        #expect(receiver.nextIndex == UInt64(Self.window) + 1)
    }

    @Test("sealed messages delivered in shuffled order all open")
    func shuffledMessages() throws {
        let root = SecretKey(random: 32)
        let sender = SendingRatchet(rootSecret: root)
        var messages: [(UInt32, [UInt8])] = []
        for n in 0..<300 { messages.append(try sender.seal(Array("m\(n)".utf8)) { _ in }) }
        var rng = SeededGenerator(state: 7)
        var receiver = ReceivingRatchet(rootSecret: root)
        for (index, sealed) in messages.shuffled(using: &rng) {
            #expect(try receiver.open(sealed, index: index) == Array("m\(index)".utf8))
        }
        #expect(receiver.skippedKeyCount == 0)
    }

    @Test("replays are rejected, both of the newest index and of a cached one")
    func replay() throws {
        let root = SecretKey(random: 32)
        var receiver = ReceivingRatchet(rootSecret: root)
        _ = try receiver.messageKey(for: 0)
        #expect(throws: RatchetError.replayedIndex(0)) { try receiver.messageKey(for: 0) }
        _ = try receiver.messageKey(for: 5)
        _ = try receiver.messageKey(for: 3)
        #expect(throws: RatchetError.replayedIndex(3)) { try receiver.messageKey(for: 3) }
        #expect(throws: RatchetError.replayedIndex(5)) { try receiver.messageKey(for: 5) }
        #expect(receiver.skippedIndices == [1, 2, 4])
    }

    @Test("an index more than 50,000 ahead is refused and changes nothing")
    func beyondWindow() throws {
        var receiver = ReceivingRatchet(rootSecret: SecretKey(random: 32))
        let before = receiver
        #expect(throws: RatchetError.indexBeyondWindow(index: UInt32(Self.window + 1), highestAcceptable: UInt32(Self.window))) {
            try receiver.messageKey(for: UInt32(Self.window + 1))
        }
        #expect(throws: RatchetError.indexBeyondWindow(index: UInt32.max, highestAcceptable: UInt32(Self.window))) {
            try receiver.messageKey(for: UInt32.max)
        }
        #expect(receiver == before)
        _ = try receiver.messageKey(for: 10)
        #expect(throws: RatchetError.indexBeyondWindow(index: UInt32(Self.window + 12), highestAcceptable: UInt32(Self.window + 11))) {
            try receiver.messageKey(for: UInt32(Self.window + 12))
        }
    }

    @Test("window exhaustion: a full cache evicts its oldest keys, which then fail as too old")
    func windowExhaustion() throws {
        let root = SecretKey(random: 32)
        let keys = senderKeys(root: root, count: Self.window + 11)
        var receiver = ReceivingRatchet(rootSecret: root)
        _ = try receiver.messageKey(for: UInt32(Self.window))           // caches 0..<50,000: full
        #expect(receiver.skippedKeyCount == Self.window)
        #expect(try receiver.messageKey(for: UInt32(Self.window + 10)) == keys[Self.window + 10])  // 9 more skipped
        #expect(receiver.skippedKeyCount == Self.window)
        #expect(receiver.evictionFloor == 9)
        for i in 0..<9 {
            #expect(throws: RatchetError.indexTooOld(UInt32(i))) { try receiver.messageKey(for: UInt32(i)) }
        }
        #expect(try receiver.messageKey(for: 9) == keys[9])
        #expect(try receiver.messageKey(for: UInt32(Self.window + 9)) == keys[Self.window + 9])
        #expect(receiver.skippedIndices.first == 10)
    }

    @Test("the receiving side ends at UInt32.max without wrapping")
    func lastIndex() throws {
        // A state positioned at UInt32.max with the frozen vector's chain key (ff x 32).
        var state: [UInt8] = Array("SKRR".utf8) + [1, 32, 0, 0, 0] + [UInt8](repeating: 0xff, count: 32)
        state += [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0] + [UInt8](repeating: 0, count: 8) + [0, 0, 0, 0]
        var receiver = try ReceivingRatchet(serialized: state)
        let step = try #require(try VectorFile.load("ratchet-vectors.json", as: RatchetVectorFile.self).singleSteps.first { $0.index == UInt32.max })
        #expect(try receiver.messageKey(for: UInt32.max).exportedBytes.hexString == step.messageKey)
        #expect(receiver.nextIndex == SendingRatchetState.exhaustedIndex)
        #expect(throws: RatchetError.replayedIndex(UInt32.max)) { try receiver.messageKey(for: UInt32.max) }
        #expect(try ReceivingRatchet(serialized: receiver.serialized()) == receiver)
    }

    @Test("a forged message neither consumes nor skips keys")
    func forgeryDoesNotBurnKeys() throws {
        let root = SecretKey(random: 32)
        let sender = SendingRatchet(rootSecret: root)
        var sealed: [[UInt8]] = []
        for _ in 0..<6 { sealed.append(try sender.seal([1, 2, 3]) { _ in }.sealed) }
        var receiver = ReceivingRatchet(rootSecret: root)
        let before = receiver
        var forged = sealed[5]
        forged[forged.count - 1] ^= 1
        #expect(throws: RatchetError.authenticationFailed) { try receiver.open(forged, index: 5) }
        #expect(receiver == before)
        #expect(try receiver.open(sealed[5], index: 5) == [1, 2, 3])
        #expect(throws: RatchetError.authenticationFailed) { try receiver.open(sealed[4], index: 2) }
        #expect(try receiver.open(sealed[2], index: 2) == [1, 2, 3])
        #expect(receiver.skippedIndices == [0, 1, 3, 4])
    }

    @Test("state round-trip keeps the chain, the cache and the eviction floor")
    func roundTrip() throws {
        let root = SecretKey(random: 32)
        let keys = senderKeys(root: root, count: 40)
        var receiver = ReceivingRatchet(rootSecret: root)
        for i: UInt32 in [3, 10, 7, 30, 12] { _ = try receiver.messageKey(for: i) }
        let bytes = receiver.serialized()
        var restored = try ReceivingRatchet(serialized: bytes)
        #expect(restored == receiver)
        #expect(restored.serialized() == bytes)
        #expect(restored.skippedIndices == receiver.skippedIndices)
        #expect(try restored.messageKey(for: 0) == keys[0])
        #expect(try restored.messageKey(for: 35) == keys[35])
        #expect(throws: RatchetError.replayedIndex(7)) { try restored.messageKey(for: 7) }
        // Header: magic, version, key length, key, nextIndex 31, floor 0, count 26 (0..<30 minus 3, 7, 10, 12).
        #expect(Array(bytes.prefix(9)) == Array("SKRR".utf8) + [1, 32, 0, 0, 0])
        #expect(Array(bytes[41..<49]) == [31, 0, 0, 0, 0, 0, 0, 0])
        #expect(Array(bytes[57..<61]) == [26, 0, 0, 0])
        #expect(bytes.count == 61 + 26 * 36)
    }

    @Test("damaged states are rejected with .invalidState")
    func damagedStates() throws {
        var receiver = ReceivingRatchet(rootSecret: SecretKey(random: 32))
        _ = try receiver.messageKey(for: 4)
        let good = receiver.serialized()
        #expect(try ReceivingRatchet(serialized: good) == receiver)
        var cases: [[UInt8]] = []
        for n in [0, 3, 5, 8, 9, 20, good.count - 1] { cases.append(Array(good.prefix(n))) }   // truncations
        cases.append(good + [0])                                                             // trailing byte
        var badMagic = good; badMagic[0] = UInt8(ascii: "X"); cases.append(badMagic)
        var badVersion = good; badVersion[4] = 2; cases.append(badVersion)
        var hugeKeyLength = good; hugeKeyLength[8] = 0xff; cases.append(hugeKeyLength)        // key runs past the end
        var shortKeyLength = good; shortKeyLength[5] = 31; cases.append(shortKeyLength)      // everything after shifts
        var floorAboveNext = good; floorAboveNext[49] = 9; cases.append(floorAboveNext)
        var indexOutside = good; indexOutside[61] = 200; cases.append(indexOutside)          // first cached index >= nextIndex
        var unordered = good; unordered[61] = 1; unordered[61 + 36] = 0; cases.append(unordered)
        var hugeNext = good; hugeNext[41 + 4] = 2; cases.append(hugeNext)                     // nextIndex > 2^32
        for bytes in cases {
            #expect(throws: RatchetError.self) { try ReceivingRatchet(serialized: bytes) }
            do { _ = try ReceivingRatchet(serialized: bytes) } catch let error as RatchetError {
                guard case .invalidState = error else { Issue.record("unexpected \(error)"); continue }
            }
        }
    }

    @Test("root secrets of any length round-trip through both persisted forms")
    func unusualRootLengths() throws {
        for length in [0, 1, 16, 32, 300] {
            let root = SecretKey(bytes: (0..<length).map { UInt8(truncatingIfNeeded: $0) })
            var receiver = ReceivingRatchet(rootSecret: root)
            #expect(try ReceivingRatchet(serialized: receiver.serialized()) == receiver)
            _ = try receiver.messageKey(for: 1)
            #expect(try ReceivingRatchet(serialized: receiver.serialized()) == receiver)
            let sender = SendingRatchet(rootSecret: root)
            let restored = try SendingRatchet(state: sender.state)
            #expect(try sender.nextMessageKey { _ in }.messageKey == restored.nextMessageKey { _ in }.messageKey)
        }
    }
}
