// The server's configuration values (TLS, HTTP/2 settings, limits, admission), its counters
// and its errors. Plain Swift; the C libraries stay in their wrappers.

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
    public var errorResponse: @Sendable (_ status: Int, _ kind: String) -> HTTPReply
    /// Decides `Expect: 100-continue` before `100 Continue` is sent (HTTPContinueCheck); nil
    /// sends it as soon as the head is complete.
    public var continueCheck: HTTPContinueCheck?
    /// Asked once per accepted connection, on its loop thread (keep it short); nil serves every
    /// connection. For test servers that misbehave on purpose (mock-apns' connection faults).
    public var admission: (@Sendable () -> HTTPAdmission)?

    /// `{"error":"<kind>"}`, the default `errorResponse`.
    public static let plainErrorResponse: @Sendable (Int, String) -> HTTPReply = { status, kind in
        .json(status, #"{"error":"\#(kind)"}"#)
    }

    public init(host: String = "127.0.0.1", port: Int = 0, tls: TLSConfiguration? = nil,
                cleartextHTTP2: Bool = true, http2: HTTP2Settings = HTTP2Settings(),
                limits: HTTPLimits = HTTPLimits(), loopThreads: Int = 1, serverName: String? = nil,
                errorResponse: @escaping @Sendable (_ status: Int, _ kind: String) -> HTTPReply = plainErrorResponse) {
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
