// The public value types of the server API: headers, requests, responses, TLS details and the
// configuration structs. Everything here is plain Swift; the C libraries stay in their wrappers.
#if canImport(Glibc)
import Glibc
#endif

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

public struct HTTPRequest: Sendable {
    public var method: String
    /// As sent: `path?query` (HTTP/2: the `:path` pseudo header).
    public var target: String
    /// `target` without the query.
    public var path: String
    public var version: HTTPVersion
    /// HTTP/2: no pseudo headers; `:authority` is also present as `host`.
    public var headers: HTTPHeaders
    public var body: [UInt8]
    /// "127.0.0.1:54321" or "[::1]:54321".
    public var remoteAddress: String
    public var tls: TLSInfo?
    /// Unique per server; lets a handler keep per-connection state.
    public var connectionID: UInt64
    /// HTTP/2 stream identifier, 0 for HTTP/1.
    public var streamID: Int32
    /// `remoteAddress` as per-address limits count it (`PeerKey.text`), worked out once per
    /// connection; empty when the address is unknown.
    public var clientKey: String

    public init(method: String, target: String, version: HTTPVersion, headers: HTTPHeaders,
                body: [UInt8], remoteAddress: String, tls: TLSInfo?, connectionID: UInt64,
                streamID: Int32, clientKey: String = "") {
        self.method = method
        self.clientKey = clientKey
        self.target = target
        // RFC 9112 3.2.2: an absolute-form target (sent to proxies, allowed to servers) names
        // the same resource as its path.
        var t = target
        if t.utf8.first != UInt8(ascii: "/"), let parts = absoluteFormParts(target) {
            t = parts.pathAndQuery.isEmpty ? "/" : String(parts.pathAndQuery)
        }
        // memchr over the bytes instead of the UTF8View's firstIndex (~400 instructions).
        let q = t.withUTF8 { u -> Int? in
            guard let base = u.baseAddress, let hit = memchr(base, 0x3F, u.count) else { return nil }
            return base.distance(to: hit.assumingMemoryBound(to: UInt8.self))
        }
        if let q {
            self.path = q == 0 ? "/" : String(decoding: t.utf8.prefix(q), as: UTF8.self)
        } else {
            self.path = t
        }
        self.version = version
        self.headers = headers
        self.body = body
        self.remoteAddress = remoteAddress
        self.tls = tls
        self.connectionID = connectionID
        self.streamID = streamID
    }
}

/// An `http://` or `https://` absolute-form target split into its authority and the rest
/// (path and query, starting with "/" or "?", or empty); nil for any other target.
func absoluteFormParts(_ target: String) -> (authority: Substring, pathAndQuery: Substring)? {
    let lower = target.prefix(8).lowercased()
    let schemeLength: Int
    if lower.hasPrefix("http://") { schemeLength = 7 } else if lower.hasPrefix("https://") { schemeLength = 8 } else { return nil }
    let rest = target.dropFirst(schemeLength)
    let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
    return (rest[..<end], rest[end...])
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: [UInt8]

    public init(status: Int, headers: HTTPHeaders = .init(), body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A response with `content-type: application/json` and the given body text.
    public static func json(_ status: Int, _ body: String, headers: HTTPHeaders = .init()) -> HTTPResponse {
        var h = headers
        h.replaceOrAdd("content-type", "application/json")
        return HTTPResponse(status: status, headers: h, body: Array(body.utf8))
    }
}

/// What to do with the connection once a response has been written.
public enum ConnectionAction: Sendable {
    case keep
    /// HTTP/2: GOAWAY(NO_ERROR, last stream = this stream) after the response.
    /// HTTP/1: `Connection: close` on this response, then close.
    case goAway
    /// Abrupt: close the TCP connection right after writing this response.
    case close
}

/// Called on a loop thread: must not block. Blocking work goes to the caller's own thread and
/// answers later through the responder. A handler that never responds stalls its request; the
/// server's shutdown still completes (after its grace period).
public typealias HTTPHandler = @Sendable (HTTPRequest, HTTPResponder) -> Void

/// HTTP/1.1 `Expect: 100-continue`: whether to invite the body. Called on a loop thread with
/// the request head (`body` empty) as soon as it is complete; must not block. Answer through
/// the decision from any thread: `proceed()` sends `100 Continue`; `refuse(response)` sends
/// that final response instead and closes the connection after it, the body is never read
/// and the request never reaches the handler. A body that arrives before the decision (a
/// client that stopped waiting) makes the decision moot: the request goes to the handler.
public typealias HTTPContinueCheck = @Sendable (HTTPRequest, HTTPContinueDecision) -> Void

public struct TLSConfiguration: Sendable {
    public var certificatePath: String
    public var privateKeyPath: String
    /// PEM bundle of CAs that client certificates are verified against (enables mTLS).
    public var clientCAPath: String?
    public var requireClientCertificate: Bool
    /// Offered in server preference order.
    public var alpn: [String]

    public init(certificatePath: String, privateKeyPath: String, clientCAPath: String? = nil,
                requireClientCertificate: Bool = false, alpn: [String] = ["h2", "http/1.1"]) {
        self.certificatePath = certificatePath
        self.privateKeyPath = privateKeyPath
        self.clientCAPath = clientCAPath
        self.requireClientCertificate = requireClientCertificate
        self.alpn = alpn
    }
}

public struct HTTP2Settings: Sendable {
    public var maxConcurrentStreams: UInt32
    public var initialWindowSize: UInt32
    public var maxFrameSize: UInt32
    public var maxHeaderListSize: UInt32
    /// Requests of one connection handed to the handler and not answered yet; further ones
    /// are refused with RST_STREAM(REFUSED_STREAM). Counts streams the client reset after
    /// sending them, until their handler answers.
    public var maxUnansweredRequests: Int = 100
    /// Incoming RST_STREAM frames one connection may send: a token bucket of this many,
    /// refilled at `streamResetRate` a second; past it nghttp2 sends GOAWAY and the
    /// connection ends. Twice the concurrent streams: a client cancelling every open stream
    /// at once is still served.
    public var streamResetBurst: UInt64 = 200
    public var streamResetRate: UInt64 = 33

    public init(maxConcurrentStreams: UInt32 = 100, initialWindowSize: UInt32 = 1 << 20,
                maxFrameSize: UInt32 = 16384, maxHeaderListSize: UInt32 = 16384) {
        self.maxConcurrentStreams = maxConcurrentStreams
        self.initialWindowSize = initialWindowSize
        self.maxFrameSize = maxFrameSize
        self.maxHeaderListSize = maxHeaderListSize
    }
}

public struct HTTPLimits: Sendable {
    public var maxHeaderBytes: Int
    public var maxHeaderCount: Int
    public var maxBodyBytes: Int
    public var maxConnections: Int
    /// Open connections one client address may hold (an IPv4 address, an IPv4-mapped IPv6
    /// address as that IPv4 address, or an IPv6 /64); further ones are closed at accept and
    /// counted in `connectionsRefused`. 0 = no per-address limit.
    public var maxConnectionsPerAddress: Int = 0
    public var maxRequestsPerConnection: Int
    /// A keep-alive connection with nothing in flight is closed after this long.
    public var idleTimeout: Duration
    /// A request head must be complete this long after its first byte (slowloris).
    public var headerTimeout: Duration
    /// A request body must be complete this long after its head.
    public var bodyTimeout: Duration
    /// Output must reach the kernel this long after it was queued. Each write counts from its
    /// own queueing, so a peer that takes a byte now and then does not renew the deadline.
    public var writeTimeout: Duration
    /// Output one connection may have queued for its peer (not yet taken by the kernel) before
    /// the server stops reading its requests; reading resumes below a quarter of it.
    public var maxQueuedOutputBytes: Int = 64 << 10
    /// Queued output over all connections: above it, every connection with output queued
    /// stops reading until its own queue is empty. 0 = no server-wide budget.
    public var maxQueuedOutputBytesTotal: Int = 64 << 20
    /// Input held over all connections (`bufferedInputBytes`): when a read takes the total past
    /// it, the connection holding the most input on that loop is closed, until the total is
    /// back under it. Each connection holds at most maxHeaderBytes + maxBodyBytes + one read
    /// (64 KiB) on HTTP/1 and max(2 x maxBodyBytes, 64 KiB) + one read on h2, so this only
    /// bites when many connections are each mid-request at once. 0 = no server-wide budget.
    public var maxBufferedInputBytesTotal: Int = 64 << 20
    /// SO_SNDBUF of accepted sockets (the kernel doubles it); 0 keeps the kernel's
    /// autotuning, which lets one connection whose peer does not read hold up to
    /// net.ipv4.tcp_wmem's maximum (4 MiB on Debian) of kernel memory.
    public var socketSendBufferBytes: Int = 0

    public init(maxHeaderBytes: Int = 16384, maxHeaderCount: Int = 100, maxBodyBytes: Int = 1 << 20,
                maxConnections: Int = 10_000, maxRequestsPerConnection: Int = 100_000,
                idleTimeout: Duration = .seconds(60), headerTimeout: Duration = .seconds(10),
                bodyTimeout: Duration = .seconds(30), writeTimeout: Duration = .seconds(30)) {
        self.maxHeaderBytes = maxHeaderBytes
        self.maxHeaderCount = maxHeaderCount
        self.maxBodyBytes = maxBodyBytes
        self.maxConnections = maxConnections
        self.maxRequestsPerConnection = maxRequestsPerConnection
        self.idleTimeout = idleTimeout
        self.headerTimeout = headerTimeout
        self.bodyTimeout = bodyTimeout
        self.writeTimeout = writeTimeout
    }
}

/// What a server does with a connection it just accepted (`HTTPServerConfiguration.admission`).
public enum HTTPAdmission: Sendable, Equatable {
    case serve
    /// Close it at once, before any byte is read or written.
    case close
    /// Keep it open and never read from it (no TLS handshake, no HTTP/2 preface): it ends
    /// when the peer gives up or the server stops.
    case stall
    /// HTTP/2 only: send SETTINGS, then GOAWAY(NO_ERROR, last stream 0) before any stream.
    case goAwayAtStart
}

public struct HTTPServerConfiguration: Sendable {
    public var host: String
    /// 0 = ephemeral; read the bound port from `HTTPServer.localPort`.
    public var port: Int
    public var tls: TLSConfiguration?
    /// On cleartext connections, sniff the HTTP/2 client preface (h2c with prior knowledge).
    public var cleartextHTTP2: Bool
    public var http2: HTTP2Settings
    public var limits: HTTPLimits
    /// Event-loop threads, each with its own SO_REUSEPORT listener.
    public var loopThreads: Int
    /// Value of the `server` response header; nil sends none.
    public var serverName: String?
    /// Every connection starts with a PROXY protocol header from a trusted balancer, whose
    /// source address stands for the connection (ProxyProtocol.swift). nil: none is read.
    public var proxyProtocol: ProxyProtocolConfiguration?
    /// The response for a request the server itself refuses before any handler sees it
    /// (malformed HTTP/1.1, a body over `maxBodyBytes`, a header or body timeout): `status` is
    /// 400/408/413/414/417/431/501/505, `kind` the parser's error kind (HTTPServerErrorKinds in
    /// docs/http.md). Lets an application answer these in its own error format. Framing
    /// headers are the server's; the connection closes after HTTP/1.1 errors regardless.
    public var errorResponse: @Sendable (_ status: Int, _ kind: String) -> HTTPResponse
    /// Decides `Expect: 100-continue` before `100 Continue` is sent (HTTPContinueCheck); nil
    /// sends it as soon as the head is complete.
    public var continueCheck: HTTPContinueCheck?
    /// Asked once per accepted connection, on its loop thread (keep it short); nil serves every
    /// connection. For test servers that misbehave on purpose (mock-apns' connection faults).
    public var admission: (@Sendable () -> HTTPAdmission)?

    /// `{"error":"<kind>"}`, the default `errorResponse`.
    public static let plainErrorResponse: @Sendable (Int, String) -> HTTPResponse = { status, kind in
        .json(status, #"{"error":"\#(kind)"}"#)
    }

    public init(host: String = "127.0.0.1", port: Int = 0, tls: TLSConfiguration? = nil,
                cleartextHTTP2: Bool = true, http2: HTTP2Settings = HTTP2Settings(),
                limits: HTTPLimits = HTTPLimits(), loopThreads: Int = 1, serverName: String? = nil,
                errorResponse: @escaping @Sendable (_ status: Int, _ kind: String) -> HTTPResponse = plainErrorResponse) {
        self.errorResponse = errorResponse
        self.host = host
        self.port = port
        self.tls = tls
        self.cleartextHTTP2 = cleartextHTTP2
        self.http2 = http2
        self.limits = limits
        self.loopThreads = loopThreads
        self.serverName = serverName
    }
}

/// A snapshot of the server's counters.
public struct HTTPServerMetrics: Sendable, Equatable {
    public var connectionsOpen: Int = 0
    public var connectionsTotal: Int = 0
    /// Index 1...5 = 1xx...5xx responses sent (index 0 unused).
    public var requestsByStatusClass: [Int] = [0, 0, 0, 0, 0, 0]
    /// HTTP/1.1 parse failures by the parser's error kind.
    public var parseErrorsByKind: [String: Int] = [:]
    public var tlsHandshakeFailures: Int = 0
    /// Connections refused because `maxConnections` were open, or (also counted in
    /// `connectionsRefusedPerAddress`) their address held `maxConnectionsPerAddress`.
    public var connectionsRefused: Int = 0
    public var connectionsRefusedPerAddress: Int = 0
    /// Connections closed by a header, body, idle or write timeout.
    public var timeouts: Int = 0
    /// Connections closed for the PROXY protocol: from an untrusted address, or without a
    /// valid header in time.
    public var proxyHeaderFailures: Int = 0
    /// Output bytes queued for peers right now, over all connections (a gauge).
    public var queuedOutputBytes: Int = 0
    /// Input bytes held by connections right now (unparsed bytes, requests in progress, h2
    /// streams not yet handed to the handler), over all connections (a gauge).
    public var bufferedInputBytes: Int = 0
    /// The most input one connection has held at once since the server started.
    public var largestConnectionInputBytes: Int = 0
    /// Connections closed because connections together held more input than
    /// `maxBufferedInputBytesTotal` (the one holding most on its loop goes first).
    public var connectionsClosedForInputBudget: Int = 0

    public init() {}

    public var requestsTotal: Int { requestsByStatusClass.reduce(0, +) }
}

public enum HTTPServerError: Error, CustomStringConvertible, Sendable {
    case invalidAddress(String)
    case libuv(operation: String, message: String)
    case tls(String)
    case http2(String)
    case alreadyStarted
    case notStarted

    public var description: String {
        switch self {
        case .invalidAddress(let a): return "invalid listen address: \(a)"
        case .libuv(let op, let m): return "libuv \(op): \(m)"
        case .tls(let m): return "TLS: \(m)"
        case .http2(let m): return "HTTP/2: \(m)"
        case .alreadyStarted: return "server already started"
        case .notStarted: return "server not started"
        }
    }
}

extension Duration {
    /// Whole milliseconds, at least 1 for positive durations (timers round up).
    var milliseconds: UInt64 {
        let (s, atto) = components
        if s < 0 { return 0 }
        let ms = UInt64(s) * 1000 + UInt64(atto / 1_000_000_000_000_000)
        return ms == 0 && atto > 0 ? 1 : ms
    }
}
