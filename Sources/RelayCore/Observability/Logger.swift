// Structured logs: one JSON object per line on stderr (or a human format). Callers pass only
// values safe to log: never secrets, full push tokens or ciphertext (use `redactToken`).
import Basics
import FoundationEssentials
import Glibc
import Synchronization

public final class RelayLogger: Sendable {
    public enum Level: Int, Sendable, Comparable, CaseIterable {
        case debug = 0, info, warning, error
        public var name: String { ["debug", "info", "warning", "error"][rawValue] }
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
        public init?(name: String) {
            guard let l = Level.allCases.first(where: { $0.name == name }) else { return nil }
            self = l
        }
    }
    public enum Format: String, Sendable { case json, text }

    public let minimum: Level
    public let format: Format
    private let fd: Int32
    private let lock = Mutex(())
    /// Lines written (tests use an fd-less logger that captures instead).
    private let captured: LineCapture?

    final class LineCapture: Sendable {
        let lines = Mutex<[String]>([])
    }

    public init(minimum: Level = .info, format: Format = .json, fd: Int32 = 2, capture: Bool = false) {
        self.minimum = minimum
        self.format = format
        self.fd = fd
        self.captured = capture ? LineCapture() : nil
    }

    public var capturedLines: [String] { captured?.lines.withLock { $0 } ?? [] }

    public func log(_ level: Level, _ message: String, _ fields: KeyValuePairs<String, any Sendable> = [:]) {
        guard level >= minimum else { return }
        let ts = iso8601UTC(millis: SystemRelayClock().nowMillis())
        var line: String
        switch format {
        case .json:
            line = "{\"ts\":\"\(ts)\",\"level\":\"\(level.name)\",\"msg\":\(jsonString(message))"
            for (k, v) in fields {
                line += ",\(jsonString(k)):"
                switch v {
                case let i as Int: line += String(i)
                case let i as Int64: line += String(i)
                case let d as Double: line += d.isFinite ? String(d) : "null"
                case let b as Bool: line += b ? "true" : "false"
                default: line += jsonString("\(v)")
                }
            }
            line += "}\n"
        case .text:
            line = "\(ts) \(level.name.uppercased()) \(message)"
            for (k, v) in fields { line += " \(k)=\(v)" }
            line += "\n"
        }
        if let captured {
            captured.lines.withLock { $0.append(line) }
            return
        }
        lock.withLock { _ in
            _ = FileDescriptor.writeAll(fd, line)  // a failed log write has nowhere to be reported
        }
    }

    public func debug(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.debug, m, f) }
    public func info(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.info, m, f) }
    public func warning(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.warning, m, f) }
    public func error(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.error, m, f) }
}

/// First 8 hex digits and the length: enough to correlate, not enough to push to the device.
public func redactToken(_ token: String) -> String {
    "\(token.prefix(8))…(\(token.count))"
}
