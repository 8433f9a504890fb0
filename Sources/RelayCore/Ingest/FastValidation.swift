// The ingest validation fast path: one pass over the body bytes for the shape every accessory
// sends (a flat object of the known fields, ASCII strings without escapes, messageIndex a
// plain integer or a string of digits). No intermediate member list, key Strings or
// String-based checks, which dominate the general path's cost (JSONReader + Validation.swift;
// figures in docs/performance-history.md).
//
// It only ever answers "valid, here is the NewResponse" or "not sure" (nil). Anything unusual —
// an escape, non-ASCII, a nested value, true/false/null, a duplicate or unknown key, a missing
// field, any value that fails a check — returns nil and the general path decides, so error
// codes and messages come from one place. ValidationTests checks that both paths agree.
//
// Strings are delimited with memchr for the closing quote, without looking at their bytes on
// the way: an escaped quote (`\"`) would end a string early, but every field's own check below
// refuses a backslash (hex, UUID, base64 and digits cannot contain one; `app` is checked for
// it), and key bytes are compared with the known names, none of which contains one. So a body
// with a backslash anywhere in a string never reaches `return NewResponse`.

#if canImport(Glibc)
import Basics
import Glibc
#endif

extension IngestValidation {
    static func fastValidate(_ body: UnsafeBufferPointer<UInt8>, limits: IngestLimits) -> NewResponse? {
        guard let base = body.baseAddress, let fields = scanFields(base, body.count) else { return nil }
        return decodeFields(base, fields, limits: limits)
    }

    /// Where each known field's value lies in the body: string contents without their quotes,
    /// or a number's digits. A slot not present has start -1.
    struct FieldRanges {
        var starts = (-1, -1, -1, -1, -1, -1)
        var ends = (0, 0, 0, 0, 0, 0)

        @inline(__always)
        mutating func set(_ slot: Int, _ start: Int, _ end: Int) {
            switch slot {
            case 0: starts.0 = start; ends.0 = end
            case 1: starts.1 = start; ends.1 = end
            case 2: starts.2 = start; ends.2 = end
            case 3: starts.3 = start; ends.3 = end
            case 4: starts.4 = start; ends.4 = end
            default: starts.5 = start; ends.5 = end
            }
        }
    }

    /// Step 1: the object's shape. Nil for anything but a flat object of distinct known keys
    /// holding plain strings (messageIndex: also a plain integer) with the five required present.
    @inline(__always)
    private static func scanFields(_ base: UnsafePointer<UInt8>, _ n: Int) -> FieldRanges? {
        var i = 0
        var fields = FieldRanges()
        var seen: UInt8 = 0

        while i < n, isJSONSpace(base[i]) { i += 1 }
        guard i < n, base[i] == UInt8(ascii: "{") else { return nil }
        i += 1
        while true {
            while i < n, isJSONSpace(base[i]) { i += 1 }
            guard i < n, base[i] == UInt8(ascii: "\"") else { return nil }
            i += 1
            guard let keyEnd = closingQuote(base, i, n) else { return nil }
            let slot = fieldSlot(base + i, keyEnd - i)
            i = keyEnd + 1
            guard slot >= 0, seen & (1 << slot) == 0 else { return nil }
            seen |= 1 << slot
            while i < n, isJSONSpace(base[i]) { i += 1 }
            guard i < n, base[i] == UInt8(ascii: ":") else { return nil }
            i += 1
            while i < n, isJSONSpace(base[i]) { i += 1 }
            guard i < n else { return nil }
            let valueStart: Int
            let valueEnd: Int
            if base[i] == UInt8(ascii: "\"") {
                valueStart = i + 1
                guard let close = closingQuote(base, valueStart, n) else { return nil }
                valueEnd = close
                i = close + 1
            } else {
                // Only messageIndex may be a number, and only a JSON integer without sign,
                // fraction or exponent (anything else: the general path names the error).
                guard slot == 3 else { return nil }
                valueStart = i
                while i < n, base[i] &- 0x30 < 10 { i += 1 }
                valueEnd = i
                guard valueEnd > valueStart, base[valueStart] != 0x30 || valueEnd - valueStart == 1 else { return nil }
                if i < n {
                    let b = base[i]
                    guard isJSONSpace(b) || b == UInt8(ascii: ",") || b == UInt8(ascii: "}") else { return nil }
                }
            }
            fields.set(slot, valueStart, valueEnd)
            while i < n, isJSONSpace(base[i]) { i += 1 }
            guard i < n else { return nil }
            if base[i] == UInt8(ascii: ",") { i += 1; continue }
            guard base[i] == UInt8(ascii: "}") else { return nil }
            i += 1
            break
        }
        while i < n, isJSONSpace(base[i]) { i += 1 }
        guard i == n, seen & 0b11111 == 0b11111 else { return nil }
        return fields
    }

    /// Step 2: each value's own check and conversion, in slot order.
    @inline(__always)
    private static func decodeFields(_ base: UnsafePointer<UInt8>, _ fields: FieldRanges, limits: IngestLimits) -> NewResponse? {
        let (starts, ends) = (fields.starts, fields.ends)
        guard let pushToken = lowercasedPushToken(base + starts.0, ends.0 - starts.0) else { return nil }

        // sessionIdentifier: a UUID, canonical uppercase, checked and formatted in one pass.
        guard let session = UUIDText.canonicalUppercase(UnsafeBufferPointer(start: base + starts.1, count: ends.1 - starts.1)) else { return nil }

        // keyID: base64 of exactly 4 bytes.
        guard let keyID = Base64.decode(UnsafeBufferPointer(start: base + starts.2, count: ends.2 - starts.2), trailingBits: .ignored),
              keyID.count == 4 else { return nil }

        guard let index = decimalIndex(base + starts.3, ends.3 - starts.3) else { return nil }

        // encryptedData: base64 of a sealed box whose APNs payload fits.
        guard let sealed = Base64.decode(UnsafeBufferPointer(start: base + starts.4, count: ends.4 - starts.4), trailingBits: .ignored),
              sealed.count >= minimumSealedBytes,
              apnsPayloadLength(encryptedBytes: sealed.count, keyIDBytes: keyID.count, messageIndex: index) <= limits.maxAPNsPayloadBytes
        else { return nil }

        var app: String?
        if starts.5 >= 0 {
            let count = ends.5 - starts.5
            guard count > 0, count <= 255 else { return nil }
            for k in starts.5..<ends.5 {
                let b = base[k]
                guard b >= 0x20, b < 0x80, b != UInt8(ascii: "\\") else { return nil }
            }
            app = String(decoding: UnsafeBufferPointer(start: base + starts.5, count: count), as: UTF8.self)
        }
        return NewResponse(app: app, pushToken: pushToken, sessionIdentifier: session, keyID: keyID, messageIndex: index, encryptedData: sealed)
    }

    /// pushToken: Basics.PushToken's rule, canonical lowercase. Checked and lowercased in one
    /// pass straight into the String's storage; a bad byte abandons the String.
    @inline(__always)
    private static func lowercasedPushToken(_ tokenStart: UnsafePointer<UInt8>, _ tokenCount: Int) -> String? {
        guard PushToken.isValidLength(tokenCount) else { return nil }
        var tokenOK = true
        let pushToken = String(unsafeUninitializedCapacity: tokenCount) { out in
            for k in 0..<tokenCount {
                let b = tokenStart[k]
                let lower = b | 0x20   // maps A-F to a-f; digits already have the bit
                guard b &- 0x30 < 10 || lower &- 0x61 < 6 else { tokenOK = false; return 0 }
                out[k] = b &- 0x30 < 10 ? b : lower
            }
            return tokenCount
        }
        return tokenOK ? pushToken : nil
    }

    /// messageIndex: 1...10 decimal digits, at most UInt32.max.
    @inline(__always)
    private static func decimalIndex(_ digits: UnsafePointer<UInt8>, _ digitCount: Int) -> UInt32? {
        guard digitCount > 0, digitCount <= 10 else { return nil }
        var value: UInt64 = 0
        for k in 0..<digitCount {
            let d = digits[k] &- 0x30
            guard d < 10 else { return nil }
            value = value * 10 + UInt64(d)
        }
        return value <= UInt64(UInt32.max) ? UInt32(value) : nil
    }

    @inline(__always)
    private static func isJSONSpace(_ b: UInt8) -> Bool {
        b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D
    }

    /// Index of the next `"` at or after `from`, or nil.
    @inline(__always)
    private static func closingQuote(_ base: UnsafePointer<UInt8>, _ from: Int, _ n: Int) -> Int? {
        guard from < n, let q = memchr(base + from, 0x22, n - from) else { return nil }
        return base.distance(to: q.assumingMemoryBound(to: UInt8.self))
    }

    /// Slot of a known field name given as bytes (the same slots as `fieldSlot(_: String)`),
    /// -1 for anything else. Length first, then the bytes.
    @inline(__always)
    private static func fieldSlot(_ p: UnsafePointer<UInt8>, _ count: Int) -> Int {
        switch count {
        case 9: return same(p, "pushToken") ? 0 : -1
        case 17: return same(p, "sessionIdentifier") ? 1 : -1
        case 5: return same(p, "keyID") ? 2 : -1
        case 12: return same(p, "messageIndex") ? 3 : -1
        case 13: return same(p, "encryptedData") ? 4 : -1
        case 3: return same(p, "app") ? 5 : -1
        default: return -1
        }
    }

    @inline(__always)
    private static func same(_ p: UnsafePointer<UInt8>, _ name: StaticString) -> Bool {
        memcmp(p, name.utf8Start, name.utf8CodeUnitCount) == 0
    }
}
