// Sockets for the HTTP/2 connections: where to connect (parsed once from the base URL), a
// non-blocking TCP connect over every address getaddrinfo returns, and the byte transport
// abstraction the connection drives (plain TCP for h2c, TLS from OpenSSL.swift).
import Glibc

enum IOResult {
    case bytes(Int)
    /// Nothing more now; `wantWrite` = wait for POLLOUT (TLS may need to write to read).
    case wouldBlock(wantWrite: Bool)
    case closed
    case failed(String)
}

enum HandshakeStep {
    case done, wantRead, wantWrite
    case failed(String)
}

/// How bytes get on and off the wire once TCP is connected.
protocol ByteTransport: AnyObject {
    func handshake() -> HandshakeStep
    func read(_ buffer: UnsafeMutableRawPointer, _ capacity: Int) -> IOResult
    func write(_ buffer: UnsafeRawPointer, _ count: Int) -> IOResult
    func shutdown()
}

/// h2c with prior knowledge: the socket as is.
final class PlainTransport: ByteTransport {
    private let fd: Int32
    init(fd: Int32) { self.fd = fd }

    func handshake() -> HandshakeStep { .done }

    func read(_ buffer: UnsafeMutableRawPointer, _ capacity: Int) -> IOResult {
        let n = Glibc.read(fd, buffer, capacity)
        if n > 0 { return .bytes(n) }
        if n == 0 { return .closed }
        return Self.error(errno)
    }

    func write(_ buffer: UnsafeRawPointer, _ count: Int) -> IOResult {
        let n = send(fd, buffer, count, Int32(MSG_NOSIGNAL))
        if n >= 0 { return .bytes(n) }
        return Self.error(errno)
    }

    func shutdown() {}

    private static func error(_ e: Int32) -> IOResult {
        if e == EAGAIN || e == EWOULDBLOCK || e == EINTR { return .wouldBlock(wantWrite: false) }
        return .failed(String(cString: strerror(e)))
    }
}

/// The APNs (or mock) origin, parsed once from the configured base URL.
struct Endpoint: Sendable, Equatable {
    var tls: Bool
    /// Without brackets (an IPv6 literal is bare here).
    var host: String
    var port: Int
    /// `:authority` as RFC 9113 wants it: host, plus `:port` when it is not the scheme's default.
    var authority: String
}

extension Endpoint {
    init(url: String) throws {
        let rest: Substring
        if url.hasPrefix("https://") {
            tls = true
            rest = url.dropFirst(8)
        } else if url.hasPrefix("http://") {
            tls = false
            rest = url.dropFirst(7)
        } else {
            throw PushClientError.invalidConfiguration("environment URL must start with https:// or http://, got \(url)")
        }
        let hostPort = rest.prefix { $0 != "/" }
        guard hostPort.count == rest.count else {
            throw PushClientError.invalidConfiguration("environment URL must have no path, got \(url)")
        }
        var portText: Substring?
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else {
                throw PushClientError.invalidConfiguration("environment URL has an unclosed IPv6 bracket: \(url)")
            }
            host = String(hostPort[hostPort.index(after: hostPort.startIndex)..<close])
            let after = hostPort[hostPort.index(after: close)...]
            if after.hasPrefix(":") { portText = after.dropFirst() } else if !after.isEmpty {
                throw PushClientError.invalidConfiguration("environment URL: unexpected text after ]: \(url)")
            }
        } else if let colon = hostPort.lastIndex(of: ":") {
            host = String(hostPort[..<colon])
            portText = hostPort[hostPort.index(after: colon)...]
        } else {
            host = String(hostPort)
        }
        guard !host.isEmpty else { throw PushClientError.invalidConfiguration("environment URL has no host: \(url)") }
        let defaultPort = tls ? 443 : 80
        if let portText {
            guard let p = Int(portText), (1...65535).contains(p) else {
                throw PushClientError.invalidConfiguration("environment URL port must be 1...65535: \(url)")
            }
            port = p
        } else {
            port = defaultPort
        }
        let bracketed = host.contains(":") ? "[\(host)]" : host
        authority = port == defaultPort ? bracketed : "\(bracketed):\(port)"
    }
}

/// A socket fd, closed in deinit.
final class Socket {
    let fd: Int32
    init(fd: Int32) { self.fd = fd }
    deinit { close(fd) }
}

/// A non-blocking TCP connect in progress over the addresses of one host.
final class TCPConnector {
    private var addresses: [(family: Int32, address: [UInt8])] = []
    private var lastError = ""
    private let endpoint: Endpoint
    private(set) var socket: Socket?

    /// Resolves the host (blocking getaddrinfo, on the slot thread) and starts the first connect.
    init(endpoint: Endpoint) throws {
        self.endpoint = endpoint
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        // No AI_ADDRCONFIG: glibc implements it with an AF_NETLINK socket, which the systemd
        // unit's RestrictAddressFamilies forbids (and it hides ::1 on IPv4-only hosts). An
        // address family the host lacks just fails its connect and the next address is tried.
        hints.ai_flags = 0
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &list)
        guard rc == 0 else {
            throw PushClientError.transport("cannot resolve \(endpoint.host): \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(list) }
        var p = list
        while let ai = p {
            if let a = ai.pointee.ai_addr {
                addresses.append((ai.pointee.ai_family,
                                  Array(UnsafeRawBufferPointer(start: a, count: Int(ai.pointee.ai_addrlen)))))
            }
            p = ai.pointee.ai_next
        }
        guard try startNext() else { throw PushClientError.transport(failureMessage) }
    }

    var failureMessage: String { "cannot connect to \(endpoint.authority): \(lastError.isEmpty ? "no address" : lastError)" }

    /// Starts connecting to the next address; false when none is left.
    private func startNext() throws -> Bool {
        while !addresses.isEmpty {
            let (family, address) = addresses.removeFirst()
            let fd = Glibc.socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { lastError = String(cString: strerror(errno)); continue }
            let s = Socket(fd: fd)
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let rc = address.withUnsafeBytes { connect(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t($0.count)) }
            if rc == 0 || errno == EINPROGRESS {
                socket = s
                return true
            }
            lastError = String(cString: strerror(errno))
        }
        socket = nil
        return false
    }

    /// After POLLOUT/POLLERR: true when connected; false while another address is tried;
    /// throws when every address failed.
    func finish() throws -> Bool {
        guard let s = socket else { throw PushClientError.transport(failureMessage) }
        var err: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 else {
            lastError = String(cString: strerror(errno))
            if try startNext() { return false }
            throw PushClientError.transport(failureMessage)
        }
        if err == 0 { return true }
        if err == EINPROGRESS { return false }
        lastError = String(cString: strerror(err))
        if try startNext() { return false }
        throw PushClientError.transport(failureMessage)
    }
}
