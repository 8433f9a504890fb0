// The rule for repeated log lines: at most one line per key per window (10 s in the relay); the
// repeats inside the window are counted, and their count is reported once the window is over
// ("storage error on ingest (4,812 more in the last 10 s)"). A pure value with time passed in,
// so the rule is unit tested without sleeps; RelayLogger keeps one behind a lock.
//
// Keys name a kind of event (a message, an HTTP status and note), never a request's values:
// the set of keys stays as small as the code's set of messages, and a window is forgotten when
// it ends.

struct RepeatLimiter<Note> {
    /// What the limiter says about one occurrence.
    enum Verdict {
        /// Log it. `reportFirst` is the previous window of this key, ended but not yet reported
        /// (its count and its first line's note): say it before this line.
        case log(reportFirst: Report?)
        /// Counted in the open window, not logged.
        case suppress
    }

    /// A window that ended with repeats in it.
    struct Report {
        var key: String
        var note: Note
        var count: Int
    }

    private struct Window {
        var start: Int64
        var note: Note
        var count = 0
    }

    let window: Int64
    private var open: [String: Window] = [:]

    /// `window` in the unit of the times passed to `admit` and `expire`.
    init(window: Int64) {
        self.window = window
    }

    /// One occurrence of `key` at `now`; `note` is kept for the report if this one opens a window.
    mutating func admit(_ key: String, note: Note, now: Int64) -> Verdict {
        if let w = open[key] {
            if now < w.start + window {
                open[key]!.count += 1
                return .suppress
            }
            open[key] = Window(start: now, note: note)
            return .log(reportFirst: w.count > 0 ? Report(key: key, note: w.note, count: w.count) : nil)
        }
        open[key] = Window(start: now, note: note)
        return .log(reportFirst: nil)
    }

    /// Closes the windows that ended by `now` and returns those that had repeats, oldest first.
    mutating func expire(now: Int64) -> [Report] {
        let ended = open.filter { now >= $0.value.start + window }.sorted { $0.value.start < $1.value.start }
        for (key, _) in ended { open[key] = nil }
        return ended.compactMap { key, w in w.count > 0 ? Report(key: key, note: w.note, count: w.count) : nil }
    }

    /// When the next open window ends (nil: none open).
    var nextExpiry: Int64? { open.values.map { $0.start + window }.min() }
}
