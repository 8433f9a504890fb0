import HTTPServer
import Testing
import TestSupport


@Suite("HTTP/1.1 parser: split equivalence")
struct HTTP1ParserPropertyTests {
    static let valid: [String] = [
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "POST /p?q=1 HTTP/1.1\r\nHost: h:1\r\nContent-Length: 7\r\nConnection: close\r\n\r\nabcdefg",
        "PUT /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
            + "4;ext=\"v;\\\"\"\r\nwxyz\r\n10\r\n0123456789abcdef\r\n0\r\nT: 1\r\n\r\n",
        "\r\n\r\nOPTIONS * HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "GET http://x.example/ HTTP/1.1\r\nHost: x.example\r\nX-Long: " + String(repeating: "L", count: 700) + "\r\n\r\n",
    ]

    /// Random input built from valid requests, sometimes with one byte replaced by a byte that
    /// matters to HTTP framing, so that failures are exercised at every position too.
    static func randomInput(_ rng: inout SeededGenerator) -> [UInt8] {
        var input: [UInt8] = []
        for _ in 0..<Int.random(in: 1...6, using: &rng) {
            input += Array(valid.randomElement(using: &rng)!.utf8)
        }
        if Bool.random(using: &rng) {
            let interesting: [UInt8] = [0x0D, 0x0A, 0x20, 0x09, 0x00, 0x3A, 0x3B, 0x22, 0x30, 0x66, 0x7F, 0xC3]
            input[Int.random(in: 0..<input.count, using: &rng)] = interesting.randomElement(using: &rng)!
        }
        return input
    }

    static func randomChunks(total: Int, _ rng: inout SeededGenerator) -> [Int] {
        var chunks: [Int] = []
        var covered = 0
        // Keep big inputs to a bounded number of appends (debug builds are slow).
        let maxChunk = max([1, 3, 17, 64, 4096].randomElement(using: &rng)!, total / 20_000)
        while covered < total {
            let size = Int.random(in: 1...maxChunk, using: &rng)
            chunks.append(size)
            covered += size
        }
        return chunks
    }

    @Test("same events however the input is split", arguments: 0..<8)
    func splitEquivalence(seed: UInt64) {
        var rng = SeededGenerator(seed: 0xC0FF_EE00 + seed)
        let limits = HTTP1Limits(maxHeaderBytes: Int.random(in: 400...2000, using: &rng), maxHeaderCount: 8, maxBodyBytes: 64)
        for iteration in 0..<60 {
            let input = Self.randomInput(&rng)
            let whole = parseEvents(input, limits: limits)
            let chunks = Self.randomChunks(total: input.count, &rng)
            let split = parseEvents(input, chunks: chunks, limits: limits)
            #expect(split == whole, "seed \(seed) iteration \(iteration) chunks \(chunks)")
        }
    }

    @Test("every malformed case fails the same way under random splits", arguments: 0..<4)
    func malformedSplits(seed: UInt64) {
        var rng = SeededGenerator(seed: 0xBAD0_0000 + seed)
        for testCase in HTTP1MalformedCases.all {
            let chunks = Self.randomChunks(total: testCase.bytes.count, &rng)
            let events = parseEvents(testCase.bytes, chunks: chunks)
            #expect(failure(events)?.kind.rawValue == testCase.kind, "\(testCase.name) chunks \(chunks)")
        }
    }
}
