// The libuv wrapper: one `EventLoop` per loop thread (loop, cross-thread task queue woken by a
// uv_async, listener) and one `TCPSocket` per connection (uv_tcp_t + uv_timer_t). libuv types
// stay in this file. Handles are heap-allocated so they never move while libuv holds them; the
// Swift object a handle points back to is retained until that handle's close callback ran.
internal import CUV
import POSIXThreads
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Work handed to a loop from another thread.
enum LoopTask {
    case respond(Connection, HTTPResponder, HTTPResponse, ConnectionAction)
    case abort(Connection)
    case setMaxConcurrentStreams(Connection, UInt32)
    case continueDecided(Connection, UInt64, HTTPResponse?)
    case run(@Sendable () -> Void)
    case beginShutdown
    case forceClose
}

private struct TaskQueue {
    var items: [LoopTask] = []
    var stopped = false
}

private func uvMessage(_ code: Int32) -> String { String(cString: uv_strerror(code)) }

// @unchecked Sendable: everything mutable here (`listener`, `connections`, the buffers, the
// date cache) is touched only on the loop thread once `start` has created it. Other threads
// use only `enqueue` (a Mutex-protected queue plus uv_async_send, which libuv documents as
// thread-safe), `isCurrentThread` (an Atomic) and `connectionCount` (an Atomic).
final class EventLoop: ThreadExecutor, @unchecked Sendable {
    let core: ServerCore
    let loop: UnsafeMutablePointer<uv_loop_t>
    private let async: UnsafeMutablePointer<uv_async_t>
    private var listener: UnsafeMutablePointer<uv_tcp_t>?
    private let tasks = Mutex(TaskQueue())
    private let threadID = Atomic<UInt>(0)
    private var thread: pthread_t?
    let connectionCount = Atomic<Int>(0)
    var connections: [ObjectIdentifier: Connection] = [:]
    var shuttingDown = false

    /// Reused by every read on this loop: reads are consumed synchronously in the read callback.
    let readBuffer: UnsafeMutableRawPointer
    static let readBufferSize = 65536
    /// Decrypted TLS records land here before the HTTP layer copies what it keeps.
    let plainBuffer: UnsafeMutableRawPointer
    static let plainBufferSize = 65536

    /// Where HTTP/1 response heads are assembled (HeadWriter); larger heads spill past it.
    var headScratch = [UInt8](repeating: 0, count: 4096)

    private var dateLine: [UInt8] = []
    private var dateString = ""
    private var dateRefreshedAt: UInt64 = 0

    init(core: ServerCore) throws {
        self.core = core
        loop = .allocate(capacity: 1)
        async = .allocate(capacity: 1)
        readBuffer = .allocate(byteCount: Self.readBufferSize, alignment: 16)
        plainBuffer = .allocate(byteCount: Self.plainBufferSize, alignment: 16)
        var rc = uv_loop_init(loop)
        guard rc == 0 else {
            loop.deallocate(); async.deallocate(); readBuffer.deallocate(); plainBuffer.deallocate()
            throw HTTPServerError.libuv(operation: "uv_loop_init", message: uvMessage(rc))
        }
        rc = uv_async_init(loop, async) { handle in
            guard let handle, let data = handle.pointee.data else { return }
            Unmanaged<EventLoop>.fromOpaque(data).takeUnretainedValue().runTasks()
        }
        guard rc == 0 else {
            uv_loop_close(loop)
            loop.deallocate(); async.deallocate(); readBuffer.deallocate(); plainBuffer.deallocate()
            throw HTTPServerError.libuv(operation: "uv_async_init", message: uvMessage(rc))
        }
        async.pointee.data = Unmanaged.passUnretained(self).toOpaque()
    }

    deinit {
        // Only reached after the thread was joined (or never started) and every handle closed.
        uv_loop_close(loop)
        loop.deallocate()
        async.deallocate()
        readBuffer.deallocate()
        plainBuffer.deallocate()
    }

    // MARK: Listening and the thread

    /// Binds on the caller's thread (before the loop runs) so errors surface from `start()`.
    /// Returns the bound port.
    func listen(host: String, port: Int, reusePort: Bool) throws -> Int {
        var storage = sockaddr_storage()
        let isV6 = host.contains(":")
        let rc: Int32 = withUnsafeMutablePointer(to: &storage) { p in
            if isV6 {
                return p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { uv_ip6_addr(host, Int32(port), $0) }
            } else {
                return p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { uv_ip4_addr(host, Int32(port), $0) }
            }
        }
        guard rc == 0 else { throw HTTPServerError.invalidAddress("\(host):\(port)") }
        let fd = socket(isV6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HTTPServerError.libuv(operation: "socket", message: String(cString: strerror(errno))) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if reusePort {
            setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size))
        }
        let len = socklen_t(isV6 ? MemoryLayout<sockaddr_in6>.size : MemoryLayout<sockaddr_in>.size)
        let brc = withUnsafePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) }
        }
        guard brc == 0 else {
            let msg = String(cString: strerror(errno))
            close(fd)
            throw HTTPServerError.libuv(operation: "bind \(host):\(port)", message: msg)
        }
        let handle = UnsafeMutablePointer<uv_tcp_t>.allocate(capacity: 1)
        uv_tcp_init(loop, handle)
        handle.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        listener = handle
        var urc = uv_tcp_open(handle, uv_os_sock_t(fd))
        if urc == 0 {
            urc = uv_listen(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_stream_t.self), 1024) { server, status in
                guard let server, let data = server.pointee.data else { return }
                Unmanaged<EventLoop>.fromOpaque(data).takeUnretainedValue().accept(status: status)
            }
        }
        guard urc == 0 else {
            closeListener()
            throw HTTPServerError.libuv(operation: "listen \(host):\(port)", message: uvMessage(urc))
        }
        var bound = sockaddr_storage()
        var blen = Int32(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &bound) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { uv_tcp_getsockname(handle, $0, &blen) }
        }
        return Self.port(of: &bound)
    }

    private static func port(of storage: inout sockaddr_storage) -> Int {
        withUnsafePointer(to: &storage) { p in
            if Int32(p.pointee.ss_family) == AF_INET6 {
                return p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { Int(UInt16(bigEndian: $0.pointee.sin6_port)) }
            }
            return p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { Int(UInt16(bigEndian: $0.pointee.sin_port)) }
        }
    }

    private func closeListener() {
        guard let l = listener else { return }
        listener = nil
        uv_close(UnsafeMutableRawPointer(l).assumingMemoryBound(to: uv_handle_t.self)) { h in
            h?.deallocate()
        }
    }

    func startThread() throws {
        do {
            thread = try POSIXThreads.startThread(name: nil) { [self] in run() }
        } catch {
            throw HTTPServerError.libuv(operation: "pthread_create", message: String(cString: strerror(error.code)))
        }
    }

    private func run() {
        threadID.store(UInt(pthread_self()), ordering: .releasing)
        uv_run(loop, UV_RUN_DEFAULT)
    }

    /// For a loop whose thread never started (a failed `start`): closes its handles here.
    func stopWithoutThread() {
        forceClose()
        uv_run(loop, UV_RUN_DEFAULT)
    }

    var hasThread: Bool { thread != nil }

    func join() {
        if let t = thread {
            pthread_join(t, nil)
            thread = nil
        }
    }

    var isCurrentThread: Bool {
        threadID.load(ordering: .acquiring) == UInt(pthread_self())
    }

    // MARK: Cross-thread tasks

    /// Returns false once the loop stopped (the task is dropped).
    @discardableResult
    func enqueue(_ task: LoopTask) -> Bool {
        tasks.withLock { q in
            if q.stopped { return false }
            q.items.append(task)
            // Inside the lock: the handle cannot be closed between the check and the send.
            uv_async_send(async)
            return true
        }
    }

    @discardableResult
    func execute(_ work: @escaping @Sendable () -> Void) -> Bool { enqueue(.run(work)) }

    private func runTasks() {
        let items = tasks.withLock { q -> [LoopTask] in
            let items = q.items
            q.items.removeAll()
            return items
        }
        for t in items {
            switch t {
            case .respond(let c, let r, let resp, let action): c.complete(r, resp, action)
            case .abort(let c): c.close()
            case .setMaxConcurrentStreams(let c, let n): c.setMaxConcurrentStreams(n)
            case .continueDecided(let c, let sequence, let refusal): c.continueDecided(sequence: sequence, refusal: refusal)
            case .run(let work): work()
            case .beginShutdown: beginShutdown()
            case .forceClose: forceClose()
            }
        }
    }

    private func beginShutdown() {
        shuttingDown = true
        closeListener()
        for c in Array(connections.values) { c.beginShutdown() }
    }

    private func forceClose() {
        shuttingDown = true
        closeListener()
        for c in Array(connections.values) { c.close() }
        tasks.withLock { q in
            q.stopped = true
            q.items.removeAll()
            uv_close(UnsafeMutableRawPointer(async).assumingMemoryBound(to: uv_handle_t.self), nil)
        }
    }

    // MARK: Accepting

    private func accept(status: Int32) {
        guard status == 0, let l = listener else { return }
        let socket = TCPSocket(loop: self)
        let rc = uv_accept(UnsafeMutableRawPointer(l).assumingMemoryBound(to: uv_stream_t.self), socket.stream)
        guard rc == 0 else {
            socket.close()
            return
        }
        let peer = socket.peer()
        if let proxy = core.proxyProtocol, !(peer.bytes.map(proxy.trusts) ?? false) {
            // Only the configured balancers may connect to a PROXY protocol listener.
            core.recordProxyRefused()
            socket.close()
            return
        }
        let admission = core.admission?() ?? .serve
        if admission == .close {
            socket.close()
            return
        }
        if shuttingDown || !core.reserveConnection() {
            core.recordRefused()
            socket.close()
            return
        }
        // The per-address share, after the global one (which is released if this refuses).
        // Behind a PROXY header it is taken once the header names the client.
        var perAddressKey: PeerKey?
        if core.proxyProtocol == nil, core.maxConnectionsPerAddress > 0, let key = peer.key {
            guard core.reserveConnection(for: key) else {
                core.releaseConnection()
                core.recordRefused(perAddress: true)
                socket.close()
                return
            }
            perAddressKey = key
        }
        socket.setNoDelay()
        if core.socketSendBufferBytes > 0 { socket.setSendBuffer(core.socketSendBufferBytes) }
        let conn = Connection(loop: self, socket: socket, id: core.nextConnectionID(), remoteAddress: peer.address)
        conn.perAddressKey = perAddressKey
        conn.socketPeerKey = peer.key
        conn.clientKey = peer.key?.text ?? ""
        socket.owner = conn
        connections[ObjectIdentifier(conn)] = conn
        connectionCount.add(1, ordering: .relaxed)
        if admission == .stall { return }   // never read: closed when the server stops
        conn.goAwayAtStart = admission == .goAwayAtStart
        socket.startReading()
        conn.start()
    }

    /// Closes the connections of this loop holding the most input until the server-wide input
    /// total is back under its budget (or nothing here holds any): a few greedy peers lose
    /// their connections instead of the process its memory or new clients their service.
    func closeGreediestInput() {
        while core.inputOverBudget() {
            var greediest: Connection?
            for conn in connections.values where !conn.closed && conn.inputHeld > (greediest?.inputHeld ?? 0) {
                greediest = conn
            }
            guard let conn = greediest else { return }
            core.recordInputBudgetClose()
            conn.close()
            conn.accountInput(0)
        }
    }

    /// Called by a connection once its socket's handles are closed.
    func remove(_ conn: Connection) {
        if connections.removeValue(forKey: ObjectIdentifier(conn)) != nil {
            connectionCount.subtract(1, ordering: .relaxed)
            core.releaseConnection()
            if let key = conn.perAddressKey { core.releaseConnection(for: key) }
        }
    }

    // MARK: Clock

    var now: UInt64 { uv_now(loop) }

    /// `date: <IMF-fixdate>\r\n`, refreshed at most once a second.
    var dateHeaderLine: [UInt8] {
        refreshDate()
        return dateLine
    }

    /// The IMF-fixdate alone (HTTP/2 `date` header), refreshed at most once a second.
    var dateValue: String {
        refreshDate()
        return dateString
    }

    private func refreshDate() {
        let n = uv_now(loop)
        if dateLine.isEmpty || n &- dateRefreshedAt >= 1000 {
            dateRefreshedAt = n
            dateString = httpDate()
            dateLine = Array("date: \(dateString)\r\n".utf8)
        }
    }
}

func httpDate() -> String {
    var t = time(nil)
    var tmv = tm()
    gmtime_r(&t, &tmv)
    let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
    return "\(days[Int(tmv.tm_wday)]), \(two(tmv.tm_mday)) \(months[Int(tmv.tm_mon)]) \(tmv.tm_year + 1900) \(two(tmv.tm_hour)):\(two(tmv.tm_min)):\(two(tmv.tm_sec)) GMT"
}

/// One accepted TCP connection's libuv handles. Retains itself from accept until both handles'
/// close callbacks ran; holds its `Connection` until then (the cycle is broken on close).
final class TCPSocket {
    /// unowned(unsafe): a loop outlives its sockets (it runs until every handle closed).
    unowned(unsafe) let loop: EventLoop
    private let tcp: UnsafeMutablePointer<uv_tcp_t>
    private let timer: UnsafeMutablePointer<uv_timer_t>
    var owner: Connection?
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
