import Testing
import Ratchet

private struct DiskFull: Error, Equatable {}

@Suite("Sending ratchet")
struct SendingRatchetTests {
    @Test("keys follow the chain; every key is persisted before it is returned")
    func followsChain() throws {
        let root = SecretKey(random: 32)
        let sender = SendingRatchet(rootSecret: root)
        var persisted: [SendingRatchetState] = []
        var chainKey = root
        for expected in UInt32(0)..<5 {
            let (index, key) = try sender.nextMessageKey { persisted.append($0) }
            let step = ratchetStep(chainKey: chainKey, messageIndex: expected)
            #expect(index == expected)
            #expect(key == step.messageKey)
            #expect(persisted.last == SendingRatchetState(chainKey: step.nextChainKey.exportedBytes.hexString, nextIndex: UInt64(expected) + 1))
            chainKey = step.nextChainKey
        }
        #expect(sender.state == persisted.last)
    }

    @Test("persist failure yields no key and does not advance")
    func persistFailure() throws {
        let sender = SendingRatchet(rootSecret: SecretKey(random: 32))
        _ = try sender.nextMessageKey { _ in }
        let before = sender.state
        var got: (index: UInt32, messageKey: SecretKey)? = nil
        #expect(throws: DiskFull()) { got = try sender.nextMessageKey { _ in throw DiskFull() } }
        #expect(got == nil)
        #expect(sender.state == before)
        let (index, _) = try sender.nextMessageKey { _ in }
        #expect(index == 1, "the index whose persist failed is handed out again, its key never left")
    }

    @Test("a restored state continues where the persisted one stopped")
    func restore() throws {
        let sender = SendingRatchet(rootSecret: SecretKey(random: 32))
        var saved: SendingRatchetState? = nil
        for _ in 0..<3 { _ = try sender.nextMessageKey { saved = $0 } }
        let restored = try SendingRatchet(state: try #require(saved))
        let a = try sender.nextMessageKey { _ in }, b = try restored.nextMessageKey { _ in }
        #expect(a.index == 3 && b.index == 3 && a.messageKey == b.messageKey)
    }

    @Test("the last index is UInt32.max; after it the ratchet refuses instead of wrapping")
    func exhaustion() throws {
        let sender = try SendingRatchet(state: SendingRatchetState(chainKey: String(repeating: "ff", count: 32), nextIndex: UInt64(UInt32.max)))
        var saved: SendingRatchetState? = nil
        let (index, _) = try sender.nextMessageKey { saved = $0 }
        #expect(index == UInt32.max)
        #expect(saved?.nextIndex == SendingRatchetState.exhaustedIndex)
        var persistCalled = false
        #expect(throws: RatchetError.indexSpaceExhausted) { try sender.nextMessageKey { _ in persistCalled = true } }
        #expect(!persistCalled)
        let reloaded = try SendingRatchet(state: try #require(saved))
        #expect(throws: RatchetError.indexSpaceExhausted) { try reloaded.nextMessageKey { _ in } }
    }

    @Test("invalid persisted states are rejected")
    func invalidStates() {
        #expect(throws: RatchetError.self) { try SendingRatchet(state: .init(chainKey: "xyz", nextIndex: 0)) }
        #expect(throws: RatchetError.self) { try SendingRatchet(state: .init(chainKey: "abc", nextIndex: 0)) }
        #expect(throws: RatchetError.self) {
            try SendingRatchet(state: .init(chainKey: String(repeating: "00", count: 32), nextIndex: SendingRatchetState.exhaustedIndex + 1))
        }
    }

    @Test("seal convenience: receiver opens what the sender sealed")
    func sealOpen() throws {
        let root = SecretKey(random: 32)
        let sender = SendingRatchet(rootSecret: root)
        var receiver = ReceivingRatchet(rootSecret: root)
        for n in 0..<4 {
            let (index, sealed) = try sender.seal([UInt8(n)], aad: [7]) { _ in }
            #expect(try receiver.open(sealed, index: index, aad: [7]) == [UInt8(n)])
        }
    }

    @Test("concurrent callers get distinct consecutive indices, each persisted in order")
    func concurrentCallers() async throws {
        let root = SecretKey(random: 32)
        let sender = SendingRatchet(rootSecret: root)
        let indices = try await withThrowingTaskGroup(of: [UInt32].self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var mine: [UInt32] = []
                    for _ in 0..<50 {
                        // persist runs under the ratchet's lock, so the states it sees are strictly increasing.
                        mine.append(try sender.nextMessageKey { _ in }.index)
                    }
                    return mine
                }
            }
            var all: [UInt32] = []
            for try await part in group { all += part }
            return all
        }
        #expect(indices.sorted() == Array(0..<400))
        #expect(sender.state.nextIndex == 400)
        let sequential = SendingRatchet(rootSecret: root)
        for _ in 0..<400 { _ = try sequential.nextMessageKey { _ in } }
        #expect(sequential.state == sender.state)
    }
}
