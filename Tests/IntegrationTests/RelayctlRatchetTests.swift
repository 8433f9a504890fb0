// Drives the built `relayctl` binary's ratchet commands as a firmware developer would, checking
// its output against the frozen vectors in Tests/RatchetTests/Vectors and its exit codes
// (0 ok, 1 failed open, 64 usage).
import Foundation
import Testing

private let ratchetRepoRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// The relayctl next to the test bundle (same build directory), or $RELAYCTL.
private let relayctlPath: String = {
    if let path = ProcessInfo.processInfo.environment["RELAYCTL"] { return path }
    let besideTests = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("relayctl").path
    if FileManager.default.isExecutableFile(atPath: besideTests) { return besideTests }
    return ratchetRepoRoot.appendingPathComponent(".build/debug/relayctl").path
}()

private struct CLIResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

private func relayctl(_ arguments: String...) throws -> CLIResult {
    try relayctl(arguments)
}

private func relayctl(_ arguments: [String]) throws -> CLIResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: relayctlPath)
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Outputs here are small (< 64 KiB), so reading one pipe after the other cannot deadlock.
    let o = out.fileHandleForReading.readDataToEndOfFile()
    let e = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return CLIResult(status: process.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: e, as: UTF8.self))
}

private func jsonObject(_ text: String) throws -> [String: Any] {
    try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
}

private func frozenVectors() throws -> [String: Any] {
    let url = ratchetRepoRoot.appendingPathComponent("Tests/RatchetTests/Vectors/ratchet-vectors.json")
    return try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
}

private let key32 = String(repeating: "11", count: 32)

@Suite("relayctl ratchet (built binary)")
struct RelayctlRatchetTests {
    @Test("the binary exists")
    func binaryExists() {
        #expect(FileManager.default.isExecutableFile(atPath: relayctlPath), "build relayctl first: \(relayctlPath)")
    }

    @Test("--help works at every level and exits 0; a bare group is a usage error")
    func help() throws {
        for path in [[], ["ratchet"], ["ratchet", "step"], ["ratchet", "chain"], ["ratchet", "keyid"], ["ratchet", "seal"], ["ratchet", "open"],
                     ["ratchet", "body"], ["ratchet", "body", "encode"], ["ratchet", "body", "decode"]] {
            let r = try relayctl(path + ["--help"])
            #expect(r.status == 0, "\(path)")
            #expect(r.stdout.contains("USAGE: relayctl"), "\(path)")
            #expect(r.stdout.contains("OVERVIEW:"), "\(path)")
        }
        #expect(try relayctl("ratchet", "--help").stdout.contains("step"))
        #expect(try relayctl("ratchet", "step", "--help").stdout.contains("--chain-key <64 hex>"))
        let bare = try relayctl()
        #expect(bare.status == 64)
        #expect(bare.stderr.contains("SUBCOMMANDS"))
        #expect(try relayctl("ratchet").status == 64)
    }

    @Test("step matches the frozen single-step vectors")
    func step() throws {
        let singles = try #require(try frozenVectors()["singleSteps"] as? [[String: Any]])
        for v in singles.prefix(5) + singles.suffix(2) {
            let index = try #require(v["index"] as? Int)
            let r = try relayctl("ratchet", "step", "--chain-key", try #require(v["chainKey"] as? String), "--index", String(index), "--json")
            #expect(r.status == 0, "\(r.stderr)")
            let json = try jsonObject(r.stdout)
            #expect(json["messageKey"] as? String == v["messageKey"] as? String, "index \(index)")
            #expect(json["nextChainKey"] as? String == v["nextChainKey"] as? String, "index \(index)")
        }
        let text = try relayctl("ratchet", "step", "--chain-key", key32, "--index=3")
        #expect(text.status == 0)
        #expect(text.stdout.hasPrefix("messageKey:"))
    }

    @Test("chain matches a frozen chain")
    func chain() throws {
        let chains = try #require(try frozenVectors()["chains"] as? [[String: Any]])
        let first = try #require(chains.first)
        let expected = try #require(first["steps"] as? [[String: Any]])
        let r = try relayctl("ratchet", "chain", "--root-key", try #require(first["rootKey"] as? String), "--count", String(expected.count), "--json")
        #expect(r.status == 0, "\(r.stderr)")
        let steps = try #require(try jsonObject(r.stdout)["steps"] as? [[String: Any]])
        #expect(steps.count == expected.count)
        for (got, want) in zip(steps, expected) {
            for key in ["chainKey", "messageKey", "nextChainKey"] {
                #expect(got[key] as? String == want[key] as? String, "\(key) at \(want["index"] ?? "?")")
            }
        }
    }

    @Test("keyid prints base64 and hex of the SHA-384 prefix")
    func keyid() throws {
        let cases = try #require(try frozenVectors()["keyIDs"] as? [[String: Any]])
        for c in cases {
            let r = try relayctl("ratchet", "keyid", "--public-key", try #require(c["publicKey"] as? String), "--json")
            #expect(r.status == 0)
            let json = try jsonObject(r.stdout)
            let hex = try #require(c["keyID"] as? String)
            #expect(json["keyIDHex"] as? String == hex)
            let bytes = stride(from: 0, to: hex.count, by: 2).map { i -> UInt8 in
                let start = hex.index(hex.startIndex, offsetBy: i)
                return UInt8(hex[start..<hex.index(start, offsetBy: 2)], radix: 16)!
            }
            #expect(json["keyID"] as? String == Data(bytes).base64EncodedString())
        }
    }

    @Test("seal with the frozen nonce reproduces the worked response; open returns the body")
    func sealOpen() throws {
        let response = try #require(try frozenVectors()["response"] as? [String: Any])
        let key = try #require(response["messageKey"] as? String)
        let body = try #require(response["body"] as? String)
        let sealedHex = try #require(response["sealed"] as? String)
        let sealed = try relayctl("ratchet", "seal", "--key", key, "--plaintext", body, "--nonce", try #require(response["nonce"] as? String), "--json")
        #expect(sealed.status == 0, "\(sealed.stderr)")
        let json = try jsonObject(sealed.stdout)
        #expect(json["sealedHex"] as? String == sealedHex)
        let b64 = try #require(json["sealed"] as? String)
        let opened = try relayctl("ratchet", "open", "--key", key, "--sealed", b64, "--json")
        #expect(opened.status == 0, "\(opened.stderr)")
        #expect(try jsonObject(opened.stdout)["plaintext"] as? String == body)
    }

    @Test("random nonces differ, AAD is bound, and a failed open exits 1")
    func failedOpen() throws {
        let a = try jsonObject(try relayctl("ratchet", "seal", "--key", key32, "--plaintext", "00ff", "--aad", "beef", "--json").stdout)
        let b = try jsonObject(try relayctl("ratchet", "seal", "--key", key32, "--plaintext", "00ff", "--aad", "beef", "--json").stdout)
        let sealedA = try #require(a["sealed"] as? String), sealedB = try #require(b["sealed"] as? String)
        #expect(sealedA != sealedB)
        #expect(try relayctl("ratchet", "open", "--key", key32, "--sealed", sealedB, "--aad", "beef").stdout == "plaintext: 00ff\n")
        let noAAD = try relayctl("ratchet", "open", "--key", key32, "--sealed", sealedA)
        #expect(noAAD.status == 1)
        #expect(noAAD.stderr.contains("open failed"))
        #expect(noAAD.stdout.isEmpty)
        let wrongKey = try relayctl("ratchet", "open", "--key", String(repeating: "22", count: 32), "--sealed", sealedA, "--aad", "beef")
        #expect(wrongKey.status == 1)
        var raw = [UInt8](try #require(Data(base64Encoded: sealedA)))
        raw[raw.count - 1] ^= 0x80
        let tampered = try relayctl("ratchet", "open", "--key", key32, "--sealed", Data(raw).base64EncodedString(), "--aad", "beef")
        #expect(tampered.status == 1)
    }

    @Test("bad input is a usage error: exit 64, message on stderr, nothing on stdout", arguments: [
        ["ratchet", "step", "--chain-key", "zz", "--index", "1"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 31), "--index", "1"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32), "--index", "4294967296"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32), "--index", "-1"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32), "--index", "0x10"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32)],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32), "--index", "1", "--index", "2"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32), "--index", "1", "--bogus"],
        ["ratchet", "step", "--chain-key", String(repeating: "11", count: 32), "--index"],
        ["ratchet", "step", "positional"],
        ["ratchet", "chain", "--root-key", String(repeating: "11", count: 32), "--count", "0"],
        ["ratchet", "chain", "--root-key", String(repeating: "11", count: 32), "--count", "100001"],
        ["ratchet", "keyid", "--public-key", ""],
        ["ratchet", "keyid", "--public-key", "abc"],
        ["ratchet", "seal", "--key", String(repeating: "11", count: 32), "--plaintext", "00", "--nonce", "0011"],
        ["ratchet", "seal", "--key", String(repeating: "11", count: 16), "--plaintext", "00"],
        ["ratchet", "seal", "--key", String(repeating: "11", count: 32), "--plaintext", "0g"],
        ["ratchet", "open", "--key", String(repeating: "11", count: 32), "--sealed", "not base64!"],
        ["ratchet", "open", "--key", String(repeating: "11", count: 32), "--sealed", "AAAA"],
        ["ratchet", "body", "encode", "--notification-id", "", "--source-id", "s", "--action-id", "a"],
        ["ratchet", "body", "encode", "--notification-id", "n", "--source-id", "s"],
        ["ratchet", "body", "decode", "--body", "0g"],
        ["ratchet", "body"],
        ["ratchet", "nope"],
        ["nope"],
    ])
    func usageErrors(arguments: [String]) throws {
        let r = try relayctl(arguments)
        #expect(r.status == 64, "\(arguments): \(r.stderr)")
        #expect(r.stderr.hasPrefix("error: ") || r.stderr.contains("USAGE"), "\(arguments)")
        #expect(r.stdout.isEmpty, "\(arguments)")
    }

    @Test("body encode reproduces the frozen body; decode checks it strictly (exit 1 when malformed)")
    func body() throws {
        let response = try #require(try frozenVectors()["response"] as? [String: Any])
        let expected = try #require(response["body"] as? String)
        let encoded = try relayctl("ratchet", "body", "encode",
                                   "--notification-id", try #require(response["notificationIdentifier"] as? String),
                                   "--source-id", try #require(response["sourceIdentifier"] as? String),
                                   "--action-id", try #require(response["actionIdentifier"] as? String),
                                   "--user-text", try #require(response["userText"] as? String), "--json")
        #expect(encoded.status == 0, "\(encoded.stderr)")
        #expect(try jsonObject(encoded.stdout)["body"] as? String == expected)
        let decoded = try relayctl("ratchet", "body", "decode", "--body", expected, "--json")
        #expect(decoded.status == 0)
        let json = try jsonObject(decoded.stdout)
        #expect(json["actionIdentifier"] as? String == response["actionIdentifier"] as? String)
        #expect(json["userText"] as? String == response["userText"] as? String)
        let noText = try jsonObject(try relayctl("ratchet", "body", "decode", "--body", "0001610001620001 63".replacingOccurrences(of: " ", with: ""), "--json").stdout)
        #expect(noText["userText"] is NSNull)
        for bad in [expected + "00", String(expected.dropLast(2)), "0001610001620000", "000161000162000163" + "0001ff"] {
            let r = try relayctl("ratchet", "body", "decode", "--body", bad)
            #expect(r.status == 1, "\(bad)")
            #expect(r.stderr.contains("malformed body"), "\(bad)")
        }
    }
}
