// The only file in PushClient that touches libcurl. Two owner classes: `CurlTransfer` (one easy
// handle + its header list + error buffer) and `CurlMulti` (one multi handle). Both are used
// only by the connection-slot thread that created them.
internal import CCurl
import Foundation

/// libcurl's global init is not thread-safe against other curl calls; a Swift global is
/// initialised exactly once, atomically, on first use.
private let curlGlobalInit: CURLcode = curl_global_init(Int(CURL_GLOBAL_ALL))

func curlVersionString() -> String { String(cString: curl_version()) }

/// How to reach APNs and authenticate the TLS connection; the same for every request.
struct CurlConnectionOptions: Sendable {
    var http2PriorKnowledge: Bool
    var caFile: String?
    var certificate: (cert: String, key: String, passphrase: String?)?
    var requestTimeoutMS: Int
    var connectTimeoutMS: Int
    var keepaliveSeconds: Int
}

/// What libcurl said when a transfer finished.
struct CurlOutcome: Sendable {
    var ok: Bool
    var timedOut: Bool
    /// The connection died under the request (reset, GOAWAY, RST_STREAM, nothing received).
    var connectionLost: Bool
    var message: String
    var status: Int
    /// Body bytes libcurl handed to the connection: 0 means APNs cannot have acted on it.
    var bytesUploaded: Int64
    /// Connections libcurl opened for this transfer (CURLINFO_NUM_CONNECTS).
    var newConnections: Int
}

final class CurlTransfer {
    fileprivate let easy: UnsafeMutableRawPointer
    private var headerList: UnsafeMutablePointer<curl_slist>? = nil
    private let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CURL_ERROR_SIZE))
    /// Set by the slot; travels with the transfer so completion finds its request.
    var context: AnyObject?
    private(set) var responseBody: [UInt8] = []
    private(set) var responseHeaders: [String: String] = [:]

    /// Sets everything that is the same for every push; `prepare` sets the rest. A slot keeps
    /// finished transfers and reuses them (saves curl_easy_init and ~25 setopt calls per push).
    init(options: CurlConnectionOptions) throws {
        _ = curlGlobalInit
        guard let easy = curl_easy_init() else { throw PushClientError.curl("curl_easy_init failed") }
        self.easy = easy
        errorBuffer.initialize(to: 0)
        try set(CURLOPT_ERRORBUFFER, pointer: UnsafeMutableRawPointer(errorBuffer))
        try set(CURLOPT_NOSIGNAL, 1)
        try set(CURLOPT_POST, 1)
        try set(CURLOPT_HTTP_VERSION, options.http2PriorKnowledge ? Int(CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE) : Int(CURL_HTTP_VERSION_2TLS))
        try set(CURLOPT_SSLVERSION, Int(CURL_SSLVERSION_TLSv1_2))
        try set(CURLOPT_CONNECTTIMEOUT_MS, options.connectTimeoutMS)
        // Wait for the slot's connection to multiplex instead of opening a second one.
        try set(CURLOPT_PIPEWAIT, 1)
        // Idle-connection health: libcurl 7.88's HTTP/2 PING upkeep only runs from
        // curl_easy_upkeep on easy-interface handles, never for a multi's connections, so the
        // kernel probes idle connections instead and a dead one is dropped before reuse.
        try set(CURLOPT_TCP_KEEPALIVE, 1)
        try set(CURLOPT_TCP_KEEPIDLE, max(1, options.keepaliveSeconds))
        try set(CURLOPT_TCP_KEEPINTVL, max(1, min(options.keepaliveSeconds, 10)))
        if let ca = options.caFile { try set(CURLOPT_CAINFO, ca) }
        if let cert = options.certificate {
            try set(CURLOPT_SSLCERT, cert.cert)
            let lower = cert.cert.lowercased()
            if lower.hasSuffix(".p12") || lower.hasSuffix(".pfx") {
                try set(CURLOPT_SSLCERTTYPE, "P12")
            } else {
                try set(CURLOPT_SSLCERTTYPE, "PEM")
                try set(CURLOPT_SSLKEY, cert.key)
                try set(CURLOPT_SSLKEYTYPE, "PEM")
            }
            if let pass = cert.passphrase { try set(CURLOPT_KEYPASSWD, pass) }
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        try set(CURLOPT_PRIVATE, pointer: me)
        try set(CURLOPT_WRITEDATA, pointer: me)
        try set(CURLOPT_HEADERDATA, pointer: me)
        try check(ccurl_easy_setopt_write_callback(easy, CURLOPT_WRITEFUNCTION) { ptr, size, count, user in
            let n = size * count
            guard let ptr, let user else { return n }
            let t = Unmanaged<CurlTransfer>.fromOpaque(user).takeUnretainedValue()
            // APNs error bodies are tiny; cap what a misbehaving server can make us buffer.
            if t.responseBody.count < 65536 {
                t.responseBody.append(contentsOf: UnsafeRawBufferPointer(start: ptr, count: n))
            }
            return n
        })
        try check(ccurl_easy_setopt_write_callback(easy, CURLOPT_HEADERFUNCTION) { ptr, size, count, user in
            let n = size * count
            guard let ptr, let user else { return n }
            // Byte-level: this runs for every response header line of every push, and a
            // String + Foundation `trimmingCharacters` here cost ~50k instructions per push.
            let line = UnsafeRawBufferPointer(start: ptr, count: n)
            if let name = CurlTransfer.keptHeaderName(line) {
                let t = Unmanaged<CurlTransfer>.fromOpaque(user).takeUnretainedValue()
                t.responseHeaders[name] = CurlTransfer.headerValue(line, nameLength: name.utf8.count)
            }
            return n
        })
    }

    /// "apns-id" or "apns-unique-id" when `line` ("Name: value\r\n") is one of those headers
    /// (name compared ASCII case-insensitively), else nil. No allocation for other headers.
    static func keptHeaderName(_ line: UnsafeRawBufferPointer) -> String? {
        guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { return nil }
        for candidate in ["apns-id", "apns-unique-id"] where candidate.utf8.count == colon {
            if zip(candidate.utf8, line[..<colon]).allSatisfy({ $0 == ($1 | (($1 >= 0x41 && $1 <= 0x5A) ? 0x20 : 0)) }) {
                return candidate
            }
        }
        return nil
    }

    /// The value after "name:", without leading/trailing spaces, tabs, CR and LF.
    static func headerValue(_ line: UnsafeRawBufferPointer, nameLength: Int) -> String {
        func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 || b == 0x0D || b == 0x0A }
        var start = nameLength + 1
        var end = line.count
        while start < end, isSpace(line[start]) { start += 1 }
        while end > start, isSpace(line[end - 1]) { end -= 1 }
        return String(decoding: line[start..<end], as: UTF8.self)
    }

    /// The per-push part: URL, headers, body, what is left of the push's time budget.
    func prepare(url: String, headers: [String], body: [UInt8], timeoutMS: Int) throws {
        responseBody.removeAll(keepingCapacity: true)
        responseHeaders.removeAll(keepingCapacity: true)
        errorBuffer[0] = 0
        var list: UnsafeMutablePointer<curl_slist>? = nil
        for h in headers {
            guard let l = curl_slist_append(list, h) else {
                curl_slist_free_all(list)
                throw PushClientError.curl("out of memory (curl_slist_append)")
            }
            list = l
        }
        // libcurl borrows the list until the transfer ends: swap, then free the old one.
        try set(CURLOPT_HTTPHEADER, pointer: UnsafeMutableRawPointer(list))
        curl_slist_free_all(headerList)
        headerList = list
        try set(CURLOPT_URL, url)
        // Size first, then COPYPOSTFIELDS: libcurl copies the bytes (POSTFIELDS would keep a
        // pointer into a Swift array that may move).
        try check(ccurl_easy_setopt_off_t(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)))
        try body.withUnsafeBufferPointer { buf in
            try check(buf.baseAddress!.withMemoryRebound(to: CChar.self, capacity: body.count) {
                ccurl_easy_setopt_string(easy, CURLOPT_COPYPOSTFIELDS, $0)
            })
        }
        try set(CURLOPT_TIMEOUT_MS, timeoutMS)
    }

    deinit {
        curl_easy_cleanup(easy)
        curl_slist_free_all(headerList)
        errorBuffer.deallocate()
    }

    fileprivate func outcome(code: CURLcode) -> CurlOutcome {
        var status = 0
        _ = ccurl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        var uploaded: curl_off_t = 0
        _ = ccurl_easy_getinfo_off_t(easy, CURLINFO_SIZE_UPLOAD_T, &uploaded)
        var connects = 0
        _ = ccurl_easy_getinfo_long(easy, CURLINFO_NUM_CONNECTS, &connects)
        var message = ""
        if code != CURLE_OK {
            let detail = String(cString: errorBuffer)
            message = "\(String(cString: curl_easy_strerror(code)))" + (detail.isEmpty ? "" : ": \(detail)")
        }
        let lost: Set<CURLcode> = [CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_HTTP2, CURLE_HTTP2_STREAM,
                                   CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE]
        return CurlOutcome(ok: code == CURLE_OK, timedOut: code == CURLE_OPERATION_TIMEDOUT,
                           connectionLost: lost.contains(code), message: message,
                           status: status, bytesUploaded: Int64(uploaded), newConnections: connects)
    }

    private func set(_ option: CURLoption, _ value: Int) throws { try check(ccurl_easy_setopt_long(easy, option, value)) }
    private func set(_ option: CURLoption, _ value: String) throws { try check(ccurl_easy_setopt_string(easy, option, value)) }
    private func set(_ option: CURLoption, pointer: UnsafeMutableRawPointer?) throws {
        try check(ccurl_easy_setopt_pointer(easy, option, pointer))
    }
    private func check(_ code: CURLcode) throws {
        guard code == CURLE_OK else { throw PushClientError.curl(String(cString: curl_easy_strerror(code))) }
    }
}

/// One multi handle = one HTTP/2 connection (MAX_HOST_CONNECTIONS 1) carrying many streams.
final class CurlMulti {
    private let multi: UnsafeMutableRawPointer
    private var transfers: [UnsafeMutableRawPointer: CurlTransfer] = [:]

    var count: Int { transfers.count }

    init(maxConcurrentStreams: Int = 1000) throws {
        _ = curlGlobalInit
        guard let m = curl_multi_init() else { throw PushClientError.curl("curl_multi_init failed") }
        multi = m
        try check(ccurl_multi_setopt_long(m, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX)))
        try check(ccurl_multi_setopt_long(m, CURLMOPT_MAX_HOST_CONNECTIONS, 1))
        try check(ccurl_multi_setopt_long(m, CURLMOPT_MAXCONNECTS, 1))
        // Client-side cap per connection (libcurl's default is 100); the server's own
        // SETTINGS_MAX_CONCURRENT_STREAMS still applies: nghttp2 queues streams above it.
        try check(ccurl_multi_setopt_long(m, CURLMOPT_MAX_CONCURRENT_STREAMS, maxConcurrentStreams))
    }

    deinit {
        for (easy, _) in transfers { _ = curl_multi_remove_handle(multi, easy) }
        transfers.removeAll()
        _ = curl_multi_cleanup(multi)
    }

    func add(_ transfer: CurlTransfer) throws {
        try check(curl_multi_add_handle(multi, transfer.easy))
        transfers[transfer.easy] = transfer
    }

    /// Drives all transfers; returns the ones that finished.
    func perform() throws -> [(CurlTransfer, CurlOutcome)] {
        var running: Int32 = 0
        try check(curl_multi_perform(multi, &running))
        var done: [(CurlTransfer, CurlOutcome)] = []
        var left: Int32 = 0
        while let msg = curl_multi_info_read(multi, &left) {
            guard msg.pointee.msg == CURLMSG_DONE, let easy = msg.pointee.easy_handle,
                  let t = transfers.removeValue(forKey: easy) else { continue }
            let outcome = t.outcome(code: ccurl_msg_result(msg))
            _ = curl_multi_remove_handle(multi, easy)
            done.append((t, outcome))
        }
        return done
    }

    /// Removes every transfer without completing it (shutdown); returns them.
    func abandonAll() -> [CurlTransfer] {
        let all = Array(transfers.values)
        for t in all { _ = curl_multi_remove_handle(multi, t.easy) }
        transfers.removeAll()
        return all
    }

    /// Sleeps until curl has work, `wakeFD` is readable, or `timeoutMS` passes.
    func poll(wakeFD: Int32, timeoutMS: Int32) throws {
        var extra = curl_waitfd(fd: wakeFD, events: Int16(CURL_WAIT_POLLIN), revents: 0)
        var n: Int32 = 0
        try check(curl_multi_poll(multi, &extra, 1, timeoutMS, &n))
    }

    private func check(_ code: CURLMcode) throws {
        guard code == CURLM_OK else { throw PushClientError.curl(String(cString: curl_multi_strerror(code))) }
    }
}
