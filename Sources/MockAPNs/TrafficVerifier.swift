// Decrypts accessory pushes as the iPhone would: one receiving ratchet per configured root
// secret, keyed by the ratchet keyID the push carries (the iPhone keeps one per paired
// accessory, and keyID identifies the accessory's key). 50,000 skipped keys are kept, each
// usable once, so out-of-order delivery verifies and replays do not.
import Foundation
import Ratchet
import Synchronization

public final class TrafficVerifier: Sendable {
    private let roots: [[UInt8]: SecretKey]
    private let ratchets: Mutex<[[UInt8]: ReceivingRatchet]>

    public init(rootSecrets: [MockRootSecret]) {
        var roots: [[UInt8]: SecretKey] = [:]
        for root in rootSecrets { roots[root.keyID] = root.rootSecret }
        self.roots = roots
        ratchets = Mutex([:])
    }

    public var isEmpty: Bool { roots.isEmpty }

    /// nil verified when no root secret matches the push's keyID.
    public func verify(_ fields: AccessoryFields) -> DeliveryVerification {
        guard let root = roots[fields.keyID] else { return .notApplicable }
        let opened: Result<[UInt8], Error> = ratchets.withLock { all in
            var ratchet = all[fields.keyID] ?? ReceivingRatchet(rootSecret: root)
            do {
                // `open` commits the ratchet only when the tag verified: forgeries burn no index.
                let plaintext = try ratchet.open(fields.encryptedData, index: fields.messageIndex)
                all[fields.keyID] = ratchet
                return .success(plaintext)
            } catch {
                return .failure(error)
            }
        }
        switch opened {
        case .failure(let error):
            return DeliveryVerification(verified: false, error: describe(error))
        case .success(let plaintext):
            do {
                let body = try NotificationResponseBody(decoding: plaintext)
                var v = DeliveryVerification(verified: true)
                v.notificationIdentifier = body.notificationIdentifier
                v.sourceIdentifier = body.sourceIdentifier
                v.actionIdentifier = body.actionIdentifier
                v.userText = body.userText
                return v
            } catch {
                return DeliveryVerification(verified: false, error: "decrypted, but not a response body: \(describe(error))")
            }
        }
    }

    /// Forgets all receiving state (a new pairing, as far as the mock knows).
    public func reset() { ratchets.withLock { $0.removeAll() } }

    private func describe(_ error: Error) -> String {
        guard let error = error as? RatchetError else { return "\(error)" }
        switch error {
        case .authenticationFailed: return "authentication failed (wrong key, index or modified bytes)"
        case .replayedIndex(let i): return "messageIndex \(i) already used (replay)"
        case .indexTooOld(let i): return "messageIndex \(i) is below the 50,000-key window"
        case .indexBeyondWindow(let i, let highest): return "messageIndex \(i) skips more than 50,000 keys (highest acceptable \(highest))"
        case .sealedBoxTooShort(let n): return "encryptedData is \(n) bytes, shorter than nonce + tag"
        default: return "\(error)"
        }
    }
}
