/// Every failure the Ratchet module reports. Cases carry lengths and indices, never key material
/// or plaintext, so they are safe to log.
public enum RatchetError: Error, Equatable, Sendable {
    // Primitives
    /// A key had the wrong length (AES-256-GCM keys are 32 bytes).
    case invalidKeyLength(expected: Int, actual: Int)
    /// A GCM nonce was not 12 bytes.
    case invalidNonceLength(Int)
    /// HKDF-SHA256 can produce 1...8160 bytes.
    case invalidOutputLength(Int)
    /// A sealed box shorter than nonce(12) + tag(16).
    case sealedBoxTooShort(Int)
    /// The GCM tag did not verify: wrong key, wrong AAD, or modified bytes.
    case authenticationFailed
    /// OpenSSL reported a failure; the text is OpenSSL's own message.
    case openSSL(String)

    // Sending ratchet
    /// Every index 0...UInt32.max has been used; the ratchet never wraps.
    case indexSpaceExhausted

    // Receiving ratchet
    /// The index was already used (its key is gone).
    case replayedIndex(UInt32)
    /// The index is below the retained window: already used, or its skipped key was evicted
    /// because more than `ReceivingRatchet.maximumSkippedKeys` keys were cached.
    case indexTooOld(UInt32)
    /// Reaching the index would skip more than `ReceivingRatchet.maximumSkippedKeys` keys.
    case indexBeyondWindow(index: UInt32, highestAcceptable: UInt32)
    /// A persisted ratchet state could not be restored; the text names what is wrong.
    case invalidState(String)

    // Wire codecs
    /// An internet message shorter than keyID(4) + index(4) + nonce(12) + tag(16).
    case messageTooShort(Int)
    /// A keyID that is not 4 bytes.
    case invalidKeyIDLength(Int)
    /// A response body field whose length prefix runs past the end of the input.
    case truncatedField(String)
    /// A response body field that is not valid UTF-8.
    case invalidUTF8(field: String)
    /// A required response body field that is empty.
    case emptyField(String)
    /// A response body field longer than the 2-byte length prefix can express.
    case fieldTooLong(field: String, length: Int)
    /// A response body larger than `NotificationResponseBody.maximumEncodedLength`.
    case bodyTooLarge(Int)
    /// Bytes left over after the last field.
    case trailingBytes(Int)
}
