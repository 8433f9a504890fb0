// THROWAWAY: minimal stand-in for the strict parser (HTTP1Parser.swift, owned by another
// engineer). Deleted before landing.

public enum HTTPVersion: Sendable { case http1_0, http1_1, http2 }

package struct HTTP1Limits {
    package var maxHeaderBytes: Int
    package var maxHeaderCount: Int
    package var maxBodyBytes: Int
    package init(maxHeaderBytes: Int, maxHeaderCount: Int, maxBodyBytes: Int) {
        self.maxHeaderBytes = maxHeaderBytes; self.maxHeaderCount = maxHeaderCount; self.maxBodyBytes = maxBodyBytes
    }
}
package enum HTTP1ParserState { case idle, head, body }
package struct HTTP1RequestHead {
    package var method: String
    package var target: String
    package var version: HTTPVersion
    package var headers: [(name: String, value: String)]
    package var keepAlive: Bool
    package var expectContinue: Bool
    package var contentLength: Int?
    package var chunked: Bool
}
package struct HTTP1Request { package var head: HTTP1RequestHead; package var body: [UInt8] }
package struct HTTP1ParseError: Error {
    package enum Kind: String { case malformed, headerTooLarge, bodyTooLarge, badVersion, badLength, obsFold, missingHost }
    package var kind: Kind
    package var status: Int
}
package enum HTTP1Event { case head(HTTP1RequestHead); case request(HTTP1Request); case failure(HTTP1ParseError) }

package struct HTTP1Parser {
    let limits: HTTP1Limits
    var buf: [UInt8] = []
    var pos = 0
    var head: HTTP1RequestHead?
    var body: [UInt8] = []
    var failed: HTTP1ParseError?
    var chunkRemaining = -1   // -1: expecting size line
    var chunkDone = false

    package init(limits: HTTP1Limits) { self.limits = limits }
    package mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if pos > 0 && pos == buf.count { buf.removeAll(keepingCapacity: true); pos = 0 }
        buf.append(contentsOf: bytes)
    }
    package var state: HTTP1ParserState {
        if head != nil { return .body }
        return pos < buf.count ? .head : .idle
    }
    func findCRLF(from: Int) -> Int? {
        var i = from
        while i + 1 < buf.count { if buf[i] == 13 && buf[i + 1] == 10 { return i }; i += 1 }
        return nil
    }
    mutating func fail(_ k: HTTP1ParseError.Kind, _ s: Int) -> HTTP1Event {
        let e = HTTP1ParseError(kind: k, status: s); failed = e; return .failure(e)
    }
    package mutating func next() -> HTTP1Event? {
        if let f = failed { return .failure(f) }
        if head == nil {
            // find end of head
            var end: Int? = nil
            var i = pos
            while i + 3 < buf.count {
                if buf[i] == 13 && buf[i+1] == 10 && buf[i+2] == 13 && buf[i+3] == 10 { end = i; break }
                i += 1
            }
            guard let e = end else {
                if buf.count - pos > limits.maxHeaderBytes { return fail(.headerTooLarge, 431) }
                return nil
            }
            if e - pos > limits.maxHeaderBytes { return fail(.headerTooLarge, 431) }
            let text = String(decoding: buf[pos..<e], as: UTF8.self)
            if buf[pos..<e].contains(0) { return fail(.malformed, 400) }
            pos = e + 4
            var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
            let rl = lines.removeFirst().split(separator: " ", omittingEmptySubsequences: false)
            guard rl.count == 3 else { return fail(.malformed, 400) }
            let version: HTTPVersion
            switch rl[2] { case "HTTP/1.1": version = .http1_1; case "HTTP/1.0": version = .http1_0; default: return fail(.badVersion, 505) }
            var headers: [(name: String, value: String)] = []
            var cl: Int? = nil; var chunked = false; var conn = ""; var expect = false; var host = false
            for l in lines {
                if l.first == " " || l.first == "\t" { return fail(.obsFold, 400) }
                guard let c = l.firstIndex(of: ":") else { return fail(.malformed, 400) }
                let n = l[..<c]
                if n.isEmpty || n.last == " " { return fail(.malformed, 400) }
                let name = n.lowercased()
                let value = String(l[l.index(after: c)...].trimmingCharacters(in: .whitespaces))
                headers.append((name: name, value: value))
                switch name {
                case "content-length":
                    guard let v = Int(value), v >= 0, value.allSatisfy({ $0.isASCII && $0.isNumber }) else { return fail(.badLength, 400) }
                    if let o = cl, o != v { return fail(.badLength, 400) }
                    cl = v
                case "transfer-encoding":
                    guard value.lowercased() == "chunked" else { return fail(.malformed, 501) }
                    chunked = true
                case "connection": conn = value.lowercased()
                case "expect": expect = value.lowercased() == "100-continue"
                case "host": host = true
                default: break
                }
            }
            if headers.count > limits.maxHeaderCount { return fail(.headerTooLarge, 431) }
            if cl != nil && chunked { return fail(.badLength, 400) }
            if version == .http1_1 && !host { return fail(.missingHost, 400) }
            if let c = cl, c > limits.maxBodyBytes { return fail(.bodyTooLarge, 413) }
            let ka = version == .http1_1 ? conn != "close" : conn == "keep-alive"
            let h = HTTP1RequestHead(method: String(rl[0]), target: String(rl[1]), version: version, headers: headers,
                                     keepAlive: ka, expectContinue: expect && version == .http1_1, contentLength: cl, chunked: chunked)
            if (cl ?? 0) == 0 && !chunked { return .request(HTTP1Request(head: h, body: [])) }
            head = h; body = []; chunkRemaining = -1
            return .head(h)
        }
        let h = head!
        if let cl = h.contentLength {
            let need = cl - body.count
            let avail = min(need, buf.count - pos)
            body.append(contentsOf: buf[pos..<pos + avail]); pos += avail
            if body.count == cl { head = nil; return .request(HTTP1Request(head: h, body: body)) }
            return nil
        }
        while true {
            if chunkRemaining == -1 {
                guard let e = findCRLF(from: pos) else { return nil }
                let line = String(decoding: buf[pos..<e], as: UTF8.self)
                guard let n = Int(line, radix: 16), n >= 0 else { return fail(.badLength, 400) }
                pos = e + 2
                if n == 0 { chunkRemaining = -2 } else { chunkRemaining = n }
                if body.count + n > limits.maxBodyBytes { return fail(.bodyTooLarge, 413) }
            } else if chunkRemaining == -2 {
                guard let e = findCRLF(from: pos) else { return nil }
                let empty = e == pos
                pos = e + 2
                if empty { head = nil; return .request(HTTP1Request(head: h, body: body)) }
            } else {
                let avail = min(chunkRemaining, buf.count - pos)
                body.append(contentsOf: buf[pos..<pos + avail]); pos += avail; chunkRemaining -= avail
                if chunkRemaining > 0 { return nil }
                guard buf.count - pos >= 2 else { chunkRemaining = 0; if buf.count - pos < 2 { return nil } ; continue }
                guard buf[pos] == 13 && buf[pos+1] == 10 else { return fail(.malformed, 400) }
                pos += 2; chunkRemaining = -1
            }
        }
    }
}

import Foundation
