// One accepted connection's libuv handles (uv_tcp_t + uv_timer_t), owned by `TCPSocket`.
// Heap-allocated so they never move while libuv holds them; the socket retains itself until
// both close callbacks ran.
internal import CUV
#if canImport(Glibc)
import Glibc
#endif

/// One accepted TCP connection's libuv handles. Retains itself from accept until both handles'
/// close callbacks ran; holds its `ServerConnection` until then (the cycle is broken on close).
final class TCPSocket {
    /// unowned(unsafe): a loop outlives its sockets (it runs until every handle closed).
    unowned(unsafe) let loop: EventLoop
    private let tcp: UnsafeMutablePointer<uv_tcp_t>
    private let timer: UnsafeMutablePointer<uv_timer_t>
    var owner: ServerConnection?
    private var pendingCloses = 0
    private(set) var isClosing = false
    private(set) var writesInFlight = 0
    /// Bytes handed to uv_write and not yet written to the kernel (also counted in the
    /// server-wide `ServerCore.queuedOutput`).
    private(set) var queuedBytes = 0
    private(set) var reading = false
    /// When each queued write was queued, oldest first (libuv completes writes in order): the
    /// write timeout runs from the oldest, so a peer taking a byte now and then cannot renew it.
    private var writeQueuedAt: [UInt64] = []
    private var writeQueuedHead = 0

    init(loop: EventLoop) {
        self.loop = loop
        tcp = .allocate(capacity: 1)
        timer = .allocate(capacity: 1)
        uv_tcp_init(loop.loop, tcp)
        uv_timer_init(loop.loop, timer)
        let me = Unmanaged.passRetained(self).toOpaque()
        tcp.pointee.data = me
        timer.pointee.data = me
    }

    var stream: UnsafeMutablePointer<uv_stream_t> {
        UnsafeMutableRawPointer(tcp).assumingMemoryBound(to: uv_stream_t.self)
    }

    /// Takes an accepted socket; false if libuv refused it (the caller still owns `fd`).
    func open(_ fd: Int32) -> Bool { uv_tcp_open(tcp, uv_os_sock_t(fd)) == 0 }

    func setNoDelay() { uv_tcp_nodelay(tcp, 1) }

    func setSendBuffer(_ bytes: Int) {
        var value = Int32(clamping: bytes)
        _ = withUnsafeMutablePointer(to: &value) {
            uv_send_buffer_size(UnsafeMutableRawPointer(tcp).assumingMemoryBound(to: uv_handle_t.self), $0)
        }
    }

    /// The peer as text ("1.2.3.4:5", "[::1]:5"), its per-address key and its address bytes
    /// (4 or 16; nil if unknown).
    func peer() -> (address: String, key: PeerKey?, bytes: [UInt8]?) {
        var storage = sockaddr_storage()
        var len = Int32(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { uv_tcp_getpeername(tcp, $0, &len) }
        }
        guard rc == 0 else { return ("unknown", nil, nil) }
        let (bytes, port) = withUnsafePointer(to: &storage) { p -> ([UInt8], UInt16) in
            if Int32(p.pointee.ss_family) == AF_INET6 {
                return p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { a in
                    (withUnsafeBytes(of: a.pointee.sin6_addr) { Array($0) }, UInt16(bigEndian: a.pointee.sin6_port))
                }
            }
            return p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { a in
                (withUnsafeBytes(of: a.pointee.sin_addr) { Array($0) }, UInt16(bigEndian: a.pointee.sin_port))
            }
        }
        return (addressText(bytes, port: port) ?? "unknown", PeerKey(addressBytes: bytes), bytes)
    }

    private static func from(_ data: UnsafeMutableRawPointer?) -> TCPSocket {
        Unmanaged<TCPSocket>.fromOpaque(data!).takeUnretainedValue()
    }

    func startReading() {
        guard !isClosing, !reading else { return }
        reading = true
        uv_read_start(stream, { handle, _, buf in
            let s = TCPSocket.from(handle!.pointee.data)
            buf!.pointee = uv_buf_init(s.loop.readBuffer.assumingMemoryBound(to: CChar.self),
                                       UInt32(EventLoop.readBufferSize))
        }, { stream, nread, _ in
            let s = TCPSocket.from(stream!.pointee.data)
            if nread > 0 {
                s.owner?.onRead(UnsafeRawBufferPointer(start: s.loop.readBuffer, count: nread))
            } else if nread < 0 {
                if Int32(nread) == UV_EOF.rawValue { s.owner?.onEOF() } else { s.owner?.close() }
            }
        })
    }

    func stopReading() {
        guard reading, !isClosing else { return }
        reading = false
        uv_read_stop(stream)
    }

    /// Writes what the kernel takes now; the rest is copied and queued. Returns false on a
    /// fatal socket error (the caller closes).
    func write(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !isClosing else { return false }
        var offset = 0
        if writesInFlight == 0 {
            var buf = uv_buf_init(UnsafeMutablePointer(mutating: bytes.baseAddress!.assumingMemoryBound(to: CChar.self)),
                                  UInt32(bytes.count))
            let n = uv_try_write(stream, &buf, 1)
            if n >= 0 {
                offset = Int(n)
            } else if n != UV_EAGAIN.rawValue {
                return false
            }
        }
        if offset == bytes.count { return true }
        // One block: the request, its byte count (libuv clears req->bufs before the callback),
        // then the bytes it writes.
        let rest = bytes.count - offset
        let headerSize = (MemoryLayout<uv_write_t>.stride + 15) & ~15
        let block = UnsafeMutableRawPointer.allocate(byteCount: headerSize + 16 + rest, alignment: 16)
        let req = block.bindMemory(to: uv_write_t.self, capacity: 1)
        (block + headerSize).storeBytes(of: rest, as: Int.self)
        let data = block + headerSize + 16
        data.copyMemory(from: bytes.baseAddress! + offset, byteCount: rest)
        req.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        var buf = uv_buf_init(data.assumingMemoryBound(to: CChar.self), UInt32(rest))
        let rc = uv_write(req, stream, &buf, 1) { req, status in
            let s = TCPSocket.from(req!.pointee.data)
            let headerSize = (MemoryLayout<uv_write_t>.stride + 15) & ~15
            let written = (UnsafeMutableRawPointer(req!) + headerSize).load(as: Int.self)
            s.queuedBytes -= written
            s.loop.core.queuedOutput.subtract(written, ordering: .relaxed)
            UnsafeMutableRawPointer(req!).deallocate()
            s.writesInFlight -= 1
            s.writeDone()
            if status < 0 { s.owner?.close() } else { s.owner?.onWriteDone() }
        }
        if rc != 0 {
            block.deallocate()
            return false
        }
        writesInFlight += 1
        queuedBytes += rest
        loop.core.queuedOutput.add(rest, ordering: .relaxed)
        writeQueuedAt.append(loop.now)
        return true
    }

    /// When the oldest write still queued was queued (nil: none is).
    var oldestWriteQueuedAt: UInt64? {
        writeQueuedHead < writeQueuedAt.count ? writeQueuedAt[writeQueuedHead] : nil
    }

    private func writeDone() {
        writeQueuedHead += 1
        if writeQueuedHead == writeQueuedAt.count {
            writeQueuedAt.removeAll(keepingCapacity: true)
            writeQueuedHead = 0
        } else if writeQueuedHead >= 32 {
            writeQueuedAt.removeFirst(writeQueuedHead)
            writeQueuedHead = 0
        }
    }

    /// Sends FIN once the queued writes are written (uv_shutdown). The request is freed in its
    /// callback, which libuv also runs (with UV_ECANCELED) when the handle is closed first.
    /// Returns false if libuv refused (the caller closes).
    func shutdownWrite() -> Bool {
        guard !isClosing else { return false }
        let req = UnsafeMutablePointer<uv_shutdown_t>.allocate(capacity: 1)
        let rc = uv_shutdown(req, stream) { req, _ in req?.deallocate() }
        if rc != 0 {
            req.deallocate()
            return false
        }
        return true
    }

    func armTimer(milliseconds: UInt64) {
        guard !isClosing else { return }
        uv_timer_start(timer, { t in
            TCPSocket.from(t!.pointee.data).owner?.onTimer()
        }, milliseconds, 0)
    }

    func stopTimer() {
        guard !isClosing else { return }
        uv_timer_stop(timer)
    }

    /// Closes both handles; pending writes complete with ECANCELED first (libuv guarantees it).
    func close() {
        guard !isClosing else { return }
        isClosing = true
        pendingCloses = 2
        let cb: uv_close_cb = { h in
            TCPSocket.from(h!.pointee.data).handleClosed()
        }
        uv_close(UnsafeMutableRawPointer(tcp).assumingMemoryBound(to: uv_handle_t.self), cb)
        uv_close(UnsafeMutableRawPointer(timer).assumingMemoryBound(to: uv_handle_t.self), cb)
    }

    private func handleClosed() {
        pendingCloses -= 1
        guard pendingCloses == 0 else { return }
        tcp.deallocate()
        timer.deallocate()
        let o = owner
        owner = nil
        o?.onSocketClosed()
        Unmanaged.passUnretained(self).release()
    }
}

/// A NUL-terminated C string held in a Swift array.
func cArrayString(_ chars: [CChar]) -> String {
    String(decoding: chars.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
