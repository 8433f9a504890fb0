// Adapts the ingest/admin services (plain values, APITypes.swift) to HTTPServer's handler type.
// Conversions only: the API's rules live in IngestService.swift and AdminService.swift.
import FoundationEssentials
import HTTPServer

enum HTTPGlue {
    /// Honours a client's X-Request-Id when it is short and plain; otherwise mints one.
    static func requestID(given: String?) -> String {
        if let given, (1...64).contains(given.utf8.count),
           given.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2D || $0 == 0x5F || $0 == 0x2E }) {
            return given
        }
        return RelayCrypto.requestID()
    }

    /// Only the headers the services read (authorization, content-type) are copied into
    /// APIRequest, as plain fields: no dictionary of headers is built per request.
    static func apiRequest(_ r: HTTPRequest) -> APIRequest {
        // One pass over the (already lowercased) names instead of a lookup per header, each of
        // which lowercased its argument.
        var authorization: String?
        var contentType: String?
        var givenID: String?
        var authorizations = 0
        for field in r.headers.fields {
            switch field.name {
            case "authorization":
                authorizations += 1
                if authorization == nil { authorization = field.value }
            // Repeated, the values are combined as RFC 9110 5.3 says, which is no single media
            // type: IngestValidation refuses it with 415 (the first used to win).
            case "content-type": contentType = contentType.map { $0 + ", " + field.value } ?? field.value
            case "x-request-id": if givenID == nil { givenID = field.value }
            default: break
            }
        }
        // Two Authorization fields are ambiguous (a proxy may have checked the other one): no
        // credential, so a 401, as the parser refuses two Content-Length or Host fields.
        if authorizations > 1 { authorization = nil }
        return APIRequest(method: r.method, path: r.path, authorization: authorization, contentType: contentType, body: r.body,
                          requestID: requestID(given: givenID), remoteAddress: r.remoteAddress, clientKey: r.clientKey,
                          query: r.target.utf8.count == r.path.utf8.count ? "" : r.target.firstIndex(of: "?").map { String(r.target[r.target.index(after: $0)...]) } ?? "")
    }

    /// The full body even for HEAD: HTTPServer sends a HEAD answer's headers only, with the
    /// Content-Length the GET would have had (RFC 9110 9.3.2).
    static func httpResponse(_ r: APIReply) -> HTTPReply {
        var h = HTTPHeaders()
        h.reserveCapacity(r.headers.count)
        for (n, v) in r.headers { h.add(n, v) }
        return HTTPReply(status: r.status, headers: h, body: r.bodyBytes)
    }

    /// `service` gets the request and completes with the answer, on any thread: the writer
    /// hands it to the loop that owns the connection, which builds a `later` answer itself.
    static func handler(_ service: @escaping @Sendable (APIRequest, @escaping @Sendable (APIAnswer) -> Void) -> Void) -> HTTPHandler {
        { request, writer in
            service(apiRequest(request)) { answer in
                switch answer {
                case .now(let reply): writer.respond(httpResponse(reply))
                case .later(let source): writer.respond(building: LaterReply(source: source))
                }
            }
        }
    }

    /// A service's `later` answer as HTTPServer builds it on the loop (two words: it fits an
    /// existential's inline buffer, so handing it over allocates nothing).
    struct LaterReply: HTTPReplySource {
        let source: any APIReplySource
        func makeReply() -> HTTPReply { httpResponse(source.makeReply()) }
    }

    /// `Expect: 100-continue` decided by a service: nil invites the body, a response refuses it.
    static func continueCheck(_ service: @escaping @Sendable (APIRequest, @escaping @Sendable (APIReply?) -> Void) -> Void) -> HTTPContinueCheck {
        { request, decision in
            service(apiRequest(request)) { answer in
                if let answer { decision.refuse(httpResponse(answer)) } else { decision.proceed() }
            }
        }
    }

    /// Requests HTTPServer refuses itself (malformed, far over the body limit, too slow) get
    /// the API's error format too, so a client's error handling sees one shape everywhere,
    /// and an x-request-id like every other response (the request's own id is not trusted:
    /// the request was refused before its fields were).
    static func errorResponse(maxBodyBytes: Int) -> @Sendable (Int, String) -> HTTPReply {
        { status, kind in
            let e = serverError(status: status, kind: kind, maxBodyBytes: maxBodyBytes)
            return HTTPReply(status: status, headers: HTTPHeaders([("content-type", "application/json"),
                                                                      ("x-request-id", RelayCrypto.requestID())]),
                                body: Array(e.jsonBody.utf8))
        }
    }

    static func serverError(status: Int, kind: String, maxBodyBytes: Int) -> ClientError {
        switch status {
        case 413: return ClientError(status: 413, code: "body_too_large", field: "body", message: "body exceeds \(maxBodyBytes) bytes")
        case 408: return ClientError(status: 408, code: "request_timeout", field: nil, message: "the request was not received in time (\(kind))")
        case 414: return ClientError(status: 414, code: "uri_too_long", field: nil, message: "the request target is too long")
        case 431: return ClientError(status: 431, code: "headers_too_large", field: nil, message: "the request headers are too large or too many (\(kind))")
        case 417: return ClientError(status: 417, code: "expectation_failed", field: "expect", message: "only Expect: 100-continue is supported")
        case 501: return ClientError(status: 501, code: "not_implemented", field: nil, message: "unsupported HTTP feature (\(kind))")
        case 500: return ClientError(status: 500, code: "internal_error", field: nil, message: "the server could not form a valid response")
        case 505: return ClientError(status: 505, code: "http_version_not_supported", field: nil, message: "only HTTP/1.0, HTTP/1.1 and HTTP/2 are supported")
        default: return ClientError(status: status, code: "malformed_request", field: nil, message: "malformed HTTP request (\(kind))")
        }
    }
}
