// Streams the server refuses unprocessed, forced deterministically by a scripted h2c server
// written byte by byte (RFC 9113 framing; the only header block it sends is ":status: 200" as
// the one-byte HPACK static index 0x88). mock-apns cannot produce these: its server names every
// stream it received in its GOAWAY.
import Foundation
import Synchronization
import Testing
import TestSupport
@testable import PushClient

/// A loopback h2c server that answers requests by script. Each accepted connection runs on its
/// own thread with blocking reads.
final class ScriptedH2Server: @unchecked Sendable {
    // @unchecked: `listener` and `script` are immutable; `log` is a Mutex.
    enum Script {
        /// Connection 1: wait for `burst` complete requests, answer the first `answered` of
        /// them, then GOAWAY(last-stream-id = the last answered stream). Later connections:
        /// answer everything.
        case goAway(burst: Int, answered: Int)
        /// Answer everything, except the `nth` request on connection 1: RST_STREAM(REFUSED_STREAM).
        case refuse(nth: Int)
    }
    struct Log {
        /// Requests answered 200, per connection (index = accept order).
        var answered: [Int] = []
        /// Requests that arrived on connection 1 after its GOAWAY (must stay 0).
        var afterGoAway = 0
        var refused = 0
    }
    private let listener: LoopbackListener
    private let script: Script
    let log = Mutex(Log())
    var port: Int { listener.port }

    init(_ script: Script) throws {
        self.script = script
        listener = try LoopbackListener()
        listener.acceptInBackground { [self] fd in
            let n = log.withLock { $0.answered.append(0); return $0.answered.count - 1 }
            Thread { [self] in serve(fd, connection: n) }.start()
        }
    }

    func close() { listener.close() }

    private func frame(_ type: UInt8, _ flags: UInt8, _ stream: Int32, _ payload: [UInt8] = []) -> [UInt8] {
        let n = payload.count
        return [UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff), type, flags,
                UInt8(stream >> 24 & 0x7f), UInt8(stream >> 16 & 0xff), UInt8(stream >> 8 & 0xff), UInt8(stream & 0xff)] + payload
    }

    private func be32(_ v: UInt32) -> [UInt8] { [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)] }

    private func serve(_ fd: Int32, connection: Int) {
        defer { Glibc.close(fd) }
        func readExactly(_ n: Int) -> [UInt8]? {
            var buf = [UInt8](repeating: 0, count: n)
            var got = 0
            while got < n {
                let r = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, n - got) }
                if r <= 0 { return nil }
                got += r
            }
            return buf
        }
        func send(_ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } }
        func answer(_ stream: Int32) {
            send(frame(0x1, 0x5, stream, [0x88]))   // HEADERS, END_STREAM|END_HEADERS, ":status: 200"
            log.withLock { $0.answered[connection] += 1 }
        }
        guard readExactly(24) != nil else { return }   // client preface
        send(frame(0x4, 0, 0, [0x00, 0x03] + be32(100)))   // SETTINGS: MAX_CONCURRENT_STREAMS 100
        var complete: [Int32] = []
        var goAwaySent = false
        var seen = 0
        while let head = readExactly(9) {
            let length = Int(head[0]) << 16 | Int(head[1]) << 8 | Int(head[2])
            let type = head[3], flags = head[4]
            let stream = Int32(head[5] & 0x7f) << 24 | Int32(head[6]) << 16 | Int32(head[7]) << 8 | Int32(head[8])
            guard let payload = readExactly(length) else { return }
            switch type {
            case 0x4 where flags & 0x1 == 0: send(frame(0x4, 0x1, 0))                 // SETTINGS -> ACK
            case 0x6 where flags & 0x1 == 0: send(frame(0x6, 0x1, 0, payload))        // PING -> ACK
            case 0x0 where flags & 0x1 != 0, 0x1 where flags & 0x1 != 0:                 // request complete
                seen += 1
                if goAwaySent {
                    log.withLock { $0.afterGoAway += 1 }
                    continue
                }
                switch script {
                case .goAway(let burst, let answered) where connection == 0:
                    complete.append(stream)
                    if complete.count == burst {
                        for s in complete.prefix(answered) { answer(s) }
                        send(frame(0x7, 0, 0, be32(UInt32(complete[answered - 1])) + be32(0)))   // GOAWAY NO_ERROR
                        goAwaySent = true
                    }
                case .refuse(let nth) where connection == 0 && seen == nth:
                    send(frame(0x3, 0, stream, be32(0x7)))   // RST_STREAM REFUSED_STREAM
                    log.withLock { $0.refused += 1 }
                default:
                    answer(stream)
                }
            default: break
            }
        }
    }
}

@Suite(.serialized) struct RefusedStreamTests {
    /// GOAWAY naming only the first 2 of 6 streams: the 4 above it were not processed, so they go
    /// out again on a new connection. Every push is delivered, and the server processed exactly
    /// 6 requests: nothing was sent twice.
    @Test func streamsAboveGoAwayAreRetriedOnANewConnection() throws {
        let server = try ScriptedH2Server(.goAway(burst: 6, answered: 2))
        defer { server.close() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "http://127.0.0.1:\(server.port)"),
                                                         credentials: try tokenCredentials(dir), connections: 1))
        defer { client.shutdown() }
        let requests = (0..<6).map { push(index: UInt32($0)) }
        let results = sendAll(client, requests, upTo: 15)
        #expect(results.allSatisfy { $0.map(isDelivered) == true }, "\(results)")
        let log = server.log.withLock { $0 }
        #expect(log.answered == [2, 4])
        #expect(log.afterGoAway == 0)
        #expect(client.engineStats.refusedRetries == 4)
    }

    /// RST_STREAM(REFUSED_STREAM) on one stream: that push is sent again (the connection stays),
    /// and the server processes each push once.
    @Test func refusedStreamIsRetried() throws {
        let server = try ScriptedH2Server(.refuse(nth: 2))
        defer { server.close() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "http://127.0.0.1:\(server.port)"),
                                                         credentials: try tokenCredentials(dir), connections: 1))
        defer { client.shutdown() }
        let results = sendAll(client, (0..<5).map { push(index: UInt32($0)) }, upTo: 15)
        #expect(results.allSatisfy { $0.map(isDelivered) == true }, "\(results)")
        let log = server.log.withLock { $0 }
        #expect(log.refused == 1)
        #expect(log.answered == [5])
        #expect(client.engineStats.refusedRetries == 1)
    }
}
