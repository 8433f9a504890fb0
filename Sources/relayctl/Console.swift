// Output for relayctl: text or JSON on stdout, diagnostics on stderr. Writes go straight to
// file descriptors 1 and 2 (the Swift 6 checker rejects the C `stdout` global).
#if canImport(Glibc)
import Glibc
#endif

struct Console {
    func out(_ text: String) { write(fd: 1, text + "\n") }
    func error(_ text: String) { write(fd: 2, text + "\n") }

    private func write(fd: Int32, _ text: String) {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return  // stdout closed (e.g. `| head`): nothing useful left to do
            }
            bytes = bytes.dropFirst(n)
        }
    }
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

    static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
