// Helpers every test target needs and none can import from another test target: a seeded PRNG
// (failing inputs replay) and loopback sockets. Depends on nothing but Glibc, so any test target
// can use it without pulling in another module.
import Glibc

/// SplitMix64: small and seedable, so a failing seed can be replayed.
public struct SeededGenerator: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public init(state: UInt64) { self.state = state }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

public struct LoopbackSocketError: Error, CustomStringConvertible {
    public let description: String
}

/// A TCP socket bound to 127.0.0.1 on an ephemeral port and listening (nothing accepts unless
/// the owner does). Closed by `close()` or on deinit.
public final class LoopbackListener: @unchecked Sendable {
    // @unchecked Sendable: fd and port are immutable; closing twice is guarded by `closed`,
    // which only the owner's single close path touches.
    public let fd: Int32
    public let port: Int
    private var closed = false

    /// `port` 0: an ephemeral one. A given port (one found free earlier) is bound with
    /// SO_REUSEADDR, for tests where nothing listens on it at first.
    public init(port: Int = 0, backlog: Int32 = 16) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw LoopbackSocketError(description: "socket: errno \(errno)") }
        var one: Int32 = 1
        if port != 0 { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sp -> Bool in
                bind(fd, sp, len) == 0 && listen(fd, backlog) == 0 && getsockname(fd, sp, &len) == 0
            }
        }
        guard ok else {
            let e = errno
            Glibc.close(fd)
            throw LoopbackSocketError(description: "cannot listen on 127.0.0.1: errno \(e)")
        }
        self.fd = fd
        self.port = Int(UInt16(bigEndian: addr.sin_port))
    }

    public func close() {
        guard !closed else { return }
        closed = true
        shutdown(fd, Int32(SHUT_RDWR))
        Glibc.close(fd)
    }

    deinit { close() }
}

/// A loopback port that was free a moment ago (bound to 0, read back, released), for tools
/// that cannot bind port 0 themselves.
public func freeLoopbackPort() throws -> Int {
    let l = try LoopbackListener(backlog: 1)
    defer { l.close() }
    return l.port
}
