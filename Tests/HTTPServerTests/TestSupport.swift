// Loopback helpers for the server tests: a raw-socket HTTP/1.1 client that can send arbitrary
// bytes and tell a closed connection from a silent one, and a scoped server starter.
import Foundation
import HTTPServer
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

struct TestError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Starts a server on an ephemeral loopback port, runs `body`, and always shuts it down.
func withServer<R>(_ configuration: HTTPServerConfiguration = HTTPServerConfiguration(),
                   handler: @escaping HTTPHandler = echoHandler,
                   _ body: (HTTPServer) throws -> R) throws -> R {
    let server = try HTTPServer(configuration: configuration, handler: handler)
    try server.start()
    defer { server.stop(grace: .milliseconds(500)) }
    return try body(server)
}

/// Answers `<METHOD> <target> <body length> <connection id>` so tests can see what arrived.
let echoHandler: HTTPHandler = { req, res in
    var h = HTTPHeaders()
    h.add("x-connection-id", String(req.connectionID))
    h.add("x-stream-id", String(req.streamID))
    if req.path == "/echo" {
        res.respond(HTTPReply(status: 200, headers: h, body: req.body))
    } else {
        res.respond(HTTPReply(status: 200, headers: h, body: Array("\(req.method) \(req.target) \(req.body.count)".utf8)))
    }
}

struct ParsedResponse {
    var status: Int
    var headers: [(String, String)]
    var body: [UInt8]
    func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }
    var text: String { String(decoding: body, as: UTF8.self) }
}

final class RawClient {
    let fd: Int32
    private var buffer: [UInt8] = []

    /// `from`: a local IPv4 address to connect from (any 127.x.y.z works on loopback).
    init(port: Int, host: String = "127.0.0.1", from source: String? = nil, timeoutSeconds: Int = 5) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestError("socket failed") }
        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            inet_pton(AF_INET, source, &local.sin_addr)
            let brc = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            // No close here: every stored property is set, so a throw still runs deinit, which
            // closes fd. Closing it here too closed whatever another test had opened under the
            // same number in between (a server's listener: its loop then spun on EINVAL).
            guard brc == 0 else { throw TestError("bind \(source) failed: errno \(errno)") }
        }
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        inet_pton(AF_INET, host, &addr.sin_addr)
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard rc == 0 else { throw TestError("connect to \(port) failed: errno \(errno)") }   // deinit closes fd
    }

    deinit { close(fd) }

    func setReceiveTimeout(milliseconds: Int) {
        var tv = timeval(tv_sec: milliseconds / 1000, tv_usec: Int((milliseconds % 1000) * 1000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    func send(_ text: String) throws { try send(Array(text.utf8)) }

    func send(_ bytes: [UInt8]) throws {
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw TestError("send failed: errno \(errno)") }
            off += n
        }
    }

    enum ReadResult { case data, closed, timeout }

    /// One recv into the buffer.
    private func fill() -> ReadResult {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n > 0 {
            buffer.append(contentsOf: chunk[0..<n])
            return .data
        }
        if n == 0 { return .closed }
        if errno == EAGAIN || errno == EWOULDBLOCK { return .timeout }
        return .closed   // ECONNRESET counts as closed
    }

    /// Reads one response (Content-Length framed, or bodyless statuses). Nil if the connection
    /// closed or timed out first.
    func readResponse(headOnly: Bool = false) -> ParsedResponse? {
        while true {
            if let r = tryParse(headOnly: headOnly) { return r }
            if fill() != .data { return nil }
        }
    }

    private func tryParse(headOnly: Bool) -> ParsedResponse? {
        let sep: [UInt8] = [13, 10, 13, 10]
        guard buffer.count >= 4, let end = (0...(buffer.count - 4)).first(where: { Array(buffer[$0..<$0 + 4]) == sep }) else {
            return nil
        }
        let head = String(decoding: buffer[0..<end], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else { return nil }
        var headers: [(String, String)] = []
        for l in lines {
            guard let c = l.firstIndex(of: ":") else { continue }
            headers.append((String(l[..<c]), l[l.index(after: c)...].trimmingCharacters(in: .whitespaces)))
        }
        let length = headOnly ? 0 : (headers.first { $0.0.lowercased() == "content-length" }.flatMap { Int($0.1) } ?? 0)
        guard buffer.count >= end + 4 + length else { return nil }
        let body = Array(buffer[(end + 4)..<(end + 4 + length)])
        buffer.removeFirst(end + 4 + length)
        return ParsedResponse(status: status, headers: headers, body: body)
    }

    /// True if the peer closes within the receive timeout (any bytes before the close are kept).
    func waitForClose() -> Bool {
        while true {
            switch fill() {
            case .data: continue
            case .closed: return true
            case .timeout: return false
            }
        }
    }

    var pendingBytes: [UInt8] { buffer }

    /// How the connection ended: 0 for a clean EOF (FIN), the errno for a reset or other error,
    /// EAGAIN if it did not end within the receive timeout. Bytes before the end are kept.
    func readUntilEnd() -> Int32 {
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 { buffer.append(contentsOf: chunk[0..<n]); continue }
            return n == 0 ? 0 : errno
        }
    }
}

/// Runs a CLI tool, capturing stdout+stderr; nil if the tool is not installed.
func runTool(_ name: String, _ args: [String], timeout: TimeInterval = 60) throws -> (status: Int32, output: String)? {
    guard let path = findTool(name) else { return nil }
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = args
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = pipe
    try p.run()
    let deadline = Date().addingTimeInterval(timeout)
    var data = Data()
    let handle = pipe.fileHandleForReading
    // Read on this thread until EOF; kill on timeout from a watchdog.
    let watchdog = DispatchWorkItem { if p.isRunning { p.terminate() } }
    DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: watchdog)
    data = handle.readDataToEndOfFile()
    p.waitUntilExit()
    watchdog.cancel()
    _ = deadline
    return (p.terminationStatus, String(decoding: data, as: UTF8.self))
}

func findTool(_ name: String) -> String? {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin"] {
        let p = "\(dir)/\(name)"
        if FileManager.default.isExecutableFile(atPath: p) { return p }
    }
    return nil
}

func missingToolMessage(_ name: String) -> String {
    "\(name) is not installed (run `make deps`): skipping"
}

/// The writers a holding handler collected, once there are `count` of them (or what there is
/// after 5 s).
func heldWriters(_ held: borrowing Mutex<[HTTPReplyWriter]>, count: Int) -> [HTTPReplyWriter] {
    var writers: [HTTPReplyWriter] = []
    for _ in 0..<500 where writers.count < count {
        usleep(10_000)
        writers = held.withLock { $0 }
    }
    return writers
}
