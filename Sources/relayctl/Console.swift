// Output for relayctl: text or JSON on stdout, diagnostics on stderr. Writes go straight to
// file descriptors 1 and 2 (the Swift 6 checker rejects the C `stdout` global).
import Basics

struct Console {
    func out(_ text: String) { write(fd: 1, text + "\n") }
    func error(_ text: String) { write(fd: 2, text + "\n") }

    // stdout closed (e.g. `| head`): nothing useful left to do with the error.
    private func write(fd: Int32, _ text: String) { FileDescriptor.writeAll(fd, text) }
}

/// A minimal JSON value with deterministic key order (the order given), for `--json` output.
indirect enum JSON {
    case string(String)
    case number(Int64)
    case object([(String, JSON)])
    case array([JSON])
    case null

    var rendered: String {
        switch self {
        case .string(let s): return JSON.quote(s)
        case .number(let n): return String(n)
        case .null: return "null"
        case .array(let items): return "[" + items.map(\.rendered).joined(separator: ",") + "]"
        case .object(let pairs): return "{" + pairs.map { JSON.quote($0.0) + ":" + $0.1.rendered }.joined(separator: ",") + "}"
        }
    }

    static func quote(_ s: String) -> String { JSONString.quote(s) }
}
