// The write side of the seam between the two stores (StoreRows.swift is the read side): a
// statement whose SQL is the same in both dialects is written once, with PostgreSQL's `$N`
// placeholders, and its values once, as StoreValues; each backend runs it with its own binding
// (SQLite as `?N` and SQLValue here, PostgreSQL as written and PGValue in PostgresValues.swift). The shared statements
// themselves are in StoreStatements.swift.

/// A value bound to a shared statement: what both backends bind alike.
enum StoreValue: Sendable, Equatable {
    case null
    case int(Int64)
    case text(String)
    case bytes([UInt8])
}

/// SQL text written once with `$N` placeholders, with its SQLite rendering made once, here:
/// keep a StoreSQL in a `static let` and the rendering is paid once per process (SQLite's
/// statement cache is keyed by the rendered text, PostgreSQL's by the text as written).
struct StoreSQL: Sendable, Equatable {
    /// As written: PostgreSQL's form.
    let postgres: String
    /// Each `$N` as `?N` (SQLite's numbered parameter: the same N binds the same value).
    let sqlite: String

    init(_ text: String) {
        postgres = text
        sqlite = Self.sqliteText(text)
    }

    /// The rule: `$` followed by digits is a placeholder and becomes `?` with the same digits
    /// (`$10` is parameter ten, never `$1` then `0`). Copied as they are: a `$` not followed by
    /// a digit, one inside a word (PostgreSQL's `x$1` is an identifier), and anything inside a
    /// '...' string literal or a "..." quoted identifier (a doubled quote stays inside). Shared
    /// statements use no comments and no dollar-quoted strings, which this does not look into.
    static func sqliteText(_ text: String) -> String {
        var out = [UInt8]()
        out.reserveCapacity(text.utf8.count)
        var quote: UInt8?   // the quote character of the literal or identifier we are inside
        for c in text.utf8 {
            if let q = quote {
                if c == q { quote = nil }   // a doubled quote closes and reopens at once
            } else if c == UInt8(ascii: "'") || c == UInt8(ascii: "\"") {
                quote = c
            } else if isDigit(c), out.last == UInt8(ascii: "$"), out.count < 2 || !isWordByte(out[out.count - 2]) {
                out[out.count - 1] = UInt8(ascii: "?")
            }
            out.append(c)
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    /// A byte an identifier may continue with (`$` too, in PostgreSQL); UTF-8 beyond ASCII counts.
    private static func isWordByte(_ c: UInt8) -> Bool {
        isDigit(c) || c == UInt8(ascii: "_") || c == UInt8(ascii: "$") || c >= 0x80
            || (c | 0x20 >= UInt8(ascii: "a") && c | 0x20 <= UInt8(ascii: "z"))
    }
}

/// One shared statement ready to run: its text and its values, `$1` being values[0].
struct StoreStatement: Sendable, Equatable {
    let sql: StoreSQL
    let values: [StoreValue]

    init(_ sql: StoreSQL, _ values: [StoreValue] = []) {
        self.sql = sql
        self.values = values
    }
}

extension SQLiteDatabase {
    /// Every row of a shared statement, run with its `?N` text.
    @discardableResult
    func query(_ s: StoreStatement) throws -> [[SQLValue]] {
        try query(s.sql.sqlite, s.values.map(SQLValue.init))
    }

    /// Runs a shared write statement with its `?N` text; returns the number of rows it changed.
    @discardableResult
    func run(_ s: StoreStatement) throws -> Int {
        try run(s.sql.sqlite, s.values.map(SQLValue.init))
    }
}

extension SQLValue {
    init(_ v: StoreValue) {
        switch v {
        case .null: self = .null
        case .int(let i): self = .integer(i)
        case .text(let s): self = .text(s)
        case .bytes(let b): self = .blob(b)
        }
    }
}
