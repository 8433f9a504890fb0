// Connection strings as libpq reads them, for redaction and the transport checks at load.
import FoundationEssentials
import Glibc
internal import CPQ

/// A connection string as libpq itself reads it (PQconninfoParse): URI (`postgresql://u:p@h/db?k=v`,
/// percent-encoding included) or keyword/value (`password = x`, `password='a b'`), so redaction
/// and the transport checks see exactly what the connection will use.
struct PostgresConnInfo {
    struct Option: Equatable {
        var keyword: String
        var value: String
        /// libpq marks secrets with dispchar "*" (password, sslpassword).
        var secret: Bool
    }
    /// Only the options the string sets, in libpq's order.
    let options: [Option]

    /// nil and `error` set when libpq refuses the string. Its message can quote a fragment of
    /// the string (a password that is not valid percent-encoding), so quoted parts are elided.
    init?(_ string: String, error: inout String) {
        var message: UnsafeMutablePointer<CChar>?
        guard let parsed = PQconninfoParse(string, &message) else {
            let text = message.map { PostgresConnection.clean(UnsafePointer($0)) } ?? "out of memory"
            if let message { PQfreemem(message) }
            error = Self.elideQuoted(text)
            return nil
        }
        defer { PQconninfoFree(parsed) }
        var options: [Option] = []
        var p = parsed
        while let keyword = p.pointee.keyword {
            if let value = p.pointee.val {
                let dispchar = p.pointee.dispchar.map { String(cString: $0) } ?? ""
                options.append(Option(keyword: String(cString: keyword), value: String(cString: value), secret: dispchar.hasPrefix("*")))
            }
            p += 1
        }
        self.options = options
    }

    init?(_ string: String) {
        var ignored = ""
        self.init(string, error: &ignored)
    }

    subscript(keyword: String) -> String? { options.first { $0.keyword == keyword }?.value }

    /// keyword=value form with every secret as ***, quoted as libpq reads it back.
    var redacted: String {
        options.map { o in
            guard !o.secret else { return "\(o.keyword)=***" }
            let plain = !o.value.isEmpty && !o.value.contains { $0.isWhitespace || $0 == "'" || $0 == "\\" }
            let quoted = plain ? o.value : "'" + o.value.replacing("\\", with: "\\\\").replacing("'", with: "\\'") + "'"
            return "\(o.keyword)=\(quoted)"
        }.joined(separator: " ")
    }

    /// `text` with every non-empty secret value replaced by ***: for libpq's own error messages.
    func scrub(_ text: String) -> String {
        options.filter { $0.secret && !$0.value.isEmpty }.reduce(text) { $0.replacing($1.value, with: "***") }
    }

    private static func elideQuoted(_ text: String) -> String {
        var out = "", inQuote = false
        for ch in text {
            if ch == "\"" {
                out += inQuote ? "…\"" : "\""
                inQuote.toggle()
            } else if !inQuote {
                out.append(ch)
            }
        }
        return out
    }
}

/// A PostgreSQL connection string fit for logs, `relayctl status` and check-config: libpq's
/// own reading of it with passwords as ***, never the text as written (which may hold one).
func redactPostgresURL(_ url: String) -> String {
    PostgresConnInfo(url)?.redacted ?? "(a connection string libpq cannot parse)"
}

/// Why libpq would refuse this connection string (its message, quoted fragments elided), nil
/// when it parses: checked at config load so the redaction above always has libpq's reading.
func postgresURLProblem(_ url: String) -> String? {
    var error = ""
    return PostgresConnInfo(url, error: &error) == nil ? "libpq cannot parse it: \(error)" : nil
}
