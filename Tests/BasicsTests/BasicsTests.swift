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
        #expect(FileDescriptor.writeAll(fds[1], "x") == EBADF)
    }
}
