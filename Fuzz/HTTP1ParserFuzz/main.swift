// libFuzzer target for HTTP1Parser, built without SwiftPM by scripts/fuzz.sh:
//   swiftc -parse-as-library -sanitize=fuzzer,address -package-name fuzz <parser sources> main.swift
// (the sources are listed in fuzz.conf beside this file). Beyond "no crash, no memory error",
// every input is checked for:
//   1. split independence: the events are the same whole, byte by byte, and in chunk sizes
//      derived from the input;
//   2. stream invariants: `.head` then `.request` with the same head, limits respected, the
//      declared body length delivered, a failure that stays put and empties the buffer;
//   3. round trip: every accepted request, written back out canonically, parses to itself.
// A violated check calls fatalError, which libFuzzer reports as a crash with the input saved.

private let limitSets = [
    HTTP1Limits(),
    HTTP1Limits(maxHeaderBytes: 200, maxHeaderCount: 5, maxBodyBytes: 64),
]

@_cdecl("LLVMFuzzerTestOneInput")
public func http1ParserFuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    for limits in limitSets {
        let whole = events(input, chunks: [], limits: limits)
        check(whole, limits: limits)
        let byteByByte = events(input, chunks: Array(repeating: 1, count: input.count), limits: limits)
        if byteByByte != whole { fatalError("byte-by-byte events differ: \(byteByByte) vs \(whole)") }
        let chunks = pseudoRandomChunks(input)
        let split = events(input, chunks: chunks, limits: limits)
        if split != whole { fatalError("split \(chunks) events differ: \(split) vs \(whole)") }
        for case .request(let request) in whole { roundTrip(request) }
    }
    return 0
}

private func events(_ input: [UInt8], chunks: [Int], limits: HTTP1Limits) -> [HTTP1Event] {
    var parser = HTTP1Parser(limits: limits)
    var out: [HTTP1Event] = []
    var offset = 0
    var index = 0
    while offset < input.count {
        let size = index < chunks.count ? min(chunks[index], input.count - offset) : input.count - offset
        index += 1
        input[offset..<(offset + size)].withUnsafeBytes { parser.append($0) }
        offset += size
        while let event = parser.next() {
            out.append(event)
            if case .failure(let error) = event {
                // Sticky failure, nothing kept, later input ignored.
                if parser.next() != .failure(error) { fatalError("failure not sticky") }
                if parser.bufferedByteCount != 0 { fatalError("failed parser keeps \(parser.bufferedByteCount) bytes") }
                if parser.state != .idle { fatalError("failed parser state \(parser.state)") }
                parser.append(UnsafeRawBufferPointer(start: data("GET / HTTP/1.1\r\n"), count: 16))
                if parser.next() != .failure(error) { fatalError("failure forgotten after more input") }
                return out
            }
        }
        // Waiting for input: at most one partial line or nothing is left in the buffer.
        if parser.bufferedByteCount > max(limits.maxHeaderBytes, HTTP1Parser.maxChunkSizeDigits + limits.maxHeaderBytes + 2) {
            fatalError("buffer holds \(parser.bufferedByteCount) bytes while waiting")
        }
    }
    return out
}

private func check(_ events: [HTTP1Event], limits: HTTP1Limits) {
    var pendingHead: HTTP1RequestHead?
    for event in events {
        switch event {
        case .head(let head):
            if pendingHead != nil { fatalError("two heads without a request") }
            if head.version == .http2 { fatalError("HTTP/2 head") }
            if head.headers.count > limits.maxHeaderCount { fatalError("\(head.headers.count) headers") }
            if head.chunked && head.contentLength != nil { fatalError("chunked with Content-Length") }
            if head.version == .http1_1 && head.headers.filter({ $0.name == "host" }).count != 1 { fatalError("Host count") }
            for field in head.headers where field.name != field.name.lowercased() { fatalError("name not lowercased") }
            pendingHead = head
        case .request(let request):
            guard let head = pendingHead, head == request.head else { fatalError("request without its head") }
            if request.body.count > limits.maxBodyBytes { fatalError("body of \(request.body.count) bytes") }
            if let length = head.contentLength, request.body.count != length { fatalError("body length mismatch") }
            if !head.chunked && head.contentLength == nil && !request.body.isEmpty { fatalError("body without framing") }
            pendingHead = nil
        case .failure(let error):
            if ![400, 413, 414, 417, 431, 501, 505].contains(error.status) { fatalError("status \(error.status)") }
        }
    }
}

/// Writes an accepted request back out in canonical form and expects it to parse to itself.
private func roundTrip(_ request: HTTP1Request) {
    let head = request.head
    var text = "\(head.method) \(head.target) \(head.version == .http1_0 ? "HTTP/1.0" : "HTTP/1.1")\r\n"
    for field in head.headers { text += "\(field.name): \(field.value)\r\n" }
    text += "\r\n"
    var bytes = Array(text.utf8)
    if head.chunked {
        if !request.body.isEmpty {
            bytes += Array((String(request.body.count, radix: 16) + "\r\n").utf8) + request.body + Array("\r\n".utf8)
        }
        bytes += Array("0\r\n\r\n".utf8)
    } else {
        bytes += request.body
    }
    let roomy = HTTP1Limits(maxHeaderBytes: 1 << 20, maxHeaderCount: 1 << 16, maxBodyBytes: 1 << 20)
    let again = events(bytes, chunks: [], limits: roomy)
    guard again.count == 2, case .request(let reparsed) = again[1], reparsed == request else {
        fatalError("round trip changed the request: \(request) -> \(again)")
    }
}

/// Chunk sizes 1...16 from a small LCG seeded by the input, so a crash replays exactly.
private func pseudoRandomChunks(_ input: [UInt8]) -> [Int] {
    var state: UInt64 = 0x9E37_79B9_7F4A_7C15 ^ UInt64(input.count)
    for byte in input.prefix(8) { state = state &* 31 &+ UInt64(byte) }
    var chunks: [Int] = []
    var covered = 0
    while covered < input.count {
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        let size = Int(state >> 60) + 1
        chunks.append(size)
        covered += size
    }
    return chunks
}

private func data(_ text: StaticString) -> UnsafeRawPointer { UnsafeRawPointer(text.utf8Start) }
