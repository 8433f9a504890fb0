import HTTPServer
import Testing

// Feeds `input` in the given chunk sizes (the rest in one piece) and drains events after each
// append, as the server does. Stops at the first failure, after checking the parser stays failed.
func parseEvents(_ input: [UInt8], chunks: [Int] = [], limits: HTTP1Limits = HTTP1Limits()) -> [HTTP1Event] {
    var parser = HTTP1Parser(limits: limits)
    var events: [HTTP1Event] = []
    var offset = 0
    var sizes = chunks
    while offset < input.count {
        let size = sizes.isEmpty ? input.count - offset : min(max(sizes.removeFirst(), 0), input.count - offset)
        input[offset..<(offset + size)].withUnsafeBytes { parser.append($0) }
        offset += size
        while let event = parser.next() {
            events.append(event)
            if case .failure = event { return events }
        }
    }
    return events
}

func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

func requests(_ events: [HTTP1Event]) -> [HTTP1Request] {
    events.compactMap { if case .request(let r) = $0 { return r } else { return nil } }
}

func failure(_ events: [HTTP1Event]) -> HTTP1ParseError? {
    if case .failure(let error)? = events.last { return error }
    return nil
}

@Suite("HTTP/1.1 parser: malformed requests")
struct HTTP1ParserMalformedTests {
    @Test("refused with the expected status and kind", arguments: HTTP1MalformedCases.all)
    func malformed(_ testCase: HTTP1MalformedCase) throws {
        let events = parseEvents(testCase.bytes)
        let error = try #require(failure(events), "\(testCase.name): accepted or waiting, events \(events)")
        #expect(error.status == testCase.status)
        #expect(error.kind.rawValue == testCase.kind)
        #expect(requests(events).isEmpty, "a request was delivered before the failure")
    }

    @Test("same verdict when the case arrives one byte at a time", arguments: HTTP1MalformedCases.all)
    func malformedByteAtATime(_ testCase: HTTP1MalformedCase) throws {
        // Large cases (a 512 KiB body) go byte by byte over their first 20 KB only: debug builds
        // are slow, and the interesting boundaries are all in the first few KB.
        let chunks = Array(repeating: 1, count: min(testCase.bytes.count, 20_000)) + [testCase.bytes.count]
        let events = parseEvents(testCase.bytes, chunks: chunks)
        let error = try #require(failure(events))
        #expect(error.kind.rawValue == testCase.kind)
    }

    @Test func tableCoversEveryStatusAndIsUnique() {
        let statuses = Set(HTTP1MalformedCases.all.map(\.status))
        #expect(statuses == [400, 413, 414, 417, 431, 501, 505])
        let names = HTTP1MalformedCases.all.map(\.name)
        #expect(Set(names).count == names.count)
        // Every kind the parser can report is exercised by at least one case.
        let kinds = Set(HTTP1MalformedCases.all.map(\.kind))
        let missing = HTTP1ParseError.Kind.allCases.map(\.rawValue).filter { !kinds.contains($0) }
        #expect(missing.isEmpty, "kinds without a case: \(missing)")
    }

    @Test func staysFailedAndDropsLaterInput() {
        var parser = HTTP1Parser()
        parser.append(bytes("GET / HTTP/1.1\r\nHost : a\r\n\r\n"))
        guard case .failure(let first)? = parser.next() else {
            Issue.record("expected a failure")
            return
        }
        #expect(first.kind == .whitespaceBeforeColon)
        parser.append(bytes("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(parser.next() == .failure(first))
        #expect(parser.next() == .failure(first))
        #expect(parser.failure == first)
        #expect(parser.bufferedByteCount == 0)
    }

    @Test func requestsBeforeAFailureAreDelivered() {
        let input = bytes("GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\nX: \0\r\n\r\n")
        let events = parseEvents(input)
        #expect(requests(events).map(\.head.target) == ["/1"])
        #expect(failure(events)?.kind == .invalidHeaderValue)
    }
}

@Suite("HTTP/1.1 parser: valid requests")
struct HTTP1ParserValidTests {
    @Test func simpleGet() throws {
        let events = parseEvents(bytes("GET /a/b?c=d HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent:  wrk \t\r\nACCEPT: */*\r\n\r\n"))
        #expect(events.count == 2)
        guard case .head(let head)? = events.first else {
            Issue.record("no head")
            return
        }
        let request = try #require(requests(events).first)
        #expect(request.head == head)
        #expect(head.method == "GET")
        #expect(head.target == "/a/b?c=d")
        #expect(head.version == .http1_1)
        #expect(head.headers.map(\.name) == ["host", "user-agent", "accept"])
        #expect(head.headers.map(\.value) == ["example.com:8080", "wrk", "*/*"])
        #expect(head.firstValue("user-agent") == "wrk")
        #expect(head.keepAlive)
        #expect(!head.expectContinue)
        #expect(head.contentLength == nil)
        #expect(!head.chunked)
        #expect(request.body.isEmpty)
    }

    @Test func postWithContentLength() throws {
        let events = parseEvents(bytes("POST /ingest HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world"))
        let request = try #require(requests(events).first)
        #expect(request.head.contentLength == 11)
        #expect(request.body == bytes("hello world"))
    }

    @Test func contentLengthZeroAndLeadingZeros() throws {
        let zero = try #require(requests(parseEvents(bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"))).first)
        #expect(zero.head.contentLength == 0)
        #expect(zero.body.isEmpty)
        let padded = try #require(requests(parseEvents(bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 003\r\n\r\nabc"))).first)
        #expect(padded.head.contentLength == 3)
        #expect(padded.body == bytes("abc"))
    }

    @Test func valuesKeepInnerWhitespaceAndObsText() throws {
        var input = bytes("GET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nX-Inner: a \t b\r\nX-Utf8: ")
        input += Array("caf\u{e9}".utf8) + bytes("\r\n\r\n")
        let head = try #require(requests(parseEvents(input)).first).head
        #expect(head.firstValue("x-empty") == "")
        #expect(head.firstValue("x-inner") == "a \t b")
        #expect(head.firstValue("x-utf8") == "caf\u{e9}")
    }

    @Test func requestTargetForms() throws {
        let absolute = try #require(requests(parseEvents(bytes("GET http://a.example/x?y HTTP/1.1\r\nHost: a.example\r\n\r\n"))).first)
        #expect(absolute.head.target == "http://a.example/x?y")
        let asterisk = try #require(requests(parseEvents(bytes("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"))).first)
        #expect(asterisk.head.target == "*")
        let connect = try #require(requests(parseEvents(bytes("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n"))).first)
        #expect(connect.head.target == "a.example:443")
        let custom = try #require(requests(parseEvents(bytes("PURGE-ALL /%7Ex HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"))).first)
        #expect(custom.head.method == "PURGE-ALL")
        #expect(custom.head.target == "/%7Ex")
    }

    @Test func http10WithoutHost() throws {
        let head = try #require(requests(parseEvents(bytes("GET / HTTP/1.0\r\n\r\n"))).first).head
        #expect(head.version == .http1_0)
        #expect(head.headers.isEmpty)
        #expect(!head.keepAlive)
    }

    @Test func emptyHostIsAllowed() throws {
        // RFC 9112 3.2: a target without authority is sent with an empty Host.
        let head = try #require(requests(parseEvents(bytes("GET / HTTP/1.1\r\nHost:\r\n\r\n"))).first).head
        #expect(head.firstValue("host") == "")
    }

    @Test func leadingEmptyLinesAreIgnoredUpToTheBound() throws {
        let input = String(repeating: "\r\n", count: HTTP1Parser.maxLeadingEmptyLines) + "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        #expect(requests(parseEvents(bytes(input))).count == 1)
    }

    @Test func transferEncodingIsCaseInsensitiveAndTrimmed() throws {
        let input = bytes("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        let request = try #require(requests(parseEvents(input)).first)
        #expect(request.head.chunked)
        #expect(request.head.contentLength == nil)
        #expect(request.body == bytes("abc"))
    }
}

@Suite("HTTP/1.1 parser: keep-alive and Expect")
struct HTTP1ParserConnectionTests {
    @Test("keepAlive", arguments: [
        ("HTTP/1.1", "", true),
        ("HTTP/1.1", "Connection: close\r\n", false),
        ("HTTP/1.1", "Connection: CLOSE\r\n", false),
        ("HTTP/1.1", "Connection: keep-alive\r\n", true),
        ("HTTP/1.1", "Connection: upgrade, close\r\n", false),
        ("HTTP/1.1", "Connection: keep-alive\r\nConnection: close\r\n", false),
        ("HTTP/1.1", "Connection: closed\r\n", true),
        ("HTTP/1.0", "", false),
        ("HTTP/1.0", "Connection: keep-alive\r\n", true),
        ("HTTP/1.0", "Connection: Keep-Alive\r\n", true),
        ("HTTP/1.0", "Connection: keep-alive, close\r\n", false),
        ("HTTP/1.0", "Connection: close\r\n", false),
    ])
    func keepAlive(version: String, connection: String, expected: Bool) throws {
        let input = bytes("GET / \(version)\r\nHost: a\r\n\(connection)\r\n")
        let head = try #require(requests(parseEvents(input)).first).head
        #expect(head.keepAlive == expected)
    }

    @Test func expectContinueHeadArrivesBeforeTheBody() throws {
        var parser = HTTP1Parser()
        parser.append(bytes("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 4\r\n\r\n"))
        guard case .head(let head)? = parser.next() else {
            Issue.record("no head before the body")
            return
        }
        #expect(head.expectContinue)
        #expect(parser.next() == nil)
        #expect(parser.state == .body)
        parser.append(bytes("abcd"))
        guard case .request(let request)? = parser.next() else {
            Issue.record("no request")
            return
        }
        #expect(request.body == bytes("abcd"))
        #expect(parser.state == .idle)
    }

    @Test func expectContinueIsIgnoredOnHTTP10() throws {
        let input = bytes("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx")
        let head = try #require(requests(parseEvents(input)).first).head
        #expect(!head.expectContinue)
    }

    @Test func stateFollowsTheRequest() {
        var parser = HTTP1Parser()
        #expect(parser.state == .idle)
        parser.append(bytes("\r\n"))
        #expect(parser.next() == nil)
        #expect(parser.state == .head)
        parser.append(bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Len"))
        #expect(parser.next() == nil)
        #expect(parser.state == .head)
        parser.append(bytes("gth: 2\r\n\r\na"))
        guard case .head? = parser.next() else {
            Issue.record("no head")
            return
        }
        #expect(parser.next() == nil)
        #expect(parser.state == .body)
        parser.append(bytes("b"))
        guard case .request? = parser.next() else {
            Issue.record("no request")
            return
        }
        #expect(parser.state == .idle)
        #expect(parser.next() == nil)
    }
}

@Suite("HTTP/1.1 parser: pipelining and splits")
struct HTTP1ParserPipeliningTests {
    static let pipeline = bytes(
        "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n"
            + "POST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
            + "POST /3 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x=\"y\\\"z\"\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n"
            + "\r\nGET /4 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
            + "DELETE /5 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")

    @Test func eventsInOrder() {
        let events = parseEvents(Self.pipeline)
        #expect(events.count == 10)
        for (index, event) in events.enumerated() {
            switch event {
            case .head: #expect(index % 2 == 0)
            case .request: #expect(index % 2 == 1)
            case .failure(let error): Issue.record("unexpected \(error)")
            }
        }
        let all = requests(events)
        #expect(all.map(\.head.target) == ["/1", "/2", "/3", "/4", "/5"])
        #expect(all.map(\.body) == [[], bytes("hello"), bytes("abcde"), [], []])
        #expect(all.map(\.head.keepAlive) == [true, true, true, true, false])
        // Trailers are validated and dropped, never merged into the headers.
        #expect(all[2].head.firstValue("x-t") == nil)
    }

    @Test func byteAtATimeGivesTheSameEvents() {
        let whole = parseEvents(Self.pipeline)
        let split = parseEvents(Self.pipeline, chunks: Array(repeating: 1, count: Self.pipeline.count))
        #expect(split == whole)
    }

    @Test func everyTwoWaySplitGivesTheSameEvents() {
        let whole = parseEvents(Self.pipeline)
        for cut in 0...Self.pipeline.count {
            #expect(parseEvents(Self.pipeline, chunks: [cut]) == whole, "split at \(cut)")
        }
    }

    @Test func copiesOfAParserAreIndependent() throws {
        var first = HTTP1Parser()
        first.append(bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nab"))
        guard case .head? = first.next() else {
            Issue.record("no head")
            return
        }
        #expect(first.next() == nil)
        var second = first
        first.append(bytes("c"))
        second.append(bytes("d"))
        guard case .request(let a)? = first.next(), case .request(let b)? = second.next() else {
            Issue.record("missing requests")
            return
        }
        #expect(a.body == bytes("abc"))
        #expect(b.body == bytes("abd"))
    }

    @Test func aBurstGrowsTheBufferWhichIsFreedOnceDrained() {
        var parser = HTTP1Parser()
        let burst = Array(repeating: bytes("GET /x HTTP/1.1\r\nHost: a\r\n\r\n"), count: 3000).flatMap { $0 }
        parser.append(burst)
        #expect(parser.bufferCapacity >= burst.count)
        var count = 0
        while let event = parser.next() {
            if case .request = event { count += 1 }
        }
        #expect(count == 3000)
        #expect(parser.bufferCapacity <= HTTP1Parser.retainedBufferCapacity)
        // Still works afterwards.
        parser.append(bytes("GET /y HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(parser.next() != nil)
        guard case .request(let last)? = parser.next() else {
            Issue.record("no request after the burst")
            return
        }
        #expect(last.head.target == "/y")
    }

    @Test func manyRequestsThroughOneParserKeepTheBufferSmall() {
        var parser = HTTP1Parser()
        let request = bytes("GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        var count = 0
        for _ in 0..<2000 {
            parser.append(request)
            while let event = parser.next() {
                if case .request = event { count += 1 }
            }
            #expect(parser.bufferedByteCount == 0)
        }
        #expect(count == 2000)
    }
}

@Suite("HTTP/1.1 parser: chunked bodies")
struct HTTP1ParserChunkedTests {
    static func chunkedRequest(_ body: String) -> [UInt8] {
        bytes("POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    }

    @Test("accepted chunk framings", arguments: [
        ("5\r\nhello\r\n0\r\n\r\n", "hello"),
        ("A\r\n0123456789\r\n0\r\n\r\n", "0123456789"),
        ("a\r\n0123456789\r\n0\r\n\r\n", "0123456789"),
        ("0000000000000005\r\nhello\r\n0\r\n\r\n", "hello"),
        ("0\r\n\r\n", ""),
        ("2;name\r\nab\r\n1;a=b;c=\"d e\"\r\nc\r\n0;last\r\n\r\n", "abc"),
        ("2 ; name = value\r\nab\r\n0\r\n\r\n", "ab"),
        ("2;q=\"\\\"quoted\\\\\"\r\nab\r\n0\r\n\r\n", "ab"),
        ("1\r\na\r\n0\r\nX-Checksum: 1\r\nX-Other:  two \r\n\r\n", "a"),
    ])
    func accepted(body: String, expected: String) throws {
        let input = Self.chunkedRequest(body)
        let request = try #require(requests(parseEvents(input)).first, "events: \(parseEvents(input))")
        #expect(request.body == bytes(expected))
        #expect(request.head.chunked)
        #expect(parseEvents(input, chunks: Array(repeating: 1, count: input.count)) == parseEvents(input))
    }

    @Test func largeChunkedBodyUpToTheLimit() throws {
        let limits = HTTP1Limits(maxBodyBytes: 100_000)
        var body = ""
        for _ in 0..<10 { body += "2710\r\n" + String(repeating: "z", count: 10_000) + "\r\n" }
        let input = Self.chunkedRequest(body + "0\r\n\r\n")
        let request = try #require(requests(parseEvents(input, chunks: [70, 4093, 1, 9999], limits: limits)).first)
        #expect(request.body.count == 100_000)
        let over = Self.chunkedRequest(body + "1\r\n")
        #expect(failure(parseEvents(over, limits: limits))?.status == 413)
    }

    @Test func bodyWaitsForTheFinalCRLF() {
        var parser = HTTP1Parser()
        parser.append(Self.chunkedRequest("3\r\nabc\r\n0\r\n"))
        guard case .head? = parser.next() else {
            Issue.record("no head")
            return
        }
        #expect(parser.next() == nil)
        #expect(parser.state == .body)
        parser.append(bytes("\r\n"))
        guard case .request(let request)? = parser.next() else {
            Issue.record("no request")
            return
        }
        #expect(request.body == bytes("abc"))
    }
}

@Suite("HTTP/1.1 parser: limits")
struct HTTP1ParserLimitTests {
    static let limits = HTTP1Limits(maxHeaderBytes: 200, maxHeaderCount: 4, maxBodyBytes: 10)

    /// A head of exactly `size` bytes (request line + Host + one padding header + final CRLF).
    static func head(size: Int) -> [UInt8] {
        let prefix = "GET / HTTP/1.1\r\nHost: a\r\nX: "
        let padding = size - prefix.utf8.count - 4
        return bytes(prefix + String(repeating: "p", count: padding) + "\r\n\r\n")
    }

    @Test func headAtTheLimitIsAcceptedOneMoreIs431() throws {
        #expect(Self.head(size: 200).count == 200)
        #expect(requests(parseEvents(Self.head(size: 200), limits: Self.limits)).count == 1)
        let error = try #require(failure(parseEvents(Self.head(size: 201), limits: Self.limits)))
        #expect(error.status == 431)
        let split = try #require(failure(parseEvents(Self.head(size: 201), chunks: Array(repeating: 1, count: 201), limits: Self.limits)))
        #expect(split.status == 431)
    }

    @Test func headerCountAtTheLimitIsAcceptedOneMoreIs431() throws {
        let four = bytes("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n")
        #expect(requests(parseEvents(four, limits: Self.limits)).count == 1)
        let five = bytes("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n")
        let error = try #require(failure(parseEvents(five, limits: Self.limits)))
        #expect(error.kind == .tooManyHeaders)
        #expect(error.status == 431)
    }

    @Test func bodyAtTheLimitIsAcceptedOneMoreIs413() throws {
        let ten = bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789")
        #expect(requests(parseEvents(ten, limits: Self.limits)).first?.body.count == 10)
        let eleven = bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n")
        #expect(failure(parseEvents(eleven, limits: Self.limits))?.status == 413)
        let chunkedTen = bytes("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n")
        #expect(requests(parseEvents(chunkedTen, limits: Self.limits)).first?.body.count == 10)
        let chunkedEleven = bytes("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n6\r\n")
        #expect(failure(parseEvents(chunkedEleven, limits: Self.limits))?.kind == .bodyTooLarge)
    }

    @Test func partialLineOverTheLimitFailsWithoutItsLineEnd() throws {
        // A peer that never sends LF cannot make the parser buffer more than the limit.
        var parser = HTTP1Parser(limits: Self.limits)
        parser.append(bytes("GET / HTTP/1.1\r\nHost: a\r\nX: "))
        #expect(parser.next() == nil)
        parser.append(Array(repeating: UInt8(ascii: "a"), count: 200))
        #expect(parser.next() == .failure(HTTP1ParseError(.headerSectionTooLarge)))
    }
}

@Suite("HTTP/1.1 parser: head value semantics")
struct HTTP1RequestHeadTests {
    @Test func settersCopyOnWrite() throws {
        let original = try #require(requests(parseEvents(bytes("GET /a HTTP/1.1\r\nHost: a\r\n\r\n"))).first).head
        var changed = original
        changed.target = "/b"
        changed.headers.append((name: "x", value: "y"))
        #expect(original.target == "/a")
        #expect(original.headers.count == 1)
        #expect(changed.target == "/b")
        #expect(changed.headers.count == 2)
        #expect(changed != original)
    }

    @Test func invalidUTF8InAValueIsRepairedNotPassedThrough() throws {
        let input = bytes("GET / HTTP/1.1\r\nHost: a\r\nX: a") + [0xFF, 0xC3] + bytes("b\r\n\r\n")
        let head = try #require(requests(parseEvents(input)).first).head
        #expect(head.firstValue("x") == "a\u{FFFD}\u{FFFD}b")
    }
}

/// Field values are checked eight bytes at a time while no byte can be a CTL or DEL; every
/// position of every word (and of the byte-by-byte tail) must give the byte loop's verdict.
@Suite("HTTP/1.1 parser: field value bytes at every position")
struct HTTP1ParserValueWordTests {
    func verdict(value: [UInt8]) -> HTTP1ParseError.Kind? {
        let head = bytes("GET / HTTP/1.1\r\nHost: a\r\nX-Test: ") + value + bytes("\r\n\r\n")
        let events = parseEvents(head)
        if let error = failure(events) { return error.kind }
        return requests(events).count == 1 ? nil : .invalidRequestLine   // (never: a complete head)
    }

    @Test func everyByteClassAtEveryPositionOfValuesUpTo40Bytes() {
        for length in 1...40 {
            for position in 0..<length {
                for (byte, expected) in [(UInt8(0x00), HTTP1ParseError.Kind.invalidHeaderValue), (0x01, .invalidHeaderValue),
                                         (0x1F, .invalidHeaderValue), (0x7F, .invalidHeaderValue), (0x0D, .bareLineEnding),
                                         (0x09, nil), (0x20, nil), (0x7E, nil), (0x80, nil), (0xFF, nil), (0x1F &+ 1, nil)] {
                    // Interior positions only for whitespace: leading/trailing SP/HTAB is trimmed.
                    var value = [UInt8](repeating: UInt8(ascii: "a"), count: length)
                    value[position] = byte
                    let got = verdict(value: value)
                    #expect(got == expected, "length \(length), byte \(byte) at \(position): \(String(describing: got))")
                }
            }
        }
    }

    @Test func valuesKeepTheirBytes() {
        let value = bytes("Bearer rk_") + [0x80, 0xC3, 0xA9] + bytes("\tabc def-ghi_jkl~") + [0xFF]
        let head = bytes("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: ") + value + bytes("\r\n\r\n")
        let request = requests(parseEvents(head)).first
        #expect(request?.head.firstValue("authorization") == String(decoding: value, as: UTF8.self))
    }
}

/// Known field names are recognised a word at a time (OR 0x20 against the lowercase literal);
/// that is exact only for token bytes. Every single-byte change of every known name, to every
/// token byte, must come out as exactly that name lowercased, never as the literal.
@Suite("HTTP/1.1 parser: field names recognised by words")
struct HTTP1ParserNameWordTests {
    static let known = ["host", "accept", "expect", "cookie", "connection", "user-agent", "content-type", "authorization",
                        "cache-control", "content-length", "accept-encoding", "accept-language", "transfer-encoding"]
    static let tokenBytes: [UInt8] = Array("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".utf8)

    func parsedName(_ name: [UInt8]) -> String? {
        // A value every interpreted header accepts, so the name alone decides.
        let value: String
        switch String(decoding: name, as: UTF8.self).lowercased() {
        case "content-length": value = "0"
        case "transfer-encoding": value = "chunked"
        case "expect": value = "100-continue"
        default: value = "a"
        }
        let hostLine = String(decoding: name, as: UTF8.self).lowercased() == "host" ? "" : "Host: a\r\n"
        let text = "POST / HTTP/1.1\r\n" + hostLine + String(decoding: name, as: UTF8.self) + ": " + value + "\r\n"
            + (String(decoding: name, as: UTF8.self).lowercased() == "transfer-encoding" ? "\r\n0\r\n\r\n" : "\r\n")
        guard let head = requests(parseEvents(bytes(text))).first?.head else { return nil }
        return head.headers.first { $0.name != "host" || hostLine.isEmpty }?.name
    }

    @Test func everyOneByteVariantOfAKnownNameKeepsItsOwnSpelling() {
        var checked = 0
        for name in Self.known {
            let original = Array(name.utf8)
            #expect(parsedName(Array(name.uppercased().utf8)) == name)
            for position in 0..<original.count {
                for b in Self.tokenBytes {
                    var variant = original
                    variant[position] = b
                    let expected = String(decoding: variant, as: UTF8.self).lowercased()
                    // A variant that turned into another interpreted name (none do at one byte,
                    // but the request would then need its own value) is skipped.
                    guard expected == name || !Self.known.contains(expected) else { continue }
                    let got = parsedName(variant)
                    if got != expected { Issue.record("\(String(decoding: variant, as: UTF8.self)): parsed as \(got ?? "nil")") }
                    checked += 1
                }
            }
        }
        #expect(checked > 10_000)
    }
}
