// The ingest validation fast path: one pass over the body bytes for the shape every accessory
// sends (a flat object of the known fields, ASCII strings without escapes, messageIndex a
// plain integer or a string of digits). No intermediate member list, key Strings or
// String-based checks: the general path (JSONReader + Validation.swift) cost ~30k instructions
// per request, this one a fraction of that.
//
// It only ever answers "valid, here is the NewResponse" or "not sure" (nil). Anything unusual —
// an escape, non-ASCII, a nested value, true/false/null, a duplicate or unknown key, a missing
// field, any value that fails a check — returns nil and the general path decides, so error
// codes and messages come from one place. ValidationTests checks that both paths agree.

extension IngestValidation {
    /// Field names in slot order (the same slots as `fieldSlot`).
    private static let fieldNames: [[UInt8]] = ["pushToken", "sessionIdentifier", "keyID", "messageIndex", "encryptedData", "app"].map { Array($0.utf8) }

    static func fastValidate(_ body: UnsafeBufferPointer<UInt8>, limits: IngestLimits) -> NewResponse? {
        let n = body.count
        var i = 0
        @inline(__always) func skipWhitespace() {
            while i < n {
                let b = body[i]
                guard b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D else { return }
                i += 1
            }
        }
        // Value byte ranges per slot (string contents without quotes, or a number's digits).
        var starts = (-1, -1, -1, -1, -1, -1)
        var ends = (0, 0, 0, 0, 0, 0)
        var seen: UInt8 = 0

        skipWhitespace()
        guard i < n, body[i] == UInt8(ascii: "{") else { return nil }
        i += 1
        while true {
            skipWhitespace()
            guard i < n, body[i] == UInt8(ascii: "\"") else { return nil }
            i += 1
            let keyStart = i
            while i < n, body[i] != UInt8(ascii: "\"") {
                let b = body[i]
                guard b >= 0x20, b < 0x7f, b != UInt8(ascii: "\\") else { return nil }
                i += 1
            }
            guard i < n else { return nil }
            let keyEnd = i
            i += 1
            var slot = -1
            for (k, name) in fieldNames.enumerated() where name.count == keyEnd - keyStart {
                var same = true
                for j in 0..<name.count where body[keyStart + j] != name[j] {
                    same = false
                    break
                }
                if same { slot = k; break }
            }
            guard slot >= 0, seen & (1 << slot) == 0 else { return nil }
            seen |= 1 << slot
            skipWhitespace()
            guard i < n, body[i] == UInt8(ascii: ":") else { return nil }
            i += 1
            skipWhitespace()
            guard i < n else { return nil }
            let valueStart: Int
            let valueEnd: Int
            if body[i] == UInt8(ascii: "\"") {
                i += 1
                valueStart = i
                while i < n, body[i] != UInt8(ascii: "\"") {
                    let b = body[i]
                    guard b >= 0x20, b < 0x80, b != UInt8(ascii: "\\") else { return nil }
                    i += 1
                }
                guard i < n else { return nil }
                valueEnd = i
                i += 1
            } else {
                // Only messageIndex may be a number, and only a JSON integer without sign,
                // fraction or exponent (anything else: the general path names the error).
                guard slot == 3 else { return nil }
                valueStart = i
                while i < n, body[i] >= 0x30, body[i] <= 0x39 { i += 1 }
                valueEnd = i
                guard valueEnd > valueStart, body[valueStart] != 0x30 || valueEnd - valueStart == 1 else { return nil }
                if i < n {
                    let b = body[i]
                    guard b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D || b == UInt8(ascii: ",") || b == UInt8(ascii: "}") else { return nil }
                }
            }
            switch slot {
            case 0: starts.0 = valueStart; ends.0 = valueEnd
            case 1: starts.1 = valueStart; ends.1 = valueEnd
            case 2: starts.2 = valueStart; ends.2 = valueEnd
            case 3: starts.3 = valueStart; ends.3 = valueEnd
            case 4: starts.4 = valueStart; ends.4 = valueEnd
            default: starts.5 = valueStart; ends.5 = valueEnd
            }
            skipWhitespace()
            guard i < n else { return nil }
            if body[i] == UInt8(ascii: ",") { i += 1; continue }
            guard body[i] == UInt8(ascii: "}") else { return nil }
            i += 1
            break
        }
        skipWhitespace()
        guard i == n, seen & 0b11111 == 0b11111 else { return nil }

        // pushToken: non-empty, even length, hex, canonical lowercase.
        let token = UnsafeBufferPointer(rebasing: body[starts.0..<ends.0])
        guard !token.isEmpty, token.count % 2 == 0, token.count <= limits.maxPushTokenHexDigits else { return nil }
        for b in token {
            guard (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66) else { return nil }
        }
        let pushToken = String(unsafeUninitializedCapacity: token.count) { out in
            for (k, b) in token.enumerated() { out[k] = (b >= 0x41 && b <= 0x46) ? b + 32 : b }
            return token.count
        }

        // sessionIdentifier: a UUID, canonical uppercase.
        guard let uuid = UUIDText.parse(UnsafeBufferPointer(rebasing: body[starts.1..<ends.1])) else { return nil }
        let session = UUIDText.format(uuid, uppercase: true)

        // keyID: base64 of exactly 4 bytes.
        guard let keyID = Base64.decode(UnsafeBufferPointer(rebasing: body[starts.2..<ends.2])), keyID.count == 4 else { return nil }

        // messageIndex: 1...10 decimal digits, at most UInt32.max.
        let digits = UnsafeBufferPointer(rebasing: body[starts.3..<ends.3])
        guard !digits.isEmpty, digits.count <= 10 else { return nil }
        var value: UInt64 = 0
        for b in digits {
            guard b >= 0x30 && b <= 0x39 else { return nil }
            value = value * 10 + UInt64(b - 0x30)
        }
        guard value <= UInt64(UInt32.max) else { return nil }
        let index = UInt32(value)

        // encryptedData: base64 of a sealed box whose APNs payload fits.
        guard let sealed = Base64.decode(UnsafeBufferPointer(rebasing: body[starts.4..<ends.4])), sealed.count >= minimumSealedBytes,
              apnsPayloadLength(encryptedBytes: sealed.count, keyIDBytes: keyID.count, messageIndex: index) <= limits.maxAPNsPayloadBytes
        else { return nil }

        var app: String?
        if starts.5 >= 0 {
            let a = UnsafeBufferPointer(rebasing: body[starts.5..<ends.5])
            guard !a.isEmpty, a.count <= 255 else { return nil }
            app = String(decoding: a, as: UTF8.self)
        }
        return NewResponse(app: app, pushToken: pushToken, sessionIdentifier: session, keyID: keyID, messageIndex: index, encryptedData: sealed)
    }
}
