// Header fields as the server API hands them over: ordered, names lowercased, checked for
// values that could split a response.

/// Ordered header list. Names are stored lowercased (HTTP/2 requires it, HTTP/1.1 ignores case),
/// values as received. Lookups are case-insensitive.
public struct HTTPHeaders: Sendable, Sequence {
    public typealias Element = (name: String, value: String)
    var storage: [HTTPField]
    /// Some field could split a response (name not a token, CR/LF/NUL in a value). Kept up to
    /// date by every mutator so serialising a response does not rescan fields it already saw.
    private(set) var hasUnsafeField = false

    public init(_ pairs: [(String, String)] = []) {
        storage = pairs.map { HTTPField(name: $0.0.lowercased(), value: $0.1) }
        hasUnsafeField = storage.contains { !isSafeHeader(name: $0.name, value: $0.value) }
    }

    /// Names already lowercased and fields already validated (the HTTP/1 parser and nghttp2
    /// refuse the bytes `hasUnsafeField` looks for): skips the copy and the scan.
    init(lowercasedFields fields: [HTTPField]) {
        storage = fields
    }

    public subscript(name: String) -> String? {
        let key = lowercasedASCII(name)
        for h in storage where h.name == key { return h.value }
        return nil
    }

    public func values(_ name: String) -> [String] {
        let key = lowercasedASCII(name)
        return storage.filter { $0.name == key }.map(\.value)
    }

    public mutating func add(_ name: String, _ value: String) {
        // One pass over the name for both its case and its token check (the name is safe iff
        // its lowercased form is: lowercasing only touches A-Z).
        var name = name
        let (isToken, hasUpper) = name.withUTF8 { scanHeaderName($0) }
        if !isToken || !isSafeHeaderValue(value) { hasUnsafeField = true }
        storage.append(HTTPField(name: hasUpper ? lowercasedASCII(name) : name, value: value))
    }

    /// Room for `n` fields in total without regrowing.
    public mutating func reserveCapacity(_ n: Int) {
        storage.reserveCapacity(n)
    }

    /// Replaces the first header of that name (dropping later duplicates) or appends it.
    public mutating func replaceOrAdd(_ name: String, _ value: String) {
        let key = lowercasedASCII(name)
        if let i = storage.firstIndex(where: { $0.name == key }) {
            storage[i].value = value
            var j = storage.count - 1
            while j > i {
                if storage[j].name == key { storage.remove(at: j) }
                j -= 1
            }
            hasUnsafeField = storage.contains { !isSafeHeader(name: $0.name, value: $0.value) }
        } else {
            if !isSafeHeader(name: key, value: value) { hasUnsafeField = true }
            storage.append(HTTPField(name: key, value: value))
        }
    }

    public mutating func remove(_ name: String) {
        let key = lowercasedASCII(name)
        storage.removeAll { $0.name == key }
        if hasUnsafeField {
            hasUnsafeField = storage.contains { !isSafeHeader(name: $0.name, value: $0.value) }
        }
    }

    /// The fields themselves, for package code that walks them on a hot path (the public
    /// iterator is not specialised across the module boundary).
    package var fields: [HTTPField] { storage }

    public var count: Int { storage.count }
    public var isEmpty: Bool { storage.isEmpty }

    public func makeIterator() -> Iterator { Iterator(base: storage.makeIterator()) }

    /// Yields `(name, value)` pairs in order.
    public struct Iterator: IteratorProtocol {
        var base: IndexingIterator<[HTTPField]>

        public mutating func next() -> (name: String, value: String)? {
            guard let field = base.next() else { return nil }
            return (field.name, field.value)
        }
    }
}

/// `s.lowercased()` without the allocation when `s` has no ASCII capitals (the usual case:
/// callers write header names in lowercase). Non-ASCII bytes are left alone: they never occur
/// in valid field names.
@inline(__always)
func lowercasedASCII(_ s: String) -> String {
    var s = s
    // withUTF8: a pointer loop instead of the UTF8View iterator (several times cheaper per byte).
    let hasUpper = s.withUTF8 { u in
        for b in u where b &- 0x41 < 26 { return true }
        return false
    }
    guard hasUpper else { return s }
    return String(decoding: s.utf8.map { $0 &- 0x41 < 26 ? $0 | 0x20 : $0 }, as: UTF8.self)
}
