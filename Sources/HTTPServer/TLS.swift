// The OpenSSL wrapper: one `TLSContext` per server (an SSL_CTX, replaced whole on reload), one
// `TLSSession` (SSL with two memory BIOs) per connection. The loop feeds ciphertext in and takes
// ciphertext out; OpenSSL never touches the socket. OpenSSL types stay in this file; error text,
// certificate subjects and the ALPN result come from OpenSSLSupport.
internal import COpenSSL
internal import OpenSSLSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

private func opensslErrors() -> String { OpenSSLErrors.drain(ifNone: "unknown OpenSSL error") }

/// The certificate a TLS context serves, for logs (after a start or a reload).
public struct TLSCertificateSummary: Sendable, Equatable {
    public var subject: String
    /// "2027-01-31T12:00:00Z"
    public var notAfter: String
}

/// The server's TLS settings, re-read from their files by `reload()`: each load builds a whole
/// new SSL_CTX and swaps it in for new connections; a connection keeps the SSL_CTX it started
/// with (its TLSSession holds it), so a reload never drops or renegotiates anything.
final class TLSContext: Sendable {
    let configuration: TLSConfiguration
    private let current: Mutex<TLSContextGeneration>

    init(configuration c: TLSConfiguration) throws {
        configuration = c
        current = Mutex(try TLSContextGeneration(configuration: c))
    }

    /// The files are read and checked in full before the swap: on any error the running
    /// context stays and the error says which file and why.
    func reload() throws -> TLSCertificateSummary {
        let next = try TLSContextGeneration(configuration: configuration)
        current.withLock { $0 = next }
        return next.summary
    }

    var generation: TLSContextGeneration { current.withLock { $0 } }
}

extension HTTPServer {
    /// Re-reads the listener's certificate, key and client CA (SIGHUP in relay-server). Nil
    /// for a cleartext listener; throws, keeping the served certificate, if the new files do
    /// not load.
    public func reloadTLS() throws -> TLSCertificateSummary? {
        try core.tls?.reload()
    }
}

// @unchecked Sendable: the SSL_CTX is fully configured in init and only read afterwards
// (SSL_new from loop threads), which OpenSSL documents as thread-safe; `alpnPrefs` is
// immutable after init and lives as long as any SSL made from this SSL_CTX (each TLSSession
// holds its generation).
final class TLSContextGeneration: @unchecked Sendable {
    fileprivate let ctx: OpaquePointer
    /// 2-byte big-endian length followed by the ALPN wire list; read by the C select callback.
    private let alpnPrefs: UnsafeMutablePointer<UInt8>
    let summary: TLSCertificateSummary

    init(configuration c: TLSConfiguration) throws {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_server_method()) else {
            throw HTTPServerError.tls("SSL_CTX_new: \(opensslErrors())")
        }
        var wire: [UInt8] = []
        for p in c.alpn where !p.isEmpty && p.utf8.count < 256 {
            wire.append(UInt8(p.utf8.count))
            wire.append(contentsOf: p.utf8)
        }
        let alpnPrefs = UnsafeMutablePointer<UInt8>.allocate(capacity: wire.count + 2)
        alpnPrefs[0] = UInt8(wire.count >> 8)
        alpnPrefs[1] = UInt8(wire.count & 0xff)
        for (i, b) in wire.enumerated() { alpnPrefs[i + 2] = b }
        func fail(_ message: String) -> HTTPServerError {
            SSL_CTX_free(ctx)
            alpnPrefs.deallocate()
            return .tls(message)
        }

        guard cossl_ctx_set_min_tls12(ctx) == 1 else { throw fail("cannot require TLS 1.2: \(opensslErrors())") }
        cossl_ctx_harden_server(ctx)
        // Under SSL_VERIFY_PEER OpenSSL refuses to resume a session (internal_error alert, the
        // handshake fails) unless a session id context is set; accessories resume.
        let sessionContext = Array("accessory-relay".utf8)
        guard SSL_CTX_set_session_id_context(ctx, sessionContext, UInt32(sessionContext.count)) == 1 else {
            throw fail("session id context: \(opensslErrors())")
        }
        guard SSL_CTX_use_certificate_chain_file(ctx, c.certificatePath) == 1 else {
            throw fail("certificate \(c.certificatePath): \(opensslErrors())")
        }
        guard SSL_CTX_use_PrivateKey_file(ctx, c.privateKeyPath, SSL_FILETYPE_PEM) == 1 else {
            throw fail("private key \(c.privateKeyPath): \(opensslErrors())")
        }
        guard SSL_CTX_check_private_key(ctx) == 1 else {
            throw fail("private key \(c.privateKeyPath) does not match certificate \(c.certificatePath): \(opensslErrors())")
        }
        if let ca = c.clientCAPath {
            // Only this file is trusted for client certificates (a new SSL_CTX has no default
            // store), and its names are sent in the CertificateRequest so a client picks the
            // right certificate.
            guard SSL_CTX_load_verify_locations(ctx, ca, nil) == 1, let names = SSL_load_client_CA_file(ca) else {
                throw fail("client CA \(ca): \(opensslErrors())")
            }
            SSL_CTX_set_client_CA_list(ctx, names)
            var mode = SSL_VERIFY_PEER
            if c.requireClientCertificate { mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT }
            SSL_CTX_set_verify(ctx, mode, nil)
        } else if c.requireClientCertificate {
            throw fail("requireClientCertificate needs clientCAPath")
        }
        if !wire.isEmpty { cossl_ctx_set_alpn_prefs(ctx, alpnPrefs) }
        self.ctx = ctx
        self.alpnPrefs = alpnPrefs
        summary = Self.summary(SSL_CTX_get0_certificate(ctx))
    }

    deinit {
        SSL_CTX_free(ctx)
        alpnPrefs.deallocate()
    }

    private static func summary(_ cert: OpaquePointer?) -> TLSCertificateSummary {
        var s = TLSCertificateSummary(subject: "", notAfter: "")
        guard let cert else { return s }
        let certificate = X509Certificate(retaining: cert)
        s.subject = certificate.subject ?? ""
        if let t = certificate.notAfter {
            func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
            s.notAfter = "\(t.tm_year + 1900)-\(two(t.tm_mon + 1))-\(two(t.tm_mday))T\(two(t.tm_hour)):\(two(t.tm_min)):\(two(t.tm_sec))Z"
        }
        return s
    }
}

enum TLSHandshakeResult { case done, needMore, failed(String) }
enum TLSReadResult { case data(Int), needMore, closed, failed(String) }

/// One connection's TLS state. Loop-thread only.
final class TLSSession {
    private let ssl: OpaquePointer
    private let rbio: OpaquePointer
    private let wbio: OpaquePointer
    /// Keeps the SSL_CTX's ALPN list alive for this connection across reloads.
    private let generation: TLSContextGeneration
    private(set) var handshakeDone = false

    init(context: TLSContext) throws {
        let generation = context.generation
        guard let ssl = SSL_new(generation.ctx) else { throw HTTPServerError.tls("SSL_new: \(opensslErrors())") }
        guard let r = BIO_new(BIO_s_mem()), let w = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw HTTPServerError.tls("BIO_new: \(opensslErrors())")
        }
        self.ssl = ssl
        self.generation = generation
        rbio = r
        wbio = w
        SSL_set_bio(ssl, r, w)   // the SSL owns both BIOs from here
        SSL_set_accept_state(ssl)
    }

    deinit { SSL_free(ssl) }

    /// Hands received ciphertext to OpenSSL (copied into the read BIO).
    func feed(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return true }
        return BIO_write(rbio, base, Int32(bytes.count)) == Int32(bytes.count)
    }

    func handshake() -> TLSHandshakeResult {
        ERR_clear_error()
        let rc = SSL_do_handshake(ssl)
        if rc == 1 {
            handshakeDone = true
            return .done
        }
        let err = SSL_get_error(ssl, rc)
        if err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE { return .needMore }
        return .failed(opensslErrors())
    }

    func read(into buffer: UnsafeMutableRawPointer, capacity: Int) -> TLSReadResult {
        ERR_clear_error()
        let n = SSL_read(ssl, buffer, Int32(capacity))
        if n > 0 { return .data(Int(n)) }
        let err = SSL_get_error(ssl, n)
        switch err {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: return .needMore
        case SSL_ERROR_ZERO_RETURN: return .closed
        default: return .failed(opensslErrors())
        }
    }

    /// Encrypts all of `plain` (memory BIOs never block, so SSL_write takes everything).
    func write(_ plain: UnsafeRawBufferPointer) -> Bool {
        guard let base = plain.baseAddress, plain.count > 0 else { return true }
        ERR_clear_error()
        var offset = 0
        while offset < plain.count {
            let n = SSL_write(ssl, base + offset, Int32(min(plain.count - offset, 1 << 30)))
            if n <= 0 { return false }
            offset += Int(n)
        }
        return true
    }

    /// Moves pending ciphertext (handshake records, alerts, encrypted data) to `wire`.
    func drainOutput(into wire: inout [UInt8]) {
        while true {
            let pending = Int(BIO_ctrl_pending(wbio))
            if pending <= 0 { return }
            let start = wire.count
            wire.append(contentsOf: repeatElement(0, count: pending))
            let n = wire.withUnsafeMutableBytes { BIO_read(wbio, $0.baseAddress! + start, Int32(pending)) }
            if n <= 0 {
                wire.removeLast(pending)
                return
            }
            if Int(n) < pending { wire.removeLast(pending - Int(n)) }
        }
    }

    /// Queues a close_notify alert (sent by the next drain).
    func shutdown() {
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
    }

    var info: TLSInfo {
        let alpn = selectedALPN(ssl)
        let version = String(cString: SSL_get_version(ssl))
        let cipher = SSL_get_current_cipher(ssl).map { String(cString: SSL_CIPHER_get_name($0)) } ?? ""
        var subject: String?
        if let cert = SSL_get1_peer_certificate(ssl) {
            subject = X509Certificate(owning: cert).subject
        }
        return TLSInfo(alpn: alpn, version: version, cipher: cipher, peerCertificateSubject: subject)
    }
}
