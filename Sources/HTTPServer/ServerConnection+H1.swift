// HTTP/1.1 on a connection: feeds the strict parser, dispatches requests, keeps responses in
// request order (pipelining) whatever order handlers answer in, 100-continue, keep-alive and
// Connection: close, parse errors as `configuration.errorResponse(status, kind)` (by default
// `{"error":"<kind>"}`) followed by a close.

/// One request awaiting (or holding) its response, in pipeline order.
struct H1Slot {
    var response: HTTPReply?
    var action: ConnectionAction = .keep
    var keepAlive: Bool
    var isHEAD: Bool
    var version: HTTPVersion
}

/// `Expect: 100-continue` of the request being received (one at a time: its head and its
/// body arrive before the next request's head).
enum ExpectContinue {
    case none
    /// `ServerCore.continueCheck` is deciding for the request that will have this sequence.
    case checking(sequence: UInt64)
    /// `100 Continue` is owed once the responses to the requests before it are out.
    case owed
}

/// At most this many requests of one connection wait for handlers; beyond it the connection
/// stops reading until responses drain (bounded memory under pipelining floods).
let maxPipelinedRequests = 128

private let continueLine: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)
private let connectionCloseLine: [UInt8] = Array("connection: close\r\n".utf8)
private let connectionKeepAliveLine: [UInt8] = Array("connection: keep-alive\r\n".utf8)
private let contentLengthPrefix: [UInt8] = Array("content-length: ".utf8)
private let crlf: [UInt8] = [13, 10]
/// "content-length: <n>\r\n" for the small bodies most responses have, built once.
private let contentLengthLines: [[UInt8]] = (0..<1024).map { Array("content-length: \($0)\r\n".utf8) }
private let colonSpace: [UInt8] = [58, 32]

/// "HTTP/1.1 <code> <reason>\r\n" for 100...599, built once.
private let statusLines: [[UInt8]] = (0..<600).map { code in
    code < 100 ? [] : Array("HTTP/1.1 \(code) \(reasonPhrase(code))\r\n".utf8)
}

func reasonPhrase(_ status: Int) -> String {
    switch status {
    case 100: return "Continue"
    case 101: return "Switching Protocols"
    case 200: return "OK"
    case 201: return "Created"
    case 202: return "Accepted"
    case 204: return "No Content"
    case 206: return "Partial Content"
    case 301: return "Moved Permanently"
    case 302: return "Found"
    case 304: return "Not Modified"
    case 307: return "Temporary Redirect"
    case 308: return "Permanent Redirect"
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 406: return "Not Acceptable"
    case 408: return "Request Timeout"
    case 409: return "Conflict"
    case 410: return "Gone"
    case 411: return "Length Required"
    case 413: return "Content Too Large"
    case 414: return "URI Too Long"
    case 415: return "Unsupported Media Type"
    case 417: return "Expectation Failed"
    case 422: return "Unprocessable Content"
    case 429: return "Too Many Requests"
    case 431: return "Request Header Fields Too Large"
    case 500: return "Internal Server Error"
    case 501: return "Not Implemented"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    case 505: return "HTTP Version Not Supported"
    default: return "Status"
    }
}

extension ServerCore {
    /// The response to send for a handler's `response`: itself, or when it could split the
    /// response, a 500 in the application's error format (so it carries what that format
    /// adds, e.g. the relay's x-request-id).
    func safeResponse(_ response: HTTPReply) -> HTTPReply {
        if responseIsSafe(response) { return response }
        let replacement = errorResponse(500, "invalid_response")
        return responseIsSafe(replacement) ? replacement : invalidResponse
    }
}

extension ServerConnection {
    func h1Receive(_ bytes: UnsafeRawBufferPointer) {
        h1Process(bytes)
    }

    /// Appends `bytes` (if any) and handles every complete event. One exclusive access to
    /// `parser` spans the loop: per-call access to a class-stored struct pays an exclusivity
    /// check each time and, for getters, a copy. Nothing reached from here touches `parser`:
    /// a handler answering synchronously re-enters through `h1Complete`, which finds
    /// `processingH1` set and leaves the parsing to this loop. Reads never nest.
    func h1Process(_ bytes: UnsafeRawBufferPointer? = nil) {
        guard !processingH1 else {
            precondition(bytes == nil, "nested HTTP/1 read")
            return
        }
        processingH1 = true
        defer { processingH1 = false }
        withUnsafeMutablePointer(to: &self.parser) { parser in
            // Once no further request will be parsed, input is dropped instead of buffered:
            // the socket stops reading then, but bytes of the read in progress still arrive.
            if let bytes, !state.stopsParsing { parser.pointee.append(bytes) }
            h1Events(parser)
            if state.stopsParsing { parser.pointee.discardInput() }
            accountInput(parser.pointee.heldByteCount)
        }
    }

    private func h1Events(_ parser: UnsafeMutablePointer<HTTP1Parser>) {
        while !state.stopsParsing && !closed {
            if slots.count - slotsHead >= maxPipelinedRequests {
                state.pauseForPipeline()
                socket.stopReading()
                break
            }
            if out.count + socket.queuedBytes > core.outputLimit() {
                // Responses pile up faster than the peer reads them: parse more once it has.
                state.pauseForWrites()
                socket.stopReading()
                break
            }
            guard let event = parser.pointee.next() else { break }
            switch event {
            case .head(let head):
                if head.expectContinue {
                    if let check = core.continueCheck {
                        let sequence = nextSequence
                        expectContinue = .checking(sequence: sequence)
                        check(h1Request(head, body: []), HTTPContinueDecision(connection: self, sequence: sequence))
                    } else if slotsHead == slots.count {
                        out.append(contentsOf: continueLine)
                    } else {
                        expectContinue = .owed
                    }
                }
            case .request(let request):
                expectContinue = .none   // the body came (even while checking): the handler decides
                requestsSeen += 1
                let head = request.head
                let keepAlive = head.keepAlive && !state.shuttingDown
                    && requestsSeen < core.maxRequestsPerConnection
                if !keepAlive { stopParsing() }
                let isHEAD = head.method.utf8.count == 4 && head.method == "HEAD"
                let sequence = nextSequence
                nextSequence += 1
                slots.append(H1Slot(response: nil, keepAlive: keepAlive, isHEAD: isHEAD, version: head.version))
                let writer = HTTPReplyWriter(connection: self, sequence: sequence, streamID: 0, isHEAD: isHEAD)
                core.handler(h1Request(head, body: request.body), writer)
            case .failure(let error):
                let kind = "\(error.kind.rawValue)"
                core.recordParseError(kind)
                stopParsing()
                nextSequence += 1
                slots.append(H1Slot(response: core.errorResponse(error.status, kind),
                                    keepAlive: false, isHEAD: false, version: .http1_1))
                h1Drain()
            }
        }
        let now = loop.now
        h1State = parser.pointee.state
        switch h1State {
        case .idle:
            headStartedAt = 0
            bodyStartedAt = 0
        case .head:
            if headStartedAt == 0 { headStartedAt = now }
            bodyStartedAt = 0
        case .body:
            if bodyStartedAt == 0 { bodyStartedAt = now }
            headStartedAt = 0
        }
    }

    func h1Request(_ head: HTTP1RequestHead, body: [UInt8]) -> HTTPRequest {
        var headers = HTTPHeaders(lowercasedFields: head.headerFields)
        if head.target.utf8.first != UInt8(ascii: "/"), let parts = absoluteFormParts(head.target) {
            // RFC 9112 3.2.2: the target's authority replaces the Host field.
            headers.replaceOrAdd("host", String(parts.authority))
        }
        return HTTPRequest(method: head.method, target: head.target, version: head.version,
                           headers: headers, body: body,
                           remoteAddress: remoteAddress, tls: tlsInfo, connectionID: id, streamID: 0,
                           clientKey: clientKey)
    }

    /// The continue check's answer for the request that will have `sequence`: `100 Continue`,
    /// or `refusal` as that request's answer in pipeline order, nothing more parsed or read.
    /// Ignored once the request arrived whole (the handler answers it) or the connection ended.
    func continueDecided(sequence: UInt64, refusal: HTTPReply?) {
        guard !closed, case .checking(sequence) = expectContinue else { return }
        expectContinue = .none
        if let refusal {
            stopParsing()
            nextSequence += 1
            slots.append(H1Slot(response: refusal, keepAlive: false, isHEAD: false, version: .http1_1))
            h1Drain()
            h1Process()   // drops the input buffered for the refused body (no-op when re-entered)
        } else if slotsHead == slots.count {
            out.append(contentsOf: continueLine)
        } else {
            expectContinue = .owed
        }
        flush()
        updateTimer()
    }

    func h1Complete(_ writer: HTTPReplyWriter, _ response: HTTPReply, _ action: ConnectionAction) {
        guard writer.sequence >= baseSequence else { return }
        let index = Int(writer.sequence - baseSequence)
        guard index >= slotsHead && index < slots.count else { return }
        slots[index].response = response
        slots[index].action = action
        h1Drain()
        if slots.count - slotsHead < maxPipelinedRequests {
            switch state.pipelineHasRoom() {
            case .none: break
            case .parse: h1Process()
            case .readAndParse: socket.startReading(); h1Process()
            }
        }
        flush()
        updateTimer()
    }

    /// Serializes every leading answered slot.
    func h1Drain() {
        // take(): the response moves out of its slot instead of being copied out and cleared.
        while slotsHead < slots.count, let response = slots[slotsHead].response.take() {
            let slot = slots[slotsHead]
            slotsHead += 1
            let last = slotsHead == slots.count
            var keepAlive = slot.keepAlive && slot.action == .keep
            if state.shuttingDown && last { keepAlive = false }
            if state.peerHalfClosed && last { keepAlive = false }
            h1Serialize(response, keepAlive: keepAlive, isHEAD: slot.isHEAD, version: slot.version)
            if !keepAlive {
                // Nothing after this response is answered: the connection ends here.
                stopParsing()
                state.closeAfterFlush(abrupt: slot.action == .close)
                slotsHead = slots.count
                break
            }
        }
        if slotsHead == slots.count {
            baseSequence = nextSequence
            slots.removeAll(keepingCapacity: true)
            slotsHead = 0
            if case .owed = expectContinue, !state.closesAfterFlush {
                out.append(contentsOf: continueLine)
                expectContinue = .none
            }
        } else if slotsHead >= 64 {
            slots.removeFirst(slotsHead)
            baseSequence += UInt64(slotsHead)
            slotsHead = 0
        }
    }

    func h1WriteError(status: Int, kind: String) {
        h1Serialize(core.errorResponse(status, kind), keepAlive: false, isHEAD: false, version: .http1_1)
    }

    func h1Serialize(_ response: HTTPReply, keepAlive: Bool, isHEAD: Bool, version: HTTPVersion) {
        let r = core.safeResponse(response)
        core.recordStatus(r.status)
        let bodyless = r.status < 200 || r.status == 204 || r.status == 304
        let dateLine = loop.dateHeaderLine
        // Build in a local buffer: one exclusive access to `out` instead of one per append.
        var o: [UInt8] = []
        swap(&o, &out)
        defer { swap(&o, &out) }
        // The head's dozen pieces go through the loop's scratch memory and reach `o` in one
        // append (see HeadWriter).
        loop.headScratch.withUnsafeMutableBufferPointer { scratch in
            var head = HeadWriter(scratch)
            head.put(statusLines[r.status], &o)
            var hasDate = false
            var hasServer = false
            for h in r.headers.storage {
                switch classifyResponseHeader(h.name) {
                case .framing: continue   // framing is the server's job
                case .date: hasDate = true
                case .server: hasServer = true
                case .none: break
                }
                head.put(h.name, &o)
                head.put(58, 32, &o)   // ": "
                head.put(h.value, &o)
                head.put(13, 10, &o)
            }
            if !hasDate { head.put(dateLine, &o) }
            if !hasServer, let line = core.serverHeaderLine {
                head.put(line, &o)
            }
            if !bodyless {
                if r.body.count < contentLengthLines.count {
                    head.put(contentLengthLines[r.body.count], &o)
                } else {
                    head.put(contentLengthPrefix, &o)
                    head.putDecimal(r.body.count, &o)
                    head.put(13, 10, &o)
                }
            }
            if !keepAlive {
                head.put(connectionCloseLine, &o)
            } else if version == .http1_0 {
                head.put(connectionKeepAliveLine, &o)
            }
            head.put(13, 10, &o)
            head.flush(into: &o)
        }
        if !bodyless && !isHEAD { o.append(contentsOf: r.body) }
    }
}

/// Builds a response head in scratch memory and appends it to the output in one call: the
/// head is a dozen short pieces, and each `Array.append(contentsOf:)` costs several times a
/// copy into the scratch. A head larger than the scratch spills into
/// the output as it goes, so any size gives the same bytes.
struct HeadWriter {
    private let base: UnsafeMutablePointer<UInt8>
    private let capacity: Int
    private var count = 0

    init(_ scratch: UnsafeMutableBufferPointer<UInt8>) {
        base = scratch.baseAddress!
        capacity = scratch.count
    }

    mutating func put(_ bytes: UnsafeBufferPointer<UInt8>, _ out: inout [UInt8]) {
        if count + bytes.count > capacity {
            flush(into: &out)
            if bytes.count > capacity {
                out.append(contentsOf: bytes)
                return
            }
        }
        if let b = bytes.baseAddress { (base + count).update(from: b, count: bytes.count) }
        count += bytes.count
    }

    mutating func put(_ bytes: [UInt8], _ out: inout [UInt8]) {
        bytes.withUnsafeBufferPointer { put($0, &out) }
    }

    mutating func put(_ text: String, _ out: inout [UInt8]) {
        // Through withUTF8: a String's UTF8View is about twice as slow to copy from.
        var text = text
        text.withUTF8 { put($0, &out) }
    }

    mutating func put(_ a: UInt8, _ b: UInt8, _ out: inout [UInt8]) {
        if count + 2 > capacity { flush(into: &out) }
        base[count] = a
        base[count + 1] = b
        count += 2
    }

    mutating func putDecimal(_ n: Int, _ out: inout [UInt8]) {
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &digits) { d in
            var start = d.count
            var v = n
            repeat {
                start -= 1
                d[start] = UInt8(48 + v % 10)
                v /= 10
            } while v > 0
            put(UnsafeBufferPointer(start: d.baseAddress!.assumingMemoryBound(to: UInt8.self) + start, count: d.count - start), &out)
        }
    }

    /// Appends what is buffered to `out`.
    mutating func flush(into out: inout [UInt8]) {
        guard count > 0 else { return }
        out.append(contentsOf: UnsafeBufferPointer(start: base, count: count))
        count = 0
    }
}
