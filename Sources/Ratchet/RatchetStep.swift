internal import OpenSSLSupport

/// The HKDF info prefix of a ratchet step (UTF-8, no terminator). The 4-byte little-endian
/// message index follows it.
public let ratchetInfoPrefix: [UInt8] = Array("AccessoryTransportSecurity-RatchetKeys-".utf8)

/// The info bytes for one ratchet step: prefix || messageIndex as UInt32 little-endian.
public func ratchetInfo(messageIndex: UInt32) -> [UInt8] {
    ratchetInfoPrefix + [UInt8(truncatingIfNeeded: messageIndex),
                         UInt8(truncatingIfNeeded: messageIndex >> 8),
                         UInt8(truncatingIfNeeded: messageIndex >> 16),
                         UInt8(truncatingIfNeeded: messageIndex >> 24)]
}

/// One step of Apple's Symmetric Key Ratchet.
///
/// HKDF-SHA256 *expand only* (no extract), PRK = chainKey, info = `ratchetInfo(messageIndex:)`,
/// 64 bytes out: bytes 0..<32 are the message key, bytes 32..<64 the next chain key. The 64
/// bytes are derived into memory that is zeroed after the two keys are copied out of it.
public func ratchetStep(chainKey: SecretKey, messageIndex: UInt32) -> (messageKey: SecretKey, nextChainKey: SecretKey) {
    let info = ratchetInfo(messageIndex: messageIndex)
    let messageKey = UnsafeMutableRawBufferPointer.allocate(byteCount: 32, alignment: 16)
    let nextChainKey = UnsafeMutableRawBufferPointer.allocate(byteCount: 32, alignment: 16)
    withUnsafeTemporaryAllocation(byteCount: 64, alignment: 16) { okm in
        do {
            try chainKey.withUnsafeBytes { prk in
                try info.withUnsafeBytes { try LibCrypto.hkdfExpand(prk: prk, info: $0, output: okm) }
            }
        } catch {
            // Only reachable if OpenSSL itself fails (allocation): 64 bytes of expand cannot fail on input.
            fatalError("ratchetStep: \(error)")
        }
        messageKey.copyMemory(from: UnsafeRawBufferPointer(rebasing: okm[0..<32]))
        nextChainKey.copyMemory(from: UnsafeRawBufferPointer(rebasing: okm[32..<64]))
        wipe(okm)
    }
    return (SecretKey(adopting: messageKey), SecretKey(adopting: nextChainKey))
}

/// The ratchet's key identifier: the first 4 bytes of SHA-384 over the accessory public key's
/// raw representation (X-Wing: 1216 bytes; P-256 raw: 64 bytes).
public func keyID(publicKey: [UInt8]) -> [UInt8] {
    do {
        return try Array(publicKey.withUnsafeBytes { try LibCrypto.sha384($0) }.prefix(4))
    } catch {
        fatalError("keyID: \(error)")  // only an OpenSSL-internal failure gets here
    }
}
