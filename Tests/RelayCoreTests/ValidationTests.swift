import Basics
import Foundation
import Testing
import TestSupport
@testable import RelayCore

private let goodToken = String(repeating: "ab", count: 32)
private let goodSession = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
private let goodKeyID = "AQIDBA=="  // 01 02 03 04
private let sealed28 = Data(repeating: 7, count: 40).base64EncodedString()

private func body(_ overrides: [String: String?] = [:], extra: String = "") -> [UInt8] {
    var fields: [(String, String)] = [
        ("pushToken", "\"\(goodToken)\""),
        ("sessionIdentifier", "\"\(goodSession)\""),
        ("keyID", "\"\(goodKeyID)\""),
        ("messageIndex", "7"),
        ("encryptedData", "\"\(sealed28)\""),
    ]
    for (k, v) in overrides {
        if let i = fields.firstIndex(where: { $0.0 == k }) {
            if let v { fields[i].1 = v } else { fields.remove(at: i) }
        } else if let v { fields.append((k, v)) }
    }
    let inner = fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",")
    return Array("{\(inner)\(extra)}".utf8)
}

@Test func validBodyIsCanonicalised() throws {
    let r = try IngestValidation.validate(contentType: "application/json; charset=utf-8",
                                          body: body(["pushToken": "\"ABCDEF\"", "sessionIdentifier": "\"\(goodSession.lowercased())\""])).get()
    #expect(r.pushToken == "abcdef")
    #expect(r.sessionIdentifier == goodSession)
    #expect(r.keyID == [1, 2, 3, 4])
    #expect(r.messageIndex == 7)
    #expect(r.encryptedData == [UInt8](repeating: 7, count: 40))
    #expect(r.app == nil)
}

@Test func messageIndexAsStringAndBounds() throws {
    #expect(try IngestValidation.validate(contentType: "application/json", body: body(["messageIndex": "\"4294967295\""])).get().messageIndex == UInt32.max)
    #expect(try IngestValidation.validate(contentType: "application/json", body: body(["messageIndex": "0"])).get().messageIndex == 0)
}

@Test func appIsPassedThrough() throws {
    let r = try IngestValidation.validate(contentType: "application/json", body: body(["app": "\"com.example.app\""])).get()
    #expect(r.app == "com.example.app")
}

struct Case: Sendable, CustomStringConvertible {
    var name: String
    var contentType: String?
    var body: [UInt8]
    var status: Int
    var code: String
    var field: String
    var description: String { name }
}

private let longData = Data(repeating: 1, count: 3100).base64EncodedString()

private let cases: [Case] = [
    Case(name: "no content type", contentType: nil, body: body(), status: 415, code: "unsupported_media_type", field: "content-type"),
    Case(name: "text/plain", contentType: "text/plain", body: body(), status: 415, code: "unsupported_media_type", field: "content-type"),
    Case(name: "latin1 charset", contentType: "application/json; charset=latin1", body: body(), status: 415, code: "unsupported_media_type", field: "content-type"),
    Case(name: "too large", contentType: "application/json", body: [UInt8](repeating: 0x20, count: 16385), status: 413, code: "body_too_large", field: "body"),
    Case(name: "empty", contentType: "application/json", body: [], status: 400, code: "invalid_json", field: "body"),
    Case(name: "array", contentType: "application/json", body: Array("[1]".utf8), status: 400, code: "invalid_json", field: "body"),
    Case(name: "truncated", contentType: "application/json", body: Array(body().dropLast()), status: 400, code: "invalid_json", field: "body"),
    Case(name: "trailing garbage", contentType: "application/json", body: body() + Array("x".utf8), status: 400, code: "invalid_json", field: "body"),
    Case(name: "trailing comma", contentType: "application/json", body: body(extra: ","), status: 400, code: "invalid_json", field: "body"),
    Case(name: "invalid utf8", contentType: "application/json", body: body(["app": "\"a\u{FFFD}\""]).map { $0 == 0xEF ? 0xC0 : $0 }, status: 400, code: "invalid_json", field: "body"),
    Case(name: "overlong utf8", contentType: "application/json", body: Array("{\"app\":\"".utf8) + [0xC0, 0xAF] + Array("\"}".utf8), status: 400, code: "invalid_json", field: "body"),
    Case(name: "lone surrogate escape", contentType: "application/json", body: Array(#"{"app":"\ud800"}"#.utf8), status: 400, code: "invalid_json", field: "body"),
    Case(name: "control char", contentType: "application/json", body: Array("{\"app\":\"a\u{01}\"}".utf8), status: 400, code: "invalid_json", field: "body"),
    Case(name: "deep nesting", contentType: "application/json", body: Array(("{\"x\":" + String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000) + "}").utf8), status: 400, code: "invalid_json", field: "body"),
    Case(name: "leading zero", contentType: "application/json", body: body(["messageIndex": "07"]), status: 400, code: "invalid_json", field: "body"),
    Case(name: "unknown field", contentType: "application/json", body: body(["colour": "\"red\""]), status: 400, code: "unknown_field", field: "colour"),
    Case(name: "duplicate field", contentType: "application/json", body: body(extra: ",\"keyID\":\"AQIDBA==\""), status: 400, code: "duplicate_field", field: "keyID"),
    Case(name: "missing pushToken", contentType: "application/json", body: body(["pushToken": nil]), status: 400, code: "missing_field", field: "pushToken"),
    Case(name: "missing session", contentType: "application/json", body: body(["sessionIdentifier": nil]), status: 400, code: "missing_field", field: "sessionIdentifier"),
    Case(name: "missing keyID", contentType: "application/json", body: body(["keyID": nil]), status: 400, code: "missing_field", field: "keyID"),
    Case(name: "missing index", contentType: "application/json", body: body(["messageIndex": nil]), status: 400, code: "missing_field", field: "messageIndex"),
    Case(name: "missing data", contentType: "application/json", body: body(["encryptedData": nil]), status: 400, code: "missing_field", field: "encryptedData"),
    Case(name: "odd token", contentType: "application/json", body: body(["pushToken": "\"abc\""]), status: 400, code: "invalid_push_token", field: "pushToken"),
    Case(name: "non-hex token", contentType: "application/json", body: body(["pushToken": "\"zz\""]), status: 400, code: "invalid_push_token", field: "pushToken"),
    Case(name: "empty token", contentType: "application/json", body: body(["pushToken": "\"\""]), status: 400, code: "invalid_push_token", field: "pushToken"),
    Case(name: "numeric token", contentType: "application/json", body: body(["pushToken": "12"]), status: 400, code: "invalid_push_token", field: "pushToken"),
    Case(name: "bad uuid", contentType: "application/json", body: body(["sessionIdentifier": "\"not-a-uuid\""]), status: 400, code: "invalid_session_identifier", field: "sessionIdentifier"),
    Case(name: "keyID 3 bytes", contentType: "application/json", body: body(["keyID": "\"AQID\""]), status: 400, code: "invalid_key_id", field: "keyID"),
    Case(name: "keyID not base64", contentType: "application/json", body: body(["keyID": "\"!!!!!!==\""]), status: 400, code: "invalid_key_id", field: "keyID"),
    Case(name: "keyID unpadded", contentType: "application/json", body: body(["keyID": "\"AQIDBA\""]), status: 400, code: "invalid_key_id", field: "keyID"),
    Case(name: "index negative", contentType: "application/json", body: body(["messageIndex": "-1"]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "index too big", contentType: "application/json", body: body(["messageIndex": "4294967296"]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "index fraction", contentType: "application/json", body: body(["messageIndex": "1.5"]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "index exponent", contentType: "application/json", body: body(["messageIndex": "1e3"]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "index string junk", contentType: "application/json", body: body(["messageIndex": "\"12a\""]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "index bool", contentType: "application/json", body: body(["messageIndex": "true"]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "data short", contentType: "application/json", body: body(["encryptedData": "\"\(Data(count: 27).base64EncodedString())\""]), status: 400, code: "invalid_encrypted_data", field: "encryptedData"),
    Case(name: "data not base64", contentType: "application/json", body: body(["encryptedData": "\"@@@@\""]), status: 400, code: "invalid_encrypted_data", field: "encryptedData"),
    Case(name: "data object", contentType: "application/json", body: body(["encryptedData": "{}"]), status: 400, code: "invalid_encrypted_data", field: "encryptedData"),
    Case(name: "payload too large", contentType: "application/json", body: body(["encryptedData": "\"\(longData)\""]), status: 400, code: "payload_too_large", field: "encryptedData"),
    Case(name: "app empty", contentType: "application/json", body: body(["app": "\"\""]), status: 400, code: "invalid_app", field: "app"),
    Case(name: "app number", contentType: "application/json", body: body(["app": "1"]), status: 400, code: "invalid_app", field: "app"),
    Case(name: "app 256 bytes", contentType: "application/json", body: body(["app": "\"\(String(repeating: "a", count: 256))\""]), status: 400, code: "invalid_app", field: "app"),
    // docs/api.md's limits and order of checks, case by case.
    Case(name: "index string 11 characters", contentType: "application/json", body: body(["messageIndex": "\"00000000007\""]), status: 400, code: "invalid_message_index", field: "messageIndex"),
    Case(name: "surrogate in an unknown key", contentType: "application/json", body: body(extra: #","\ud800x":1"#), status: 400, code: "invalid_json", field: "body"),
    Case(name: "lone low surrogate in pushToken", contentType: "application/json", body: body(["pushToken": #""\udc00""#]), status: 400, code: "invalid_json", field: "body"),
    Case(name: "surrogate beats a bad field", contentType: "application/json", body: body(["keyID": "1", "app": #""\ud83d""#]), status: 400, code: "invalid_json", field: "body"),
    Case(name: "unknown member beats bad fields", contentType: "application/json", body: body(["pushToken": "1", "zz": "1"]), status: 400, code: "unknown_field", field: "zz"),
    Case(name: "first offending member wins", contentType: "application/json", body: body(extra: #","zz":1,"pushToken":"ab""#), status: 400, code: "unknown_field", field: "zz"),
    Case(name: "pushToken before keyID", contentType: "application/json", body: body(["keyID": "1", "pushToken": "1"]), status: 400, code: "invalid_push_token", field: "pushToken"),
    Case(name: "keyID before a missing messageIndex", contentType: "application/json", body: body(["keyID": "1", "messageIndex": nil]), status: 400, code: "invalid_key_id", field: "keyID"),
    Case(name: "encryptedData before app", contentType: "application/json", body: body(["encryptedData": "1", "app": "1"]), status: 400, code: "invalid_encrypted_data", field: "encryptedData"),
    Case(name: "content type before size", contentType: "text/plain", body: [UInt8](repeating: 0x20, count: 16385), status: 415, code: "unsupported_media_type", field: "content-type"),
    Case(name: "size before JSON", contentType: "application/json", body: [UInt8](repeating: 0x7B, count: 16385), status: 413, code: "body_too_large", field: "body"),
]

@Test(arguments: cases)
func invalidBodiesAreRefusedNamingTheField(_ c: Case) {
    switch IngestValidation.validate(contentType: c.contentType, body: c.body) {
    case .success: Issue.record("\(c.name) was accepted")
    case .failure(let e):
        #expect(e.status == c.status, "\(c.name)")
        #expect(e.code == c.code, "\(c.name): \(e.message)")
        #expect(e.field == c.field, "\(c.name)")
        #expect(!e.message.isEmpty)
        // The error body is JSON naming the code and field.
        let obj = try? JSONSerialization.jsonObject(with: Data(e.jsonBody.utf8)) as? [String: String]
        #expect(obj?["error"] == c.code)
        #expect(obj?["field"] == c.field)
    }
}

@Test func payloadLimitMatchesPushClientBodyAtTheBoundary() throws {
    // Largest ciphertext whose APNs body is exactly 4096 bytes is accepted, one more byte is not.
    var n = 28
    while IngestValidation.apnsPayloadLength(encryptedBytes: n + 1, messageIndex: 7) <= 4096 { n += 1 }
    let ok = Data(repeating: 9, count: n).base64EncodedString()
    let tooBig = Data(repeating: 9, count: n + 3).base64EncodedString()
    #expect((try? IngestValidation.validate(contentType: "application/json", body: body(["encryptedData": "\"\(ok)\""])).get()) != nil)
    if case .failure(let e) = IngestValidation.validate(contentType: "application/json", body: body(["encryptedData": "\"\(tooBig)\""])) {
        #expect(e.code == "payload_too_large")
    } else { Issue.record("oversized payload accepted") }
    // The formula equals the literal body length.
    let literal = #"{"aps":{"encryptedData":"\#(ok)","sessionIdentifier":"\#(goodSession)","keyID":"AQIDBA==","messageIndex":"7"}}"#
    #expect(literal.utf8.count == IngestValidation.apnsPayloadLength(encryptedBytes: n, messageIndex: 7))
}

@Test func jsonReaderHandlesEscapesAndUnicode() throws {
    let m = try JSONReader.readObject(Array(#"{"a":"x\"\\\/\n\u00e9\ud83d\ude00","b":null,"c":[{"d":1}],"e":-0.5e+3}"#.utf8))
    #expect(m.count == 4)
    #expect(m[0].1 == .string("x\"\\/\n\u{e9}\u{1F600}"))
    #expect(m[1].1 == .null)
    #expect(m[2].1 == .nested)
    #expect(m[3].1 == .number("-0.5e+3"))
}

@Test func base64IsStrict() {
    #expect(Base64.decode("AQIDBA==") == [1, 2, 3, 4])
    #expect(Base64.decode("AQIDBAU=") == [1, 2, 3, 4, 5])
    #expect(Base64.decode("AQIDBAUG") == [1, 2, 3, 4, 5, 6])
    #expect(Base64.decode("AQ=DBA==") == nil)
    #expect(Base64.decode("AQIDBA=") == nil)
    #expect(Base64.decode("AQID BA=") == nil)
}

@Test func uuidTextRoundTripsAndRejectsMalformed() throws {
    let u = UUID()
    let bytes = try #require(UUIDText.parse(u.uuidString))
    #expect(UUIDText.format(bytes, uppercase: true) == u.uuidString)
    #expect(UUIDText.format(bytes) == u.uuidString.lowercased())
    #expect(UUIDText.parse(u.uuidString.lowercased()) == bytes)
    for bad in ["", "6F9619FF8B86D011B42D00C04FC964FF", "6F9619FF-8B86-D011-B42D-00C04FC964F", "6F9619FF-8B86-D011-B42D-00C04FC964FFF",
                "6F9619FF-8B86-D011-B42D_00C04FC964FF", "6F9619FG-8B86-D011-B42D-00C04FC964FF", "6F9619F-F8B86-D011-B42D-00C04FC964FF",
                "6F9619FF-8B86-D011-B42D-00C04FC964é",   // 36 bytes, the last character two of them
                "-F9619FF-8B86-D011-B42D-00C04FC964FF", "6F9619FF-8B86-D011-B42D-00C04FC964F-"] {
        #expect(UUIDText.parse(bad) == nil, "\(bad)")
    }
    let v4 = RelayCrypto.uuidV4()
    let b = try #require(UUIDText.parse(v4))
    #expect(v4 == v4.lowercased() && b[6] >> 4 == 4 && b[8] >> 6 == 2)
}

@Test func bufferedIDBytesAreNeverHandedOutTwice() throws {
    // 700 UUIDs draw 11,200 bytes: the 4 KiB pool is refilled twice along the way.
    var seen = Set<String>()
    for _ in 0..<700 {
        let v4 = RelayCrypto.uuidV4()
        let b = try #require(UUIDText.parse(v4))
        #expect(b[6] >> 4 == 4 && b[8] >> 6 == 2)
        seen.insert(v4)
    }
    #expect(seen.count == 700)
    let ids = (0..<600).map { _ in RelayCrypto.idBytes(8) }
    #expect(Set(ids).count == 600 && ids.allSatisfy { $0.count == 8 })
}

@Test func everyKnownFieldHasItsOwnSlot() {
    let slots = IngestValidation.fields.compactMap(IngestValidation.fieldSlot)
    #expect(slots.count == IngestValidation.fields.count && Set(slots).count == slots.count)
    #expect(IngestValidation.fieldSlot("pushtoken") == nil && IngestValidation.fieldSlot("") == nil)
}

@Test func asciiHelpers() {
    #expect(ASCII.trim(" \tapplication/json \t"[...]) == "application/json")
    #expect(ASCII.trim("   "[...]) == "")
    #expect(ASCII.lowercased("AbC-é") == "abc-é")
    #expect(ASCII.uppercased("abc-1") == "ABC-1")
}

/// The one-pass fast path must never accept what the general path refuses, and must return
/// exactly the general path's result when it accepts; for the body shape accessories send it
/// must actually be taken.
@Suite struct FastValidationTests {
    static let token = String(repeating: "ab", count: 32)
    static let session = "6f9619ff-8b86-d011-b42d-00c04fc964ff"
    static let data = Data(repeating: 7, count: 40).base64EncodedString()

    static func object(_ members: [(String, String)], separator: String = ",") -> String {
        "{" + members.map { "\"\($0.0)\":\($0.1)" }.joined(separator: separator) + "}"
    }

    static let good: [(String, String)] = [("pushToken", "\"\(token)\""), ("sessionIdentifier", "\"\(session)\""), ("keyID", "\"AQIDBA==\""),
                                           ("messageIndex", "7"), ("encryptedData", "\"\(data)\"")]

    static func replacing(_ name: String, with value: String?) -> [(String, String)] {
        var m = good.filter { $0.0 != name }
        if let value { m.append((name, value)) }
        return m
    }

    /// Bodies the fast path must take (and agree on).
    static var common: [String] {
        [object(good), object(good.reversed()), object(good, separator: " ,\n\t"), " \r\n" + object(good) + "\n ",
         object(replacing("messageIndex", with: "\"7\"")), object(replacing("messageIndex", with: "0")),
         object(replacing("messageIndex", with: "4294967295")), object(replacing("messageIndex", with: "\"0042\"")),
         object(replacing("pushToken", with: "\"" + String(repeating: "AB", count: 32) + "\"")),
         object(replacing("sessionIdentifier", with: "\"" + session.uppercased() + "\"")),
         object(good + [("app", "\"com.example.app\"")]), object(replacing("pushToken", with: "\"0a\""))]
    }

    /// Bodies with something unusual or wrong: the fast path may only decline or agree.
    static var unusual: [String] {
        var out: [String] = []
        for f in ["pushToken", "sessionIdentifier", "keyID", "messageIndex", "encryptedData"] {
            out.append(object(replacing(f, with: nil)))                 // missing
            out.append(object(replacing(f, with: "null")))
            out.append(object(replacing(f, with: "true")))
            out.append(object(replacing(f, with: "{\"a\":1}")))
            out.append(object(replacing(f, with: "[1]")))
            out.append(object(replacing(f, with: "\"\"")))
            out.append(object(replacing(f, with: "12")))
            out.append(object(good + [(f, "\"x\"")]))                    // duplicate
        }
        for v in ["01", "-1", "1.0", "1e3", "4294967296", "\"4294967296\"", "\"12345678901\"", "\"1 \"", "\"-1\"", "\"\\u0031\"", "1,"] {
            out.append(object(replacing("messageIndex", with: v)))
        }
        for v in ["\"abc\"", "\"zz\"", "\"" + String(repeating: "ab", count: 101) + "\"", "\"\\u0061b\"", "\"ab\u{7f}\"", "\"é\""] {
            out.append(object(replacing("pushToken", with: v)))
        }
        for v in ["\"6f9619ff8b86d011b42d00c04fc964ff\"", "\"6f9619ff-8b86-d011-b42d-00c04fc964fz\"", "\"{6f9619ff-8b86-d011-b42d-00c04fc964ff}\""] {
            out.append(object(replacing("sessionIdentifier", with: v)))
        }
        for v in ["\"AQID\"", "\"AQIDBAU=\"", "\"AQIDBA\"", "\"AQID BA==\"", "\"AQIDBA=\""] {
            out.append(object(replacing("keyID", with: v)))
        }
        let big = Data(repeating: 1, count: 3000).base64EncodedString()
        for v in ["\"" + Data(repeating: 1, count: 27).base64EncodedString() + "\"", "\"" + Data(repeating: 1, count: 28).base64EncodedString() + "\"",
                  "\"\(big)\"", "\"AAAA*AAA\"", "\"" + data.replacingOccurrences(of: "=", with: "") + "\""] {
            out.append(object(replacing("encryptedData", with: v)))
        }
        for v in ["\"\"", "\"" + String(repeating: "a", count: 256) + "\"", "\"" + String(repeating: "a", count: 255) + "\"", "\"caf\\u00e9\"", "\"café\"", "7"] {
            out.append(object(good + [("app", v)]))
        }
        out += [object(good + [("extra", "1")]), object(good) + "x", object(good) + ",", "{" + object(good).dropFirst().dropLast() + ",}",
                "{}", "[]", "", "  ", "{\"pushT\\u006fken\":\"ab\"}", object(good).replacingOccurrences(of: ":", with: " : "),
                String(object(good).dropLast())]
        return out
    }

    func check(_ text: String) -> (fast: NewResponse?, full: Result<NewResponse, ClientError>) {
        let bytes = Array(text.utf8)
        let limits = IngestLimits()
        return (bytes.withUnsafeBufferPointer { IngestValidation.fastValidate($0, limits: limits) },
                IngestValidation.validateInFull(body: bytes, limits: limits))
    }

    @Test func theFastPathTakesTheCommonShapeAndAgrees() {
        for text in Self.common {
            let (fast, full) = check(text)
            #expect(fast != nil, "fast path declined: \(text)")
            if let fast { #expect(full == .success(fast), "paths disagree on: \(text)") }
        }
    }

    @Test func theFastPathNeverAcceptsWhatTheGeneralPathRefuses() {
        var declined = 0
        for text in Self.unusual {
            let (fast, full) = check(text)
            if let fast { #expect(full == .success(fast), "paths disagree on: \(text)") } else { declined += 1 }
        }
        // Most of these are errors; the general path must have been left to name them.
        #expect(declined > Self.unusual.count / 2)
    }
}

/// The fast path delimits strings with memchr and leaves backslashes to each field's check; these
/// bodies put escapes and stray bytes exactly where that could go wrong, then random mutations of
/// a good body check the same property broadly (seeded: the same bodies every run).
@Suite struct FastValidationMutationTests {
    func agree(_ bytes: [UInt8]) -> Bool {
        let limits = IngestLimits()
        let fast = bytes.withUnsafeBufferPointer { IngestValidation.fastValidate($0, limits: limits) }
        guard let fast else { return true }
        return IngestValidation.validateInFull(body: bytes, limits: limits) == .success(fast)
    }

    @Test func escapesNeverSlipThroughTheFastPath() {
        let o: ([(String, String)]) -> String = { FastValidationTests.object($0) }
        let g = FastValidationTests.good
        let bodies: [String] = [
            o(g + [("app", #""com.example\"x""#)]),
            o(g + [("app", #""com.example\\""#)]),
            o(g + [("app", #""a\u0062""#)]),
            o(g + [("app", "\"a\u{7f}b\"")]),
            o(g + [("app", "\"a\u{1f}b\"")]),
            o(FastValidationTests.replacing("pushToken", with: #""ab\"cd""#)),
            o(FastValidationTests.replacing("keyID", with: #""AQID\"A==""#)),
            o(FastValidationTests.replacing("encryptedData", with: #""\/AAA""#)),
            o(FastValidationTests.replacing("messageIndex", with: #""1\"2""#)),
            #"{"push\"Token":"ab"}"#,
            #"{"app":"x\",\"pushToken\":\"ab\"}"#,
        ]
        for text in bodies {
            #expect(agree(Array(text.utf8)), "paths disagree on: \(text)")
        }
        // The first body is valid JSON with an escaped quote in app: the general path takes it.
        let first = Array(bodies[0].utf8)
        #expect(first.withUnsafeBufferPointer { IngestValidation.fastValidate($0, limits: IngestLimits()) } == nil)
        #expect((try? IngestValidation.validateInFull(body: first, limits: IngestLimits()).get())?.app == "com.example\"x")
    }

    @Test func randomMutationsOfAGoodBodyNeverMakeThePathsDisagree() {
        var rng = SeededGenerator(seed: 0x5eed)
        let base = Array(FastValidationTests.object(FastValidationTests.good + [("app", "\"com.example.app\"")]).utf8)
        let interesting: [UInt8] = Array(#"\"{}[],:0123456789aAfFzZ-=+/ "#.utf8) + [0, 0x09, 0x0A, 0x0D, 0x7F, 0x80, 0xC3, 0xFF]
        var taken = 0
        for _ in 0..<4000 {
            var b = base
            for _ in 0..<Int(rng.next() % 3 + 1) {
                let pos = Int(rng.next() % UInt64(b.count))
                switch rng.next() % 3 {
                case 0: b[pos] = interesting[Int(rng.next() % UInt64(interesting.count))]
                case 1: b.insert(interesting[Int(rng.next() % UInt64(interesting.count))], at: pos)
                default: b.remove(at: pos)
                }
            }
            let fast = b.withUnsafeBufferPointer { IngestValidation.fastValidate($0, limits: IngestLimits()) }
            if fast != nil { taken += 1 }
            #expect(agree(b), "paths disagree on: \(String(decoding: b, as: UTF8.self))")
        }
        // Some mutations stay valid (a hex digit for another, whitespace): the fast path took them.
        #expect(taken > 0)
    }

    @Test func uppercaseUUIDMatchesParseThenFormat() {
        var rng = SeededGenerator(seed: 7)
        let alphabet = Array("0123456789abcdefABCDEF-gG{} ".utf8)
        var samples = ["6f9619ff-8b86-d011-b42d-00c04fc964ff", "6F9619FF-8B86-D011-B42D-00C04FC964FF", "6f9619ff8b86-d011-b42d-00c04fc964ff-",
                       "", "6f9619ff-8b86-d011-b42d-00c04fc964f", "6f9619ff-8b86-d011-b42d-00c04fc964fff"]
        for _ in 0..<2000 {
            var s = Array("6f9619ff-8b86-d011-b42d-00c04fc964ff".utf8)
            s[Int(rng.next() % 36)] = alphabet[Int(rng.next() % UInt64(alphabet.count))]
            samples.append(String(decoding: s, as: UTF8.self))
        }
        for s in samples {
            let expected = UUIDText.parse(s).map { UUIDText.format($0, uppercase: true) }
            let got = Array(s.utf8).withUnsafeBufferPointer { UUIDText.canonicalUppercase($0) }
            #expect(got == expected, "\(s)")
        }
    }
}

/// The ingest's base64 (Basics.Base64 with unused trailing bits ignored) against a reference
/// decoder of the same rules: padding only at the end, no whitespace, length a multiple of 4.
@Suite struct Base64Tests {
    static func reference(_ s: [UInt8]) -> [UInt8]? {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        guard s.count % 4 == 0 else { return nil }
        var pad = 0
        if s.count >= 1, s[s.count - 1] == 0x3D { pad += 1 }
        if s.count >= 2, s[s.count - 2] == 0x3D { pad += 1 }
        var out: [UInt8] = []
        var i = 0
        while i < s.count {
            let last = i + 4 == s.count
            var v: UInt32 = 0
            for j in 0..<4 {
                if s[i + j] == 0x3D {
                    guard last && j >= 4 - pad else { return nil }
                    v <<= 6
                    continue
                }
                guard let d = alphabet.firstIndex(of: s[i + j]) else { return nil }
                v = v << 6 | UInt32(d)
            }
            out.append(UInt8(v >> 16 & 0xFF))
            if !(last && pad == 2) { out.append(UInt8(v >> 8 & 0xFF)) }
            if !(last && pad >= 1) { out.append(UInt8(v & 0xFF)) }
            i += 4
        }
        return out
    }

    @Test func decodeAgreesWithTheReference() {
        var rng = SeededGenerator(seed: 42)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        let odd = Array("= -_.\n*".utf8) + [0, 0x80, 0xFF]
        var samples: [[UInt8]] = ["", "AQIDBA==", "AQIDBA=", "AQID", "AQ==", "AQI=", "A===", "====", "AA=A", "=AAA", "AQ=="+"AQ==", "////", "++++"]
            .map { Array($0.utf8) }
        for _ in 0..<5000 {
            let count = Int(rng.next() % 17)
            var s = (0..<count).map { _ in alphabet[Int(rng.next() % 64)] }
            if !s.isEmpty, rng.next() % 2 == 0 { s[s.count - 1] = 0x3D }
            if s.count > 1, rng.next() % 3 == 0 { s[s.count - 2] = 0x3D }
            if !s.isEmpty, rng.next() % 4 == 0 { s[Int(rng.next() % UInt64(s.count))] = odd[Int(rng.next() % UInt64(odd.count))] }
            samples.append(s)
        }
        var decoded = 0
        for s in samples {
            let got = s.withUnsafeBufferPointer { Base64.decode($0, trailingBits: .ignored) }
            #expect(got == Self.reference(s), "\(String(decoding: s, as: UTF8.self))")
            if got != nil { decoded += 1 }
        }
        #expect(decoded > 1000)
        #expect(Base64.decode("AQIDBA==") == [1, 2, 3, 4])
    }
}

/// Content-Type as an RFC 9110 8.3.1 media type: case-insensitive type and charset, any other
/// parameters (token or quoted-string values), OWS around ";" only; charset other than utf-8
/// (or given twice) is 415 with its own message; a comma-joined pair of fields is no media type.
@Test(arguments: [
    ("application/json", nil), ("Application/JSON", nil), ("application/json; charset=utf-8", nil),
    ("application/json;charset=UTF-8", nil), ("application/json ; charset=\"utf-8\"", nil), ("application/json; foo=bar", nil),
    ("application/json; foo=bar; charset=utf-8", nil), ("application/json; foo=\"a;b,c\\\"d\"", nil), ("application/json;", nil),
    ("application/json;;foo=bar", nil), ("application/json\t;\tCharSet=Utf-8", nil), (" application/json ", nil),
    ("application/json; charset=latin1", "only charset=utf-8 is accepted"),
    ("application/json; charset=\"utf-16\"", "only charset=utf-8 is accepted"),
    ("application/json; charset=utf-8; charset=utf-8", "only charset=utf-8 is accepted"),
    ("application/json; charset=utf8", "only charset=utf-8 is accepted"),
    ("text/plain", "Content-Type must be application/json"), ("application/jsonx", "Content-Type must be application/json"),
    ("application/problem+json", "Content-Type must be application/json"), ("text/plain; charset=utf-8", "Content-Type must be application/json"),
    ("application/json, text/plain", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application/json, application/json", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application/json; charset = utf-8", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application/json; foo", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application/json; foo=\"open", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application/json; foo=", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application /json", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("application/", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
    ("", "Content-Type must be one media type (RFC 9110 8.3.1), application/json"),
] as [(String, String?)])
func contentTypeIsAMediaType(_ value: String, _ refusal: String?) {
    let e = IngestValidation.checkContentType(value)
    #expect(e?.message == refusal, "\(value)")
    if let e { #expect(e.status == 415 && e.code == "unsupported_media_type" && e.field == "content-type") }
}
