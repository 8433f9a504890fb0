// The libuv loop: one `EventLoop` per loop thread (loop, cross-thread task queue woken by a
// uv_async, listener). The listener is in Listener.swift, a connection's handles in TCPSocket.swift. Handles are
// heap-allocated so they never move while libuv holds them; the Swift object a handle points
// back to is retained until that handle's close callback ran.
internal import CUV
import POSIXThreads
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Work handed to a loop from another thread.
enum LoopTask {
    /// A reply for the writer's connection (the task does not hold the connection itself: the
    /// thread queueing it then never touches that object).
    case respond(HTTPReplyWriter, HTTPReply, ConnectionAction)
    /// A reply built here, on the loop (`HTTPReplyWriter.respond(building:)`).
    case build(HTTPReplyWriter, any HTTPReplySource, ConnectionAction)
    case abort(ServerConnection)
    case setMaxConcurrentStreams(ServerConnection, UInt32)
    case continueDecided(ServerConnection, UInt64, HTTPReply?)
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
final class EventLoop: @unchecked Sendable {
    let core: ServerCore
    let loop: UnsafeMutablePointer<uv_loop_t>
    private let async: UnsafeMutablePointer<uv_async_t>
    private var listener: Listener?
    private let tasks = Mutex(TaskQueue())
    private let threadID = Atomic<UInt>(0)
    private var thread: pthread_t?
    let connectionCount = Atomic<Int>(0)
    var connections: [ObjectIdentifier: ServerConnection] = [:]
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
        let fd = socket(isV6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
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
        guard brc == 0, Glibc.listen(fd, 1024) == 0 else {
            let msg = String(cString: strerror(errno))
            close(fd)
            throw HTTPServerError.libuv(operation: (brc == 0 ? "listen " : "bind ") + "\(host):\(port)", message: msg)
        }
        var bound = sockaddr_storage()
        var blen = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &bound) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &blen) }
        }
        let boundPort = Self.port(of: &bound)
        listener = try Listener(loop: self, fd: fd, address: "\(isV6 ? "[\(host)]" : host):\(boundPort)")
        return boundPort
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
        listener?.close()
        listener = nil
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

    /// The queue's other buffer (loop thread only): swapped in under the lock, so the queue keeps
    /// a buffer with room and a thread handing a reply over does not grow one per wake-up.
    private var spareTasks: [LoopTask] = []
    /// A burst's buffer is not kept past this many tasks.
    private static let spareTasksKept = 1024

    private func runTasks() {
        var items: [LoopTask] = []
        swap(&items, &spareTasks)
        tasks.withLock { q in swap(&q.items, &items) }
        defer {
            items.removeAll(keepingCapacity: items.capacity <= Self.spareTasksKept)
            swap(&items, &spareTasks)
        }
        for t in items {
            switch t {
            case .respond(let r, let resp, let action): r.connection.complete(r, resp, action)
            case .build(let r, let source, let action): r.connection.complete(r, source.makeReply(), action)
            case .abort(let c): c.close()
            case .setMaxConcurrentStreams(let c, let n): c.setMaxConcurrentStreams(n)
            case .continueDecided(let c, let sequence, let refusal): c.continueDecided(sequence: sequence, refusal: refusal)
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
        let dropped = tasks.withLock { q -> [LoopTask] in
            q.stopped = true
            let items = q.items
            q.items.removeAll()
            uv_close(UnsafeMutableRawPointer(async).assumingMemoryBound(to: uv_handle_t.self), nil)
            return items
        }
        // Their connections are closed: nothing is sent, but a reply source is still built (and
        // dropped), so what building it records is not lost (HTTPReplyWriter.respond(building:)).
        for case .build(_, let source, _) in dropped { _ = source.makeReply() }
    }

    // MARK: Accepting

    /// A connection the listener accepted (`fd` non-blocking, close-on-exec; now owned here).
    func accepted(_ fd: Int32) {
        let socket = TCPSocket(loop: self)
        guard socket.open(fd) else {
            close(fd)
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
        let conn = ServerConnection(loop: self, socket: socket, id: core.nextConnectionID(), remoteAddress: peer.address)
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
            var greediest: ServerConnection?
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
    func remove(_ conn: ServerConnection) {
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
