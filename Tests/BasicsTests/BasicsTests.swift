import Foundation
import Testing
@testable import Basics

@Suite struct HexTests {
    @Test func encodesBothCases() {
        #expect(Hex.encode([0x00, 0x0f, 0xa5, 0xff]) == "000fa5ff")
        #expect(Hex.encode([0x00, 0x0f, 0xa5, 0xff], uppercase: true) == "000FA5FF")
        #expect(Hex.encode([]) == "")
    }

    @Test func decodesEitherCaseAndEmpty() {
        #expect(Hex.decode("00Fa5fFF") == [0x00, 0xfa, 0x5f, 0xff])
        #expect(Hex.decode("") == [])
    }

    @Test func rejectsOddCountNonDigitsSeparatorsAndNonASCII() {
        #expect(Hex.decode("abc") == nil)
        #expect(Hex.decode("0g") == nil)
        #expect(Hex.decode("0a 0b") == nil)
        #expect(Hex.decode("0x0a") == nil)
        #expect(Hex.decode("\u{FF10}\u{FF10}") == nil)  // fullwidth zeros
    }

    @Test func predicateAndValue() {
        for b in UInt8.min...UInt8.max {
            let ascii = (0x30...0x39).contains(b) || (0x41...0x46).contains(b) || (0x61...0x66).contains(b)
            #expect(Hex.isDigit(b) == ascii)
            #expect((Hex.value(b) != nil) == ascii)
        }
        #expect(Hex.value(UInt8(ascii: "F")) == 15)
        #expect(Hex.isHex("aB09"))
        #expect(!Hex.isHex(""))
        #expect(!Hex.isHex("abz"))
        #expect(Hex.isHex("abc"))  // odd counts are fine for the predicate
    }

    @Test func roundTripsRandomBytes() {
        var g = SystemRandomNumberGenerator()
        for n in 0..<40 {
            let b = (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
            #expect(Hex.decode(Hex.encode(b)) == b)
            #expect(Hex.decode(Hex.encode(b, uppercase: true)) == b)
        }
    }
}

@Suite struct Base64Tests {
    // RFC 4648 section 10 vectors.
    static let vectors: [(String, String)] = [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"),
                                              ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")]

    @Test func standardPaddedMatchesRFCAndFoundation() {
        for (plain, encoded) in Self.vectors {
            #expect(Base64.encode(Array(plain.utf8)) == encoded)
            #expect(Base64.decode(encoded) == Array(plain.utf8))
        }
        var g = SystemRandomNumberGenerator()
        for n in 0..<70 {
            let b = (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
            #expect(Base64.encode(b) == Data(b).base64EncodedString())
            #expect(Base64.decode(Data(b).base64EncodedString()) == b)
        }
    }

    @Test func urlUnpaddedUsesDashUnderscoreAndNoPadding() {
        #expect(Base64.encode([0xfb, 0xff], alphabet: .url, padding: false) == "-_8")
        #expect(Base64.encode([0xfb, 0xff]) == "+/8=")
        #expect(Base64.encode(Array("f".utf8), alphabet: .url, padding: false) == "Zg")
        #expect(Base64.decode("-_8", alphabet: .url, padding: false) == [0xfb, 0xff])
        #expect(Base64.encodedCount(1, padding: false) == 2)
        #expect(Base64.encodedCount(2, padding: false) == 3)
        #expect(Base64.encodedCount(3, padding: false) == 4)
    }

    @Test func appendKeepsWhatIsThere() {
        var out = Array("x:".utf8)
        Base64.append([1, 2, 3, 4], to: &out)
        #expect(String(decoding: out, as: UTF8.self) == "x:AQIDBA==")
    }

    @Test func decodeRejectsWrongAlphabetPaddingLengthAndNonCanonical() {
        #expect(Base64.decode("+/8=", alphabet: .url, padding: false) == nil)   // standard digits, padding
        #expect(Base64.decode("-_8", alphabet: .url, padding: true) == nil)     // missing padding
        #expect(Base64.decode("-_8=", alphabet: .url, padding: false) == nil)   // padding where forbidden
        #expect(Base64.decode("-_8=") == nil)                                   // url digits in standard
        #expect(Base64.decode("Zg=", padding: true) == nil)                     // length not a multiple of 4
        #expect(Base64.decode("Z", alphabet: .url, padding: false) == nil)      // one leftover digit
        #expect(Base64.decode("Zh", alphabet: .url, padding: false) == nil)     // unused bits set
        #expect(Base64.decode("Zh==") == nil)
        #expect(Base64.decode("Z===") == nil)
        #expect(Base64.decode("Zg=A") == nil)
        #expect(Base64.decode("Zg==Zg==") == nil)
        #expect(Base64.decode("Zm9v\n") == nil)
        #expect(Base64.decode("") == [])
        #expect(Base64.decode("", alphabet: .url, padding: false) == [])
        #expect(Base64.decode("====") == nil)
        #expect(Base64.decode("Zm9vYm==") == nil)                                // pad after 2 of 4 digits, bits set
        #expect(Base64.decode("Zm9=Yg==") == nil)                                // pad inside
    }

    /// The ingest decoder's one difference: unused trailing bits are ignored, not refused.
    @Test func ignoredTrailingBitsAcceptWhatMustBeZeroRefuses() {
        #expect(Base64.decode("Zh==", trailingBits: .ignored) == [0x66])
        #expect(Base64.decode("Zm9=", trailingBits: .ignored) == [0x66, 0x6f])
        #expect(Base64.decode("Zm9=") == nil)
        #expect(Base64.decode("Zh", alphabet: .url, padding: false, trailingBits: .ignored) == [0x66])
        #expect(Base64.decode("Zh=A", trailingBits: .ignored) == nil)            // still strict otherwise
        #expect(Base64.decode("Zh=", trailingBits: .ignored) == nil)
        // Byte and String entry points agree, canonical or not, on every alphabet.
        var g = SystemRandomNumberGenerator()
        for n in 0..<40 {
            let b = (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
            for alphabet in [Base64.Alphabet.standard, .url] {
                for padding in [true, false] {
                    let text = Base64.encode(b, alphabet: alphabet, padding: padding)
                    var copy = text
                    let viaBytes = copy.withUTF8 { Base64.decode($0, alphabet: alphabet, padding: padding) }
                    #expect(viaBytes == b)
                    #expect(Base64.decode(text[...], alphabet: alphabet, padding: padding, trailingBits: .ignored) == b)
                }
            }
        }
    }
}

@Suite struct UUIDTextTests {
    static let bytes: [UInt8] = [0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17, 0x40, 0x00]

    @Test func formatsLowerAndUpperLikeFoundation() {
        #expect(UUIDText.format(Self.bytes) == "123e4567-e89b-12d3-a456-426614174000")
        #expect(UUIDText.format(Self.bytes, uppercase: true) == "123E4567-E89B-12D3-A456-426614174000")
        for _ in 0..<20 {
            let u = UUID()
            let viaRaw = withUnsafeBytes(of: u.uuid) { UUIDText.format(bytes: $0, uppercase: true) }
            #expect(viaRaw == u.uuidString)
            #expect(withUnsafeBytes(of: u.uuid) { UUIDText.format(bytes: $0) } == u.uuidString.lowercased())
        }
    }

    @Test func parsesEitherCaseAndRejectsEverythingElse() {
        #expect(UUIDText.parse("123E4567-e89b-12D3-a456-426614174000") == Self.bytes)
        #expect(UUIDText.isCanonical("123E4567-e89b-12D3-a456-426614174000"))
        for bad in ["", "123e4567e89b12d3a456426614174000", "{123e4567-e89b-12d3-a456-426614174000}",
                    "123e4567-e89b-12d3-a456-42661417400", "123e4567-e89b-12d3-a456-4266141740000",
                    "123e4567-e89b-12d3-a456_426614174000", "123e4567-e89b-12d3-a456-42661417400g",
                    " 23e4567-e89b-12d3-a456-426614174000", "123e456-7e89b-12d3-a456-426614174000"] {
            #expect(UUIDText.parse(bad) == nil, "\(bad)")
            #expect(!UUIDText.isCanonical(bad), "\(bad)")
        }
    }
}

@Suite struct JSONStringTests {
    @Test func escapesWhatRFC8259Requires() {
        #expect(JSONString.quote("") == "\"\"")
        #expect(JSONString.quote("a\"b\\c") == #""a\"b\\c""#)
        #expect(JSONString.quote("\n\r\t") == #""\n\r\t""#)
        #expect(JSONString.quote("\u{0}\u{1}\u{8}\u{c}\u{1f}") == #""\u0000\u0001\u0008\u000c\u001f""#)
        // DEL, "/" and non-ASCII pass through unescaped, as all three old copies did.
        #expect(JSONString.quote("\u{7f}/é😀") == "\"\u{7f}/é😀\"")
    }

    @Test("Text without escapes is copied whole; one escape anywhere takes the byte-by-byte path")
    func plainTextAndTheEscapePath() {
        let plain = String(repeating: "0123456789abcdef", count: 8) + "-é😀"
        #expect(JSONString.quote(plain) == "\"" + plain + "\"")
        #expect(JSONString.quote(plain + "\n") == "\"" + plain + "\\n\"")
        #expect(JSONString.quote("\u{1f}" + plain) == "\"\\u001f" + plain + "\"")
        var out = Array("x".utf8)
        JSONString.append("ab", to: &out)
        JSONString.append("c\"", to: &out)
        #expect(String(decoding: out, as: UTF8.self) == #"x"ab""c\"""#)
    }

    @Test func everyControlCharacterRoundTripsThroughFoundation() throws {
        let all = String((0..<0x80).map { Character(Unicode.Scalar(UInt8($0))) }) + "é😀"
        let parsed = try JSONSerialization.jsonObject(with: Data(JSONString.quote(all).utf8), options: [.fragmentsAllowed])
        #expect(parsed as? String == all)
    }

    @Test func appendKeepsWhatIsThere() {
        var out = Array("k:".utf8)
        JSONString.append("v\n", to: &out)
        #expect(String(decoding: out, as: UTF8.self) == #"k:"v\n""#)
    }
}

@Suite struct WriteAllTests {
    @Test func retriesEINTRAndShortWritesUntilEverythingIsWritten() {
        let data = Array("hello, world".utf8)
        var written = [UInt8]()
        var calls = 0
        let result = data.withUnsafeBytes { raw in
            FileDescriptor.writeAll(7, raw) { fd, p, n in
                calls += 1
                #expect(fd == 7)
                if calls % 2 == 1 { errno = EINTR; return -1 }  // every other call interrupted
                let k = min(n, 5)                                 // and every write short
                written.append(contentsOf: UnsafeRawBufferPointer(start: p, count: k))
                return k
            }
        }
        #expect(result == nil)
        #expect(written == data)
        #expect(calls == 6)
    }

    @Test func stopsWithErrnoOnOtherErrorsAndEIOOnZero() {
        let data = Array("abc".utf8)
        let failed = data.withUnsafeBytes { FileDescriptor.writeAll(3, $0) { _, _, _ in errno = ENOSPC; return -1 } }
        #expect(failed == ENOSPC)
        let zero = data.withUnsafeBytes { FileDescriptor.writeAll(3, $0) { _, _, _ in 0 } }
        #expect(zero == EIO)
        let empty = [UInt8]().withUnsafeBytes { FileDescriptor.writeAll(3, $0) { _, _, _ in Issue.record("no write for empty"); return -1 } }
        #expect(empty == nil)
    }

    @Test func writesToARealPipeAndReportsEBADF() {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]) }
        #expect(FileDescriptor.writeAll(fds[1], "line one\n") == nil)
        #expect(FileDescriptor.writeAll(fds[1], Array("two".utf8)) == nil)
        close(fds[1])
        var buf = [UInt8](repeating: 0, count: 64)
        let n = read(fds[0], &buf, 64)
        #expect(String(decoding: buf[..<max(0, n)], as: UTF8.self) == "line one\ntwo")
        // Not fds[1] again: the suites run in parallel in one process, and a closed number may
        // already be another test's socket. The open-file limit is one no descriptor can have.
        var limit = rlimit()
        #expect(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0)
        #expect(FileDescriptor.writeAll(Int32(clamping: limit.rlim_cur), "x") == EBADF)
    }
}

@Suite struct JSONScannerTests {
    /// Runs `read` on a scanner over `text`; the value, or the error message.
    func scan<T>(_ text: [UInt8], at pos: Int = 0, _ read: (inout JSONScanner) throws(JSONScanError) -> T) -> Result<T, JSONScanError> {
        text.withUnsafeBufferPointer { b in
            var s = JSONScanner(b)
            s.pos = pos
            do throws(JSONScanError) { return .success(try read(&s)) } catch { return .failure(error) }
        }
    }

    @Test func stringsDecodeEscapesAndStopAfterTheClosingQuote() throws {
        let text = Array(#""a\"b\\\/\b\f\n\r\t\u00e9\ud83d\ude00" tail"#.utf8)
        let r = scan(text) { s throws(JSONScanError) in (try s.string(), s.pos) }
        let (value, end) = try r.get()
        #expect(value == "a\"b\\/\u{08}\u{0C}\n\r\té😀")
        #expect(end == text.count - 5)
        #expect(try scan(Array("\"caf\u{e9}\"".utf8)) { s throws(JSONScanError) in try s.string() }.get() == "café")
    }

    /// Each failure names what and where, in the words the ingest API answers with.
    @Test func stringFailuresSayWhatAndWhere() {
        let cases: [([UInt8], String)] = [
            (Array(#""abc"#.utf8), "unexpected end of JSON (unterminated string)"),
            (Array("\"a\u{01}\"".utf8), "invalid JSON at byte 2: control character in string"),
            (Array(#""\q""#.utf8), "invalid JSON at byte 3: invalid escape"),
            (Array(#""\u12G4""#.utf8), #"invalid JSON at byte 3: invalid \u escape"#),
            (Array(#""\u12"#.utf8), #"invalid JSON at byte 3: truncated \u escape"#),
            (Array(#""\ud800x""#.utf8), "invalid JSON at byte 7: unpaired surrogate escape"),
            (Array(#""\udc00""#.utf8), "invalid JSON at byte 7: unpaired surrogate escape"),
            ([0x22, 0xC0, 0xAF, 0x22], "invalid UTF-8 at byte 1"),            // overlong
            ([0x22, 0xED, 0xA0, 0x80, 0x22], "invalid UTF-8 at byte 1"),      // encoded surrogate
            ([0x22, 0xF4, 0x90, 0x80, 0x80, 0x22], "invalid UTF-8 at byte 1"), // above U+10FFFF
            ([0x22, 0xE2, 0x82], "invalid UTF-8 at byte 1"),                   // truncated sequence
        ]
        for (text, message) in cases {
            let r = scan(text) { s throws(JSONScanError) in try s.string() }
            #expect(r.failureMessage == message, "\(text)")
        }
    }

    @Test func numbersFollowTheGrammar() {
        for ok in ["0", "-0", "12", "-0.5e+3", "1E9", "3.25"] {
            #expect(scan(Array(ok.utf8)) { s throws(JSONScanError) in try s.number() }.success == 0..<ok.utf8.count, "\(ok)")
        }
        #expect(scan(Array("12,".utf8)) { s throws(JSONScanError) in try s.number() }.success == 0..<2)
        let bad = [("01", "invalid JSON at byte 1: leading zero in number"), ("-", "unexpected end of JSON (invalid number)"),
                   ("1.", "unexpected end of JSON (invalid fraction)"), ("1.e", "invalid JSON at byte 2: invalid fraction"),
                   ("1e+", "unexpected end of JSON (invalid exponent)"), ("x", "invalid JSON at byte 0: invalid number")]
        for (text, message) in bad {
            #expect(scan(Array(text.utf8)) { s throws(JSONScanError) in try s.number() }.failureMessage == message, "\(text)")
        }
    }

    @Test func literalsWhitespaceAndExpect() {
        #expect(scan(Array("true]".utf8)) { s throws(JSONScanError) in try s.literal("true"); return s.pos }.success == 4)
        #expect(scan(Array("tru".utf8)) { s throws(JSONScanError) in try s.literal("true") }.failureMessage == "invalid JSON at byte 0: truncated literal")
        #expect(scan(Array("trUe".utf8)) { s throws(JSONScanError) in try s.literal("true") }.failureMessage == "invalid JSON at byte 0: invalid literal")
        #expect(scan(Array(" \t\r\n: x".utf8)) { s throws(JSONScanError) in try s.expect(UInt8(ascii: ":"), "colon"); return s.pos }.success == 5)
        #expect(scan(Array("  ;".utf8)) { s throws(JSONScanError) in try s.expect(UInt8(ascii: ":"), "colon") }.failureMessage == "invalid JSON at byte 2: colon")
        #expect(scan(Array("  ".utf8)) { s throws(JSONScanError) in try s.expect(UInt8(ascii: ":"), "colon") }.failureMessage == "unexpected end of JSON (colon)")
    }
}

extension Result {
    var success: Success? { if case .success(let v) = self { v } else { nil } }
    var failureMessage: String? { if case .failure(let e as JSONScanError) = self { e.message } else { nil } }
}

/// iso8601UTC's arithmetic against gmtime_r (iso8601UTCGeneral) on the dates that break date
/// code (epoch, leap days, century years, the ends of the 4-digit years, negative times) and on
/// 200,000 seeded random times across years 0000-9999.
@Suite struct ISO8601Tests {
    @Test func knownTexts() {
        #expect(iso8601UTC(millis: 0) == "1970-01-01T00:00:00.000Z")
        #expect(iso8601UTC(millis: 1_764_483_000_123) == "2025-11-30T06:10:00.123Z")
        #expect(iso8601UTC(millis: 951_782_400_000) == "2000-02-29T00:00:00.000Z")
        #expect(iso8601UTC(millis: -1) == "1969-12-31T23:59:59.999Z")
        #expect(iso8601UTC(millis: 253_402_300_799_999) == "9999-12-31T23:59:59.999Z")
        #expect(iso8601UTC(millis: -62_167_219_200_000) == "0000-01-01T00:00:00.000Z")
    }

    @Test func agreesWithGmtime() {
        let edges: [Int64] = [0, 1, -1, 999, -999, 1000, -1000, -1001, 86_399_999, 86_400_000, 951_782_399_999, 951_782_400_000,
                              4_107_542_399_999, 4_107_542_400_000, 253_402_300_799_999, 253_402_300_800_000,
                              -62_167_219_200_000, -62_167_219_200_001, .max / 2_000_000, -2_208_988_800_000]
        for m in edges { #expect(iso8601UTC(millis: m) == iso8601UTCGeneral(millis: m), "\(m)") }
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        var mismatches = 0
        for _ in 0..<200_000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let m = Int64(state >> 16) % 315_569_520_000_000 - 62_167_219_200_000   // years 0000 to 9999
            if iso8601UTC(millis: m) != iso8601UTCGeneral(millis: m) { mismatches += 1 }
        }
        #expect(mismatches == 0)
    }
}
