import Foundation
import Testing
@testable import MockAPNs

@Suite struct PayloadJSONTests {
    static let valid = [
        "{}", #"{"a":1}"#, #" {"a":[1,2,{"b":null}],"c":true,"d":false} "#, "[]", #""x""#, "-0.5e+3", "0", "1E9",
        #"{"aps":{"alert":"hi","badge":3}}"#, "\n\t{\"k\" : \"v\"}\r\n", #"{"a":"\"\\\/\b\f\n\r\t"}"#,
    ]
    static let invalid = [
        "", " ", "{", #"{"a":}"#, #"{"a":1,}"#, "[1,]", "01", "1.", ".5", "-", "1e", #"{"a" 1}"#, "tru", "nul",
        #"{"a":1} x"#, #""\q""#, #""\u12G4""#, #"{a:1}"#, "'x'", #""abc"#, "{\"a\":\"x\u{01}\"}", "[1 2]",
        String(repeating: "[", count: 100) + String(repeating: "]", count: 100),
    ]

    @Test(arguments: valid)
    func acceptsWhatJSONSerializationAccepts(_ text: String) {
        #expect(PayloadJSON.parse(Array(text.utf8)) != nil, "\(text)")
        #expect((try? JSONSerialization.jsonObject(with: Data(text.utf8), options: .fragmentsAllowed)) != nil, "\(text)")
    }

    @Test(arguments: invalid)
    func refusesMalformed(_ text: String) {
        #expect(PayloadJSON.parse(Array(text.utf8)) == nil, "\(text)")
    }

    @Test func decodesStringsAndKeepsMembersInOrder() {
        let parsed = PayloadJSON.parse(Array(#"{"b":"\u00e9\ud83d\ude00\n","a":{"x":[]},"b":"last"}"#.utf8))
        #expect(parsed?.objectKeys == ["b", "a", "b"])
        #expect(parsed?["b"]?.stringValue == "last")  // a repeated key: the last wins, as in JSONSerialization
        if case .object(let members) = parsed { #expect(members.first?.value.stringValue == "é😀\n") } else { Issue.record("not an object") }
        #expect(parsed?["a"]?["x"] == .array([]))
        // Lone surrogates and invalid UTF-8 are refused.
        #expect(PayloadJSON.parse(Array(#""\ud800""#.utf8)) == nil)
        #expect(PayloadJSON.parse(Array(#""\udc00\ud800""#.utf8)) == nil)
        #expect(PayloadJSON.parse([0x22, 0xFF, 0x22]) == nil)
        #expect(PayloadJSON.parse([0x22, 0xC3, 0xA9, 0x22]) == .string("é"))
    }
}
