// Who is on the other end of a connection: the TLS details and the address key that
// per-address limits count by.

/// What the TLS layer negotiated for the connection a request arrived on.
public struct TLSInfo: Sendable, Equatable {
    public var alpn: String?
    public var version: String
    public var cipher: String
    public var peerCertificateSubject: String?

    public init(alpn: String?, version: String, cipher: String, peerCertificateSubject: String?) {
        self.alpn = alpn
        self.version = version
        self.cipher = cipher
        self.peerCertificateSubject = peerCertificateSubject
    }
}

/// A client address as per-address limits count it: an IPv4 address (also when it arrives
/// IPv4-mapped, ::ffff:a.b.c.d, on a dual-stack listener) or an IPv6 /64 (one subscriber's
/// prefix: a host may pick any address in it). The server's per-address connection cap and the
/// relay's per-address 401 budget both use it; the budget also charges an IPv6 key's /48.
public struct PeerKey: Hashable, Sendable {
    let high: UInt64   // IPv6: the first 64 bits; IPv4: 0
    let low: UInt32    // IPv4: the address; IPv6: 0
    let isIPv4: Bool   // keeps 0.0.0.0 apart from the IPv6 prefix ::/64

    public init(ipv4: UInt32) {
        high = 0
        low = ipv4
        isIPv4 = true
    }

    private init(ipv6Prefix: UInt64) {
        high = ipv6Prefix
        low = 0
        isIPv4 = false
    }

    /// From the 16 bytes of an IPv6 address.
    public init(ipv6 bytes: UnsafeRawBufferPointer) {
        if isIPv4Mapped(bytes) {
            self.init(ipv4: UInt32(bytes[12]) << 24 | UInt32(bytes[13]) << 16 | UInt32(bytes[14]) << 8 | UInt32(bytes[15]))
        } else {
            self.init(ipv6Prefix: bytes.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) })
        }
    }

    /// From an address as `HTTPRequest.remoteAddress` writes it ("192.0.2.7:51234",
    /// "[2001:db8::1]:443"), a port being optional; nil when it is neither.
    public init?(address: String) {
        var host = Substring(address)
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.firstIndex(of: ":"), colon == host.lastIndex(of: ":") {
            host = host[..<colon]   // IPv4 with a port (a bare IPv6 address has several colons)
        }
        guard let bytes = ipAddressBytes(String(host)) else { return nil }
        self.init(addressBytes: bytes)
    }

    /// From the 4 or 16 bytes of an IPv4 or IPv6 address (ipAddressBytes, a PROXY header);
    /// nil for any other length.
    init?(addressBytes a: [UInt8]) {
        switch a.count {
        case 4: self.init(ipv4: UInt32(a[0]) << 24 | UInt32(a[1]) << 16 | UInt32(a[2]) << 8 | UInt32(a[3]))
        case 16: self = a.withUnsafeBytes { PeerKey(ipv6: $0) }
        default: return nil
        }
    }

    /// "192.0.2.7", or the /64 as 16 hex digits and "/64" ("20010db800000000/64").
    public var text: String {
        if isIPv4 { return "\(low >> 24).\(low >> 16 & 0xff).\(low >> 8 & 0xff).\(low & 0xff)" }
        let hex = String(high, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex + "/64"
    }

    /// For an IPv6 key's `text`, the key of its /48 ("20010db80000/48"), which a limit may
    /// charge too so that a site's 65,536 /64s do not each get a budget; nil for IPv4 (or text
    /// that is no key).
    public static func slash48Text(ofKeyText text: String) -> String? {
        let u = text.utf8
        guard u.count == 19, text.hasSuffix("/64") else { return nil }
        return String(decoding: u.prefix(12), as: UTF8.self) + "/48"
    }
}

/// Whether 16 address bytes are an IPv4-mapped IPv6 address (::ffff:a.b.c.d, a dual-stack
/// listener's IPv4 peer), whose last 4 bytes are the IPv4 address.
func isIPv4Mapped(_ b: some Collection<UInt8>) -> Bool {
    b.count == 16 && b.prefix(10).allSatisfy { $0 == 0 } && b.dropFirst(10).prefix(2).allSatisfy { $0 == 0xff }
}
