// Structured logs: one JSON object per line on stderr (or a human format). Callers pass only
// values safe to log: never secrets, full push tokens or ciphertext (use `redactToken`).
// Logging never blocks the caller: lines are formatted on the calling thread and written by a
// thread of their own (LogQueue); events that can repeat per request are rate-limited
// (`limited`, RepeatLimiter). docs/operations.md, "Logs".
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
    /// Where lines wait for the writer thread (nil when capturing).
    private let queue: LogQueue?
    /// Lines written (tests use an fd-less logger that captures instead).
    private let captured: LineCapture?
    private let repeats: Mutex<RepeatLimiter<RepeatNote>>
    /// Monotonic microseconds, injected by the repeat tests.
    private let monotonic: @Sendable () -> Int64

    /// `limited(_:_:key:_:)` writes at most one line per key in this many seconds.
    public static let repeatWindowSeconds = 10

    final class LineCapture: Sendable {
        let lines = Mutex<[String]>([])
    }

    /// A rate-limited key's first line, for its window's report.
    struct RepeatNote: Sendable {
        var level: Level
        var message: String
    }

    /// Lines go to `fd` through a bounded queue and a writer thread of their own (LogQueue:
    /// 4 MiB / 16,384 lines; past that, lines are dropped and counted in `droppedLines`).
    /// `capture: true` keeps them in memory instead, synchronously (tests).
    public convenience init(minimum: Level = .info, format: Format = .json, fd: Int32 = 2, capture: Bool = false) {
        self.init(minimum: minimum, format: format, fd: fd, capture: capture, bounds: .standard, monotonic: { monotonicMicros() })
    }

    init(minimum: Level, format: Format, fd: Int32 = 2, capture: Bool = false, bounds: LogQueue.Bounds,
         monotonic: @escaping @Sendable () -> Int64) {
        self.minimum = minimum
        self.format = format
        self.captured = capture ? LineCapture() : nil
        self.monotonic = monotonic
        repeats = Mutex(RepeatLimiter(window: Int64(Self.repeatWindowSeconds) * 1_000_000))
        // The notice closure formats with this logger's format; it must not capture self (the
        // queue is a stored property), hence the static formatter.
        queue = capture ? nil : LogQueue(bounds: bounds, sink: { bytes in
            _ = FileDescriptor.writeAll(fd, bytes)  // a failed log write has nowhere to be reported
        }, dropNotice: { [format] n in
            Self.render(format, .warning, "log lines dropped: stderr did not keep up", ["dropped": n])
        })
        queue?.setTick { [weak self] in self?.reportRepeats() }
    }

    deinit {
        queue?.close()
    }

    public var capturedLines: [String] { captured?.lines.withLock { $0 } ?? [] }

    /// Lines dropped because the queue to stderr was full (`relay_log_dropped_total`).
    public var droppedLines: Int { queue?.droppedLines ?? 0 }

    /// Waits until the lines logged so far are written, at most `timeout` (a blocked stderr
    /// must not hold up a stop): true when they all were. RelayService.stop() calls it last.
    @discardableResult
    public func flush(timeout: Duration = .seconds(2)) -> Bool {
        queue?.flush(timeout: timeout) ?? true
    }

    public func log(_ level: Level, _ message: String, _ fields: KeyValuePairs<String, any Sendable> = [:]) {
        guard level >= minimum else { return }
        emit(Self.render(format, level, message, fields))
    }

    /// Like `log`, for events that can repeat thousands of times a second (503s under overload,
    /// storage errors): at most one line per `key` per 10 s; the repeats are counted and
    /// reported in one line when the window ends: "<message> (4,812 more in the last 10 s)".
    /// `key` (default: the message) names the kind of event (a fixed message, a status), never
    /// a request's values.
    /// `fields` is only evaluated for a line that is written.
    public func limited(_ level: Level, _ message: String, key: String? = nil,
                        _ fields: @autoclosure () -> KeyValuePairs<String, any Sendable> = [:]) {
        guard level >= minimum else { return }
        let key = key ?? message
        let now = monotonic()
        let (admission, next) = repeats.withLock { r in
            (r.admit(key, note: RepeatNote(level: level, message: message), now: now), r.nextExpiry)
        }
        guard case .log(let previous) = admission else { return }
        if let previous { emit(repeatLine(previous)) }
        emit(Self.render(format, level, message, fields()))
        if let next { queue?.tick(at: next) }
    }

    /// Writes the report of every rate-limited window that has ended; returns when the next one
    /// ends. The writer thread calls it on time; tests call it after moving their clock.
    @discardableResult
    func reportRepeats() -> Int64? {
        let now = monotonic()
        let (reports, next) = repeats.withLock { r in (r.expire(now: now), r.nextExpiry) }
        for r in reports { emit(repeatLine(r)) }
        return next
    }

    private func repeatLine(_ r: RepeatLimiter<RepeatNote>.Report) -> String {
        Self.render(format, r.note.level, "\(r.note.message) (\(groupedThousands(r.count)) more in the last \(Self.repeatWindowSeconds) s)",
                    ["repeated": r.count, "window_s": Self.repeatWindowSeconds])
    }

    private func emit(_ line: String) {
        if let captured {
            captured.lines.withLock { $0.append(line) }
        } else {
            queue?.offer(line)
        }
    }

    static func render(_ format: Format, _ level: Level, _ message: String, _ fields: KeyValuePairs<String, any Sendable>) -> String {
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
        return line
    }

    public func debug(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.debug, m, f) }
    public func info(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.info, m, f) }
    public func warning(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.warning, m, f) }
    public func error(_ m: String, _ f: KeyValuePairs<String, any Sendable> = [:]) { log(.error, m, f) }
}

/// First 8 hex digits and the length: enough to correlate, not enough to push to the device.
/// 4812 -> "4,812" (log messages for people).
func groupedThousands(_ n: Int) -> String {
    let digits = String(n.magnitude)
    var out = ""
    for (i, c) in digits.enumerated() {
        if i > 0 && (digits.count - i) % 3 == 0 { out.append(",") }
        out.append(c)
    }
    return n < 0 ? "-" + out : out
}

public func redactToken(_ token: String) -> String {
    "\(token.prefix(8))…(\(token.count))"
}
