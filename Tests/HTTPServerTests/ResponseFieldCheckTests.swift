// The response field checks read names and values eight bytes at a time; these compare them
// with the byte-by-byte rules they replace, on every byte value at every position and on
// seeded random fields.
@testable import HTTPServer
import TestSupport
import Testing

/// The byte loops the word checks must agree with (the code before them).
private func referenceName(_ u: [UInt8]) -> (isToken: Bool, hasUpper: Bool) {
    guard !u.isEmpty else { return (false, false) }
    let token = Set(Array("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8))
    var upper = false
    for b in u {
        if !token.contains(b) { return (false, upper) }
        if b >= 0x41 && b <= 0x5A { upper = true }
    }
    return (true, upper)
}

private func referenceValue(_ u: [UInt8]) -> Bool {
    !u.contains { $0 == 13 || $0 == 10 || $0 == 0 }
}

private func scan(_ u: [UInt8]) -> (isToken: Bool, hasUpper: Bool) {
    u.withUnsafeBufferPointer { scanHeaderName($0) }
}

private func safe(_ u: [UInt8]) -> Bool {
    u.withUnsafeBufferPointer { isSafeHeaderValue(bytes: $0) }
}

@Suite struct ResponseFieldCheckTests {
    @Test func everyByteAtEveryPositionOfANameGetsTheByteLoopsVerdict() {
        var compared = 0
        for n in 1...24 {
            // Lowercase letters with a dash every fifth byte.
            let base: [UInt8] = (0..<n).map { (i: Int) -> UInt8 in i % 5 == 4 ? 0x2D : 0x61 + UInt8(i % 26) }
            #expect(scan(base).isToken && !scan(base).hasUpper)
            for k in 0..<n {
                for b in 0...255 {
                    var name = base
                    name[k] = UInt8(b)
                    let (isToken, hasUpper) = scan(name)
                    let want = referenceName(name)
                    #expect(isToken == want.isToken && hasUpper == want.hasUpper, "\(name) byte \(b) at \(k)")
                    compared += 1
                }
            }
        }
        #expect(compared == 300 * 256)
    }

    @Test func everyByteAtEveryPositionOfAValueGetsTheByteLoopsVerdict() {
        for n in 0...24 {
            let base: [UInt8] = (0..<n).map { (i: Int) -> UInt8 in UInt8(0x20 + (i * 7) % 95) }   // printable ASCII, spaces included
            #expect(safe(base))
            for k in 0..<n {
                for b in 0...255 {
                    var value = base
                    value[k] = UInt8(b)
                    #expect(safe(value) == referenceValue(value), "\(value) byte \(b) at \(k)")
                }
            }
        }
    }

    /// Several odd bytes per field, lengths across word boundaries, from an alphabet weighted
    /// towards the bytes the word checks treat specially.
    @Test func seededRandomFieldsGetTheByteLoopsVerdict() {
        var rng = SeededGenerator(seed: 0x10_0b2)
        let alphabet: [UInt8] = Array("abcxyz-".utf8) + Array("AZ09!~|_.`".utf8) + [0, 9, 10, 13, 31, 32, 0x40, 0x5B, 0x60, 0x7B, 0x7F, 0x80, 0xC3, 0xE1, 0xFB, 0xFF]
        var tokens = 0, unsafe = 0
        for _ in 0..<20_000 {
            let n = Int.random(in: 0...40, using: &rng)
            var field: [UInt8] = (0..<n).map { _ in 0x61 + UInt8.random(in: 0..<26, using: &rng) }
            for _ in 0..<Int.random(in: 0...3, using: &rng) where n > 0 {
                field[Int.random(in: 0..<n, using: &rng)] = alphabet.randomElement(using: &rng)!
            }
            let got = scan(field), want = referenceName(field)
            #expect(got.isToken == want.isToken && got.hasUpper == want.hasUpper, "\(field)")
            #expect(safe(field) == referenceValue(field), "\(field)")
            if want.isToken { tokens += 1 }
            if !referenceValue(field) { unsafe += 1 }
        }
        // Both verdicts occur often enough for the comparison to mean something.
        #expect(tokens > 2_000 && tokens < 18_000 && unsafe > 1_000)
    }

    /// The same checks through the public type: unsafe fields are flagged, names lowercased.
    @Test func headersFlagUnsafeFieldsAndLowercaseNames() {
        var h = HTTPHeaders()
        h.add("x-request-id", "0123456789abcdef")
        h.add("Content-Type", "application/json")
        #expect(!h.hasUnsafeField)
        #expect(h.fields.map(\.name) == ["x-request-id", "content-type"])
        var split = HTTPHeaders()
        split.add("x-long-header-name", "value with\r\ninjected: header")
        #expect(split.hasUnsafeField)
        var badName = HTTPHeaders()
        badName.add("x-long-header name", "v")
        #expect(badName.hasUnsafeField)
    }
}
