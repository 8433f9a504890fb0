#if canImport(Glibc)
import Glibc
#endif
import Ratchet

enum Bench {
    /// CPU time of the calling thread, in seconds.
    static func threadCPUTime() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Runs `body` in batches until `seconds` of CPU time have passed; returns operations/second.
    static func measure(seconds: Double, batch: Int, _ body: () throws -> Void) rethrows -> Double {
        let start = threadCPUTime()
        var operations = 0
        var elapsed = 0.0
        repeat {
            for _ in 0..<batch { try body() }
            operations += batch
            elapsed = threadCPUTime() - start
        } while elapsed < seconds
        return Double(operations) / elapsed
    }

    static func run(secondsPerMeasurement seconds: Double) -> String {
        var lines: [String] = []
        var chainKey = SecretKey(random: 32)
        var index: UInt32 = 0
        let steps = measure(seconds: seconds, batch: 1000) {
            let step = ratchetStep(chainKey: chainKey, messageIndex: index)
            chainKey = step.nextChainKey
            index &+= 1
        }
        lines.append("ratchet_steps_per_sec=\(Int(steps))")

        let key = SecretKey(random: 32)
        for size in [256, 2048] {
            let plaintext = [UInt8](repeating: 0x5A, count: size)
            var sealed: [UInt8] = []
            let seals = (try? measure(seconds: seconds, batch: 500) { sealed = try AESGCM.seal(plaintext, key: key) }) ?? 0
            var opened = 0
            let opens = (try? measure(seconds: seconds, batch: 500) { opened &+= try AESGCM.open(sealed, key: key).count }) ?? 0
            precondition(opened > 0, "open produced nothing")
            // The same seal with a caller-supplied nonce, to show what RAND_bytes costs per message.
            let nonce = [UInt8](repeating: 7, count: 12)
            let fixed = (try? measure(seconds: seconds, batch: 500) { sealed = try AESGCM.seal(plaintext, key: key, nonce: nonce) }) ?? 0
            lines.append("seal_fixed_nonce_\(size)_per_sec=\(Int(fixed))")
            lines.append("seal_\(size)_per_sec=\(Int(seals))")
            lines.append("seal_\(size)_bytes_per_sec=\(Int(seals * Double(size)))")
            lines.append("open_\(size)_per_sec=\(Int(opens))")
            lines.append("open_\(size)_bytes_per_sec=\(Int(opens * Double(size)))")
        }

        // Receiving ratchet: a 1,000-message gap then every message (derive ahead, cache, use).
        let root = SecretKey(random: 32)
        let start = threadCPUTime()
        var receiver = ReceivingRatchet(rootSecret: root)
        var taken = 0
        if (try? receiver.messageKey(for: 1000)) != nil { taken += 1 }
        for i in 0..<1000 where (try? receiver.messageKey(for: UInt32(i))) != nil { taken += 1 }
        lines.append("receiver_gap1000_keys=\(taken)")
        lines.append("receiver_gap1000_seconds=\(threadCPUTime() - start)")
        return lines.joined(separator: "\n") + "\n"
    }
}
