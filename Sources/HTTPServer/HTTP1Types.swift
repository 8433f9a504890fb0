// Values produced by the strict HTTP/1.1 request parser (HTTP1Parser.swift). The rules they
// follow are listed in docs/http.md, "HTTP/1.1 parser: strictness rules and fuzzing", and pinned
// by HTTP1MalformedCases.all.

/// One header field (HTTPHeaders and the parser's heads; here so the parser's sources stand alone
/// for the fuzzer). Field lists are arrays of this struct rather than of `(name, value)`
/// tuples: an array of tuples is destroyed through the runtime's generic tuple witness, an
/// array of a struct through the struct's own compiled one, which is cheaper.
package struct HTTPField: Sendable, Equatable {
    package var name: String
    package var value: String

    @inline(__always)
    package init(name: String, value: String) {
        self.name = name
        self.value = value
    }
}

/// Limits applied while parsing one connection's requests. The server copies them from
/// `HTTPLimits`; the defaults are the same.
package struct HTTP1Limits: Sendable, Equatable {
    /// Request line + header lines + CRLFs. Also the budget for a chunked body's trailer section.
    package var maxHeaderBytes: Int
    /// Header field lines per request (and trailer field lines per chunked body).
    package var maxHeaderCount: Int
    /// Decoded body bytes (Content-Length, or the sum of chunk sizes).
    package var maxBodyBytes: Int

    package init(maxHeaderBytes: Int = 16_384, maxHeaderCount: Int = 100, maxBodyBytes: Int = 1 << 20) {
        // Non-positive limits would make every request fail in a confusing way; clamp instead.
        self.maxHeaderBytes = max(maxHeaderBytes, 64)
        self.maxHeaderCount = max(maxHeaderCount, 1)
        self.maxBodyBytes = max(maxBodyBytes, 0)
    }
}

/// What the parser is waiting for; the server picks its timeout from it (header vs body).
package enum HTTP1ParserState: Sendable, Equatable {
    /// Between requests with nothing buffered (idle timeout applies). Also reported once failed.
    case idle
    /// Some of a request head has arrived (header timeout applies).
    case head
    /// The head is complete and body bytes are outstanding (body timeout applies).
    case body
}

/// A complete, validated request head.
///
/// Stored in one immutable box (as SwiftNIO's `HTTPRequestHead` is) so that the `.head` and
/// `.request` events, which both carry it, cost one retain to copy instead of one per field.
/// Setters replace the box, so value semantics are unchanged.
package struct HTTP1RequestHead: Sendable {
    package struct Fields: Sendable {
        package var method: String
        package var target: String
        package var version: HTTPVersion
        package var headerFields: [HTTPField]
        package var keepAlive: Bool
        package var expectContinue: Bool
        package var contentLength: Int?
        package var chunked: Bool
    }

    private final class Box: Sendable {
        let fields: Fields
        init(_ fields: Fields) { self.fields = fields }
    }

    private var box: Box

    package init(_ fields: Fields) { box = Box(fields) }

    package init(method: String, target: String, version: HTTPVersion,
                 headers: [(name: String, value: String)], keepAlive: Bool, expectContinue: Bool,
                 contentLength: Int?, chunked: Bool) {
        self.init(Fields(method: method, target: target, version: version,
                         headerFields: headers.map { HTTPField(name: $0.name, value: $0.value) }, keepAlive: keepAlive,
                         expectContinue: expectContinue, contentLength: contentLength, chunked: chunked))
    }

    package var fields: Fields {
        get { box.fields }
        set { box = Box(newValue) }
    }

    package var method: String {
        get { box.fields.method }
        set { fields.method = newValue }
    }
    /// The request-target exactly as sent (origin-form `/path?query`, absolute-form, `*`, or
    /// authority-form for CONNECT).
    package var target: String {
        get { box.fields.target }
        set { fields.target = newValue }
    }
    /// `.http1_0` or `.http1_1`.
    package var version: HTTPVersion {
        get { box.fields.version }
        set { fields.version = newValue }
    }
    /// In arrival order, names lowercased, values with surrounding whitespace removed.
    package var headerFields: [HTTPField] {
        get { box.fields.headerFields }
        set { fields.headerFields = newValue }
    }
    /// `headerFields` as `(name, value)` pairs (tests and the fuzzer; the server uses the fields).
    package var headers: [(name: String, value: String)] {
        get { box.fields.headerFields.map { ($0.name, $0.value) } }
        set { fields.headerFields = newValue.map { HTTPField(name: $0.name, value: $0.value) } }
    }
    /// Whether the connection may carry another request after this one's response.
    package var keepAlive: Bool {
        get { box.fields.keepAlive }
        set { fields.keepAlive = newValue }
    }
    /// HTTP/1.1 request carrying `Expect: 100-continue`: the server should send `100 Continue`.
    package var expectContinue: Bool {
        get { box.fields.expectContinue }
        set { fields.expectContinue = newValue }
    }
    /// The Content-Length value, nil when the request has none (chunked, or no body).
    package var contentLength: Int? {
        get { box.fields.contentLength }
        set { fields.contentLength = newValue }
    }
    /// Body framed with `Transfer-Encoding: chunked`.
    package var chunked: Bool {
        get { box.fields.chunked }
        set { fields.chunked = newValue }
    }

    /// First value of a header; `name` must be lowercase.
    package func firstValue(_ name: String) -> String? {
        for field in box.fields.headerFields where field.name == name { return field.value }
        return nil
    }
}

extension HTTP1RequestHead: Equatable {
    package static func == (a: HTTP1RequestHead, b: HTTP1RequestHead) -> Bool {
        let a = a.fields, b = b.fields
        return a.method == b.method && a.target == b.target && a.version == b.version
            && a.keepAlive == b.keepAlive && a.expectContinue == b.expectContinue
            && a.contentLength == b.contentLength && a.chunked == b.chunked
            && a.headerFields == b.headerFields
    }
}

/// A complete request: head plus the decoded body (chunk framing and trailers removed).
package struct HTTP1Request: Sendable, Equatable {
    package var head: HTTP1RequestHead
    package var body: [UInt8]

    package init(head: HTTP1RequestHead, body: [UInt8]) {
        self.head = head
        self.body = body
    }
}

package enum HTTP1Event: Sendable, Equatable {
    /// A complete head. Emitted for every request, before its `.request`; lets the server send
    /// `100 Continue` and switch from the header to the body timeout.
    case head(HTTP1RequestHead)
    /// The complete request (head repeated, plus body).
    case request(HTTP1Request)
    /// The input is not an acceptable request. The parser stays failed: every later `next()`
    /// returns this same failure, so callers must stop at the first one (respond, then close).
    case failure(HTTP1ParseError)
}

/// Why a request was refused. `kind.rawValue` names the rule (used as the metrics key and in the
/// JSON error body); `status` is the HTTP status to answer with before closing the connection.
package struct HTTP1ParseError: Error, Sendable, Equatable, CustomStringConvertible {
    package enum Kind: String, Sendable, CaseIterable {
        // Request line
        case invalidRequestLine          // wrong shape: missing parts, extra spaces
        case invalidMethod               // method is not a token
        case invalidTarget               // characters outside RFC 3986, or form not allowed
        case invalidVersion              // not `HTTP/<digit>.<digit>`
        case unsupportedVersion          // well-formed version other than 1.0 / 1.1
        case targetTooLong               // request line alone exceeds maxHeaderBytes
        case tooManyEmptyLines           // more blank lines before the request line than tolerated
        // Framing of the head
        case bareLineEnding              // CR not followed by LF, or LF not preceded by CR
        case obsFold                     // field line starting with SP/HTAB (obsolete line folding)
        case invalidHeaderName           // empty name, non-token character, or missing colon
        case whitespaceBeforeColon       // `Name : value`
        case invalidHeaderValue          // NUL or another control character other than HTAB
        case headerSectionTooLarge       // head exceeds maxHeaderBytes
        case tooManyHeaders              // more than maxHeaderCount field lines
        // Semantics
        case missingHost                 // HTTP/1.1 without Host
        case multipleHost                // more than one Host field line
        case invalidHost                 // Host value with characters a host cannot contain
        case invalidContentLength        // not 1*DIGIT (sign, spaces, hex, comma lists, empty)
        case multipleContentLength       // more than one Content-Length line, even if equal
        case contentLengthWithTransferEncoding
        case invalidTransferEncoding     // final coding is not `chunked`, malformed list, repeated
        case unsupportedTransferCoding   // codings other than chunked before the final chunked
        case transferEncodingOnHTTP10
        case expectationFailed           // Expect other than 100-continue
        case bodyTooLarge                // Content-Length or chunk sizes exceed maxBodyBytes
        // Chunked body
        case invalidChunkSize            // not 1-16 hex digits
        case invalidChunkExtension       // extension not `;name[=token|quoted-string]`
        case chunkExtensionsTooLarge     // extension bytes of one body exceed maxHeaderBytes
        case invalidChunkTerminator      // chunk data not followed by CRLF
        case invalidTrailer              // trailer field line malformed (same rules as headers)
        case trailerSectionTooLarge      // trailers exceed maxHeaderBytes or maxHeaderCount

        package var status: Int {
            switch self {
            case .unsupportedVersion: return 505
            case .targetTooLong: return 414
            case .headerSectionTooLarge, .tooManyHeaders, .trailerSectionTooLarge: return 431
            case .bodyTooLarge: return 413
            case .unsupportedTransferCoding: return 501
            case .expectationFailed: return 417
            default: return 400
            }
        }
    }

    package var kind: Kind
    package var status: Int { kind.status }

    package init(_ kind: Kind) { self.kind = kind }

    package var description: String { "\(status) \(kind.rawValue)" }
}
