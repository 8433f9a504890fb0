// relayctl accessory send against a scripted fake relay on loopback (HTTP/1.1): retries reuse the
// index and the sealed bytes, the state file is advanced before each message leaves, 409 is final;
// send-test goes through the same sender.
import Foundation
import Testing
import TestSupport

/// Answers each request with the next scripted (status, extra header) and records what it got,
/// together with the state file's sending index at the moment the request arrived.
private final class FakeRelay: @unchecked Sendable {
    // @unchecked Sendable: `script`, `received` are only touched under `lock`.
    struct Received { var json: [String: Any]; var nextIndexOnDisk: Int; var authorization: String }
    let listener: LoopbackListener
    private let lock = NSLock()
    private var script: [(Int, String)]
    private var received: [Received] = []
    private let statePath: String

    init(statePath: String, script: [(Int, String)]) throws {
        listener = try LoopbackListener()
        self.statePath = statePath
        self.script = script
        // The accept thread holds the fake until `listener.close()`, which every test defers.
        listener.acceptInBackground { [self] fd in serve(fd) }
    }

    var requests: [Received] { lock.lock(); defer { lock.unlock() }; return received }

    /// One connection: its request, the next scripted answer, close.
    private func serve(_ fd: Int32) {
        var data = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        var request: (headers: String, body: [UInt8])?
        while request == nil {
            let n = read(fd, &buffer, buffer.count)
            guard n > 0 else { break }
            data += buffer[0..<n]
            if let end = data.indices.dropLast(3).first(where: { data[$0] == 13 && data[$0 + 1] == 10 && data[$0 + 2] == 13 && data[$0 + 3] == 10 }) {
                let headers = String(decoding: data[0..<end], as: UTF8.self)
                let length = headers.split(separator: "\r\n").compactMap { line -> Int? in
                    let p = line.split(separator: ":", maxSplits: 1)
                    return p.count == 2 && p[0].lowercased() == "content-length" ? Int(p[1].trimmingCharacters(in: .whitespaces)) : nil
                }.first ?? 0
                if data.count >= end + 4 + length { request = (headers, Array(data[(end + 4)..<(end + 4 + length)])) }
            }
        }
        if let request {
            let state = (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: statePath)))) as? [String: Any]
            // `accessory send` keeps its ratchet under "sending", `send-test` under "ratchet".
            let onDisk = (((state?["sending"] ?? state?["ratchet"]) as? [String: Any])?["nextIndex"] as? Int) ?? -1
            let auth = request.headers.split(separator: "\r\n").first { $0.lowercased().hasPrefix("authorization:") }.map(String.init) ?? ""
            lock.lock()
            received.append(Received(json: (try? JSONSerialization.jsonObject(with: Data(request.body))) as? [String: Any] ?? [:],
                                     nextIndexOnDisk: onDisk, authorization: auth))
            let (status, extra) = script.isEmpty ? (500, "") : script.removeFirst()
            lock.unlock()
            let body = status == 409 ? #"{"error":"conflict","field":"messageIndex"}"# : #"{"id":"00000000-0000-0000-0000-000000000001","state":"queued"}"#
            let response = "HTTP/1.1 \(status) X\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\(extra)\r\n\(body)"
            _ = Array(response.utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        }
        close(fd)
    }
}

private func pairedState() throws -> String {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("accessory-send-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    let path = dir.appendingPathComponent("acc.json").path
    let r = try Relayctl.run(["accessory", "pair", "--ciphersuite", "xwing", "--out", path])
    #expect(r.status == 0, "\(r.stderr)")
    return path
}

@Suite("relayctl accessory send (built binary, fake relay)", .serialized)
struct RelayctlAccessorySendTests {
    @Test("503 and 429 are retried with the same index and bytes; the state is on disk first; 200 and 202 are accepted")
    func retriesReuseTheIndex() throws {
        let state = try pairedState()
        let relay = try FakeRelay(statePath: state, script: [(503, ""), (429, "Retry-After: 0\r\n"), (202, ""), (200, "")])
        defer { relay.listener.close() }
        let r = try Relayctl.run(["accessory", "send", "--state", state, "--url", "http://127.0.0.1:\(relay.listener.port)",
                                  "--credential", "rk_test", "--count", "2", "--json"])
        #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
        let got = relay.requests
        try #require(got.count == 4)
        #expect(got.map { $0.json["messageIndex"] as? Int } == [0, 0, 0, 1])
        #expect(Set(got[0..<3].map { $0.json["encryptedData"] as? String ?? "" }).count == 1, "a retry re-sends the same sealed bytes")
        #expect(got[3].json["encryptedData"] as? String != got[0].json["encryptedData"] as? String)
        for request in got { #expect(request.nextIndexOnDisk == (request.json["messageIndex"] as! Int) + 1, "state persisted before sending") }
        #expect(got.allSatisfy { $0.authorization == "Authorization: Bearer rk_test" })
        let saved = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: state))) as? [String: Any])
        #expect(got[0].json["keyID"] as? String == saved["keyID"] as? String)
        #expect(got[0].json["pushToken"] as? String == saved["pushToken"] as? String)
    }

    @Test("409 is final (no retry, exit 1); the next run uses the next index, never the refused one")
    func conflictIsFinal() throws {
        let state = try pairedState()
        let relay = try FakeRelay(statePath: state, script: [(409, ""), (202, "")])
        defer { relay.listener.close() }
        let url = "http://127.0.0.1:\(relay.listener.port)"
        let first = try Relayctl.run(["accessory", "send", "--state", state, "--url", url, "--credential", "rk_test"])
        #expect(first.status == 1 && first.stdout.contains("409"), "\(first.stdout) \(first.stderr)")
        let second = try Relayctl.run(["accessory", "send", "--state", state, "--url", url, "--credential", "rk_test"])
        #expect(second.status == 0, "\(second.stderr)")
        #expect(relay.requests.map { $0.json["messageIndex"] as? Int } == [0, 1])
    }

    @Test("a redirect is not followed (to file:// or anywhere): exit 1 naming it, one request, no retry")
    func redirectIsNotFollowed() throws {
        let state = try pairedState()
        let relay = try FakeRelay(statePath: state, script: [(302, "Location: file:///etc/passwd\r\n")])
        defer { relay.listener.close() }
        let r = try Relayctl.run(["accessory", "send", "--state", state, "--url", "http://127.0.0.1:\(relay.listener.port)", "--credential", "rk_test"])
        #expect(r.status == 1 && r.stdout.contains("302") && r.stdout.contains("redirect to file:///etc/passwd not followed"), "\(r.stdout) \(r.stderr)")
        #expect(!r.stdout.contains("root:"))
        #expect(relay.requests.count == 1)
    }

    @Test("no relay: retried, then exit 1; the index stays used")
    func unreachable() throws {
        let state = try pairedState()
        let port = try freeLoopbackPort()
        let r = try Relayctl.run(["accessory", "send", "--state", state, "--url", "http://127.0.0.1:\(port)", "--credential", "rk", "--retries", "1", "--json"])
        #expect(r.status == 1)
        #expect(r.stdout.contains("\"attempts\":2"), "\(r.stdout)")
        let saved = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: state))) as? [String: Any])
        #expect((saved["sending"] as? [String: Any])?["nextIndex"] as? Int == 1)
    }

    @Test("an edited state file: wrong roots exit 1, bad key fields exit 64, each naming the file's field")
    func editedStateFile() throws {
        let state = try pairedState()
        let original = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: state))) as? [String: Any])
        let root = try #require(original["accessoryToHostRoot"] as? String)
        let flipped = (root.first == "0" ? "1" : "0") + root.dropFirst()
        for (field, value, status, fragment) in [
            ("accessoryToHostRoot", flipped, 1, "the stored ratchet roots do not match the key material"),
            ("privateKey", "zz", 64, "privateKey: not hexadecimal"),
            ("ciphersuite", "rsa", 64, "ciphersuite: expected xwing or p256, got 'rsa'"),
            ("publicKey", "00", 64, "publicKey: expected"),
        ] {
            var edited = original
            edited[field] = value
            try JSONSerialization.data(withJSONObject: edited).write(to: URL(fileURLWithPath: state))
            let r = try Relayctl.run(["accessory", "send", "--state", state, "--url", "http://127.0.0.1:1", "--credential", "rk"])
            #expect(r.status == Int32(status) && r.stderr.contains(state) && r.stderr.contains(fragment), "\(field): \(r.status) \(r.stderr)")
        }
    }

    @Test("bad input is exit 64 naming the flag")
    func badInput() throws {
        let state = try pairedState()
        for (arguments, flag) in [
            (["--url", "ftp://x"], "--url"),
            (["--url", "http://127.0.0.1:1", "--client-cert", "/etc/hostname"], "--client-key"),
            (["--url", "http://127.0.0.1:1", "--ca-file", "/does/not/exist"], "--ca-file"),
            (["--url", "http://127.0.0.1:1", "--count", "0"], "--count"),
        ] {
            let r = try Relayctl.run(["accessory", "send", "--state", state, "--credential", "rk"] + arguments)
            #expect(r.status == 64 && r.stderr.contains(flag), "\(arguments): \(r.stderr)")
        }
    }

    @Test("send-test sends through the same code: a 500 is retried with the same index and bytes, the state on disk first")
    func sendTestSharesTheSender() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("send-test-\(UUID().uuidString)").path
        let state = dir + "/ratchet.json"
        let relay = try FakeRelay(statePath: state, script: [(500, ""), (202, ""), (503, "")])
        defer { relay.listener.close() }
        let url = "http://127.0.0.1:\(relay.listener.port)"
        let rootKey = String(repeating: "0123456789abcdef", count: 4)
        let r = try Relayctl.run(["send-test", "--url", url, "--credential", "rk_test", "--root-key", rootKey, "--state-file", state, "--json"])
        #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
        let got = relay.requests
        try #require(got.count == 2)
        #expect(got.map { $0.json["messageIndex"] as? Int } == [0, 0])
        #expect(got[0].json["encryptedData"] as? String == got[1].json["encryptedData"] as? String, "a retry re-sends the same sealed bytes")
        #expect(got.allSatisfy { $0.nextIndexOnDisk == 1 }, "state persisted before sending")
        #expect(got.allSatisfy { $0.authorization == "Authorization: Bearer rk_test" })
        // --retries is the same option: 0 makes the next 503 final.
        let final = try Relayctl.run(["send-test", "--url", url, "--credential", "rk_test", "--root-key", rootKey, "--state-file", state, "--retries", "0"])
        #expect(final.status == 1 && final.stdout.contains("503"), "\(final.stdout) \(final.stderr)")
        #expect(relay.requests.count == 3)
    }
}
