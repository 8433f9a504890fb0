// The PROXY protocol header a load balancer (HAProxy, AWS NLB, nginx stream) puts before a
// connection's first byte to name the client it accepted: version 2 (binary) and version 1
// (text), as specified in haproxy's doc/proxy-protocol.txt. Pure parsing; ServerConnection decides
// what a header may change (only from a trusted proxy: see ProxyProtocolConfiguration).
#if canImport(Glibc)
import Glibc
#endif

/// An IP network written as CIDR ("10.0.0.0/8", "2001:db8::/32") or one address ("192.0.2.7").
/// IPv4 networks also match IPv4-mapped IPv6 peers (::ffff:a.b.c.d) of a dual-stack listener.
public struct IPNetwork: Sendable, Equatable, CustomStringConvertible {
    /// 4 or 16 bytes, host bits cleared.
    let bytes: [UInt8]
    /// Per byte of `bytes`: the bits the prefix covers.
    let mask: [UInt8]
    let prefixLength: Int
    public let description: String

    public init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = ipAddressBytes(String(parts[0])) else { return nil }
        let maxPrefix = address.count * 8
        var prefix = maxPrefix
        if parts.count == 2 {
            guard !parts[1].isEmpty, parts[1].allSatisfy({ $0.isASCII && $0.isNumber }), parts[1].count <= 3,
                  let p = Int(parts[1]), p <= maxPrefix else { return nil }
            prefix = p
        }
        mask = (0..<address.count).map { i in
            let bitsHere = max(0, min(8, prefix - i * 8))
            return bitsHere == 0 ? 0 : UInt8(truncatingIfNeeded: 0xFF << (8 - bitsHere))
        }
        bytes = zip(address, mask).map { $0 & $1 }
        prefixLength = prefix
        description = text
    }

    /// Whether `address` (4 or 16 bytes) lies in this network.
    public func contains(_ address: [UInt8]) -> Bool {
        var a = address
        if bytes.count == 4 && a.count == 16 {
            guard isIPv4Mapped(a) else { return false }
            a = Array(a[12...])
        }
        guard a.count == bytes.count else { return false }
        for i in 0..<a.count where a[i] & mask[i] != bytes[i] { return false }
        return true
    }
}

/// The 4 or 16 bytes of a textual IPv4 or IPv6 address; nil for anything else.
func ipAddressBytes(_ text: String) -> [UInt8]? {
    var v4 = in_addr()
    if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
    var v6 = in6_addr()
    if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
    return nil
}

/// "192.0.2.7:51234" or "[2001:db8::1]:51234" (HTTPRequest.remoteAddress) from 4 or 16 address
/// bytes and a port; nil for any other length.
func addressText(_ address: [UInt8], port: UInt16) -> String? {
    var buffer = [CChar](repeating: 0, count: 64)
    let family: Int32
    switch address.count {
    case 4: family = AF_INET
    case 16: family = AF_INET6
    default: return nil
    }
    guard address.withUnsafeBytes({ inet_ntop(family, $0.baseAddress, &buffer, socklen_t(buffer.count)) }) != nil else { return nil }
    let host = cArrayString(buffer)
    return address.count == 4 ? "\(host):\(port)" : "[\(host)]:\(port)"
}

/// What a PROXY header says about the connection.
public struct ProxyHeader: Sendable, Equatable {
    /// The client's address (4 or 16 bytes) and port; nil for a v2 LOCAL command (the proxy's
    /// own health check), v1 `UNKNOWN`, or an address family other than TCP over IPv4/IPv6:
    /// the connection then keeps the proxy's address.
    public var sourceAddress: [UInt8]?
    public var sourcePort: UInt16

    /// "192.0.2.7:51234" or "[2001:db8::1]:51234", as HTTPRequest.remoteAddress writes it.
    public var sourceText: String? { sourceAddress.flatMap { addressText($0, port: sourcePort) } }

    /// The per-address key of the source, or nil when there is none.
    public var sourceKey: PeerKey? { sourceAddress.flatMap(PeerKey.init(addressBytes:)) }
}

public enum ProxyHeaderParse: Sendable, Equatable {
    /// The bytes so far are a valid beginning: read more.
    case needMore
    /// Not a PROXY header, or a malformed one: the connection is refused. The text says why.
    case invalid(String)
    /// A complete header of `length` bytes; the connection's own bytes follow it.
    case header(ProxyHeader, length: Int)
}

enum ProxyProtocol {
    static let v2Signature: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A]
    static let v1Prefix: [UInt8] = Array("PROXY ".utf8)
    /// v1: the longest line the specification allows, CRLF included.
    static let v1MaxLength = 107
    /// v2: address block plus TLVs; balancers send well under this (AWS NLB's VPC endpoint TLV
    /// included). Longer ones are refused rather than buffered.
    static let v2MaxPayload = 1024

    /// Parses the start of a connection's input (pure; bytes may arrive in any split).
    static func parse(_ bytes: [UInt8]) -> ProxyHeaderParse {
        guard let first = bytes.first else { return .needMore }
        if first == v2Signature[0] {
            let n = min(bytes.count, v2Signature.count)
            guard Array(bytes[0..<n]) == Array(v2Signature[0..<n]) else { return .invalid("not a PROXY protocol header") }
            return parseV2(bytes)
        }
        if first == v1Prefix[0] {
            let n = min(bytes.count, v1Prefix.count)
            guard Array(bytes[0..<n]) == Array(v1Prefix[0..<n]) else { return .invalid("not a PROXY protocol header") }
            return parseV1(bytes)
        }
        return .invalid("not a PROXY protocol header")
    }

    private static func parseV2(_ b: [UInt8]) -> ProxyHeaderParse {
        guard b.count >= 16 else { return .needMore }
        let versionCommand = b[12]
        guard versionCommand >> 4 == 2 else { return .invalid("PROXY v2: version \(versionCommand >> 4)") }
        let command = versionCommand & 0x0F
        guard command <= 1 else { return .invalid("PROXY v2: command \(command)") }
        let familyProtocol = b[13]
        let payload = Int(b[14]) << 8 | Int(b[15])
        guard payload <= v2MaxPayload else { return .invalid("PROXY v2: \(payload)-byte header") }
        guard b.count >= 16 + payload else { return .needMore }
        let length = 16 + payload
        if command == 0 {   // LOCAL: the proxy speaking for itself; addresses are ignored
            return .header(ProxyHeader(sourceAddress: nil, sourcePort: 0), length: length)
        }
        switch familyProtocol {
        case 0x11:   // TCP over IPv4: src(4) dst(4) sport(2) dport(2)
            guard payload >= 12 else { return .invalid("PROXY v2: short IPv4 address block") }
            return .header(ProxyHeader(sourceAddress: Array(b[16..<20]), sourcePort: UInt16(b[24]) << 8 | UInt16(b[25])), length: length)
        case 0x21:   // TCP over IPv6: src(16) dst(16) sport(2) dport(2)
            guard payload >= 36 else { return .invalid("PROXY v2: short IPv6 address block") }
            return .header(ProxyHeader(sourceAddress: Array(b[16..<32]), sourcePort: UInt16(b[48]) << 8 | UInt16(b[49])), length: length)
        case 0x00:   // UNSPEC: the receiver must use the real connection's addresses
            return .header(ProxyHeader(sourceAddress: nil, sourcePort: 0), length: length)
        default:
            // UDP or Unix sockets cannot carry an HTTP connection from a client we could key.
            return .invalid("PROXY v2: address family/protocol 0x\(String(familyProtocol, radix: 16))")
        }
    }

    private static func parseV1(_ b: [UInt8]) -> ProxyHeaderParse {
        guard let lf = b.firstIndex(of: 0x0A) else {
            return b.count >= v1MaxLength ? .invalid("PROXY v1: no line end within \(v1MaxLength) bytes") : .needMore
        }
        let length = lf + 1
        guard length <= v1MaxLength else { return .invalid("PROXY v1: line longer than \(v1MaxLength) bytes") }
        guard lf > 0, b[lf - 1] == 0x0D else { return .invalid("PROXY v1: line does not end in CRLF") }
        guard b[0..<(lf - 1)].allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return .invalid("PROXY v1: control or non-ASCII byte") }
        let fields = String(decoding: b[0..<(lf - 1)], as: UTF8.self).split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count >= 2 else { return .invalid("PROXY v1: no protocol") }
        if fields[1] == "UNKNOWN" { return .header(ProxyHeader(sourceAddress: nil, sourcePort: 0), length: length) }
        guard fields.count == 6, fields[1] == "TCP4" || fields[1] == "TCP6" else { return .invalid("PROXY v1: expected TCP4/TCP6 and four fields") }
        guard let source = ipAddressBytes(String(fields[2])), let destination = ipAddressBytes(String(fields[3])),
              source.count == (fields[1] == "TCP4" ? 4 : 16), destination.count == source.count else {
            return .invalid("PROXY v1: address does not match \(fields[1])")
        }
        guard let sport = port(fields[4]), port(fields[5]) != nil else { return .invalid("PROXY v1: bad port") }
        return .header(ProxyHeader(sourceAddress: source, sourcePort: sport), length: length)
    }

    /// 0-65535 in decimal without leading zeros (the specification's form).
    private static func port(_ s: Substring) -> UInt16? {
        guard !s.isEmpty, s.count <= 5, s.allSatisfy({ $0.isASCII && $0.isNumber }), s == "0" || s.first != "0" else { return nil }
        return UInt16(s)
    }
}

/// Accept the PROXY protocol on a listener. Every connection must come from `trustedProxies`
/// (others are closed at accept) and begin with a valid v2 or v1 header within the header
/// timeout (otherwise it is closed without an answer); the header's source address then
/// stands for the connection everywhere: `remoteAddress`, `clientKey`, the per-address limit.
public struct ProxyProtocolConfiguration: Sendable {
    public var trustedProxies: [IPNetwork]

    public init(trustedProxies: [IPNetwork]) {
        self.trustedProxies = trustedProxies
    }

    func trusts(_ address: [UInt8]) -> Bool {
        trustedProxies.contains { $0.contains(address) }
    }
}
