// The strictness spec of the HTTP/1.1 parser as data: requests that must be refused, with the
// status and error kind. Used by the parser's unit tests and by the server's raw-socket test
// (each case, sent alone on a fresh connection with default limits, must get `status` and a
// closed connection). Every case fails from its bytes alone: none waits for more input.

package struct HTTP1MalformedCase: Sendable, CustomStringConvertible {
    package var name: String
    package var bytes: [UInt8]
    package var status: Int
    /// `HTTP1ParseError.Kind` raw value, the key in `parseErrorsByKind` and the JSON body.
    package var kind: String

    package init(_ name: String, _ text: String, _ status: Int, _ kind: HTTP1ParseError.Kind) {
        self.init(name, Array(text.utf8), status, kind)
    }

    package init(_ name: String, _ bytes: [UInt8], _ status: Int, _ kind: HTTP1ParseError.Kind) {
        precondition(kind.status == status, "case \(name): kind \(kind) has status \(kind.status)")
        self.name = name
        self.bytes = bytes
        self.status = status
        self.kind = kind.rawValue
    }

    package var description: String { name }
}

package enum HTTP1MalformedCases {
    /// Valid prefix used by many cases.
    private static let get = "GET / HTTP/1.1\r\nHost: a\r\n"
    private static let post = "POST / HTTP/1.1\r\nHost: a\r\n"

    /// Every case, assuming `HTTP1Limits()` defaults (16 KiB head, 100 fields, 1 MiB body).
    package static let all: [HTTP1MalformedCase] = requestLine + lineEndings + fieldLines + framing
        + semantics + chunked + limits

    package static let requestLine: [HTTP1MalformedCase] = [
        .init("version HTTP/2.0", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505, .unsupportedVersion),
        .init("version HTTP/1.2", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505, .unsupportedVersion),
        .init("version HTTP/0.9 form", "GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505, .unsupportedVersion),
        .init("h2 preface on the HTTP/1 parser", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, .unsupportedVersion),
        .init("version lowercase", "GET / http/1.1\r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("version without minor", "GET / HTTP/1\r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("version two-digit major", "GET / HTTP/11.1\r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("version trailing garbage", "GET / HTTP/1.1x\r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("version followed by space", "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("no version (HTTP/0.9 request)", "GET /\r\n\r\n", 400, .invalidRequestLine),
        .init("method only", "GET\r\n\r\n", 400, .invalidRequestLine),
        .init("double space after method", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidRequestLine),
        .init("double space before version", "GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("tab as separator", "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidMethod),
        .init("leading space", " GET / HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidRequestLine),
        .init("method with non-token char", "GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidMethod),
        .init("method with non-ASCII", "G\u{e9}T / HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidMethod),
        .init("space inside target", "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidVersion),
        .init("fragment in target", "GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("non-ASCII in target", "GET /\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("NUL in target", "GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("backslash in target", "GET /a\\b HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("relative target", "GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("asterisk with GET", "GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("CONNECT with a path", "CONNECT /a HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidTarget),
        .init("TLS ClientHello on cleartext", [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03],
              400, .invalidRequestLine),
        // Found by the fuzzer: the verdict once depended on whether the LF arrived with the 0x05.
        .init("control byte after an empty line", "\r\n\u{5}\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400, .invalidRequestLine),
        .init("too many empty lines before request", String(repeating: "\r\n", count: 9) + get + "\r\n",
              400, .tooManyEmptyLines),
    ]

    package static let lineEndings: [HTTP1MalformedCase] = [
        .init("bare LF after request line", "GET / HTTP/1.1\nHost: a\r\n\r\n", 400, .bareLineEnding),
        .init("bare LF after header", "GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", 400, .bareLineEnding),
        .init("bare LF ending the head", get + "\n", 400, .bareLineEnding),
        .init("bare LF as leading empty line", "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400, .bareLineEnding),
        .init("bare CR in request line", "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n", 400, .bareLineEnding),
        .init("bare CR in header value", get + "X: a\rb\r\n\r\n", 400, .bareLineEnding),
        .init("bare CR in header name", get + "X\rY: a\r\n\r\n", 400, .bareLineEnding),
        .init("bare CR ending the head", get + "\r\r\n", 400, .bareLineEnding),
        .init("CR CR LF after header", get + "X: a\r\r\n\r\n", 400, .bareLineEnding),
    ]

    package static let fieldLines: [HTTP1MalformedCase] = [
        .init("obs-fold continuation", get + "X-A: b\r\n c\r\n\r\n", 400, .obsFold),
        .init("obs-fold with tab", get + "X-A: b\r\n\tc\r\n\r\n", 400, .obsFold),
        .init("obs-fold smuggling Content-Length", post + " Content-Length: 5\r\n\r\nhello", 400, .obsFold),
        .init("whitespace before first header", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400, .obsFold),
        .init("space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400, .whitespaceBeforeColon),
        .init("tab before colon", get + "Content-Length\t: 0\r\n\r\n", 400, .whitespaceBeforeColon),
        .init("empty header name", get + ": a\r\n\r\n", 400, .invalidHeaderName),
        .init("header without colon", get + "X-A b\r\n\r\n", 400, .invalidHeaderName),
        .init("header name only", get + "X-A\r\n\r\n", 400, .invalidHeaderName),
        .init("non-token char in name", get + "X(A): b\r\n\r\n", 400, .invalidHeaderName),
        .init("non-ASCII in name", get + "X\u{e9}: b\r\n\r\n", 400, .invalidHeaderName),
        .init("NUL in header value", get + "X: a\0b\r\n\r\n", 400, .invalidHeaderValue),
        .init("NUL in header name", get + "X\0: b\r\n\r\n", 400, .invalidHeaderName),
        .init("control char in value", get + "X: a\u{1}b\r\n\r\n", 400, .invalidHeaderValue),
        .init("DEL in value", get + "X: a\u{7f}b\r\n\r\n", 400, .invalidHeaderValue),
        .init("vertical tab before chunked", post + "Transfer-Encoding: \u{b}chunked\r\n\r\n0\r\n\r\n", 400, .invalidHeaderValue),
    ]

    package static let framing: [HTTP1MalformedCase] = [
        .init("Content-Length with Transfer-Encoding", post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
              400, .contentLengthWithTransferEncoding),
        .init("Transfer-Encoding with Content-Length", post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
              400, .contentLengthWithTransferEncoding),
        .init("two different Content-Length", post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
              400, .multipleContentLength),
        .init("two equal Content-Length", post + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
              400, .multipleContentLength),
        .init("Content-Length list", post + "Content-Length: 5, 5\r\n\r\nhello", 400, .invalidContentLength),
        .init("negative Content-Length", post + "Content-Length: -1\r\n\r\n", 400, .invalidContentLength),
        .init("Content-Length with plus sign", post + "Content-Length: +5\r\n\r\nhello", 400, .invalidContentLength),
        .init("hex Content-Length", post + "Content-Length: 0x5\r\n\r\nhello", 400, .invalidContentLength),
        .init("Content-Length with inner space", post + "Content-Length: 1 0\r\n\r\n", 400, .invalidContentLength),
        .init("decimal-point Content-Length", post + "Content-Length: 5.0\r\n\r\nhello", 400, .invalidContentLength),
        .init("empty Content-Length", post + "Content-Length:\r\n\r\n", 400, .invalidContentLength),
        .init("Transfer-Encoding chunked, identity", post + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
              400, .invalidTransferEncoding),
        .init("Transfer-Encoding identity", post + "Transfer-Encoding: identity\r\n\r\n", 400, .invalidTransferEncoding),
        .init("Transfer-Encoding gzip", post + "Transfer-Encoding: gzip\r\n\r\n", 400, .invalidTransferEncoding),
        .init("Transfer-Encoding chunked twice", post + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
              400, .invalidTransferEncoding),
        .init("Transfer-Encoding xchunked", post + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400, .invalidTransferEncoding),
        .init("Transfer-Encoding chunked with parameter", post + "Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n",
              400, .invalidTransferEncoding),
        .init("Transfer-Encoding empty element", post + "Transfer-Encoding: , chunked\r\n\r\n0\r\n\r\n",
              400, .invalidTransferEncoding),
        .init("Transfer-Encoding empty", post + "Transfer-Encoding:\r\n\r\n", 400, .invalidTransferEncoding),
        .init("two Transfer-Encoding lines", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
              400, .invalidTransferEncoding),
        .init("Transfer-Encoding gzip, chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
              501, .unsupportedTransferCoding),
        .init("Transfer-Encoding on HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
              400, .transferEncodingOnHTTP10),
    ]

    package static let semantics: [HTTP1MalformedCase] = [
        .init("HTTP/1.1 without Host", "GET / HTTP/1.1\r\nX: y\r\n\r\n", 400, .missingHost),
        .init("two Host", get + "Host: b\r\n\r\n", 400, .multipleHost),
        .init("two Host on HTTP/1.0", "GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 400, .multipleHost),
        .init("Host with space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, .invalidHost),
        .init("Host with path", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, .invalidHost),
        .init("Host with userinfo", "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400, .invalidHost),
        .init("Expect other than 100-continue", post + "Expect: 200-ok\r\nContent-Length: 0\r\n\r\n", 417, .expectationFailed),
        .init("Content-Length over the body limit", post + "Content-Length: 1048577\r\n\r\n", 413, .bodyTooLarge),
        .init("Content-Length overflowing 64 bits", post + "Content-Length: 99999999999999999999999\r\n\r\n", 413, .bodyTooLarge),
    ]

    package static let chunked: [HTTP1MalformedCase] = [
        .init("chunk size not hex", chunkedPost + "zz\r\n", 400, .invalidChunkSize),
        .init("chunk size negative", chunkedPost + "-5\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkSize),
        .init("chunk size with leading space", chunkedPost + " 5\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkSize),
        .init("chunk size with 0x prefix", chunkedPost + "0x5\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkExtension),
        .init("chunk size with trailing space", chunkedPost + "5 \r\nhello\r\n0\r\n\r\n", 400, .invalidChunkExtension),
        .init("chunk size of 17 digits", chunkedPost + "00000000000000005\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkSize),
        .init("chunk size over the body limit", chunkedPost + "100001\r\n", 413, .bodyTooLarge),
        .init("chunk size of 2^64-1", chunkedPost + "ffffffffffffffff\r\n", 413, .bodyTooLarge),
        .init("chunk sizes summing over the limit", chunkedPost + "80000\r\n" + String(repeating: "a", count: 0x80000)
              + "\r\n80001\r\n", 413, .bodyTooLarge),
        .init("chunk data longer than size", chunkedPost + "5\r\nhelloX\r\n0\r\n\r\n", 400, .invalidChunkTerminator),
        .init("chunk data followed by bare LF", chunkedPost + "5\r\nhello\n0\r\n\r\n", 400, .invalidChunkTerminator),
        .init("bare LF after chunk size", chunkedPost + "5\nhello\r\n0\r\n\r\n", 400, .bareLineEnding),
        .init("empty chunk extension", chunkedPost + "5;\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkExtension),
        .init("chunk extension with empty value", chunkedPost + "5;a=\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkExtension),
        .init("chunk extension unterminated quote", chunkedPost + "5;a=\"b\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkExtension),
        .init("chunk extension with NUL", chunkedPost + "5;a=\"\0\"\r\nhello\r\n0\r\n\r\n", 400, .invalidChunkExtension),
        .init("bare CR in chunk extension", chunkedPost + "5;a\rb\r\nhello\r\n0\r\n\r\n", 400, .bareLineEnding),
        .init("chunk extensions over the budget", chunkedPost + "5;a=" + String(repeating: "b", count: 16_400) + "\r\n",
              400, .chunkExtensionsTooLarge),
        .init("obs-fold in trailer", chunkedPost + "0\r\nX: a\r\n b\r\n\r\n", 400, .invalidTrailer),
        .init("space before colon in trailer", chunkedPost + "0\r\nX : a\r\n\r\n", 400, .invalidTrailer),
        .init("NUL in trailer value", chunkedPost + "0\r\nX: a\0\r\n\r\n", 400, .invalidTrailer),
        .init("bare LF in trailers", chunkedPost + "0\r\nX: a\n\r\n", 400, .bareLineEnding),
        .init("too many trailers", chunkedPost + "0\r\n" + String(repeating: "X: a\r\n", count: 101) + "\r\n",
              431, .trailerSectionTooLarge),
        .init("trailer section too large", chunkedPost + "0\r\nX: " + String(repeating: "a", count: 16_400) + "\r\n\r\n",
              431, .trailerSectionTooLarge),
    ]

    package static let limits: [HTTP1MalformedCase] = [
        .init("header section over 16 KiB", get + "X: " + String(repeating: "a", count: 16_384) + "\r\n\r\n",
              431, .headerSectionTooLarge),
        .init("many small headers over 16 KiB", get + String(repeating: "X-Pad: " + String(repeating: "a", count: 200) + "\r\n", count: 90)
              + "\r\n", 431, .headerSectionTooLarge),
        .init("101 header lines", get + String(repeating: "X: a\r\n", count: 100) + "\r\n", 431, .tooManyHeaders),
        .init("request line over 16 KiB", "GET /" + String(repeating: "a", count: 16_384) + " HTTP/1.1\r\nHost: a\r\n\r\n",
              414, .targetTooLong),
    ]

    private static let chunkedPost = post + "Transfer-Encoding: chunked\r\n\r\n"
}
