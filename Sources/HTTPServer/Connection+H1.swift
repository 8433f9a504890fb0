// HTTP/1.1 on a connection: feeds the strict parser, dispatches requests, keeps responses in
// request order (pipelining) whatever order handlers answer in, 100-continue, keep-alive and
// Connection: close, parse errors as `{"error":"<kind>"}` followed by a close.

/// One request awaiting (or holding) its response, in pipeline order.
struct H1Slot {
    var response: HTTPResponse?
    var action: ConnectionAction = .keep
    var keepAlive: Bool
    var isHEAD: Bool
    var version: HTTPVersion
}

/// At most this many requests of one connection wait for handlers; beyond it the connection
/// stops reading until responses drain (bounded memory under pipelining floods).
let maxPipelinedRequests = 128

private let continueLine: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)
private let connectionCloseLine: [UInt8] = Array("connection: close\r\n".utf8)
private let connectionKeepAliveLine: [UInt8] = Array("connection: keep-alive\r\n".utf8)
private let contentLengthPrefix: [UInt8] = Array("content-length: ".utf8)
private let crlf: [UInt8] = [13, 10]
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

/// Response header names must be tokens and values free of CR, LF and NUL, or a handler could
/// split the response.
func isSafeHeader(name: String, value: String) -> Bool {
    if name.isEmpty { return false }
    for b in name.utf8 {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "!"), UInt8(ascii: "#"),
             UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"), UInt8(ascii: "*"),
             UInt8(ascii: "+"), UInt8(ascii: "^"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            continue
        default:
            return false
        }
    }
    for b in value.utf8 where b == 13 || b == 10 || b == 0 { return false }
    return true
}

func responseIsSafe(_ r: HTTPResponse) -> Bool {
    guard r.status >= 100 && r.status <= 599 else { return false }
    for h in r.headers where !isSafeHeader(name: h.name, value: h.value) { return false }
    return true
}

let invalidResponse = HTTPResponse.json(500, #"{"error":"invalid_response"}"#)

extension Connection {
    func h1Receive(_ bytes: UnsafeRawBufferPointer) {
        parser.append(bytes)
        h1Process()
    }

    func h1Process() {
        guard !processingH1 else { return }
        processingH1 = true
        defer { processingH1 = false }
        while !stopParsing && !closed {
            if slots.count - slotsHead >= maxPipelinedRequests {
                pausedForPipeline = true
                socket.stopReading()
                break
            }
            guard let event = parser.next() else { break }
            switch event {
            case .head(let head):
                if head.expectContinue {
                    if slotsHead == slots.count { out.append(contentsOf: continueLine) } else { pendingContinue = true }
                }
            case .request(let request):
                pendingContinue = false
                requestsSeen += 1
                let head = request.head
                let keepAlive = head.keepAlive && !shuttingDown
                    && requestsSeen < core.maxRequestsPerConnection
                if !keepAlive { stopParsing = true }
                let isHEAD = head.method == "HEAD"
                let sequence = nextSequence
                nextSequence += 1
                slots.append(H1Slot(response: nil, keepAlive: keepAlive, isHEAD: isHEAD, version: head.version))
                let responder = HTTPResponder(connection: self, sequence: sequence, streamID: 0, isHEAD: isHEAD)
                let req = HTTPRequest(method: head.method, target: head.target, version: head.version,
                                      headers: HTTPHeaders(lowercased: head.headers), body: request.body,
                                      remoteAddress: remoteAddress, tls: tlsInfo, connectionID: id, streamID: 0)
                core.handler(req, responder)
            case .failure(let error):
                let kind = "\(error.kind.rawValue)"
                core.recordParseError(kind)
                stopParsing = true
                nextSequence += 1
                slots.append(H1Slot(response: .json(error.status, #"{"error":"\#(kind)"}"#),
                                    keepAlive: false, isHEAD: false, version: .http1_1))
                h1Drain()
            }
        }
        let now = loop.now
        switch parser.state {
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

    func h1Complete(_ responder: HTTPResponder, _ response: HTTPResponse, _ action: ConnectionAction) {
        guard responder.sequence >= baseSequence else { return }
        let index = Int(responder.sequence - baseSequence)
        guard index >= slotsHead && index < slots.count else { return }
        slots[index].response = response
        slots[index].action = action
        h1Drain()
        if pausedForPipeline && !stopParsing && slots.count - slotsHead < maxPipelinedRequests {
            pausedForPipeline = false
            socket.startReading()
            h1Process()
        }
        flush()
        updateTimer()
    }

    /// Serializes every leading answered slot.
    func h1Drain() {
        while slotsHead < slots.count, let response = slots[slotsHead].response {
            let slot = slots[slotsHead]
            slots[slotsHead].response = nil
            slotsHead += 1
            let last = slotsHead == slots.count
            var keepAlive = slot.keepAlive && slot.action == .keep
            if shuttingDown && last { keepAlive = false }
            if peerHalfClosed && last { keepAlive = false }
            h1Serialize(response, keepAlive: keepAlive, isHEAD: slot.isHEAD, version: slot.version)
            if !keepAlive {
                // Nothing after this response is answered: the connection ends here.
                stopParsing = true
                closeAfterFlush = true
                slotsHead = slots.count
                break
            }
        }
        if slotsHead == slots.count {
            baseSequence = nextSequence
            slots.removeAll(keepingCapacity: true)
            slotsHead = 0
            if pendingContinue && !closeAfterFlush {
                out.append(contentsOf: continueLine)
                pendingContinue = false
            }
        } else if slotsHead >= 64 {
            slots.removeFirst(slotsHead)
            baseSequence += UInt64(slotsHead)
            slotsHead = 0
        }
    }

    func h1WriteError(status: Int, kind: String) {
        h1Serialize(.json(status, #"{"error":"\#(kind)"}"#), keepAlive: false, isHEAD: false, version: .http1_1)
    }

    func h1Serialize(_ response: HTTPResponse, keepAlive: Bool, isHEAD: Bool, version: HTTPVersion) {
        let r = responseIsSafe(response) ? response : invalidResponse
        core.recordStatus(r.status)
        out.append(contentsOf: statusLines[r.status])
        var hasDate = false
        var hasServer = false
        for h in r.headers {
            switch h.name {
            case "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade":
                continue   // framing is the server's job
            case "date": hasDate = true
            case "server": hasServer = true
            default: break
            }
            out.append(contentsOf: h.name.utf8)
            out.append(contentsOf: colonSpace)
            out.append(contentsOf: h.value.utf8)
            out.append(contentsOf: crlf)
        }
        if !hasDate { out.append(contentsOf: loop.dateHeaderLine) }
        if !hasServer, let line = core.serverHeaderLine {
            out.append(contentsOf: line)
        }
        let bodyless = r.status < 200 || r.status == 204 || r.status == 304
        if !bodyless {
            out.append(contentsOf: contentLengthPrefix)
            appendDecimal(r.body.count)
            out.append(contentsOf: crlf)
        }
        if !keepAlive {
            out.append(contentsOf: connectionCloseLine)
        } else if version == .http1_0 {
            out.append(contentsOf: connectionKeepAliveLine)
        }
        out.append(contentsOf: crlf)
        if !bodyless && !isHEAD { out.append(contentsOf: r.body) }
    }

    private func appendDecimal(_ n: Int) {
        if n < 10 {
            out.append(UInt8(48 + n))
            return
        }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var count = 0
        var v = n
        withUnsafeMutableBytes(of: &digits) { d in
            while v > 0 {
                d[count] = UInt8(48 + v % 10)
                v /= 10
                count += 1
            }
            for i in stride(from: count - 1, through: 0, by: -1) { out.append(d[i]) }
        }
    }
}
