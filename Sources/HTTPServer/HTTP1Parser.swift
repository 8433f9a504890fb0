// A strict, incremental HTTP/1.1 request parser written from RFC 9110 / RFC 9112.
//
// Shape: the caller appends raw bytes as they arrive and pulls events with `next()` until it
// returns nil. Bytes may be split anywhere; several pipelined requests may arrive in one append.
// The head is processed one complete line at a time (each byte of a line is looked at once, the
// search for LF resumes where it stopped), body bytes are copied straight into the request's body
// as they arrive, so the input buffer only ever holds one partial line plus whatever the caller
// appended past the current request. Strings are created only for the method, target and header
// names/values. Anything ambiguous fails closed; the rules are in docs/http.md and pinned by
// HTTP1MalformedCases.all.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

package struct HTTP1Parser: Sendable {
    /// Blank lines tolerated before a request line (RFC 9112 2.2 asks for at least one; some
    /// clients send CRLF after a POST body). More than this is treated as garbage.
    package static let maxLeadingEmptyLines = 8
    /// Hex digits in a chunk size: 16 covers any 64-bit size; more is only padding or an attack.
    package static let maxChunkSizeDigits = 16

    private let limits: HTTP1Limits
    private var storage = HTTP1InputStorage(capacity: 0)
    /// Unconsumed input is `storage.bytes[readIndex ..< writeIndex]`.
    private var readIndex = 0
    private var writeIndex = 0
    /// Where the search for the current line's LF resumes (readIndex ... writeIndex).
    private var scanIndex = 0
    private var phase: Phase = .requestLine
    private var request = RequestInProgress()
    /// The head of the request whose body is being read (set by `finishHead`).
    private var head: HTTP1RequestHead?

    private enum Phase {
        case requestLine
        case headerLines
        /// `.head` was returned for a request without body; `.request` comes next.
        case complete
        case fixedBody(remaining: Int)
        case chunkSizeLine
        case chunkData(remaining: Int)
        case chunkDataEnd
        case trailerLines
        case failed(HTTP1ParseError)
    }

    /// Everything collected about the request being parsed; reset after each `.request`.
    private struct RequestInProgress {
        var leadingEmptyLines = 0
        var headBytes = 0
        var method = ""
        var target = ""
        var version = HTTPVersion.http1_1
        var headers: [HTTPField] = []
        var hostCount = 0
        var contentLengthCount = 0
        var contentLength = 0
        var contentLengthTooLarge = false
        var transferEncodingCount = 0
        var transferCoding = TransferCoding.chunked
        var connectionClose = false
        var connectionKeepAlive = false
        var expectContinue = false
        var expectOther = false
        var body: [UInt8] = []
        var chunkExtensionBytes = 0
        var trailerBytes = 0
        var trailerCount = 0
    }

    private enum TransferCoding { case chunked, finalNotChunked, otherCodings, malformed }

    package init(limits: HTTP1Limits = HTTP1Limits()) {
        self.limits = limits
    }

    // MARK: Public surface

    package var state: HTTP1ParserState {
        switch phase {
        case .requestLine:
            return readIndex == writeIndex && request.leadingEmptyLines == 0 ? .idle : .head
        case .headerLines:
            return .head
        case .failed:
            return .idle
        case .complete, .fixedBody, .chunkSizeLine, .chunkData, .chunkDataEnd, .trailerLines:
            return .body
        }
    }

    /// The failure the parser stopped at, if any.
    package var failure: HTTP1ParseError? {
        if case .failed(let error) = phase { return error }
        return nil
    }

    /// Bytes appended but not yet consumed by `next()`.
    package var bufferedByteCount: Int { writeIndex - readIndex }

    /// Bytes of input buffer held (memory cost of an idle connection).
    package var bufferCapacity: Int { storage.capacity }

    /// Input this parser holds for the request in progress: unconsumed bytes, the head parsed so
    /// far and the body collected so far. Bounded by maxHeaderBytes + maxBodyBytes + whatever
    /// the caller appended since the last `next()` returned nil.
    package var heldByteCount: Int {
        (writeIndex - readIndex) + request.body.count + request.headBytes
    }

    /// Drops every unconsumed byte and frees the buffer, for a connection that will parse no
    /// further request (after `Connection: close`, a refusal, shutdown): input kept past that
    /// point could only grow. Later `append`s are the caller's to refuse.
    package mutating func discardInput() {
        guard storage.capacity > 0 || writeIndex > readIndex || !request.body.isEmpty || request.headBytes > 0 else { return }
        storage = HTTP1InputStorage(capacity: 0)
        readIndex = 0
        writeIndex = 0
        scanIndex = 0
        request.body = []
        request.headBytes = 0
    }

    /// Buffer capacity kept between requests; a larger buffer (grown by a pipelined burst or a
    /// big read) is freed once empty, so idle keep-alive connections stay small.
    package static let retainedBufferCapacity = 16_384

    /// Buffers more input. Input after a failure is dropped.
    package mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard let source = bytes.baseAddress, bytes.count > 0 else { return }
        if case .failed = phase { return }
        let live = writeIndex - readIndex
        if live == 0 { readIndex = 0; writeIndex = 0; scanIndex = 0 }
        let unique = isKnownUniquelyReferenced(&storage)
        if !unique || writeIndex + bytes.count > storage.capacity {
            let needed = live + bytes.count
            let shift = readIndex
            if unique && needed <= storage.capacity {
                // Enough room once the consumed prefix is dropped: slide the live bytes down.
                if live > 0 { memmove(storage.bytes, storage.bytes + readIndex, live) }
            } else {
                var capacity = max(storage.capacity, 4096)
                while capacity < needed { capacity *= 2 }
                let grown = HTTP1InputStorage(capacity: capacity)
                if live > 0 { grown.bytes.update(from: storage.bytes + readIndex, count: live) }
                storage = grown
            }
            readIndex -= shift
            scanIndex -= shift
            writeIndex -= shift
        }
        (storage.bytes + writeIndex).update(from: source.assumingMemoryBound(to: UInt8.self), count: bytes.count)
        writeIndex += bytes.count
    }

    package mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// The next event, or nil when more input is needed.
    package mutating func next() -> HTTP1Event? {
        while true {
            switch phase {
            case .failed(let error):
                return .failure(error)
            case .requestLine:
                // Refuse obvious non-HTTP (a TLS ClientHello on the cleartext port, binary junk)
                // at its first byte instead of waiting for a line that may never come. Checked
                // before the line search so the verdict does not depend on how input is split.
                if readIndex < writeIndex {
                    let first = storage.bytes[readIndex]
                    if !isTokenChar(first) && first != cr && first != lf { return fail(.invalidRequestLine) }
                }
                switch nextLine(maxBytes: limits.maxHeaderBytes) {
                case .needMore: return nil
                case .tooLong: return fail(.targetTooLong)
                case .bareLineEnding: return fail(.bareLineEnding)
                case .line(let start, let end):
                    if start == end {
                        request.leadingEmptyLines += 1
                        if request.leadingEmptyLines > Self.maxLeadingEmptyLines { return fail(.tooManyEmptyLines) }
                        continue
                    }
                    request.headBytes = end - start + 2
                    if let error = parseRequestLine(start, end) { return fail(error) }
                    phase = .headerLines
                }
            case .headerLines:
                switch nextLine(maxBytes: limits.maxHeaderBytes - request.headBytes) {
                case .needMore: return nil
                case .tooLong: return fail(.headerSectionTooLarge)
                case .bareLineEnding: return fail(.bareLineEnding)
                case .line(let start, let end):
                    request.headBytes += end - start + 2
                    if start == end { return finishHead() }
                    if let error = parseHeaderLine(start, end) { return fail(error) }
                }
            case .complete:
                return finishRequest()
            case .fixedBody(let remaining):
                let taken = takeBody(upTo: remaining)
                if taken == remaining { return finishRequest() }
                phase = .fixedBody(remaining: remaining - taken)
                return nil
            case .chunkSizeLine:
                let budget = limits.maxHeaderBytes - request.chunkExtensionBytes
                switch nextLine(maxBytes: Self.maxChunkSizeDigits + budget + 2) {
                case .needMore: return nil
                case .tooLong:
                    let digitsEnd = min(writeIndex, readIndex + Self.maxChunkSizeDigits + 1)
                    return fail(hasOnlyHexDigits(readIndex, digitsEnd) ? .invalidChunkSize : .chunkExtensionsTooLarge)
                case .bareLineEnding: return fail(.bareLineEnding)
                case .line(let start, let end):
                    if let error = parseChunkSizeLine(start, end) { return fail(error) }
                }
            case .chunkData(let remaining):
                let taken = takeBody(upTo: remaining)
                if taken < remaining {
                    phase = .chunkData(remaining: remaining - taken)
                    return nil
                }
                phase = .chunkDataEnd
            case .chunkDataEnd:
                let available = writeIndex - readIndex
                let bytes = storage.bytes
                if available >= 1 && bytes[readIndex] != cr { return fail(.invalidChunkTerminator) }
                if available < 2 { return nil }
                if bytes[readIndex + 1] != lf { return fail(.invalidChunkTerminator) }
                consume(to: readIndex + 2)
                phase = .chunkSizeLine
            case .trailerLines:
                switch nextLine(maxBytes: limits.maxHeaderBytes - request.trailerBytes) {
                case .needMore: return nil
                case .tooLong: return fail(.trailerSectionTooLarge)
                case .bareLineEnding: return fail(.bareLineEnding)
                case .line(let start, let end):
                    request.trailerBytes += end - start + 2
                    if start == end { return finishRequest() }
                    request.trailerCount += 1
                    if request.trailerCount > limits.maxHeaderCount { return fail(.trailerSectionTooLarge) }
                    // Trailers are validated like header lines, then dropped: nothing downstream
                    // reads them, and dropping them means they can never override a header.
                    switch splitFieldLine(start, end) {
                    case .failure(let error):
                        return fail(error.kind == .bareLineEnding ? .bareLineEnding : .invalidTrailer)
                    case .success: break
                    }
                }
            }
        }
    }

    // MARK: Lines

    private enum LineResult {
        /// Line content `start ..< end`, CRLF excluded (already consumed).
        case line(Int, Int)
        case needMore
        case tooLong
        case bareLineEnding
    }

    /// Finds the next CRLF-terminated line. `maxBytes` bounds the line including its CRLF and is
    /// enforced before the line is complete, so a peer cannot make the buffer grow past it.
    private mutating func nextLine(maxBytes: Int) -> LineResult {
        let bytes = storage.bytes
        let from = scanIndex
        guard let found = memchr(bytes + from, Int32(lf), writeIndex - from) else {
            scanIndex = writeIndex
            return writeIndex - readIndex + 1 > maxBytes ? .tooLong : .needMore
        }
        let lfIndex = bytes.distance(to: found.assumingMemoryBound(to: UInt8.self))
        let start = readIndex
        if lfIndex - start + 1 > maxBytes { return .tooLong }
        if lfIndex == start || bytes[lfIndex - 1] != cr { return .bareLineEnding }
        consume(to: lfIndex + 1)
        // A CR inside the line is a bare CR; every validator below rejects it, and `fail`
        // reports it as such.
        return .line(start, lfIndex - 1)
    }

    private mutating func consume(to index: Int) {
        readIndex = index
        scanIndex = index
    }

    // MARK: Request line

    /// `method SP request-target SP HTTP-version`, single spaces, nothing else.
    private mutating func parseRequestLine(_ start: Int, _ end: Int) -> HTTP1ParseError.Kind? {
        let bytes = storage.bytes
        var i = start
        while i < end && isTokenChar(bytes[i]) { i += 1 }
        if i == end { return lineError(.invalidRequestLine, start, end) }
        if bytes[i] != sp { return lineError(i == start ? .invalidRequestLine : .invalidMethod, start, end) }
        if i == start { return lineError(.invalidRequestLine, start, end) }
        let methodEnd = i
        i += 1
        let targetStart = i
        while i < end && bytes[i] != sp { i += 1 }
        let targetEnd = i
        if targetEnd == targetStart || targetEnd == end { return lineError(.invalidRequestLine, start, end) }
        let versionStart = targetEnd + 1

        // The version decides how everything else is read, so it is judged first: a
        // well-formed but unsupported version gets 505 even if the rest is odd (`PRI * HTTP/2.0`).
        guard end - versionStart == 8,
              bytes[versionStart] == 0x48, bytes[versionStart + 1] == 0x54, bytes[versionStart + 2] == 0x54,
              bytes[versionStart + 3] == 0x50, bytes[versionStart + 4] == 0x2F,
              isDigit(bytes[versionStart + 5]), bytes[versionStart + 6] == 0x2E, isDigit(bytes[versionStart + 7])
        else { return lineError(.invalidVersion, start, end) }
        switch (bytes[versionStart + 5], bytes[versionStart + 7]) {
        case (0x31, 0x31): request.version = .http1_1
        case (0x31, 0x30): request.version = .http1_0
        default: return .unsupportedVersion
        }

        for k in targetStart..<targetEnd where !isTargetChar(bytes[k]) {
            return lineError(.invalidTarget, start, end)
        }
        let isConnect = methodEnd - start == 7 && matches(start, "CONNECT")
        let first = bytes[targetStart]
        if isConnect {
            // authority-form only: host:port, no path.
            if first == slash || first == asterisk { return .invalidTarget }
            for k in targetStart..<targetEnd where bytes[k] == slash || bytes[k] == question { return .invalidTarget }
        } else if first == asterisk {
            let isOptions = methodEnd - start == 7 && matches(start, "OPTIONS")
            if targetEnd - targetStart != 1 || !isOptions { return .invalidTarget }
        } else if first != slash {
            // absolute-form: scheme ":" ... where scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
            guard isAlpha(first) else { return .invalidTarget }
            var k = targetStart + 1
            while k < targetEnd && isSchemeChar(bytes[k]) { k += 1 }
            if k == targetEnd || bytes[k] != colon || k + 1 == targetEnd { return .invalidTarget }
        }

        request.headers.reserveCapacity(16)
        request.method = methodString(start, methodEnd)
        request.target = targetEnd - targetStart == 1 && first == slash ? "/" : makeString(targetStart, targetEnd)
        return nil
    }

    /// Common methods come from literals: no allocation and no UTF-8 validation on the hot path.
    private func methodString(_ start: Int, _ end: Int) -> String {
        switch end - start {
        case 3:
            if matches(start, "GET") { return "GET" }
            if matches(start, "PUT") { return "PUT" }
        case 4:
            if matches(start, "POST") { return "POST" }
            if matches(start, "HEAD") { return "HEAD" }
        case 5:
            if matches(start, "PATCH") { return "PATCH" }
        case 6:
            if matches(start, "DELETE") { return "DELETE" }
        case 7:
            if matches(start, "OPTIONS") { return "OPTIONS" }
        default:
            break
        }
        return makeString(start, end)
    }

    // MARK: Header lines

    private struct FieldLine {
        var nameEnd: Int
        var valueStart: Int
        var valueEnd: Int
    }

    /// `field-name ":" OWS field-value OWS` with the strict rules shared by headers and trailers.
    private func splitFieldLine(_ start: Int, _ end: Int) -> Result<FieldLine, HTTP1ParseError> {
        let bytes = storage.bytes
        let first = bytes[start]
        if first == sp || first == htab { return .failure(HTTP1ParseError(lineError(.obsFold, start, end))) }
        var i = start
        while i < end && isTokenChar(bytes[i]) { i += 1 }
        if i == end { return .failure(HTTP1ParseError(lineError(.invalidHeaderName, start, end))) }
        let c = bytes[i]
        if c != colon {
            var j = i
            while j < end && (bytes[j] == sp || bytes[j] == htab) { j += 1 }
            let kind: HTTP1ParseError.Kind = j > i && j < end && bytes[j] == colon && i > start
                ? .whitespaceBeforeColon : .invalidHeaderName
            return .failure(HTTP1ParseError(lineError(kind, start, end)))
        }
        if i == start { return .failure(HTTP1ParseError(lineError(.invalidHeaderName, start, end))) }
        let nameEnd = i
        var valueStart = i + 1
        while valueStart < end && (bytes[valueStart] == sp || bytes[valueStart] == htab) { valueStart += 1 }
        var valueEnd = end
        while valueEnd > valueStart && (bytes[valueEnd - 1] == sp || bytes[valueEnd - 1] == htab) { valueEnd -= 1 }
        // Eight bytes at a time while none can be a CTL or DEL (long Authorization values are
        // common); a word that may hold one, and the
        // tail, are checked byte by byte below, so the verdict is the byte loop's.
        var k = valueStart
        while valueEnd - k >= 8 {
            let w = UnsafeRawPointer(bytes + k).loadUnaligned(as: UInt64.self)
            let ones: UInt64 = 0x0101_0101_0101_0101
            let highs: UInt64 = 0x8080_8080_8080_8080
            // Some byte < 0x20 (exact for the whole word: bytes >= 0x80 never set it).
            let control = (w &- ones &* 0x20) & ~w & highs
            // Some byte == 0x7F (a zero byte of w ^ 0x7F7F...).
            let x = w ^ (ones &* 0x7F)
            let del = (x &- ones) & ~x & highs
            if control | del != 0 { break }
            k += 8
        }
        while k < valueEnd {
            let b = bytes[k]
            // field-vchar / obs-text / SP / HTAB: everything except CTLs and DEL.
            if (b < 0x20 && b != htab) || b == 0x7F {
                return .failure(HTTP1ParseError(b == cr ? .bareLineEnding : .invalidHeaderValue))
            }
            k += 1
        }
        return .success(FieldLine(nameEnd: nameEnd, valueStart: valueStart, valueEnd: valueEnd))
    }

    private mutating func parseHeaderLine(_ start: Int, _ end: Int) -> HTTP1ParseError.Kind? {
        let field: FieldLine
        switch splitFieldLine(start, end) {
        case .failure(let error): return error.kind
        case .success(let f): field = f
        }
        if request.headers.count >= limits.maxHeaderCount { return .tooManyHeaders }
        let (name, role) = headerName(start, field.nameEnd)
        let vs = field.valueStart, ve = field.valueEnd
        switch role {
        case .host:
            request.hostCount += 1
            if request.hostCount > 1 { return .multipleHost }
            for k in vs..<ve where !isHostChar(storage.bytes[k]) { return .invalidHost }
        case .contentLength:
            request.contentLengthCount += 1
            if request.contentLengthCount > 1 { return .multipleContentLength }
            if let error = parseContentLength(vs, ve) { return error }
        case .transferEncoding:
            request.transferEncodingCount += 1
            request.transferCoding = request.transferEncodingCount > 1 ? .malformed : classifyTransferEncoding(vs, ve)
        case .connection:
            var close = false, keepAlive = false
            forEachListElement(vs, ve) { s, e in
                if e - s == 5 && matchesLowercased(s, "close") { close = true }
                if e - s == 10 && matchesLowercased(s, "keep-alive") { keepAlive = true }
            }
            if close { request.connectionClose = true }
            if keepAlive { request.connectionKeepAlive = true }
        case .expect:
            var continueExpected = false, other = false
            forEachListElement(vs, ve) { s, e in
                if e - s == 12 && matchesLowercased(s, "100-continue") { continueExpected = true } else { other = true }
            }
            if continueExpected { request.expectContinue = true }
            if other { request.expectOther = true }
        case .contentType, .other:
            break
        }
        // The API's one content type comes from a literal: no allocation, no UTF-8 validation.
        let value = role == .contentType && ve - vs == 16 && matches(vs, "application/json") ? "application/json" : makeString(vs, ve)
        request.headers.append(HTTPField(name: name, value: value))
        return nil
    }

    /// Header fields the parser itself interprets.
    private enum HeaderRole { case host, contentLength, transferEncoding, connection, expect, contentType, other }

    /// The lowercased name and its role. Common names come from literals (no allocation, no
    /// UTF-8 validation); every name with a role is among them, so roles are found by comparing
    /// bytes, never Strings.
    private func headerName(_ start: Int, _ end: Int) -> (String, HeaderRole) {
        switch end - start {
        case 4:
            if nameIs(start, "host") { return ("host", .host) }
        case 6:
            if nameIs(start, "accept") { return ("accept", .other) }
            if nameIs(start, "expect") { return ("expect", .expect) }
            if nameIs(start, "cookie") { return ("cookie", .other) }
        case 10:
            if nameIs(start, "connection") { return ("connection", .connection) }
            if nameIs(start, "user-agent") { return ("user-agent", .other) }
        case 12:
            if nameIs(start, "content-type") { return ("content-type", .contentType) }
        case 13:
            if nameIs(start, "authorization") { return ("authorization", .other) }
            if nameIs(start, "cache-control") { return ("cache-control", .other) }
        case 14:
            if nameIs(start, "content-length") { return ("content-length", .contentLength) }
        case 15:
            if nameIs(start, "accept-encoding") { return ("accept-encoding", .other) }
            if nameIs(start, "accept-language") { return ("accept-language", .other) }
        case 17:
            if nameIs(start, "transfer-encoding") { return ("transfer-encoding", .transferEncoding) }
        default:
            break
        }
        return (makeLowercasedString(start, end), .other)
    }

    /// 1*DIGIT and nothing else. A value beyond maxBodyBytes (however many digits) is 413.
    private mutating func parseContentLength(_ start: Int, _ end: Int) -> HTTP1ParseError.Kind? {
        if start == end { return .invalidContentLength }
        let bytes = storage.bytes
        var value = 0
        var tooLarge = false
        for k in start..<end {
            let digit = bytes[k] &- 0x30
            if digit > 9 { return .invalidContentLength }
            if !tooLarge {
                let (times10, o1) = value.multipliedReportingOverflow(by: 10)
                let (sum, o2) = times10.addingReportingOverflow(Int(digit))
                if o1 || o2 || sum > limits.maxBodyBytes { tooLarge = true } else { value = sum }
            }
        }
        request.contentLength = value
        request.contentLengthTooLarge = tooLarge
        return nil
    }

    /// Exactly `chunked` (any case) is the only coding accepted. A list whose final coding is not
    /// chunked cannot be framed (RFC 9112 6.3: 400); codings we do not implement in front of a
    /// final chunked are 501; repeated chunked, parameters on chunked, or empty elements are 400.
    private func classifyTransferEncoding(_ start: Int, _ end: Int) -> TransferCoding {
        if end - start == 7 && matchesLowercased(start, "chunked") { return .chunked }
        let bytes = storage.bytes
        var elements: [(Int, Int, hasParameters: Bool)] = []
        var i = start
        while true {
            while i < end && (bytes[i] == sp || bytes[i] == htab) { i += 1 }
            let nameStart = i
            while i < end && isTokenChar(bytes[i]) { i += 1 }
            let nameEnd = i
            if nameEnd == nameStart { return .malformed }
            var hasParameters = false
            while i < end && bytes[i] != comma {
                let b = bytes[i]
                if b == semicolon { hasParameters = true } else if b != sp && b != htab && !hasParameters { return .malformed }
                i += 1
            }
            elements.append((nameStart, nameEnd, hasParameters))
            if i == end { break }
            i += 1 // comma
        }
        var chunkedCount = 0
        for element in elements where element.1 - element.0 == 7 && matchesLowercased(element.0, "chunked") {
            chunkedCount += 1
        }
        let last = elements[elements.count - 1]
        let lastIsChunked = last.1 - last.0 == 7 && matchesLowercased(last.0, "chunked") && !last.hasParameters
        if chunkedCount > 1 { return .malformed }
        if !lastIsChunked { return .finalNotChunked }
        return .otherCodings
    }

    /// Calls `body` with each non-empty, whitespace-trimmed element of a comma-separated list.
    private func forEachListElement(_ start: Int, _ end: Int, _ body: (Int, Int) -> Void) {
        let bytes = storage.bytes
        var i = start
        while i < end {
            while i < end && (bytes[i] == sp || bytes[i] == htab || bytes[i] == comma) { i += 1 }
            let s = i
            while i < end && bytes[i] != comma { i += 1 }
            var e = i
            while e > s && (bytes[e - 1] == sp || bytes[e - 1] == htab) { e -= 1 }
            if e > s { body(s, e) }
        }
    }

    private mutating func finishHead() -> HTTP1Event {
        if request.headBytes > limits.maxHeaderBytes { return fail(.headerSectionTooLarge) }
        let version = request.version
        let chunked = request.transferEncodingCount > 0
        if chunked {
            if version == .http1_0 { return fail(.transferEncodingOnHTTP10) }
            if request.contentLengthCount > 0 { return fail(.contentLengthWithTransferEncoding) }
            switch request.transferCoding {
            case .chunked: break
            case .otherCodings: return fail(.unsupportedTransferCoding)
            case .finalNotChunked, .malformed: return fail(.invalidTransferEncoding)
            }
        }
        if version == .http1_1 && request.hostCount == 0 { return fail(.missingHost) }
        if request.contentLengthTooLarge { return fail(.bodyTooLarge) }
        if request.expectOther { return fail(.expectationFailed) }

        let keepAlive = version == .http1_1
            ? !request.connectionClose
            : request.connectionKeepAlive && !request.connectionClose
        let contentLength = request.contentLengthCount > 0 ? request.contentLength : nil
        // Move (not copy) the collected strings into the head: the request keeps no reference.
        let method = request.method, target = request.target, headers = request.headers
        request.method = ""
        request.target = ""
        request.headers = []
        let head = HTTP1RequestHead(HTTP1RequestHead.Fields(
            method: method, target: target, version: version, headerFields: headers,
            keepAlive: keepAlive,
            // RFC 9110 10.1.1: a 100-continue expectation in an HTTP/1.0 request is ignored.
            expectContinue: request.expectContinue && version == .http1_1,
            contentLength: contentLength, chunked: chunked))
        self.head = head
        if chunked {
            phase = .chunkSizeLine
        } else if let length = contentLength, length > 0 {
            request.body.reserveCapacity(length)
            phase = .fixedBody(remaining: length)
        } else {
            phase = .complete
        }
        return .head(head)
    }

    private mutating func finishRequest() -> HTTP1Event {
        let head = self.head!
        let body = request.body
        self.head = nil
        request = RequestInProgress()
        phase = .requestLine
        if readIndex == writeIndex && storage.capacity > Self.retainedBufferCapacity {
            storage = HTTP1InputStorage(capacity: 0)
            readIndex = 0
            writeIndex = 0
            scanIndex = 0
        }
        return .request(HTTP1Request(head: head, body: body))
    }

    // MARK: Body

    /// Moves up to `limit` buffered bytes into the body; returns how many.
    private mutating func takeBody(upTo limit: Int) -> Int {
        let count = min(limit, writeIndex - readIndex)
        if count > 0 {
            request.body.append(contentsOf: UnsafeBufferPointer(start: storage.bytes + readIndex, count: count))
            consume(to: readIndex + count)
        }
        return count
    }

    /// `chunk-size [ chunk-ext ]`; sizes count against maxBodyBytes as soon as they are read.
    private mutating func parseChunkSizeLine(_ start: Int, _ end: Int) -> HTTP1ParseError.Kind? {
        let bytes = storage.bytes
        var i = start
        var size: UInt64 = 0
        while i < end, let digit = hexValue(bytes[i]) {
            if i - start == Self.maxChunkSizeDigits { return .invalidChunkSize }
            size = size << 4 | UInt64(digit)
            i += 1
        }
        if i == start { return lineError(.invalidChunkSize, start, end) }
        request.chunkExtensionBytes += end - i
        if request.chunkExtensionBytes > limits.maxHeaderBytes { return .chunkExtensionsTooLarge }
        if i < end && !isValidChunkExtension(i, end) { return lineError(.invalidChunkExtension, start, end) }
        if size > UInt64(limits.maxBodyBytes - request.body.count) { return .bodyTooLarge }
        if size == 0 {
            phase = .trailerLines
        } else {
            phase = .chunkData(remaining: Int(size))
        }
        return nil
    }

    /// `*( BWS ";" BWS ext-name [ BWS "=" BWS ( token / quoted-string ) ] )`, nothing after.
    private func isValidChunkExtension(_ start: Int, _ end: Int) -> Bool {
        let bytes = storage.bytes
        var i = start
        func skipWhitespace() { while i < end && (bytes[i] == sp || bytes[i] == htab) { i += 1 } }
        while i < end {
            skipWhitespace()
            guard i < end, bytes[i] == semicolon else { return false }
            i += 1
            skipWhitespace()
            let nameStart = i
            while i < end && isTokenChar(bytes[i]) { i += 1 }
            if i == nameStart { return false }
            var j = i
            while j < end && (bytes[j] == sp || bytes[j] == htab) { j += 1 }
            guard j < end, bytes[j] == equals else { continue }
            i = j + 1
            skipWhitespace()
            guard i < end else { return false }
            if bytes[i] == quote {
                i += 1
                var closed = false
                while i < end {
                    let b = bytes[i]
                    if b == quote { i += 1; closed = true; break }
                    if b == backslash {
                        guard i + 1 < end, isQuotedPairChar(bytes[i + 1]) else { return false }
                        i += 2
                    } else if isQuotedTextChar(b) {
                        i += 1
                    } else {
                        return false
                    }
                }
                if !closed { return false }
            } else {
                let valueStart = i
                while i < end && isTokenChar(bytes[i]) { i += 1 }
                if i == valueStart { return false }
            }
        }
        return true
    }

    private func hasOnlyHexDigits(_ start: Int, _ end: Int) -> Bool {
        for k in start..<end where hexValue(storage.bytes[k]) == nil { return false }
        return true
    }

    // MARK: Failure

    private mutating func fail(_ kind: HTTP1ParseError.Kind) -> HTTP1Event {
        let error = HTTP1ParseError(kind)
        phase = .failed(error)
        request = RequestInProgress()
        head = nil
        readIndex = writeIndex
        scanIndex = writeIndex
        return .failure(error)
    }

    /// A line that fails validation is reported as a bare CR if it contains one: that is the
    /// more specific diagnosis (the line only looked complete because of a later CRLF).
    private func lineError(_ kind: HTTP1ParseError.Kind, _ start: Int, _ end: Int) -> HTTP1ParseError.Kind {
        if end > start && memchr(storage.bytes + start, Int32(cr), end - start) != nil { return .bareLineEnding }
        return kind
    }

    // MARK: Bytes

    /// Invalid UTF-8 (obs-text that is not UTF-8) is repaired with U+FFFD by the initializer.
    /// Measured cheaper than `String(decoding:as:)` for short values, which are most of them.
    private func makeString(_ start: Int, _ end: Int) -> String {
        let source = storage.bytes + start
        return String(unsafeUninitializedCapacity: end - start) { buffer in
            buffer.baseAddress!.update(from: source, count: end - start)
            return end - start
        }
    }

    /// Token bytes only (ASCII), so lowercasing is a bit flip on A-Z.
    private func makeLowercasedString(_ start: Int, _ end: Int) -> String {
        let source = storage.bytes + start
        return String(unsafeUninitializedCapacity: end - start) { buffer in
            for k in 0..<(end - start) {
                let b = source[k]
                buffer[k] = b &- 0x41 < 26 ? b | 0x20 : b
            }
            return end - start
        }
    }

    /// Compares bytes at `start` with an ASCII literal, exactly.
    private func matches(_ start: Int, _ literal: StaticString) -> Bool {
        let bytes = storage.bytes
        let text = literal.utf8Start
        for k in 0..<literal.utf8CodeUnitCount where bytes[start + k] != text[k] { return false }
        return true
    }

    /// `matchesLowercased` for a field name, a word at a time. Exact only because the name is
    /// already known to be a token and the literal holds only lowercase letters and `-`: OR-ing
    /// 0x20 into a token byte gives a lowercase letter only from that letter in either case,
    /// and `-` only from `-` (0x0D is not a token byte). `literal` has at least 4 bytes.
    @inline(__always)
    private func nameIs(_ start: Int, _ literal: StaticString) -> Bool {
        let n = literal.utf8CodeUnitCount
        let name = UnsafeRawPointer(storage.bytes + start)
        let text = UnsafeRawPointer(literal.utf8Start)
        if n < 8 {
            // Two overlapping 4-byte words cover 4...7 bytes.
            let fold: UInt32 = 0x2020_2020
            return name.loadUnaligned(as: UInt32.self) | fold == text.loadUnaligned(as: UInt32.self)
                && name.loadUnaligned(fromByteOffset: n - 4, as: UInt32.self) | fold
                    == text.loadUnaligned(fromByteOffset: n - 4, as: UInt32.self)
        }
        let fold: UInt64 = 0x2020_2020_2020_2020
        var offset = 0
        while offset + 8 < n {
            if name.loadUnaligned(fromByteOffset: offset, as: UInt64.self) | fold
                != text.loadUnaligned(fromByteOffset: offset, as: UInt64.self) { return false }
            offset += 8
        }
        // The last word ends at the last byte (it may overlap the previous one).
        return name.loadUnaligned(fromByteOffset: n - 8, as: UInt64.self) | fold
            == text.loadUnaligned(fromByteOffset: n - 8, as: UInt64.self)
    }

    /// Compares bytes at `start` with a lowercase ASCII literal, ignoring the case of the input.
    private func matchesLowercased(_ start: Int, _ literal: StaticString) -> Bool {
        let bytes = storage.bytes
        let text = literal.utf8Start
        for k in 0..<literal.utf8CodeUnitCount {
            let b = bytes[start + k]
            if (b &- 0x41 < 26 ? b | 0x20 : b) != text[k] { return false }
        }
        return true
    }
}

/// The parser's input bytes. A class so that `next()` can read through a stable pointer while
/// mutating the parser's other fields (an Array would need a closure and overlapping access).
///
/// `@unchecked Sendable` proof: `HTTP1Parser.append` is the only writer, and it writes only after
/// `isKnownUniquelyReferenced` confirmed the parser value holds the sole reference (otherwise it
/// copies first) — the copy-on-write discipline of Array. A shared instance is never written, so
/// copies of a parser on different threads only ever read it.
private final class HTTP1InputStorage: @unchecked Sendable {
    let bytes: UnsafeMutablePointer<UInt8>
    let capacity: Int

    init(capacity: Int) {
        bytes = .allocate(capacity: max(capacity, 1))
        self.capacity = capacity
    }

    deinit { bytes.deallocate() }
}

// MARK: Byte classes (bit sets over ASCII; bytes >= 0x80 are in none of them)

private let cr: UInt8 = 0x0D
private let lf: UInt8 = 0x0A
private let sp: UInt8 = 0x20
private let htab: UInt8 = 0x09
private let colon: UInt8 = 0x3A
private let semicolon: UInt8 = 0x3B
private let comma: UInt8 = 0x2C
private let equals: UInt8 = 0x3D
private let quote: UInt8 = 0x22
private let backslash: UInt8 = 0x5C
private let slash: UInt8 = 0x2F
private let asterisk: UInt8 = 0x2A
private let question: UInt8 = 0x3F

@inline(__always)
private func inSet(_ b: UInt8, _ low: UInt64, _ high: UInt64) -> Bool {
    if b < 64 { return (low >> UInt64(b)) & 1 != 0 }
    if b < 128 { return (high >> UInt64(b &- 64)) & 1 != 0 }
    return false
}

/// tchar: ALPHA DIGIT ! # $ % & ' * + - . ^ _ ` | ~  (RFC 9110 5.6.2)
@inline(__always) private func isTokenChar(_ b: UInt8) -> Bool { inSet(b, 0x03FF_6CFA_0000_0000, 0x57FF_FFFF_C7FF_FFFE) }
/// RFC 3986 characters of a request-target: unreserved, sub-delims, ":" "@" "/" "?" "%".
/// Excludes SP, CTLs, non-ASCII, `"` `<` `>` `\` `^` `` ` `` `{` `|` `}` and `#` (no fragments).
@inline(__always) private func isTargetChar(_ b: UInt8) -> Bool { inSet(b, 0xAFFF_FFF2_0000_0000, 0x47FF_FFFE_87FF_FFFF) }
/// uri-host [":" port]: unreserved, sub-delims, ":" "[" "]" "%".
@inline(__always) private func isHostChar(_ b: UInt8) -> Bool { inSet(b, 0x2FFF_7FF2_0000_0000, 0x47FF_FFFE_AFFF_FFFE) }
/// qdtext: HTAB SP 0x21 0x23-0x5B 0x5D-0x7E obs-text
@inline(__always) private func isQuotedTextChar(_ b: UInt8) -> Bool { b >= 0x80 || inSet(b, 0xFFFF_FFFB_0000_0200, 0x7FFF_FFFF_EFFF_FFFF) }
/// quoted-pair second byte: HTAB SP VCHAR obs-text
@inline(__always) private func isQuotedPairChar(_ b: UInt8) -> Bool { b == htab || (b >= 0x20 && b != 0x7F) }
@inline(__always) private func isDigit(_ b: UInt8) -> Bool { b &- 0x30 < 10 }
@inline(__always) private func isAlpha(_ b: UInt8) -> Bool { (b | 0x20) &- 0x61 < 26 }
@inline(__always) private func isSchemeChar(_ b: UInt8) -> Bool { isAlpha(b) || isDigit(b) || b == 0x2B || b == 0x2D || b == 0x2E }
@inline(__always) private func hexValue(_ b: UInt8) -> UInt8? {
    if b &- 0x30 < 10 { return b &- 0x30 }
    let lower = b | 0x20
    if lower &- 0x61 < 6 { return lower &- 0x61 + 10 }
    return nil
}
