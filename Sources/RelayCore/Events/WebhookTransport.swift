// The webhook sender's HTTP: one libcurl multi handle, driven by the sender's own thread only
// (libcurl loaded with dlopen by CCurlLoader: relay-server does not link it). HTTP/2 when the
// receiver offers it over TLS (one connection multiplexes), HTTP/1.1 otherwise; connections are
// kept in the multi handle's cache between transfers. What a receiver can make it do is bounded
// as in HTTPClient's CurlClient: http and https only, no redirect followed, the reply's body read
// up to `maxResponseBodyBytes` and ignored, every transfer under its timeout.
import BuildInfo
import Synchronization
internal import CCurlLoader

struct WebhookTransportError: Error, CustomStringConvertible {
    var description: String
}

/// One POST to a webhook.
struct WebhookRequest {
    var key: Int
    var url: String
    /// "name: value" lines.
    var headers: [String]
    var body: [UInt8]
    var timeoutMillis: Int
    var caFile: String?
}

enum WebhookTransferOutcome: Equatable {
    /// The receiver answered (any status; 2xx is success).
    case status(Int)
    /// No answer: connection refused, TLS failure, timeout...
    case failed(String)
    /// Not the receiver's doing: libcurl failed here (out of memory, an option or feature it
    /// refused). The request may not have left; it is not an attempt.
    case local(String)
}

/// Owned by one thread, except `wakeup`, which any thread may call until `close`.
final class WebhookTransport: @unchecked Sendable {
    static let allowedProtocols = "http,https"
    static let maxResponseBodyBytes = 4096

    /// True from init until close, under the lock: `wakeup` (from other threads) and `close`
    /// (from the owner) never overlap, and no wakeup reaches a freed multi handle.
    private let open = Mutex(true)
    private let multi: UnsafeMutableRawPointer
    private var transfers: [Int: Transfer] = [:]   // by easy handle address
    /// Tests: a text here makes `add` fail as a local setup error would.
    private let setupFault: (@Sendable () -> String?)?

    /// An easy handle with what it needs kept alive while it runs. Between transfers it waits in
    /// `idle` with its per-webhook options set (URL, CA file, timeouts, limits, the body
    /// counter): the next transfer to the same webhook sets only its body and headers, instead
    /// of a new handle and every option per event (libcurl keeps a handle's options across
    /// transfers).
    private final class Transfer {
        var key: Int
        let easy: UnsafeMutableRawPointer
        let target: Target
        var headers: UnsafeMutablePointer<curl_slist>?
        var bodyBytes = 0
        /// CURLOPT_ERRORBUFFER: libcurl keeps the pointer, so it is allocated, not an array.
        let errorBuffer: UnsafeMutablePointer<CChar>
        init(key: Int, easy: UnsafeMutableRawPointer, target: Target) {
            self.key = key
            self.easy = easy
            self.target = target
            errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
            errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        }
        deinit { errorBuffer.deallocate() }
        var errorText: String { String(cString: errorBuffer) }
    }

    /// The options a handle keeps between transfers: one reused only for the same.
    private struct Target: Equatable {
        var url: String
        var timeoutMillis: Int
        var caFile: String?
    }

    /// Handles between transfers, at most `maxIdle` (the senders' concurrency is bounded well
    /// below it; past it a finished handle is freed).
    private var idle: [Transfer] = []
    static let maxIdle = 64

    init(setupFault: (@Sendable () -> String?)? = nil) throws(WebhookTransportError) {
        self.setupFault = setupFault
        var error = [CChar](repeating: 0, count: 256)
        guard ccurld_load(&error, error.count) == 1 else {
            throw WebhookTransportError(description: String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        guard let m = ccurld_multi_init() else { throw WebhookTransportError(description: "curl_multi_init failed") }
        multi = m
        // Wait for an HTTP/2 connection being set up rather than open one per transfer.
        _ = ccurld_multi_setopt_long(m, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
    }

    deinit { close() }

    var inFlight: Int { transfers.count }

    /// Starts a transfer; it finishes in a later `perform`. Throws only for failures here (the
    /// handle or an option could not be set up): nothing was sent.
    func add(_ request: WebhookRequest) throws(WebhookTransportError) {
        if let fault = setupFault?() { throw WebhookTransportError(description: fault) }
        let target = Target(url: request.url, timeoutMillis: request.timeoutMillis, caFile: request.caFile)
        let transfer: Transfer
        if let i = idle.lastIndex(where: { $0.target == target }) {
            transfer = idle.remove(at: i)
            transfer.key = request.key
            transfer.bodyBytes = 0
            transfer.errorBuffer[0] = 0
        } else {
            transfer = try configured(key: request.key, target)
        }
        var rc = CURLE_OK
        func set(_ r: CURLcode) { if rc == CURLE_OK { rc = r } }
        for line in request.headers + Self.fixedHeaders {
            guard let appended = ccurld_slist_append(transfer.headers, line) else {
                set(CURLE_OUT_OF_MEMORY)
                break
            }
            transfer.headers = appended
        }
        // COPYPOSTFIELDS copies the body (the array may move); its size must be set first.
        set(ccurld_setopt_offset(transfer.easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.count)))
        let body = request.body.isEmpty ? [0] : request.body   // a valid pointer; the size says 0
        set(body.withUnsafeBytes { ccurld_setopt_pointer(transfer.easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: $0.baseAddress!)) })
        set(ccurld_setopt_pointer(transfer.easy, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(transfer.headers)))
        guard rc == CURLE_OK else {
            discard(transfer)
            throw WebhookTransportError(description: "\(request.url): \(String(cString: ccurld_easy_strerror(rc)))")
        }
        let added = ccurld_multi_add_handle(multi, transfer.easy)
        guard added == CURLM_OK else {
            discard(transfer)
            throw WebhookTransportError(description: "curl_multi_add_handle: \(String(cString: ccurld_multi_strerror(added)))")
        }
        transfers[Int(bitPattern: transfer.easy)] = transfer
    }

    private static let fixedHeaders = ["Content-Type: application/json", "User-Agent: accessory-relay/\(BuildInfo.version)", "Expect:"]

    /// A new handle with the options every transfer to `target` shares.
    private func configured(key: Int, _ target: Target) throws(WebhookTransportError) -> Transfer {
        guard let easy = ccurld_easy_init() else { throw WebhookTransportError(description: "curl_easy_init failed") }
        let transfer = Transfer(key: key, easy: easy, target: target)
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        var rc = ccurld_setopt_pointer(easy, CURLOPT_ERRORBUFFER, transfer.errorBuffer)
        func set(_ r: CURLcode) { if rc == CURLE_OK { rc = r } }
        // Before the URL, so another scheme is refused rather than fetched.
        set(ccurld_setopt_string(easy, CURLOPT_PROTOCOLS_STR, Self.allowedProtocols))
        set(ccurld_setopt_string(easy, CURLOPT_REDIR_PROTOCOLS_STR, Self.allowedProtocols))
        set(ccurld_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0))
        // No proxy from the environment (http_proxy, ALL_PROXY...): a loopback-only http:// URL
        // must not leave the host in clear through one.
        set(ccurld_setopt_string(easy, CURLOPT_NOPROXY, "*"))
        set(ccurld_setopt_string(easy, CURLOPT_URL, target.url))
        set(ccurld_setopt_long(easy, CURLOPT_POST, 1))
        set(ccurld_setopt_long(easy, CURLOPT_TIMEOUT_MS, target.timeoutMillis))
        set(ccurld_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, target.timeoutMillis))
        set(ccurld_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        set(ccurld_setopt_long(easy, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_2TLS)))
        // Over TLS, wait for the first connection's ALPN: if it says h2, every transfer shares it.
        // Cleartext is HTTP/1.1 (2TLS), where waiting would serialise transfers behind one
        // connection until its first answer.
        if target.url.hasPrefix("https://") { set(ccurld_setopt_long(easy, CURLOPT_PIPEWAIT, 1)) }
        if let ca = target.caFile { set(ccurld_setopt_string(easy, CURLOPT_CAINFO, ca)) }
        set(ccurld_setopt_callback(easy, CURLOPT_WRITEFUNCTION) { _, size, count, context in
            // Counted and dropped; past the bound, returning 0 ends the transfer (the status
            // line has been read by then, so the answer still counts).
            let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
            transfer.bodyBytes += size * count
            return transfer.bodyBytes > WebhookTransport.maxResponseBodyBytes ? 0 : size * count
        })
        set(ccurld_setopt_pointer(easy, CURLOPT_WRITEDATA, context))
        guard rc == CURLE_OK else {
            discard(transfer)
            throw WebhookTransportError(description: "\(target.url): \(String(cString: ccurld_easy_strerror(rc)))")
        }
        return transfer
    }

    /// Moves every transfer on as far as it can without blocking; returns those that finished.
    func perform() -> [(key: Int, outcome: WebhookTransferOutcome)] {
        var running: Int32 = 0
        _ = ccurld_multi_perform(multi, &running)
        var done: [(key: Int, outcome: WebhookTransferOutcome)] = []
        var easy: UnsafeMutableRawPointer? = nil
        var result = CURLE_OK
        while ccurld_multi_next_done(multi, &easy, &result) == 1, let e = easy {
            guard let transfer = transfers.removeValue(forKey: Int(bitPattern: e)) else { continue }
            let status = ccurld_response_code(e)
            let outcome: WebhookTransferOutcome
            if result == CURLE_OK || (result == CURLE_WRITE_ERROR && status > 0) {
                outcome = .status(status)
            } else if Self.localFailures.contains(result) {
                outcome = .local(String(cString: ccurld_easy_strerror(result)))
            } else {
                let detail = transfer.errorText
                outcome = .failed(detail.isEmpty ? String(cString: ccurld_easy_strerror(result)) : detail)
            }
            finished(transfer)
            done.append((transfer.key, outcome))
        }
        return done
    }

    /// Results that say nothing about the receiver: libcurl or this host could not do its part.
    private static let localFailures: [CURLcode] = [CURLE_OUT_OF_MEMORY, CURLE_FAILED_INIT, CURLE_BAD_FUNCTION_ARGUMENT, CURLE_UNKNOWN_OPTION,
                                                     CURLE_NOT_BUILT_IN]

    /// Waits up to `timeoutMillis` for socket activity, curl's own timers or `wakeup`.
    func poll(timeoutMillis: Int) {
        var fds: Int32 = 0
        _ = ccurld_multi_poll(multi, Int32(clamping: max(0, timeoutMillis)), &fds)
    }

    /// Any thread: ends the owner's `poll` early.
    func wakeup() {
        open.withLock { if $0 { _ = ccurld_multi_wakeup(multi) } }
    }

    /// Aborts whatever runs and frees the multi handle (its connections close).
    func close() {
        open.withLock { isOpen in
            guard isOpen else { return }
            for transfer in transfers.values {
                _ = ccurld_multi_remove_handle(multi, transfer.easy)
                discard(transfer)
            }
            transfers = [:]
            for transfer in idle { discard(transfer) }
            idle = []
            _ = ccurld_multi_cleanup(multi)
            isOpen = false
        }
    }

    /// A transfer that ended: its handle waits for the next one to the same webhook.
    private func finished(_ transfer: Transfer) {
        _ = ccurld_multi_remove_handle(multi, transfer.easy)
        ccurld_slist_free_all(transfer.headers)
        transfer.headers = nil
        if idle.count < Self.maxIdle { idle.append(transfer) } else { discard(transfer) }
    }

    private func discard(_ transfer: Transfer) {
        ccurld_easy_cleanup(transfer.easy)
        ccurld_slist_free_all(transfer.headers)
        transfer.headers = nil
    }
}
