// Drives `relayctl accessory pair` and `derive` as a firmware developer would: a pairing's state
// file derives the same roots again, a published X-Wing vector's shared secret comes out of
// derive, and every bad input is exit 64 naming its flag.
import Foundation
import Testing

private let vectorFile = Relayctl.repoRoot.deletingLastPathComponent().appendingPathComponent("shared/vectors/kex/xwing-test-vectors.json")
private let device = "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"
private let bluetooth = "0000FE2C-0000-1000-8000-00805F9B34FB"

private func fields(_ r: Relayctl.Result) throws -> [String: Any] {
    try #require(try Relayctl.json(r) as? [String: Any])
}

/// One named value of `derive --json`'s steps.
private func step(_ derived: [String: Any], _ name: String) -> String? {
    (derived["steps"] as? [[String: String]])?.first { $0["name"] == name }?["value"]
}

private func tempPath(_ name: String) -> String {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relayctl-accessory-\(UUID().uuidString)")
    try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir.appendingPathComponent(name).path
}

@Suite("relayctl accessory (built binary)")
struct RelayctlAccessoryTests {
    @Test("pair writes a 0600 state file whose key material derives the same roots", arguments: ["xwing", "p256"])
    func pairThenDerive(suite: String) throws {
        let state = tempPath("acc.json")
        let pair = try Relayctl.run(["accessory", "pair", "--ciphersuite", suite, "--out", state, "--json"])
        #expect(pair.status == 0, "\(pair.stderr)")
        let paired = try fields(pair)
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: state)[.posixPermissions] as? NSNumber)
        #expect(mode.intValue & 0o777 == 0o600)
        #expect((paired["protocolInfo"] as? String)?.hasPrefix(suite == "xwing" ? "XWing-v1-" : "P256-v1-") == true)
        #expect((paired["publicKey"] as? String)?.count == (suite == "xwing" ? 2432 : 128))
        #expect((paired["encapsulatedKey"] as? String)?.count == (suite == "xwing" ? 2240 : 130))
        let fromState = try fields(try Relayctl.run(["accessory", "derive", "--state", state, "--json"]))
        #expect(fromState["accessoryToHostRoot"] as? String == paired["accessoryToHostRoot"] as? String)
        #expect(fromState["hostToAccessoryRoot"] as? String == paired["hostToAccessoryRoot"] as? String)
        #expect(fromState["keyID"] as? [String: String] == paired["keyID"] as? [String: String])
        // The same from flags, as a firmware team would type them.
        let saved = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: state))) as? [String: Any])
        let fromFlags = try Relayctl.run(["accessory", "derive", "--ciphersuite", suite, "--private-key", saved["privateKey"] as! String,
                                          "--public-key", saved["publicKey"] as! String, "--encapsulated-key", saved["encapsulatedKey"] as! String,
                                          "--device-uuid", saved["deviceUUID"] as! String, "--bluetooth-uuid", saved["bluetoothUUID"] as! String, "--json"])
        #expect(fromFlags.status == 0, "\(fromFlags.stderr)")
        #expect(try fields(fromFlags)["accessoryToHostRoot"] as? String == paired["accessoryToHostRoot"] as? String)
        // A lower-case UUID spelling is another protocolInfo, hence other roots.
        let lower = try fields(try Relayctl.run(["accessory", "derive", "--state", state, "--uuid-case", "lower", "--identifier",
                                                 (saved["deviceUUID"] as! String).lowercased(), "--json"]))
        #expect(lower["accessoryToHostRoot"] as? String != paired["accessoryToHostRoot"] as? String)
        // A second pair does not overwrite the state (it holds a ratchet position) without --force.
        let again = try Relayctl.run(["accessory", "pair", "--ciphersuite", suite, "--out", state])
        #expect(again.status == 64 && again.stderr.contains("--out"))
        #expect(try Relayctl.run(["accessory", "pair", "--ciphersuite", suite, "--out", state, "--force"]).status == 0)
    }

    @Test("pair --out a symbolic link is refused, with --force too; the link's target is neither created nor written")
    func pairRefusesASymbolicLink() throws {
        let link = tempPath("acc.json")
        let victim = link + "-victim"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: victim)
        let dangling = try Relayctl.run(["accessory", "pair", "--ciphersuite", "p256", "--out", link])
        #expect(dangling.status == 1 && dangling.stderr.contains("\(link) is a symbolic link; refusing to replace it"), "\(dangling.stderr)")
        #expect(!FileManager.default.fileExists(atPath: victim))
        try Data("victim".utf8).write(to: URL(fileURLWithPath: victim))
        let forced = try Relayctl.run(["accessory", "pair", "--ciphersuite", "p256", "--out", link, "--force"])
        #expect(forced.status == 1 && forced.stderr.contains("is a symbolic link"), "\(forced.stderr)")
        #expect(FileManager.default.contents(atPath: victim) == Data("victim".utf8))
        let names = try FileManager.default.contentsOfDirectory(atPath: (link as NSString).deletingLastPathComponent).sorted()
        #expect(names == ["acc.json", "acc.json-victim"], "no temporary left behind")
    }

    @Test("derive from the X-Wing draft's first vector prints its shared secret",
          .enabled(if: FileManager.default.fileExists(atPath: vectorFile.path), "shared/vectors/kex absent: skipped"))
    func publishedVector() throws {
        let list = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: vectorFile)) as? [[String: String]])
        let v = list[0]
        let out = try Relayctl.run(["accessory", "derive", "--ciphersuite", "xwing", "--private-key", v["seed"]!, "--public-key", v["pk"]!,
                                    "--encapsulated-key", v["ct"]!, "--device-uuid", device, "--bluetooth-uuid", bluetooth, "--json"])
        #expect(out.status == 0, "\(out.stderr)")
        let f = try fields(out)
        #expect(step(f, "shared_secret") == v["ss"])
        #expect(step(f, "kem_shared_secret") == v["ss"])
        #expect((f["protocolInfo"] as? [String: String])?["text"] == "XWing-v1-\(device)")
        #expect((f["contexts"] as? [String: String])?["accessoryToHost"] == "AccessoryInternetKey-AccessoryToHost-\(bluetooth)")
        // Text mode keeps the formulas as labels.
        let text = try Relayctl.run(["accessory", "derive", "--ciphersuite", "xwing", "--private-key", v["seed"]!,
                                     "--encapsulated-key", v["ct"]!, "--device-uuid", device, "--bluetooth-uuid", bluetooth])
        #expect(text.stdout.contains("ss = SHA3-256(ss_M || ss_X || ct_X || pk_X || label): \(v["ss"]!)"))
        #expect(text.stdout.contains("context AccessoryToHost: AccessoryInternetKey-AccessoryToHost-\(bluetooth)"))
    }

    @Test("bad input is exit 64 naming the flag")
    func badInput() throws {
        let seed = String(repeating: "11", count: 32)
        let base = ["accessory", "derive", "--device-uuid", device, "--bluetooth-uuid", bluetooth]
        let cases: [([String], String)] = [
            (base + ["--ciphersuite", "kyber", "--private-key", seed, "--encapsulated-key", "00"], "--ciphersuite"),
            (base + ["--ciphersuite", "xwing", "--private-key", "1111", "--encapsulated-key", String(repeating: "00", count: 1120)], "--private-key"),
            (base + ["--ciphersuite", "xwing", "--private-key", seed, "--encapsulated-key", "0000"], "--encapsulated-key"),
            (base + ["--ciphersuite", "xwing", "--private-key", seed, "--public-key", String(repeating: "00", count: 1216),
                     "--encapsulated-key", String(repeating: "00", count: 1120)], "--public-key"),
            (base + ["--ciphersuite", "p256", "--private-key", String(repeating: "00", count: 32), "--encapsulated-key", "04" + String(repeating: "00", count: 64)], "--private-key"),
            (base + ["--ciphersuite", "p256", "--private-key", seed, "--encapsulated-key", "04" + String(repeating: "00", count: 64)], "--encapsulated-key"),
            (["accessory", "derive", "--ciphersuite", "xwing", "--private-key", seed, "--encapsulated-key", "00", "--device-uuid", "not-a-uuid",
              "--bluetooth-uuid", bluetooth], "--device-uuid"),
            (["accessory", "pair", "--ciphersuite", "p256", "--out", tempPath("x.json"), "--bluetooth-uuid", "1234"], "--bluetooth-uuid"),
            (["accessory", "pair", "--ciphersuite", "xwing", "--out", tempPath("x.json"), "--ephemeral", "00"], "--ephemeral"),
            (["accessory", "derive", "--state", tempPath("x.json"), "--uuid-case", "mixed"], "--uuid-case"),
        ]
        for (arguments, flag) in cases {
            let r = try Relayctl.run(arguments)
            #expect(r.status == 64, "\(arguments): \(r.stderr)")
            #expect(r.stderr.contains(flag), "\(arguments) should name \(flag): \(r.stderr)")
        }
        // A state file that is not one: usage error naming the file.
        let junk = tempPath("junk.json")
        try Data("{}".utf8).write(to: URL(fileURLWithPath: junk))
        let r = try Relayctl.run(["accessory", "derive", "--state", junk])
        #expect(r.status == 64 && r.stderr.contains(junk))
    }
}
