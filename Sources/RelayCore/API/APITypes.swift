// The HTTP API as plain values: what HTTPGlue makes of a request, and what the services answer.
// IngestService and AdminService take and give only these, so they are tested without sockets.
import FoundationEssentials

public struct APIRequest: Sendable {
    public var method: String
    public var path: String
    /// The request target after "?" ("" without one), as sent.
    public var query: String
    /// The only request headers the services read, picked out by HTTPGlue in one pass over the
    /// request's fields (no dictionary to hash per request).
    public var authorization: String?
    public var contentType: String?
    public var body: [UInt8]
    public var requestID: String
    /// The peer as HTTPServer reports it ("192.0.2.7:51234", "[2001:db8::1]:51234"); "" unknown.
    public var remoteAddress: String
    /// The peer's key for the per-address 401 budget (`HTTPRequest.clientKey`: its IPv4
    /// address or IPv6 /64, worked out once per connection by the server).
    public var clientKey: String

    public init(method: String, path: String, authorization: String?, contentType: String?, body: [UInt8],
                requestID: String, remoteAddress: String = "", clientKey: String? = nil, query: String = "") {
        self.method = method
        self.query = query
        self.clientKey = clientKey ?? IngestService.clientKey(remoteAddress)
        self.path = path
        self.authorization = authorization
        self.contentType = contentType
        self.body = body
        self.requestID = requestID
        self.remoteAddress = remoteAddress
    }
}

public struct APIReply: Sendable, Equatable {
    public var status: Int
    public var headers: [(String, String)]
    /// The body as it goes on the wire. Bytes, not a String: the 202 is written straight into
    /// them and HTTPGlue hands the same array to HTTPServer (a String body would cost a second
    /// allocation and a copy per response on the loop thread).
    public var bodyBytes: [UInt8]

    /// The body as text (every API answer is JSON).
    public var body: String {
        get { String(decoding: bodyBytes, as: UTF8.self) }
        set { bodyBytes = Array(newValue.utf8) }
    }

    public init(status: Int, headers: [(String, String)] = [], body: String) {
        self.init(status: status, headers: headers, bodyBytes: Array(body.utf8))
    }

    public init(status: Int, headers: [(String, String)] = [], bodyBytes: [UInt8]) {
        self.status = status
        self.headers = headers
        self.bodyBytes = bodyBytes
    }

    public static func == (a: APIReply, b: APIReply) -> Bool {
        a.status == b.status && a.bodyBytes == b.bodyBytes && a.headers.map { "\($0.0):\($0.1)" } == b.headers.map { "\($0.0):\($0.1)" }
    }

    static func error(_ e: ClientError, headers: [(String, String)] = []) -> APIReply {
        APIReply(status: e.status, headers: headers, body: e.jsonBody)
    }

    public func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
}

/// A reply a service made ready on some thread and leaves for the one who writes it to build
/// (`APIAnswer.later`): `makeReply` runs exactly once, on that writer's thread.
public protocol APIReplySource: AnyObject, Sendable {
    func makeReply() -> APIReply
}

/// What a service completes with: a reply, or its source. The ingest POST's answer is known on
/// the store's thread after COMMIT; it is built by the loop that writes it, not on the store's
/// busy thread (docs/benchmarks-analysis.md, issue 26). HTTPGlue builds a `later` on the
/// connection's loop; a caller without a loop reads `reply`.
public enum APIAnswer: Sendable {
    case now(APIReply)
    case later(any APIReplySource)

    /// The reply, built here for a `later` (call once: building it counts and logs the request).
    public var reply: APIReply {
        switch self {
        case .now(let r): r
        case .later(let source): source.makeReply()
        }
    }
}
