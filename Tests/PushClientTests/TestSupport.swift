// Helpers shared by the PushClient tests: temp dirs, running CLI tools, throwaway keys/certs,
// loopback listeners. Everything binds 127.0.0.1 on ephemeral ports.
import Foundation
import POSIXThreads
import TestSupport
@testable import PushClient

struct ToolError: Error, CustomStringConvertible {
    let description: String
}

final class TempDir {
    let path: String
    init() throws {
        let p = NSTemporaryDirectory() + "pushclient-tests-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: p, withIntermediateDirectories: true)
        path = p
    }
    func file(_ name: String) -> String { path + "/" + name }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// Runs a tool to completion; returns (exit status, stdout+stderr).
@discardableResult
func run(_ tool: String, _ args: [String], stdin: [UInt8]? = nil) throws -> (status: Int32, output: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: tool.hasPrefix("/") ? tool : "/usr/bin/" + tool)
    p.arguments = args
    let out = Pipe()
    p.standardOutput = out
    p.standardError = out
    let input = Pipe()
    p.standardInput = input
    try p.run()
    if let stdin { input.fileHandleForWriting.write(Data(stdin)) }
    try input.fileHandleForWriting.close()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: data, as: UTF8.self))
}

/// A fresh P-256 key as Apple ships .p8 files (PKCS#8 PEM), plus its public key PEM.
func makeP8(in dir: TempDir) throws -> (p8Path: String, publicPath: String) {
    let key = dir.file("AuthKey.p8"), pub = dir.file("pub.pem")
    let a = try run("openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key])
    guard a.status == 0 else { throw ToolError(description: a.output) }
    let b = try run("openssl", ["pkey", "-in", key, "-pubout", "-out", pub])
    guard b.status == 0 else { throw ToolError(description: b.output) }
    return (key, pub)
}

/// Self-signed server certificate for 127.0.0.1 (it is its own CA file).
func makeServerCert(in dir: TempDir) throws -> (cert: String, key: String) {
    let cert = dir.file("server.pem"), key = dir.file("server.key")
    let r = try run("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                                "-addext", "subjectAltName=IP:127.0.0.1"])
    guard r.status == 0 else { throw ToolError(description: r.output) }
    return (cert, key)
}

func base64URLDecode(_ s: some StringProtocol) -> [UInt8]? {
    var t = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while t.count % 4 != 0 { t += "=" }
    return Data(base64Encoded: t).map(Array.init)
}

/// DER ECDSA-Sig-Value from JOSE r||s, written independently of the client's d2i path.
func derSignature(raw: [UInt8]) -> [UInt8] {
    func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        var v = Array(bytes.drop(while: { $0 == 0 }))
        if v.isEmpty { v = [0] }
        if v[0] & 0x80 != 0 { v.insert(0, at: 0) }
        return [0x02, UInt8(v.count)] + v
    }
    let body = integer(raw[0..<32]) + integer(raw[32..<64])
    return [0x30, UInt8(body.count)] + body
}

/// A TCP listener that accepts connections and never writes a byte: the "dead server".
final class SilentListener: @unchecked Sendable {
    // @unchecked: `socket` is immutable and closes itself safely; `accepted` is guarded by `lock`.
    private let socket: LoopbackListener
    var fd: Int32 { socket.fd }
    var port: Int { socket.port }
    private var accepted: [Int32] = []
    private let lock = NSLock()

    init() throws {
        socket = try LoopbackListener()
        socket.acceptInBackground { [self] c in lock.lock(); accepted.append(c); lock.unlock() }
    }

    var acceptedCount: Int { lock.lock(); defer { lock.unlock() }; return accepted.count }

    /// Stops accepting (the accept thread is gone when it returns), then closes what it accepted.
    func close() {
        socket.close()
        lock.lock(); for c in accepted { Glibc.close(c) }; accepted.removeAll(); lock.unlock()
    }
}

/// Picks a free loopback port for tools that cannot bind port 0 themselves (nghttpd).
func freePort() throws -> Int { try freeLoopbackPort() }

/// `nghttpd` serving a docroot in which POST /3/device/<token> answers 200 when the file
/// exists and 404 otherwise.
final class NGHTTPD {
    let process = Process()
    let port: Int
    let dir: TempDir
    let caFile: String

    init(tokens: [String], tls: Bool = true) throws {
        dir = try TempDir()
        let root = dir.file("root/3/device")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        for t in tokens { _ = FileManager.default.createFile(atPath: root + "/" + t, contents: Data()) }
        let (cert, key) = try makeServerCert(in: dir)
        caFile = cert
        port = try freePort()
        process.executableURL = URL(fileURLWithPath: "/usr/sbin/nghttpd")
        process.arguments = ["-a", "127.0.0.1", "-d", dir.file("root")] + (tls ? ["\(port)", key, cert] : ["--no-tls", "\(port)"])
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Wait until it accepts (bounded: 5 s).
        for _ in 0..<500 {
            if canConnect(port: port) { return }
            usleep(10_000)
        }
        throw ToolError(description: "nghttpd did not start on \(port)")
    }

    var url: String { "https://127.0.0.1:\(port)" }

    func stop() {
        // nghttpd ignores SIGTERM/SIGINT when started from the test runner: KILL it.
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}

func canConnect(port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = UInt16(port).bigEndian
    return withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}

func samplePayload(bytes: Int = 48, index: UInt32 = 7) -> AccessoryPayload {
    AccessoryPayload(encryptedData: (0..<bytes).map { UInt8($0 & 0xff) },
                     sessionIdentifier: UUID(uuidString: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F")!,
                     keyID: [0xde, 0xad, 0xbe, 0xef], messageIndex: index)
}

/// A clock tests move by hand.
final class ManualClock: PushClock, @unchecked Sendable {
    // @unchecked: `current` is guarded by `lock`.
    private let lock = NSLock()
    private var current: Date
    init(_ start: Date = Date(timeIntervalSince1970: 1_800_000_000)) { current = start }
    func now() -> Date { lock.lock(); defer { lock.unlock() }; return current }
    func advance(minutes: Double) { lock.lock(); current += minutes * 60; lock.unlock() }
}

/// A loopback TCP relay in front of a server whose existing connections can be frozen: bytes
/// stop flowing both ways but the sockets stay open (a black-holed connection, as after a
/// NAT or middlebox dropped its state). Connections accepted after `freezeExisting()` flow.
final class FreezableProxy: @unchecked Sendable {
    // @unchecked: `listener` and `target` are immutable; `frozenBefore`, `accepted`, `fds`,
    // `pumps` and `stopped` are guarded by `condition`.
    private let listener: LoopbackListener
    private let target: Int
    private let condition = Condition()
    private var accepted = 0
    private var frozenBefore = 0
    private var fds: [Int32] = []
    /// Pump threads still running: they use `fds`, which are closed only once this is 0.
    private var pumps = 0
    private var stopped = false
    var port: Int { listener.port }

    init(targetPort: Int) throws {
        listener = try LoopbackListener()
        target = targetPort
        listener.acceptInBackground { [self] c in connect(c) }
    }

    func freezeExisting() { condition.withLock { frozenBefore = accepted } }

    var connectionCount: Int { condition.withLock { accepted } }

    /// Stops accepting, wakes the pumps (shut down both ways), waits for them to leave, and only
    /// then closes the descriptors: a pump between its `stopped` check and its next read must
    /// not reach a number closed and reused meanwhile.
    func close() {
        listener.close()
        condition.lock()
        stopped = true
        for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) }
        while pumps > 0 { condition.wait() }
        let all = fds
        fds.removeAll()
        condition.unlock()
        for fd in all { Glibc.close(fd) }
    }

    private func connect(_ c: Int32) {
        let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(target).bigEndian
        let ok = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        condition.lock()
        if stopped || !ok { condition.unlock(); Glibc.close(c); Glibc.close(upstream); return }
        accepted += 1
        let serial = accepted
        fds += [c, upstream]
        pumps += 1
        condition.unlock()
        Thread { [self] in
            pump(c, upstream, serial: serial)
            condition.withLock { pumps -= 1; condition.broadcast() }
        }.start()
    }

    private func pump(_ a: Int32, _ b: Int32, serial: Int) {
        var buf = [UInt8](repeating: 0, count: 16384)
        var fds = [pollfd(fd: a, events: Int16(POLLIN), revents: 0), pollfd(fd: b, events: Int16(POLLIN), revents: 0)]
        while true {
            let (frozen, stop) = condition.withLock { (serial <= frozenBefore, stopped) }
            if stop { return }
            if frozen { usleep(20_000); continue }   // hold the bytes: nothing is read or written
            fds[0].revents = 0; fds[1].revents = 0
            if poll(&fds, 2, 50) <= 0 { continue }
            for (from, to) in [(0, 1), (1, 0)] where fds[from].revents != 0 {
                let n = read(fds[from].fd, &buf, buf.count)
                if n <= 0 { shutdown(fds[to].fd, Int32(SHUT_WR)); return }
                var off = 0
                while off < n {
                    let w = buf.withUnsafeBytes { write(fds[to].fd, $0.baseAddress! + off, n - off) }
                    if w <= 0 { return }
                    off += w
                }
            }
        }
    }
}


/// `openssl s_server` with a certificate for 127.0.0.1 and no ALPN: a TLS server that cannot
/// speak HTTP/2.
final class NoALPNServer {
    let process = Process()
    let port: Int
    let caFile: String
    private let dir: TempDir

    init() throws {
        dir = try TempDir()
        let (cert, key) = try makeServerCert(in: dir)
        caFile = cert
        port = try freePort()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", cert, "-key", key, "-quiet"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        process.standardInput = Pipe()
        try process.run()
        for _ in 0..<500 {
            if canConnect(port: port) { return }
            usleep(10_000)
        }
        stop()
        throw ToolError(description: "openssl s_server did not start on \(port)")
    }

    func stop() {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}

/// Polls `condition` every 10 ms for up to `seconds`; true as soon as it holds.
func eventually(upTo seconds: Double = 15, _ condition: () -> Bool) -> Bool {
    let end = Date() + seconds
    while Date() < end {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}
