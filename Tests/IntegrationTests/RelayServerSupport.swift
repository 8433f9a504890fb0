// Helpers for the relay-server integration tests: start the real relay-server and mock-apns
// binaries on ephemeral loopback ports with temp files, talk HTTP/1.1 to them with a tiny
// blocking client, and build ratchet-encrypted responses like an accessory.
import Foundation
import Ratchet
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

let relayRepoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// A binary from the same build directory as the test bundle (or .build/debug).
func relayBinary(_ name: String) -> String {
    let beside = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent(name).path
    if FileManager.default.isExecutableFile(atPath: beside) { return beside }
    return relayRepoRoot.appendingPathComponent(".build/debug/\(name)").path
}

struct RelayITError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// A free loopback TCP port (bound then released; good enough for tests on one machine).
func relayFreePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw RelayITError("socket failed") }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard rc == 0 else { throw RelayITError("bind failed") }
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return Int(UInt16(bigEndian: addr.sin_port))
}

struct RelayHTTPReply {
    var status: Int
    var headers: [String: String]
    var body: [UInt8]
    var text: String { String(decoding: body, as: UTF8.self) }
    var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any]) ?? [:] }
}

/// One HTTP/1.1 request on a fresh connection (Connection: close). Times out after `timeout`.
/// A blocking TCP connection to 127.0.0.1:`port` whose reads and writes time out after
/// `timeout` seconds; the caller closes it.
func relayConnect(_ port: Int, timeout: Int) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw RelayITError("socket failed") }
    var tv = timeval(tv_sec: timeout, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = in_port_t(UInt16(port).bigEndian)
    let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard rc == 0 else {
        let e = errno
        close(fd)
        throw RelayITError("connect to \(port) failed: errno \(e)")
    }
    return fd
}

func relayHTTP(_ port: Int, _ method: String, _ path: String, headers: [(String, String)] = [], body: [UInt8] = [], timeout: Int = 10) throws -> RelayHTTPReply {
    let fd = try relayConnect(port, timeout: timeout)
    defer { close(fd) }
    var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
    for (n, v) in headers { head += "\(n): \(v)\r\n" }
    if !body.isEmpty || method == "POST" { head += "Content-Length: \(body.count)\r\n" }
    head += "\r\n"
    let out = Array(head.utf8) + body
    var sent = 0
    while sent < out.count {
        let n = out[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard n > 0 else { throw RelayITError("send failed: errno \(errno)") }
        sent += n
    }
    var data: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n == 0 { break }
        if n < 0 {
            if errno == EINTR { continue }
            if data.isEmpty { throw RelayITError("recv failed: errno \(errno)") }
            break
        }
        data += buf[0..<n]
        if let reply = parseReply(data) { return reply }
    }
    guard let reply = parseReply(data, complete: true) else { throw RelayITError("malformed or missing HTTP response (\(data.count) bytes)") }
    return reply
}

private func parseReply(_ data: [UInt8], complete: Bool = false) -> RelayHTTPReply? {
    let sep: [UInt8] = [13, 10, 13, 10]
    guard let end = (0..<max(0, data.count - 3)).first(where: { Array(data[$0..<$0 + 4]) == sep }) else { return nil }
    let head = String(decoding: data[0..<end], as: UTF8.self).components(separatedBy: "\r\n")
    let parts = head[0].split(separator: " ")
    guard parts.count >= 2, let status = Int(parts[1]) else { return nil }
    var headers: [String: String] = [:]
    for line in head.dropFirst() {
        guard let c = line.firstIndex(of: ":") else { continue }
        headers[line[..<c].lowercased()] = line[line.index(after: c)...].trimmingCharacters(in: .whitespaces)
    }
    let bodyStart = end + 4
    if let cl = headers["content-length"].flatMap(Int.init) {
        guard data.count >= bodyStart + cl else { return nil }
        return RelayHTTPReply(status: status, headers: headers, body: Array(data[bodyStart..<bodyStart + cl]))
    }
    return complete ? RelayHTTPReply(status: status, headers: headers, body: Array(data[bodyStart...])) : nil
}

/// A child process whose stderr is collected; killed (SIGKILL) when the value dies if still running.
final class RelayChild: @unchecked Sendable {
    // @unchecked Sendable: `process` is set in init; the log buffer is behind its own Mutex.
    let process = Process()
    let name: String
    private let log = RelayLogBuffer()
    private var errPipe: Pipe?
    /// Signalled by the stderr reader at EOF (nil without one).
    private var stderrRead: DispatchSemaphore?

    /// `readStderr: false` leaves stderr a pipe nobody reads (it fills at 64 KiB); what it
    /// holds is read only after the process exited.
    init(_ path: String, _ arguments: [String], name: String, environment: [String: String] = [:], readStderr: Bool = true) throws {
        self.name = name
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "NOTIFY_SOCKET")
        for (k, v) in environment { env[k] = v }
        process.environment = env
        let err = Pipe()
        errPipe = err
        process.standardError = err
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        guard readStderr else { return }
        // A thread of its own reads to EOF, and `wait` waits for that EOF: with a
        // readabilityHandler, wait() could look while the handler held a chunk it had read but
        // not yet appended (under load: the start-up error line missing from stderr).
        let log = self.log
        let done = DispatchSemaphore(value: 0)
        stderrRead = done
        let fd = err.fileHandleForReading.fileDescriptor
        Thread.detachNewThread { [err] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = read(fd, &buffer, buffer.count)
                if n > 0 { log.bytes.withLock { $0 += buffer[0..<n] }; continue }
                if n < 0 && errno == EINTR { continue }
                break
            }
            withExtendedLifetime(err) {}   // the pipe (and `fd`) stays open until EOF
            done.signal()
        }
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    var pid: Int32 { process.processIdentifier }
    var stderr: String { log.bytes.withLock { String(decoding: $0, as: UTF8.self) } }
    var isRunning: Bool { process.isRunning }

    func signal(_ sig: Int32) { kill(process.processIdentifier, sig) }

    /// Waits (bounded) until /readyz on `adminPort` answers 200. The error names what /readyz
    /// last said and what the process logged, so a start that is only slow under load can be
    /// told from one that is stuck.
    func waitReady(adminPort: Int, seconds: Double = 20) throws {
        var last = "no answer"
        do {
            try relayEventually("\(name) ready", seconds: seconds) {
                guard isRunning else { throw RelayITError("\(name) exited: \(stderr)") }
                let r = try relayHTTP(adminPort, "GET", "/readyz")
                last = "\(r.status) \(r.text)"
                return r.status == 200
            }
        } catch {
            throw RelayITError("\(error); /readyz last answered: \(last); stderr: \(stderr)")
        }
    }

    /// Waits for exit up to `seconds`; returns the exit status or nil on timeout.
    func wait(seconds: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { return nil }
        process.waitUntilExit()
        drainStderr()
        return process.terminationStatus
    }

    /// After exit: everything the process wrote to stderr is in `stderr` when this returns
    /// (bounded: a descendant still holding the pipe open would keep it from ending).
    private func drainStderr() {
        if let done = stderrRead {
            _ = done.wait(timeout: .now() + 30)
            stderrRead = nil
        } else if let h = errPipe?.fileHandleForReading {
            let rest = h.readDataToEndOfFile()
            if !rest.isEmpty { log.bytes.withLock { $0 += rest } }
        }
        errPipe = nil
    }
}

/// Polls `cond` every 20 ms up to `seconds` (waiting for another process to reach a state; the
/// test fails on timeout rather than asserting any duration).
func relayEventually(_ what: String, seconds: Double = 20, _ cond: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if (try? cond()) == true { return }
        usleep(20_000)
    }
    throw RelayITError("timed out waiting for: \(what)")
}

/// An accessory: sealing responses with its sending ratchet like the firmware would.
final class TestAccessory {
    let rootSecretHex: String
    let keyID: [UInt8]
    let pushToken: String
    let session = UUID()
    private var ratchet: SendingRatchet

    init(pushToken: String? = nil) {
        let secret = SecretKey(random: 32)
        rootSecretHex = secret.withUnsafeBytes { Array($0) }.hexString
        keyID = (0..<4).map { _ in UInt8.random(in: 0...255) }
        self.pushToken = pushToken ?? (0..<32).map { _ in UInt8.random(in: 0...255) }.hexString
        ratchet = SendingRatchet(rootSecret: secret)
    }

    var keyIDBase64: String { Data(keyID).base64EncodedString() }

    /// The next ingest body (JSON bytes) and its message index.
    func nextBody(action: String = "reply", userText: String? = "on my way") throws -> (body: [UInt8], index: UInt32) {
        let (index, key) = try ratchet.nextMessageKey { _ in }
        let plaintext = try NotificationResponseBody(notificationIdentifier: "n-\(index)", sourceIdentifier: "com.example.relay-test",
                                                     actionIdentifier: action, userText: userText).encoded()
        let sealed = try AESGCM.seal(plaintext, key: key)
        return (ingestBody(index: index, sealed: sealed), index)
    }

    func ingestBody(index: UInt32, sealed: [UInt8]) -> [UInt8] {
        Array(#"{"pushToken":"\#(pushToken)","sessionIdentifier":"\#(session.uuidString)","keyID":"\#(keyIDBase64)","messageIndex":\#(index),"encryptedData":"\#(Data(sealed).base64EncodedString())"}"#.utf8)
    }
}

/// mock-apns + relay-server on ephemeral ports in a temp directory.
final class RelayHarness {
    static let bundleID = "com.example.relay-test"
    static let apnsKeyID = "TESTKEY001"
    static let teamID = "TESTTEAM01"

    let dir: String
    let accessory: TestAccessory
    var mock: RelayChild?
    var relay: RelayChild?
    var mockPort = 0
    var controlPort = 0
    var relayPort = 0
    var adminPort = 0
    var credential = ""
    var extraConfig: [String: String]
    /// Extra members of the "listen" object, e.g. `"tls":{...}` (RelayServerTLSTests).
    var listenExtra = ""
    /// Members of an "events" object (none when empty), e.g. `"webhooks":[...]` (EventsEndToEndTests).
    var eventsConfig = ""

    /// `dispatch`/`ingest` overrides are raw JSON object bodies merged into the config.
    init(dispatch: String = "", ingest: String = "", mockFaults: [String] = [], accessory: TestAccessory = TestAccessory()) throws {
        dir = NSTemporaryDirectory() + "relay-it-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        self.accessory = accessory
        extraConfig = ["dispatch": dispatch, "ingest": ingest]
        try run("/bin/sh", ["-c", "openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out '\(dir)/apns.p8'"])
        try startMock(faults: mockFaults)
        relayPort = try relayFreePort()
        adminPort = try relayFreePort()
        try writeConfig()
    }

    deinit {
        relay = nil
        mock = nil
        try? FileManager.default.removeItem(atPath: dir)
    }

    var dbPath: String { dir + "/relay.db" }

    func run(_ exe: String, _ args: [String]) throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: exe)
        p.arguments = args
        p.standardError = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw RelayITError("\(exe) \(args) exited \(p.terminationStatus)") }
    }

    func startMock(faults: [String] = []) throws {
        mockPort = try relayFreePort()
        controlPort = try relayFreePort()
        var args = ["--listen", "127.0.0.1:\(mockPort)", "--control", "127.0.0.1:\(controlPort)", "--generate-tls", "--ca-out", dir + "/ca.pem",
                    "--token-key", "\(Self.apnsKeyID):\(Self.teamID):\(dir)/apns.p8", "--bundle-id", Self.bundleID,
                    "--root-secret", "\(accessory.keyIDBase64):\(accessory.rootSecretHex)"]
        for f in faults { args += ["--fault", f] }
        try? FileManager.default.removeItem(atPath: dir + "/ca.pem")
        mock = try RelayChild(relayBinary("mock-apns"), args, name: "mock-apns")
        try relayEventually("mock-apns control port") { try relayHTTP(controlPort, "GET", "/stats").status == 200 }
    }

    func writeConfig() throws {
        let config = """
            {"listen":{"host":"127.0.0.1","port":\(relayPort)\(listenExtra.isEmpty ? "" : "," + listenExtra)},"admin":{"host":"127.0.0.1","port":\(adminPort)},
             "store":{"path":"relay.db","synchronous":"FULL"},
             "ingest":{\(extraConfig["ingest"] ?? "")},
             "dispatch":{\(extraConfig["dispatch"] ?? "")},
             "apps":[{"bundleID":"\(Self.bundleID)","environment":"custom","url":"https://127.0.0.1:\(mockPort)","caFile":"ca.pem",
                      "token":{"p8Path":"apns.p8","keyID":"\(Self.apnsKeyID)","teamID":"\(Self.teamID)"}}],
             \(eventsConfig.isEmpty ? "" : "\"events\":{\(eventsConfig)},")
             "log":{"format":"json","level":"debug"}}
            """
        try config.write(toFile: dir + "/relay.json", atomically: true, encoding: .utf8)
    }

    /// Starts relay-server and waits for /readyz.
    func startRelay(readStderr: Bool = true) throws {
        let child = try RelayChild(relayBinary("relay-server"), ["--config", dir + "/relay.json"], name: "relay-server", readStderr: readStderr)
        relay = child
        try child.waitReady(adminPort: adminPort)
        if credential.isEmpty { credential = try createCredential(apps: [Self.bundleID]) }
    }

    /// Creates a credential with the same format and hash as RelayCore, through sqlite3 (the
    /// integration target links only Ratchet; relayctl's `credentials create` comes later).
    func createCredential(apps: [String], name: String = "test") throws -> String {
        let secret = "rk_" + Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        let hash = relaySHA256Hex(secret)
        let id = "cred_" + (0..<6).map { _ in UInt8.random(in: 0...255) }.hexString
        try run("/usr/bin/sqlite3", [dbPath, ".timeout 5000",
                                     "INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ('\(id)', '\(name)', X'\(hash)', '\(apps.joined(separator: ","))', \(Int(Date().timeIntervalSince1970 * 1000)))"])
        return secret
    }

    func sql(_ query: String) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        p.arguments = [dbPath, ".timeout 5000", query]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let d = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return String(decoding: d, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func post(_ body: [UInt8], credential: String? = nil, contentType: String = "application/json") throws -> RelayHTTPReply {
        var headers = [("Content-Type", contentType)]
        if let c = credential ?? (self.credential.isEmpty ? nil : self.credential) { headers.append(("Authorization", "Bearer \(c)")) }
        return try relayHTTP(relayPort, "POST", "/v1/responses", headers: headers, body: body)
    }

    func get(_ id: String, credential: String? = nil) throws -> RelayHTTPReply {
        try relayHTTP(relayPort, "GET", "/v1/responses/\(id)", headers: [("Authorization", "Bearer \(credential ?? self.credential)")])
    }

    func deliveries() throws -> [[String: Any]] {
        let r = try relayHTTP(controlPort, "GET", "/deliveries")
        let any = try JSONSerialization.jsonObject(with: Data(r.body))
        if let a = any as? [[String: Any]] { return a }
        if let o = any as? [String: Any], let a = o["deliveries"] as? [[String: Any]] { return a }
        return []
    }

    func clearFaults() throws {
        let r = try relayHTTP(controlPort, "DELETE", "/faults")
        guard r.status / 100 == 2 else { throw RelayITError("DELETE /faults -> \(r.status) \(r.text)") }
    }

    func setFaults(_ json: String) throws {
        let r = try relayHTTP(controlPort, "POST", "/faults", headers: [("Content-Type", "application/json")], body: Array(json.utf8))
        guard r.status / 100 == 2 else { throw RelayITError("POST /faults -> \(r.status) \(r.text)") }
    }
}

func relaySHA256Hex(_ s: String) -> String {
    // openssl keeps the integration target free of a crypto dependency beyond Ratchet.
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
    p.arguments = ["dgst", "-sha256", "-r"]
    let input = Pipe(), out = Pipe()
    p.standardInput = input
    p.standardOutput = out
    try? p.run()
    input.fileHandleForWriting.write(Data(s.utf8))
    try? input.fileHandleForWriting.close()
    let d = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return String(String(decoding: d, as: UTF8.self).prefix(64))
}

/// Ids collected by several client threads.
final class RelayIDList: Sendable {
    private let list = Mutex<[String]>([])
    func append(_ s: String) { list.withLock { $0.append(s) } }
    var count: Int { list.withLock { $0.count } }
    var items: [String] { list.withLock { $0 } }
}

final class RelayLogBuffer: Sendable {
    let bytes = Mutex<[UInt8]>([])
}
