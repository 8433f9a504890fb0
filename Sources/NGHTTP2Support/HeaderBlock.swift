// One header block (the nghttp2_nv array and the bytes it points at) for a request or response.
// nghttp2 copies names and values while the submit call runs, except names flagged
// NO_COPY_NAME, which must outlive the stream (static strings only), so the block lives in
// temporary memory for exactly that call: the stack for the usual sizes.
package import CNghttp2

package struct HeaderBlock {
    private let bytes: UnsafeMutableBufferPointer<UInt8>
    private let fields: UnsafeMutableBufferPointer<nghttp2_nv>
    private var used = 0
    package private(set) var count = 0

    /// The array for nghttp2_submit_*: `count` entries.
    package var nva: UnsafePointer<nghttp2_nv> { UnsafePointer(fields.baseAddress!) }

    fileprivate init(bytes: UnsafeMutableBufferPointer<UInt8>, fields: UnsafeMutableBufferPointer<nghttp2_nv>) {
        self.bytes = bytes
        self.fields = fields
    }

    /// A field whose name is an immortal static string nghttp2 may keep pointing at. A value
    /// that differs on every message (`neverIndex`) stays out of the HPACK dynamic table, where
    /// it would only evict the entries that do repeat.
    package mutating func append(_ name: StaticString, _ value: String, neverIndex: Bool = false) {
        var flags = NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue
        if neverIndex { flags |= NGHTTP2_NV_FLAG_NO_INDEX.rawValue }
        let v = copy(value)
        add(nghttp2_nv(name: UnsafeMutablePointer(mutating: name.utf8Start), value: v.0,
                       namelen: name.utf8CodeUnitCount, valuelen: v.1, flags: UInt8(flags)))
    }

    /// A field with both name and value copied into the block.
    package mutating func append(copyingName name: String, _ value: String) {
        let n = copy(name)
        let v = copy(value)
        add(nghttp2_nv(name: n.0, value: v.0, namelen: n.1, valuelen: v.1, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
    }

    private mutating func add(_ nv: nghttp2_nv) {
        precondition(count < fields.count, "HeaderBlock: more fields than reserved")
        (fields.baseAddress! + count).initialize(to: nv)
        count += 1
    }

    private mutating func copy(_ text: String) -> (UnsafeMutablePointer<UInt8>, Int) {
        let start = bytes.baseAddress! + used
        let room = bytes.count - used
        // Native strings lend their UTF-8 in place; others (bridged, never here) are copied first.
        let n = text.utf8.withContiguousStorageIfAvailable { u -> Int in
            precondition(u.count <= room, "HeaderBlock: more bytes than reserved")
            if let b = u.baseAddress { start.update(from: b, count: u.count) }
            return u.count
        } ?? {
            var copy = text
            return copy.withUTF8 { u -> Int in
                precondition(u.count <= room, "HeaderBlock: more bytes than reserved")
                if let b = u.baseAddress { start.update(from: b, count: u.count) }
                return u.count
            }
        }()
        used += n
        return (start, n)
    }
}

/// Runs `body` with a block of room for `bytes` bytes of names and values and `fields` fields
/// (what the caller's submit returns comes back: a stream id or an nghttp2 return code).
package func withHeaderBlock(bytes: Int, fields: Int, _ body: (inout HeaderBlock) -> Int32) -> Int32 {
    withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(bytes, 1)) { b in
        withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(fields, 1)) { f in
            var block = HeaderBlock(bytes: b, fields: f)
            return body(&block)
        }
    }
}
