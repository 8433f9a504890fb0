// Random walks over connection states: each round opens a few connections that send a random
// sequence of request fragments (valid, closing, malformed, oversized, partial, 100-continue,
// h2c) to a handler that answers at random (at once, late, large, never, with .goAway or
// .close), never read, then stream bytes. Whatever the walk, no connection may hold more than
// the HTTP/1 bound (head + body + one read) or the h2 cap plus one read, and the server must
// still answer a fresh client. `HTTP_SOAK_ROUNDS` (default 12) and `HTTP_SOAK_SEED` set the
// run; `make soak-http` runs 300 rounds. A failure prints the seed that reproduces it.
import Foundation
import HTTPServer
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SplitMix64: a seeded generator so a failing walk can be replayed.
private struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

private let soakHeaderBytes = 4096
private let soakBodyBytes = 8192

private func fragments(_ rng: inout SeededRandom) -> [UInt8] {
    let n = Int.random(in: 1...6, using: &rng)
    var out: [UInt8] = []
    for _ in 0..<n {
        let piece: String
        switch Int.random(in: 0..<14, using: &rng) {
        case 0: piece = "GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
        case 1: piece = String(repeating: "GET /b HTTP/1.1\r\nHost: t\r\n\r\n", count: Int.random(in: 2...300, using: &rng))
        case 2: piece = "GET /c HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        case 3: piece = "POST /d HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
        case 4: piece = "POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3000\r\n\r\n"
        case 5: piece = "POST /f HTTP/1.1\r\nHost: t\r\nExpect: nope\r\nContent-Length: 1\r\n\r\nx"
        case 6: piece = "POST /g HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n"
        case 7: piece = "POST /h HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n"
        case 8: piece = "GET / HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n"
        case 9: piece = "GET /i HTTP/1.1\r\nHost: t\r\nX-Long: " + String(repeating: "v", count: Int.random(in: 100...6000, using: &rng))
        case 10: piece = "GET /j HTTP/1.0\r\n\r\n"
        case 11: piece = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        case 12: piece = "\r\n"
        default: piece = String(repeating: "z", count: Int.random(in: 1...2000, using: &rng))
        }
        out += Array(piece.utf8)
    }
    return out
}

@Suite(.serialized) struct ServerInputSoakTests {
    @Test func randomWalksOverConnectionStatesStayBounded() throws {
        let rounds = Int(ProcessInfo.processInfo.environment["HTTP_SOAK_ROUNDS"] ?? "") ?? 12
        let seed = UInt64(ProcessInfo.processInfo.environment["HTTP_SOAK_SEED"] ?? "") ?? UInt64.random(in: 0...UInt64.max)
        print("HTTP_SOAK_SEED=\(seed) HTTP_SOAK_ROUNDS=\(rounds)")
        var rng = SeededRandom(state: seed)
        var config = HTTPServerConfiguration()
        config.limits.maxHeaderBytes = soakHeaderBytes
        config.limits.maxBodyBytes = soakBodyBytes
        config.limits.socketSendBufferBytes = 4096
        config.limits.maxRequestsPerConnection = 50
        config.limits.maxQueuedOutputBytes = 1 << 20
        let held = Mutex<[HTTPReplyWriter]>([])
        let big = [UInt8](repeating: 0x61, count: 300_000)
        let handlerSeed = Atomic<UInt64>(seed)
        let handler: HTTPHandler = { req, res in
            if req.path == "/fresh" { res.respond(HTTPReply(status: 200)); return }
            let pick = handlerSeed.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).newValue >> 58   // 0...63
            switch pick % 8 {
            case 0: held.withLock { $0.append(res) }                      // answered at the end of the round
            case 1: res.respond(HTTPReply(status: 200, body: big))
            case 2: res.respond(HTTPReply(status: 200), then: .goAway)
            case 3: res.respond(HTTPReply(status: 200), then: .close)
            case 4: DispatchQueue.global().asyncAfter(deadline: .now() + 0.05) { res.respond(HTTPReply(status: 204)) }
            default: res.respond(HTTPReply(status: 200, body: Array("ok".utf8)))
            }
        }
        // h2's cap is max(2 x body, 64 KiB); HTTP/1's head + body. Plus one read either way.
        let bound = max(soakHeaderBytes + soakBodyBytes, max(2 * soakBodyBytes, 64 << 10)) + 65536 + 1024
        try withServer(config, handler: handler) { server in
            for round in 0..<rounds {
                var clients: [RawClient] = []
                for _ in 0..<Int.random(in: 1...4, using: &rng) {
                    let c = try RawClient(port: server.localPort)
                    var small: Int32 = 4096
                    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
                    clients.append(c)
                }
                let junk = [UInt8](repeating: UInt8.random(in: 0...255, using: &rng), count: 16384)
                let deadline = Date().addingTimeInterval(0.4)
                var scripts = clients.map { _ in fragments(&rng) }
                while Date() < deadline {
                    for (i, c) in clients.enumerated() {
                        let bytes = scripts[i].isEmpty ? junk : scripts[i]
                        let n = bytes.withUnsafeBytes { send(c.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
                        if n > 0 && !scripts[i].isEmpty { scripts[i].removeFirst(n) }
                    }
                    usleep(2_000)
                }
                let m = server.metrics
                #expect(m.largestConnectionInputBytes <= bound,
                        "round \(round) (HTTP_SOAK_SEED=\(seed)): a connection held \(m.largestConnectionInputBytes) bytes")
                for r in held.withLock({ list in defer { list = [] }; return list }) { r.respond(HTTPReply(status: 204)) }
                clients = []
            }
            let fresh = try RawClient(port: server.localPort)
            try fresh.send("GET /fresh HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(fresh.readResponse() != nil, "HTTP_SOAK_SEED=\(seed): a fresh client was not answered")
            let settled = Date().addingTimeInterval(3)
            while server.metrics.bufferedInputBytes > 0 && Date() < settled { usleep(20_000) }
            // Every connection of the walk is gone: what was counted in must have been counted out.
            #expect(server.metrics.bufferedInputBytes == 0, "HTTP_SOAK_SEED=\(seed): \(server.metrics.bufferedInputBytes) bytes still counted")
        }
        for r in held.withLock({ $0 }) { r.respond(HTTPReply(status: 204)) }
    }
}
