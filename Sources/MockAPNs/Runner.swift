// What `mock-apns` does, kept in the library so main.swift stays a one-liner: parse, start,
// wait for SIGTERM/SIGINT (DispatchSource handlers, no C callbacks), shut down.
import Dispatch
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

public enum MockAPNsMain {
    /// Exit codes: 0 clean shutdown or --help, 64 usage/config error, 1 runtime failure.
    public static func run(arguments: [String]) -> Int32 {
        let configuration: MockAPNsConfiguration
        do {
            switch try MockAPNsCommandLine.parse(arguments) {
            case .help:
                FileHandle.standardOutput.write(Data((MockAPNsCommandLine.usage + "\n").utf8))
                return 0
            case .run(let c): configuration = c
            }
        } catch let error as MockConfigurationError {
            log("error: \(error.message)")
            return 64
        } catch {
            log("error: \(error)")
            return 64
        }

        let server: MockAPNsServer
        do {
            server = try MockAPNsServer(configuration: configuration)
            try server.start()
        } catch let error as MockConfigurationError {
            log("error: \(error.message)")
            return 64
        } catch {
            log("error: cannot start: \(error)")
            return 1
        }

        let scheme: String
        switch configuration.tls {
        case .cleartextH2: scheme = "h2c (cleartext, prior knowledge) http"
        default: scheme = "https"
        }
        log("listening on \(scheme)://\(configuration.host):\(server.port)"
            + (server.caCertificatePath.map { ", CA certificate at \($0)" } ?? ""))
        if configuration.controlPort != nil {
            log("control on http://\(configuration.controlHost):\(server.controlPort) (GET /deliveries, GET /stats, POST /reset, POST|DELETE /faults)")
        }
        if configuration.tokenKeys.isEmpty { log("no --token-key: provider-token auth is off") }
        if let path = configuration.readyFilePath {
            var ready: [String: Any] = ["port": server.port, "controlPort": server.controlPort]
            ready["caPath"] = server.caCertificatePath
            do { try jsonData(ready).write(to: URL(fileURLWithPath: path), options: .atomic) } catch {
                log("error: cannot write --ready-file \(path): \(error.localizedDescription)")
                server.stop()
                return 1
            }
        }

        let received = waitForTermination()
        log("\(received), shutting down")
        server.stop()
        log("stopped; \(server.stats.accepted) push(es) accepted")
        return 0
    }

    /// Blocks the calling thread until SIGTERM or SIGINT arrives; returns its name.
    static func waitForTermination() -> String {
        let queue = DispatchQueue(label: "mock-apns.signals")
        let done = DispatchSemaphore(value: 0)
        let name = LockedBox("")
        var sources: [DispatchSourceSignal] = []
        for (number, label) in [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT")] {
            // Default dispositions would kill the process before the dispatch source sees it.
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler {
                name.set(label)
                done.signal()
            }
            source.resume()
            sources.append(source)
        }
        done.wait()
        sources.forEach { $0.cancel() }
        return name.get()
    }
}

/// A value handed from the signal queue to the waiting thread.
final class LockedBox<T: Sendable>: Sendable {
    private let value: Mutex<T>
    init(_ value: T) { self.value = Mutex(value) }
    func set(_ v: T) { value.withLock { $0 = v } }
    func get() -> T { value.withLock { $0 } }
}
