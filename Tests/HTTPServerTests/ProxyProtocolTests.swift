// The PROXY protocol: the pure header parser (v2 binary, v1 text, malformed headers, any split),
// IPNetwork, and a listener that takes the client's address from the header.
import Foundation
@testable import HTTPServer
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A v2 header: PROXY command (or LOCAL), TCP over IPv4 or IPv6, optional TLV bytes.
func proxyV2(source: [UInt8], sourcePort: UInt16, destination: [UInt8]? = nil, local: Bool = false, tlvs: [UInt8] = []) -> [UInt8] {
    let dst = destination ?? [UInt8](repeating: 0, count: source.count)
    let block = source + dst + [UInt8(sourcePort >> 8), UInt8(sourcePort & 0xff), 0x01, 0xbb] + tlvs
    return ProxyProtocol.v2Signature + [local ? 0x20 : 0x21, source.count == 4 ? 0x11 : 0x21,
                                        UInt8(block.count >> 8), UInt8(block.count & 0xff)] + block
}

/// Headers that must be refused, each named.
let malformedProxyHeaders: [(String, [UInt8])] = {
    let sig: [UInt8] = ProxyProtocol.v2Signature
    var list: [(String, [UInt8])] = []
    list.append(("plain HTTP", Array("GET / HTTP/1.1\r\n".utf8)))
    list.append(("TLS ClientHello", [0x16, 0x03, 0x01, 0x00, 0x05]))
    list.append(("v2 signature broken", [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0B]))
    list.append(("v2 version 1", sig + [0x11, 0x11, 0x00, 0x0C] + [UInt8](repeating: 0, count: 12)))
    list.append(("v2 command 2", sig + [0x22, 0x11, 0x00, 0x0C] + [UInt8](repeating: 0, count: 12)))
    list.append(("v2 UDP", sig + [0x21, 0x12, 0x00, 0x0C] + [UInt8](repeating: 0, count: 12)))
    list.append(("v2 unix", sig + [0x21, 0x31, 0x00, 0xD8] + [UInt8](repeating: 0, count: 216)))
    list.append(("v2 short IPv4 block", sig + [0x21, 0x11, 0x00, 0x08] + [UInt8](repeating: 0, count: 8)))
    list.append(("v2 short IPv6 block", sig + [0x21, 0x21, 0x00, 0x0C] + [UInt8](repeating: 0, count: 12)))
    list.append(("v2 oversized", sig + [0x21, 0x11, 0x04, 0x01]))
    list.append(("v1 lowercase", Array("proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n".utf8)))
    list.append(("v1 bare LF", Array("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n".utf8)))
    list.append(("v1 family mismatch", Array("PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n".utf8)))
    list.append(("v1 bad address", Array("PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n".utf8)))
    list.append(("v1 port too large", Array("PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n".utf8)))
    list.append(("v1 port leading zero", Array("PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n".utf8)))
    list.append(("v1 double space", Array("PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n".utf8)))
    list.append(("v1 missing field", Array("PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n".utf8)))
    list.append(("v1 UDP", Array("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n".utf8)))
    list.append(("v1 no line end", Array(("PROXY TCP4 " + String(repeating: "1", count: 100)).utf8)))
    list.append(("v1 NUL", Array("PROXY TCP4 1.2.3.4\u{0} 5.6.7.8 1 2\r\n".utf8)))
    return list
}()

@Suite struct ProxyHeaderParserTests {
    @Test func v2IPv4AndIPv6CarryTheSource() {
        let v4 = proxyV2(source: [192, 0, 2, 7], sourcePort: 51234) + Array("GET /".utf8)
        guard case .header(let h, let length) = ProxyProtocol.parse(v4) else { Issue.record("\(ProxyProtocol.parse(v4))"); return }
        #expect(length == 28)
        #expect(h.sourceText == "192.0.2.7:51234")
        #expect(h.sourceKey == PeerKey(ipv4: 0xC000_0207))
        let six = ipAddressBytes("2001:db8::1")!
        guard case .header(let h6, let l6) = ProxyProtocol.parse(proxyV2(source: six, sourcePort: 443, tlvs: [0x04, 0x00, 0x01, 0x00])) else {
            Issue.record("v6"); return
        }
        #expect(l6 == 16 + 36 + 4)   // TLVs are skipped
        #expect(h6.sourceText == "[2001:db8::1]:443")
    }

    @Test func v2LocalAndUnspecKeepTheProxysAddress() {
        guard case .header(let h, _) = ProxyProtocol.parse(proxyV2(source: [10, 0, 0, 1], sourcePort: 1, local: true)) else { Issue.record("local"); return }
        #expect(h.sourceAddress == nil)
        let unspec = ProxyProtocol.v2Signature + [0x21, 0x00, 0x00, 0x00]
        guard case .header(let u, let length) = ProxyProtocol.parse(unspec) else { Issue.record("unspec"); return }
        #expect(u.sourceAddress == nil && length == 16)
    }

    @Test func v1TCP4TCP6AndUnknown() {
        guard case .header(let h, let length) = ProxyProtocol.parse(Array("PROXY TCP4 198.51.100.22 203.0.113.7 35646 443\r\nGET".utf8)) else {
            Issue.record("tcp4"); return
        }
        #expect(length == 48)
        #expect(h.sourceText == "198.51.100.22:35646")
        guard case .header(let h6, _) = ProxyProtocol.parse(Array("PROXY TCP6 2001:db8::2 2001:db8::3 1 2\r\n".utf8)) else { Issue.record("tcp6"); return }
        #expect(h6.sourceText == "[2001:db8::2]:1")
        guard case .header(let u, _) = ProxyProtocol.parse(Array("PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n".utf8)) else { Issue.record("unknown"); return }
        #expect(u.sourceAddress == nil)
    }

    /// Every prefix of a valid header asks for more; the verdict never depends on the split.
    @Test func prefixesNeedMore() {
        for header in [proxyV2(source: [192, 0, 2, 7], sourcePort: 80), Array("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n".utf8)] {
            for n in 0..<header.count {
                #expect(ProxyProtocol.parse(Array(header[0..<n])) == .needMore, "prefix \(n)")
            }
        }
    }

    @Test(arguments: malformedProxyHeaders)
    func malformedHeadersAreInvalid(name: String, bytes: [UInt8]) {
        guard case .invalid = ProxyProtocol.parse(bytes) else {
            Issue.record("\(name): \(ProxyProtocol.parse(bytes))")
            return
        }
    }

    @Test func networks() throws {
        let ten = try #require(IPNetwork("10.0.0.0/8"))
        #expect(ten.contains([10, 200, 3, 4]))
        #expect(!ten.contains([11, 0, 0, 1]))
        #expect(ten.contains(ipAddressBytes("::ffff:10.1.2.3")!))   // IPv4-mapped peer
        let one = try #require(IPNetwork("192.0.2.7"))
        #expect(one.contains([192, 0, 2, 7]) && !one.contains([192, 0, 2, 8]))
        let v6 = try #require(IPNetwork("2001:db8::/32"))
        #expect(v6.contains(ipAddressBytes("2001:db8:ffff::1")!))
        #expect(!v6.contains(ipAddressBytes("2001:db9::1")!))
        #expect(!v6.contains([10, 0, 0, 1]))
        #expect(try #require(IPNetwork("172.16.0.0/12")).contains([172, 31, 255, 255]))
        for bad in ["", "10.0.0.0/33", "10.0.0.0/", "10.0.0/8", "2001:db8::/129", "host.example", "10.0.0.0/8/8", "10.0.0.0/-1", "10.0.0.0/ 8"] {
            #expect(IPNetwork(bad) == nil, "\(bad)")
        }
    }
}

@Suite struct ServerProxyProtocolTests {
    func config(trusting networks: [String] = ["127.0.0.0/8"]) -> HTTPServerConfiguration {
        var c = HTTPServerConfiguration()
        c.proxyProtocol = ProxyProtocolConfiguration(trustedProxies: networks.compactMap(IPNetwork.init))
        c.limits.headerTimeout = .milliseconds(300)
        return c
    }

    let addressHandler: HTTPHandler = { req, res in
        res.respond(HTTPReply(status: 200, body: Array("\(req.remoteAddress) \(req.clientKey)".utf8)))
    }

    /// The header's source is the request's address and per-address key, for every request of
    /// the connection, whether the header arrives alone or with the first request.
    @Test func headerNamesTheClient() throws {
        try withServer(config(), handler: addressHandler) { server in
            let c = try RawClient(port: server.localPort)
            try c.send(proxyV2(source: [203, 0, 113, 9], sourcePort: 4444) + Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            #expect(c.readResponse()?.text == "203.0.113.9:4444 203.0.113.9")
            try c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(c.readResponse()?.text == "203.0.113.9:4444 203.0.113.9")
            let v1 = try RawClient(port: server.localPort)
            try v1.send("PROXY TCP6 2001:db8:1:2::5 2001:db8::1 6000 443\r\n")
            try v1.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(v1.readResponse()?.text == "[2001:db8:1:2::5]:6000 \(PeerKey(address: "2001:db8:1:2::5")!.text)")
        }
    }

    /// Without a valid header the connection is closed unanswered: a request, a malformed
    /// header, or nothing at all within the header timeout.
    @Test func connectionsWithoutAValidHeaderAreClosed() throws {
        try withServer(config(), handler: addressHandler) { server in
            let plain = try RawClient(port: server.localPort)
            try plain.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(plain.waitForClose() && plain.pendingBytes.isEmpty)
            let bad = try RawClient(port: server.localPort)
            try bad.send("PROXY TCP4 1.2.3.4 5.6.7.8 99999 1\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(bad.waitForClose() && bad.pendingBytes.isEmpty)
            let silent = try RawClient(port: server.localPort)
            try silent.send(Array(ProxyProtocol.v2Signature.prefix(5)))
            #expect(silent.waitForClose())
            #expect(server.metrics.proxyHeaderFailures == 3)
        }
    }

    /// Only the trusted proxies may connect: anyone else could name any address.
    @Test func untrustedPeersAreRefusedAtAccept() throws {
        try withServer(config(trusting: ["192.0.2.0/24"]), handler: addressHandler) { server in
            let c = try RawClient(port: server.localPort)
            try? c.send(proxyV2(source: [203, 0, 113, 9], sourcePort: 4444) + Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            #expect(c.waitForClose() && c.pendingBytes.isEmpty)
            #expect(server.metrics.proxyHeaderFailures == 1)
        }
    }

    /// The per-address connection cap counts the client the header names, not the balancer.
    @Test func perAddressLimitCountsTheNamedClient() throws {
        var c = config()
        c.limits.maxConnectionsPerAddress = 1
        try withServer(c, handler: addressHandler) { server in
            let a = try RawClient(port: server.localPort)
            try a.send(proxyV2(source: [198, 51, 100, 1], sourcePort: 1) + Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            #expect(a.readResponse()?.status == 200)
            let b = try RawClient(port: server.localPort)   // another client, same balancer
            try b.send(proxyV2(source: [198, 51, 100, 2], sourcePort: 1) + Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            #expect(b.readResponse()?.status == 200)
            let again = try RawClient(port: server.localPort)   // the first client's second connection
            try again.send(proxyV2(source: [198, 51, 100, 1], sourcePort: 2) + Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            #expect(again.waitForClose() && again.pendingBytes.isEmpty)
            #expect(server.metrics.connectionsRefusedPerAddress == 1)
        }
    }
}
