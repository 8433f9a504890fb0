// The only file in PushClient that calls OpenSSL directly: the client side of TLS (one
// `TLSClientContext` = SSL_CTX per client, one `TLSClientTransport` = SSL per connection, reading
// and writing the non-blocking socket itself). Keys, ES256 and error text come from OpenSSLSupport.
internal import COpenSSL
internal import OpenSSLSupport
import Glibc

// MARK: - TLS client

/// Every queued OpenSSL error, "; "-separated ("" when none).
private func opensslErrors() -> String { OpenSSLErrors.drain() }

/// The client's SSL_CTX: TLS 1.2+, peer verification against `caFile` or the system store,
/// ALPN "h2", and the client certificate when configured.
///
/// `@unchecked Sendable`: the SSL_CTX is fully configured in init and afterwards only passed to
/// SSL_new (from slot threads), which OpenSSL documents as thread-safe.
final class TLSClientContext: @unchecked Sendable {
    fileprivate let ctx: OpaquePointer

    init(caFile: String?, certificate: (cert: String, key: String, passphrase: String?)?) throws {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_client_method()) else {
            throw PushClientError.tls("SSL_CTX_new: \(opensslErrors())")
        }
        self.ctx = ctx
        guard cossl_ctx_set_min_tls12(ctx) == 1 else {
            throw PushClientError.tls("cannot require TLS 1.2: \(opensslErrors())")
        }
        if let caFile {
            guard SSL_CTX_load_verify_locations(ctx, caFile, nil) == 1 else {
                throw PushClientError.invalidConfiguration("caFile \(caFile): \(opensslErrors())")
            }
        } else {
            guard SSL_CTX_set_default_verify_paths(ctx) == 1 else {
                throw PushClientError.tls("system CA store: \(opensslErrors())")
            }
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        // SSL_CTX_set_alpn_protos returns 0 on success (unlike most of OpenSSL).
        let alpn: [UInt8] = [2, UInt8(ascii: "h"), UInt8(ascii: "2")]
        guard SSL_CTX_set_alpn_protos(ctx, alpn, UInt32(alpn.count)) == 0 else {
            throw PushClientError.tls("cannot set ALPN: \(opensslErrors())")
        }
        // Partial writes and a moving buffer: our output buffer may shrink or grow between a
        // WANT_WRITE and the retry.
        _ = SSL_CTX_ctrl(ctx, SSL_CTRL_MODE, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER), nil)
        if let certificate { try loadClientCertificate(certificate) }
    }

    private func loadClientCertificate(_ c: (cert: String, key: String, passphrase: String?)) throws {
        if PKCS12File.isPKCS12Path(c.cert) {
            switch cossl_ctx_use_pkcs12_file(ctx, c.cert, c.passphrase) {
            case 1: break
            case -1: throw PushClientError.invalidConfiguration("certificatePath \(c.cert): cannot read the file")
            default:
                throw PushClientError.invalidConfiguration(
                    "certificatePath \(c.cert): not a PKCS#12 file with a certificate and key, or wrong passphrase: \(opensslErrors())")
            }
            guard SSL_CTX_check_private_key(ctx) == 1 else {
                throw PushClientError.invalidConfiguration("certificatePath \(c.cert): the key does not match the certificate: \(opensslErrors())")
            }
            return
        }
        guard SSL_CTX_use_certificate_chain_file(ctx, c.cert) == 1 else {
            throw PushClientError.invalidConfiguration("certificatePath \(c.cert): \(opensslErrors())")
        }
        // The passphrase is only needed while the key is read: a C copy lives for this call.
        let pass = c.passphrase.map { strdup($0) } ?? nil
        defer {
            if let pass { memset(pass, 0, strlen(pass)); free(pass) }
            SSL_CTX_set_default_passwd_cb(ctx, nil)
            SSL_CTX_set_default_passwd_cb_userdata(ctx, nil)
        }
        if let pass {
            SSL_CTX_set_default_passwd_cb_userdata(ctx, pass)
            SSL_CTX_set_default_passwd_cb(ctx) { buf, size, _, userData in
                guard let buf, let userData else { return 0 }
                let p = userData.assumingMemoryBound(to: CChar.self)
                let n = min(Int(strlen(p)), Int(size))
                buf.update(from: p, count: n)
                return Int32(n)
            }
        }
        guard SSL_CTX_use_PrivateKey_file(ctx, c.key, SSL_FILETYPE_PEM) == 1 else {
            throw PushClientError.invalidConfiguration("privateKeyPath \(c.key): \(opensslErrors())")
        }
        guard SSL_CTX_check_private_key(ctx) == 1 else {
            throw PushClientError.invalidConfiguration("privateKeyPath \(c.key) does not match the certificate: \(opensslErrors())")
        }
    }

    deinit { SSL_CTX_free(ctx) }
}

/// One TLS connection over a connected non-blocking socket (not owned: the connection closes
/// it after freeing this).
final class TLSClientTransport: ByteTransport {
    private let ssl: OpaquePointer
    private let host: String

    init(context: TLSClientContext, fd: Int32, host: String) throws {
        ERR_clear_error()
        guard let ssl = SSL_new(context.ctx) else { throw PushClientError.tls("SSL_new: \(opensslErrors())") }
        self.ssl = ssl
        self.host = host
        guard SSL_set_fd(ssl, fd) == 1 else { throw PushClientError.tls("SSL_set_fd: \(opensslErrors())") }
        var v4 = in_addr(), v6 = in6_addr()
        let isIP = inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
        if isIP {
            // RFC 6066: no SNI for IP literals; the certificate must name the IP (SAN iPAddress).
            guard X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1 else {
                throw PushClientError.tls("cannot verify IP \(host): \(opensslErrors())")
            }
        } else {
            // SSL_set_tlsext_host_name is a macro around SSL_ctrl.
            let sni = host.withCString { SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, Int(TLSEXT_NAMETYPE_host_name), UnsafeMutableRawPointer(mutating: $0)) }
            guard sni == 1, SSL_set1_host(ssl, host) == 1 else {
                throw PushClientError.tls("cannot set host name \(host): \(opensslErrors())")
            }
        }
        SSL_set_connect_state(ssl)
    }

    deinit { SSL_free(ssl) }

    func handshake() -> HandshakeStep {
        ERR_clear_error()
        let rc = SSL_do_handshake(ssl)
        if rc == 1 {
            let alpn = selectedALPN(ssl) ?? ""
            guard alpn == "h2" else {
                return .failed("TLS: \(host) did not negotiate HTTP/2 via ALPN (selected: \(alpn.isEmpty ? "none" : alpn))")
            }
            return .done
        }
        let err = SSL_get_error(ssl, rc)
        if err == SSL_ERROR_WANT_READ { return .wantRead }
        if err == SSL_ERROR_WANT_WRITE { return .wantWrite }
        var message = opensslErrors()
        let verify = SSL_get_verify_result(ssl)
        if verify != X509_V_OK {
            message += " (certificate: \(String(cString: X509_verify_cert_error_string(verify))))"
        }
        if message.isEmpty { message = err == SSL_ERROR_SYSCALL ? "connection closed during handshake (\(String(cString: strerror(errno))))" : "error \(err)" }
        return .failed("TLS handshake with \(host) failed: SSL \(message)")
    }

    func read(_ buffer: UnsafeMutableRawPointer, _ capacity: Int) -> IOResult {
        ERR_clear_error()
        let n = SSL_read(ssl, buffer, Int32(capacity))
        if n > 0 { return .bytes(Int(n)) }
        return ioError(n)
    }

    func write(_ buffer: UnsafeRawPointer, _ count: Int) -> IOResult {
        ERR_clear_error()
        let n = SSL_write(ssl, buffer, Int32(min(count, 1 << 30)))
        if n > 0 { return .bytes(Int(n)) }
        return ioError(n)
    }

    private func ioError(_ rc: Int32) -> IOResult {
        switch SSL_get_error(ssl, rc) {
        case SSL_ERROR_WANT_READ: return .wouldBlock(wantWrite: false)
        case SSL_ERROR_WANT_WRITE: return .wouldBlock(wantWrite: true)
        case SSL_ERROR_ZERO_RETURN: return .closed
        case SSL_ERROR_SYSCALL:
            let e = errno
            let detail = opensslErrors()
            if detail.isEmpty && (e == 0 || e == ECONNRESET) { return e == 0 ? .closed : .failed("connection reset by peer") }
            return .failed("TLS: \(detail.isEmpty ? String(cString: strerror(e)) : detail)")
        default: return .failed("TLS: \(opensslErrors())")
        }
    }

    /// Best effort close_notify; never waits.
    func shutdown() {
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
    }
}
