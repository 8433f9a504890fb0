// A blocking HTTP client on libcurl for `relayctl accessory send` and `send-test`: HTTP/1.1 or
// HTTP/2 (ALPN over TLS, prior knowledge over cleartext), a private CA file, a client certificate
// when the server asks for one. One easy handle per request; timeouts bound every transfer.
// What a server can make it do is bounded: http and https only, no redirect followed, the reply's
// body and headers capped (Options).
import Foundation
internal import CCurl

public final class CurlClient {
    public struct Options: Sendable {
        public var http2: Bool
        public var caFile: String?
        public var clientCertificate: String?
        public var clientKey: String?
        public var timeoutSeconds: Int
        /// A longer body ends the transfer with `TransportError` (a relay's answers are < 1 KiB).
        public var maxResponseBodyBytes: Int
        /// All header lines of a reply together, 1xx ones included.
        public var maxResponseHeaderBytes: Int

        public init(http2: Bool = false, caFile: String? = nil, clientCertificate: String? = nil, clientKey: String? = nil,
                    timeoutSeconds: Int = 10, maxResponseBodyBytes: Int = 1 << 20, maxResponseHeaderBytes: Int = 64 << 10) {
            self.http2 = http2
            self.caFile = caFile
            self.clientCertificate = clientCertificate
            self.clientKey = clientKey
            self.timeoutSeconds = timeoutSeconds
            self.maxResponseBodyBytes = maxResponseBodyBytes
            self.maxResponseHeaderBytes = maxResponseHeaderBytes
        }
    }

    public struct Reply: Sendable {
        public var status: Int
        public var body: [UInt8]
        public var retryAfter: Double?
        public var httpVersion: String
        /// A redirect's target, reported and never followed.
        public var location: String?
    }

    public struct TransportError: Error, CustomStringConvertible, Equatable, Sendable {
        public var description: String
        /// The TLS handshake failed for a reason a retry cannot change: the server refused our
        /// certificate (or asked for one we did not give), or we refused its (unknown CA, wrong
        /// name), or a certificate or key file is unusable. `tlsFailureIsFinal` decides.
        public var tlsRefused = false
    }

    /// Whether libcurl's `code` (raw CURLcode) with its error text is a TLS failure no retry
    /// cures. A reset during the handshake (CURLE_SSL_CONNECT_ERROR without a TLS alert) is
    /// not: an overloaded server does that. With TLS 1.3 the server's refusal of a client
    /// certificate arrives after the client's handshake, on the first read (CURLE_RECV_ERROR
    /// carrying the alert, e.g. "tlsv13 alert certificate required").
    public static func tlsFailureIsFinal(curlCode code: Int, detail: String) -> Bool {
        if finalTLSCodes.contains(code) { return true }
        let alert = detail.contains(" alert ")
        return alert && (code == Int(CURLE_SSL_CONNECT_ERROR.rawValue) || code == Int(CURLE_RECV_ERROR.rawValue))
    }

    /// Peer verification failed, our certificate, key, CA or CRL file is unusable, no common
    /// cipher, pinned key mismatch, a client certificate the TLS library refused.
    private static let finalTLSCodes: Set<Int> = Set([CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
                                                        CURLE_SSL_CACERT_BADFILE, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR,
                                                        CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_CLIENTCERT].map { Int($0.rawValue) })

    /// Schemes libcurl may use, for the URL given and (were redirects followed) any Location.
    static let allowedProtocols = "http,https"

    private let options: Options
    private static let initialised: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK

    public init(_ options: Options = Options()) { self.options = options }

    /// Collects the response body and headers up to their caps; `context` of the C callbacks.
    private final class Sink {
        let maxBody: Int
        let maxHeaders: Int
        var body: [UInt8] = []
        var headers: [String] = []
        var headerBytes = 0
        var bodyTooLarge = false
        var headersTooLarge = false
        init(maxBody: Int, maxHeaders: Int) { self.maxBody = maxBody; self.maxHeaders = maxHeaders }
    }

    public func post(_ url: String, bearer: String, json: [UInt8]) throws(TransportError) -> Reply {
        try request("POST", url, bearer: bearer, json: json)
    }

    public func get(_ url: String, bearer: String) throws(TransportError) -> Reply {
        try request("GET", url, bearer: bearer, json: nil)
    }

    /// POST with `json` as the body, or GET when `json` is nil.
    private func request(_ method: String, _ url: String, bearer: String, json: [UInt8]?) throws(TransportError) -> Reply {
        guard Self.initialised, let curl = curl_easy_init() else { throw TransportError(description: "libcurl could not be initialised") }
        defer { curl_easy_cleanup(curl) }
        let sink = Sink(maxBody: options.maxResponseBodyBytes, maxHeaders: options.maxResponseHeaderBytes)
        let context = Unmanaged.passUnretained(sink).toOpaque()
        var headers: UnsafeMutablePointer<curl_slist>? = nil
        for h in ["Content-Type: application/json", "Authorization: Bearer \(bearer)", "Expect:"] {
            guard let appended = curl_slist_append(headers, h) else {
                curl_slist_free_all(headers)
                throw TransportError(description: "\(method) \(url): libcurl could not build the request headers (out of memory)")
            }
            headers = appended
        }
        defer { curl_slist_free_all(headers) }
        // curl_easy_strerror says only "SSL connect error"; the buffer names the TLS alert or check that failed.
        var errorBuffer = [CChar](repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        var body = json ?? []
        let code: CURLcode = body.withUnsafeMutableBytes { bytes in errorBuffer.withUnsafeMutableBufferPointer { errors in
            var rc = ccurl_setopt_pointer(curl, CURLOPT_ERRORBUFFER, errors.baseAddress)
            func set(_ r: CURLcode) { if rc == CURLE_OK { rc = r } }
            // Before the URL, so a file:// or ftp:// URL is refused rather than fetched.
            set(ccurl_setopt_string(curl, CURLOPT_PROTOCOLS_STR, Self.allowedProtocols))
            set(ccurl_setopt_string(curl, CURLOPT_REDIR_PROTOCOLS_STR, Self.allowedProtocols))
            set(ccurl_setopt_long(curl, CURLOPT_FOLLOWLOCATION, 0))
            // No proxy from the environment: what the caller named is what is reached.
            set(ccurl_setopt_string(curl, CURLOPT_NOPROXY, "*"))
            set(ccurl_setopt_string(curl, CURLOPT_URL, url))
            if json != nil {
                set(ccurl_setopt_long(curl, CURLOPT_POST, 1))
                set(ccurl_setopt_pointer(curl, CURLOPT_POSTFIELDS, bytes.baseAddress))
                set(ccurl_setopt_long(curl, CURLOPT_POSTFIELDSIZE, bytes.count))
            } else {
                set(ccurl_setopt_long(curl, CURLOPT_HTTPGET, 1))
            }
            set(ccurl_setopt_pointer(curl, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(headers)))
            set(ccurl_setopt_long(curl, CURLOPT_TIMEOUT, options.timeoutSeconds))
            set(ccurl_setopt_long(curl, CURLOPT_CONNECTTIMEOUT, options.timeoutSeconds))
            set(ccurl_setopt_long(curl, CURLOPT_NOSIGNAL, 1))
            let version = options.http2 ? (url.hasPrefix("https:") ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE) : CURL_HTTP_VERSION_1_1
            set(ccurl_setopt_long(curl, CURLOPT_HTTP_VERSION, version))
            if let ca = options.caFile { set(ccurl_setopt_string(curl, CURLOPT_CAINFO, ca)) }
            if let cert = options.clientCertificate { set(ccurl_setopt_string(curl, CURLOPT_SSLCERT, cert)) }
            if let key = options.clientKey { set(ccurl_setopt_string(curl, CURLOPT_SSLKEY, key)) }
            // Returning less than was given makes libcurl stop the transfer (CURLE_WRITE_ERROR).
            set(ccurl_setopt_callback(curl, CURLOPT_WRITEFUNCTION) { data, size, count, context in
                let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                let n = size * count
                guard n <= sink.maxBody - sink.body.count else {
                    sink.bodyTooLarge = true
                    return 0
                }
                sink.body.append(contentsOf: UnsafeBufferPointer(start: UnsafeRawPointer(data!).assumingMemoryBound(to: UInt8.self), count: n))
                return n
            })
            set(ccurl_setopt_pointer(curl, CURLOPT_WRITEDATA, context))
            set(ccurl_setopt_callback(curl, CURLOPT_HEADERFUNCTION) { data, size, count, context in
                let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                let n = size * count
                sink.headerBytes += n
                guard sink.headerBytes <= sink.maxHeaders else {
                    sink.headersTooLarge = true
                    return 0
                }
                let line = String(decoding: UnsafeBufferPointer(start: UnsafeRawPointer(data!).assumingMemoryBound(to: UInt8.self), count: n), as: UTF8.self)
                sink.headers.append(line.trimmingCharacters(in: .whitespacesAndNewlines))
                return n
            })
            set(ccurl_setopt_pointer(curl, CURLOPT_HEADERDATA, context))
            guard rc == CURLE_OK else { return rc }
            return curl_easy_perform(curl)
        } }
        if sink.bodyTooLarge {
            throw TransportError(description: "\(method) \(url): the response body is larger than \(options.maxResponseBodyBytes) bytes; refused")
        }
        if sink.headersTooLarge {
            throw TransportError(description: "\(method) \(url): the response headers are larger than \(options.maxResponseHeaderBytes) bytes; refused")
        }
        guard code == CURLE_OK else {
            let detail = String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw TransportError(description: "\(method) \(url): \(detail.isEmpty ? String(cString: curl_easy_strerror(code)) : detail)",
                                 tlsRefused: Self.tlsFailureIsFinal(curlCode: Int(code.rawValue), detail: detail))
        }
        let version: String
        switch ccurl_http_version(curl) {
        case CURL_HTTP_VERSION_2_0: version = "HTTP/2"
        case CURL_HTTP_VERSION_1_0: version = "HTTP/1.0"
        default: version = "HTTP/1.1"
        }
        return Reply(status: ccurl_response_code(curl), body: sink.body, retryAfter: Double(Self.lastField("retry-after", sink.headers) ?? ""),
                     httpVersion: version, location: Self.lastField("location", sink.headers))
    }

    /// The value of the last header line named `name` (lowercase), trimmed.
    static func lastField(_ name: String, _ lines: [String]) -> String? {
        lines.compactMap { line -> String? in
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == name else { return nil }
            return parts[1].trimmingCharacters(in: .whitespaces)
        }.last
    }
}
