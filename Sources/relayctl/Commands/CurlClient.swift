// A blocking HTTP client on libcurl for `relayctl accessory send` and `send-test`: HTTP/1.1 or HTTP/2 (ALPN over
// TLS, prior knowledge over cleartext), a private CA file, a client certificate when the relay
// asks for one. One easy handle per request; timeouts bound every transfer.
import CCurl
import Foundation

final class CurlClient {
    struct Options {
        var http2 = false
        var caFile: String?
        var clientCertificate: String?
        var clientKey: String?
        var timeoutSeconds = 10
    }
    struct Reply {
        var status: Int
        var body: [UInt8]
        var retryAfter: Double?
        var httpVersion: String
    }
    struct TransportError: Error, CustomStringConvertible { var description: String }

    private let options: Options
    private static let initialised: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK

    init(_ options: Options) { self.options = options }

    /// Collects the response body and headers; `context` of the C callbacks.
    private final class Sink {
        var body: [UInt8] = []
        var headers: [String] = []
    }

    func post(_ url: String, bearer: String, json: [UInt8]) throws -> Reply {
        try request("POST", url, bearer: bearer, json: json)
    }

    func get(_ url: String, bearer: String) throws -> Reply {
        try request("GET", url, bearer: bearer, json: nil)
    }

    /// POST with `json` as the body, or GET when `json` is nil.
    private func request(_ method: String, _ url: String, bearer: String, json: [UInt8]?) throws -> Reply {
        guard Self.initialised, let curl = curl_easy_init() else { throw TransportError(description: "libcurl could not be initialised") }
        defer { curl_easy_cleanup(curl) }
        let sink = Sink()
        let context = Unmanaged.passUnretained(sink).toOpaque()
        var headers: UnsafeMutablePointer<curl_slist>? = nil
        for h in ["Content-Type: application/json", "Authorization: Bearer \(bearer)", "Expect:"] { headers = curl_slist_append(headers, h) }
        defer { curl_slist_free_all(headers) }
        // curl_easy_strerror says only "SSL connect error"; the buffer names the TLS alert or check that failed.
        var errorBuffer = [CChar](repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        var body = json ?? []
        let code: CURLcode = body.withUnsafeMutableBytes { bytes in errorBuffer.withUnsafeMutableBufferPointer { errors in
            var rc = ccurl_setopt_string(curl, CURLOPT_URL, url)
            func set(_ r: CURLcode) { if rc == CURLE_OK { rc = r } }
            set(ccurl_setopt_pointer(curl, CURLOPT_ERRORBUFFER, errors.baseAddress))
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
            set(ccurl_setopt_callback(curl, CURLOPT_WRITEFUNCTION) { data, size, count, context in
                let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                sink.body.append(contentsOf: UnsafeBufferPointer(start: UnsafeRawPointer(data!).assumingMemoryBound(to: UInt8.self), count: size * count))
                return size * count
            })
            set(ccurl_setopt_pointer(curl, CURLOPT_WRITEDATA, context))
            set(ccurl_setopt_callback(curl, CURLOPT_HEADERFUNCTION) { data, size, count, context in
                let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                let line = String(decoding: UnsafeBufferPointer(start: UnsafeRawPointer(data!).assumingMemoryBound(to: UInt8.self), count: size * count), as: UTF8.self)
                sink.headers.append(line.trimmingCharacters(in: .whitespacesAndNewlines))
                return size * count
            })
            set(ccurl_setopt_pointer(curl, CURLOPT_HEADERDATA, context))
            guard rc == CURLE_OK else { return rc }
            return curl_easy_perform(curl)
        } }
        guard code == CURLE_OK else {
            let detail = String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw TransportError(description: "\(method) \(url): \(detail.isEmpty ? String(cString: curl_easy_strerror(code)) : detail)")
        }
        let retryAfter = sink.headers.compactMap { line -> Double? in
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == "retry-after" else { return nil }
            return Double(parts[1].trimmingCharacters(in: .whitespaces))
        }.last
        let version: String
        switch ccurl_http_version(curl) {
        case CURL_HTTP_VERSION_2_0: version = "HTTP/2"
        case CURL_HTTP_VERSION_1_0: version = "HTTP/1.0"
        default: version = "HTTP/1.1"
        }
        return Reply(status: ccurl_response_code(curl), body: sink.body, retryAfter: retryAfter, httpVersion: version)
    }
}
