import Synchronization

/// What a sending ratchet must persist: the chain key for `nextIndex` and that index.
/// `nextIndex` counts the message keys handed out so far, so it runs 0...2^32; 2^32 means every
/// UInt32 index has been used.
public struct SendingRatchetState: Codable, Sendable, Equatable {
    /// Lowercase hex of the chain key that derives the key for `nextIndex`.
    public var chainKey: String
    public var nextIndex: UInt64

    public init(chainKey: String, nextIndex: UInt64) {
        self.chainKey = chainKey
        self.nextIndex = nextIndex
    }

    /// One past UInt32.max: the state of a ratchet that has used every index.
    public static let exhaustedIndex: UInt64 = UInt64(UInt32.max) + 1
}

/// The sending side of the ratchet (the accessory's outgoing ratchet, or a test sender).
///
/// The only way to get a message key is `nextMessageKey(persist:)`, which advances the state,
/// hands the advanced state to `persist`, and returns the key only if `persist` returned
/// normally. A crash after persisting loses at most an unused key; it can never make the sender
/// reuse an index. Thread-safe: calls are serialised, `persist` runs under the lock.
public final class SendingRatchet: Sendable {
    private struct Position {
        var chainKey: SecretKey
        var nextIndex: UInt64
    }
    private let position: Mutex<Position>

    /// Starts at index 0 with chain key 0 = the 32-byte root secret exported from HPKE.
    public init(rootSecret: SecretKey) {
        position = Mutex(Position(chainKey: rootSecret, nextIndex: 0))
    }

    /// Restores a persisted state. Throws `.invalidState` for bad hex or an index past 2^32.
    /// (Any key length round-trips; Apple's chain keys are 32 bytes.)
    public init(state: SendingRatchetState) throws {
        guard let bytes = [UInt8](hex: state.chainKey) else { throw RatchetError.invalidState("chainKey is not hex") }
        guard state.nextIndex <= SendingRatchetState.exhaustedIndex else {
            throw RatchetError.invalidState("nextIndex \(state.nextIndex) is past 2^32")
        }
        position = Mutex(Position(chainKey: SecretKey(bytes: bytes), nextIndex: state.nextIndex))
    }

    /// The current state (what the last successful `persist` received, or the initial state).
    public var state: SendingRatchetState {
        position.withLock { SendingRatchetState(chainKey: $0.chainKey.exportedBytes.hexString, nextIndex: $0.nextIndex) }
    }

    /// Derives the key for the next index, persists the advanced state, then returns the key.
    /// If `persist` throws, its error is rethrown, the in-memory state does not move, and no key
    /// leaves this function. After index UInt32.max it throws `.indexSpaceExhausted` forever.
    public func nextMessageKey(persist: (SendingRatchetState) throws -> Void) throws -> (index: UInt32, messageKey: SecretKey) {
        try position.withLock { position in
            guard position.nextIndex < SendingRatchetState.exhaustedIndex else { throw RatchetError.indexSpaceExhausted }
            let index = UInt32(position.nextIndex)
            let step = ratchetStep(chainKey: position.chainKey, messageIndex: index)
            let advanced = SendingRatchetState(chainKey: step.nextChainKey.exportedBytes.hexString,
                                               nextIndex: position.nextIndex + 1)
            try persist(advanced)
            position = Position(chainKey: step.nextChainKey, nextIndex: advanced.nextIndex)
            return (index, step.messageKey)
        }
    }

    /// Convenience: takes the next key, seals `plaintext` with it and returns index and sealed box.
    public func seal(_ plaintext: [UInt8], aad: [UInt8] = [], persist: (SendingRatchetState) throws -> Void) throws -> (index: UInt32, sealed: [UInt8]) {
        let (index, key) = try nextMessageKey(persist: persist)
        return (index, try AESGCM.seal(plaintext, key: key, aad: aad))
    }
}
