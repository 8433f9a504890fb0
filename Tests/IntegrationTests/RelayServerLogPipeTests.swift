// Logging never blocks a loop (issue 25): relay-server at log level debug (a line per request
// and per push) with its stderr a pipe nobody reads. Before the log queue, the loop thread
// blocked writing its log line once the pipe's 64 KiB were full: ~300 answers, then none
// (scripts/bench-log.sh: 30 durable 202/s over 10 s, and SIGTERM never finished).
import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct RelayServerLogPipeTests {
    @Test func debugLogToAnUnreadPipeDoesNotHoldUpIngest() throws {
        let h = try RelayHarness(ingest: #""rateLimits":{"perPushToken":{"perSecond":0,"burst":1},"perCredential":{"perSecond":0,"burst":1}}"#)
        try h.startRelay(readStderr: false)  // the config's log level is debug
        // 10,000 ingests log ~20,000 lines (a request line each, a delivered line per push):
        // more than the log queue holds (16,384 lines, 4 MiB), so lines must be dropped.
        let count = 10_000, clients = 8
        var bodies: [[UInt8]] = []
        for _ in 0..<count { bodies.append(try h.accessory.nextBody().body) }
        let statuses = Mutex<[Int: Int]>([:])
        let failures = Mutex<[String]>([])
        let group = DispatchGroup()
        let port = h.relayPort, credential = h.credential
        let start = Date()
        for c in 0..<clients {
            group.enter()
            let mine = stride(from: c, to: count, by: clients).map { bodies[$0] }
            Thread.detachNewThread {
                defer { group.leave() }
                for body in mine {
                    do {
                        let r = try relayHTTP(port, "POST", "/v1/responses", headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(credential)")],
                                              body: body, timeout: 10)
                        statuses.withLock { $0[r.status, default: 0] += 1 }
                    } catch {
                        failures.withLock { $0.append("\(error)") }
                        return  // the relay stopped answering: this client gives up
                    }
                }
            }
        }
        // 120 s for what takes ~6 s here in a debug build (the old relay answered ~300, then
        // nothing).
        let finished = group.wait(timeout: .now() + 150) == .success
        let seconds = Date().timeIntervalSince(start)
        let answered = statuses.withLock { $0.values.reduce(0, +) }
        print("RelayServerLogPipeTests: \(count) ingests at log level debug, stderr unread: \(answered) answered \(statuses.withLock { $0 }) in \(String(format: "%.1f", seconds)) s (\(Int(Double(answered) / seconds))/s)")
        #expect(finished && seconds < 120)
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0.prefix(3) })")
        #expect(statuses.withLock { $0 } == [202: count])
        let metrics = try relayHTTP(h.adminPort, "GET", "/metrics").text
        let dropped = metrics.split(separator: "\n").first { $0.hasPrefix("relay_log_dropped_total ") }.flatMap { Int($0.split(separator: " ")[1]) }
        #expect((dropped ?? 0) > 0, "relay_log_dropped_total: \(String(describing: dropped))")
        // A clean stop does not hang on the blocked stderr: the log queue gets 2 s.
        h.relay?.signal(SIGTERM)
        #expect(h.relay?.wait(seconds: 30) == 0)
    }
}
