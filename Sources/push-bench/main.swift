// push-bench: drives PushClient against an APNs endpoint (mock-apns) for scripts/bench-push.sh.
//   push-bench --url https://127.0.0.1:PORT --ca ca.pem --p8 key.p8 --key-id K --team-id T
//              --bundle com.example.app [--connections 1] [--count 20000] [--inflight 1000]
//   push-bench --print-jwt --p8 key.p8 --key-id K --team-id T     (a token for h2load)
//   push-bench --print-body                                         (the request body h2load sends)
// Prints one line: `pushes_per_sec=N delivered=N failed=N seconds=S`. Exit 64 on usage errors.
import Foundation
import PushClient
import Synchronization

func usage(_ message: String) -> Never {
    FileHandle.standardError.write(Data("push-bench: \(message)\n".utf8))
    exit(64)
}

func benchMain() -> Int32 {
    var options: [String: String] = [:]
    var flags: Set<String> = []
    var args = Array(CommandLine.arguments.dropFirst())
    while !args.isEmpty {
        let a = args.removeFirst()
        guard a.hasPrefix("--") else { usage("unexpected argument \(a)") }
        if a == "--print-jwt" || a == "--print-body" { flags.insert(a); continue }
        guard !args.isEmpty else { usage("\(a) needs a value") }
        options[String(a.dropFirst(2))] = args.removeFirst()
    }
    func int(_ name: String, _ def: Int) -> Int {
        guard let s = options[name] else { return def }
        guard let v = Int(s), v > 0 else { usage("--\(name) must be a positive integer") }
        return v
    }

    let payload = AccessoryPayload(encryptedData: Array(repeating: 0xab, count: 64),
                                   sessionIdentifier: UUID(uuidString: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F")!,
                                   keyID: [1, 2, 3, 4], messageIndex: 42)
    if flags.contains("--print-body") {
        FileHandle.standardOutput.write(Data(payload.jsonBody()))
        return 0
    }
    guard let p8 = options["p8"], let keyID = options["key-id"], let teamID = options["team-id"] else {
        usage("--p8, --key-id and --team-id are required")
    }
    let key: TokenKey
    do { key = try TokenKey(p8Path: p8, keyID: keyID, teamID: teamID) } catch {
        FileHandle.standardError.write(Data("push-bench: \(error)\n".utf8)); return 1
    }
    if flags.contains("--print-jwt") {
        do { print(try ProviderToken.make(key: key, issuedAt: Date())) } catch {
            FileHandle.standardError.write(Data("push-bench: \(error)\n".utf8)); return 1
        }
        return 0
    }
    guard let url = options["url"], let bundle = options["bundle"] else { usage("--url and --bundle are required") }
    let connections = int("connections", 1), count = int("count", 20_000), inflight = int("inflight", 1000)
    let token = options["device-token"] ?? "a1b2c3d4e5f6"

    let client: PushClient
    do {
        client = try PushClient(configuration: .init(environment: .custom(url: url), credentials: .token(key),
                                                     caFile: options["ca"], connections: connections,
                                                     requestTimeout: .seconds(30)))
    } catch {
        FileHandle.standardError.write(Data("push-bench: \(error)\n".utf8)); return 1
    }

    // Unique apns-ids without UUID(): FoundationEssentials' UUID() opens, reads and closes
    // /dev/urandom on every call (3 syscalls per push on the sending thread), which the relay
    // never pays (its ids come from the outbox). One random UUID, its last 8 bytes a counter.
    var base = UUID().uuid
    var counter: UInt64 = 0
    func nextID() -> UUID {
        counter += 1
        withUnsafeMutableBytes(of: &base) { raw in
            for i in 0..<8 { raw[8 + i] = UInt8(truncatingIfNeeded: counter >> (8 * (7 - i))) }
            raw[8] = (raw[8] & 0x3f) | 0x80   // keep the RFC 4122 variant bits
        }
        return UUID(uuid: base)
    }

    /// Sends `n` pushes keeping at most `inflight` outstanding; returns (delivered, failed, first failure).
    func run(_ n: Int) -> (Int, Int, String?) {
        let slots = DispatchSemaphore(value: inflight)
        let done = DispatchSemaphore(value: 0)
        let tally = Mutex((delivered: 0, failed: 0, first: String?.none))
        for _ in 0..<n {
            slots.wait()
            client.send(PushRequest(deviceToken: token, bundleID: bundle, apnsID: nextID(), payload: payload)) { result in
                tally.withLock {
                    if case .delivered = result { $0.delivered += 1 } else {
                        $0.failed += 1
                        if $0.first == nil { $0.first = "\(result)" }
                    }
                }
                slots.signal()
                done.signal()
            }
        }
        for _ in 0..<n { done.wait() }
        return tally.withLock { ($0.delivered, $0.failed, $0.first) }
    }

    // Warm-up: open every connection, unlock its streams, mint the token.
    _ = run(max(connections * 50, 200))
    let start = ContinuousClock.now
    let (delivered, failed, first) = run(count)
    let elapsed = start.duration(to: .now)
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    client.shutdown()
    if let first { FileHandle.standardError.write(Data("push-bench: first failure: \(first)\n".utf8)) }
    print("pushes_per_sec=\(Int(Double(delivered) / seconds)) delivered=\(delivered) failed=\(failed) seconds=\(String(format: "%.3f", seconds))")
    return failed == 0 ? 0 : 1
}

exit(benchMain())
