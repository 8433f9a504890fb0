// What HTTPServer's server sessions and PushClient's client sessions do alike with nghttp2: own
// the session, feed it bytes and take its frames (mem_recv/mem_send, so nghttp2 never touches a
// socket), submit SETTINGS, RST_STREAM, PING and GOAWAY, and name its errors. The callbacks and
// what a stream holds differ per side and stay in each module.
package import CNghttp2

/// An nghttp2 failure, in nghttp2's words.
package struct NGHTTP2Error: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
    /// "what: nghttp2's message for rc".
    package init(_ what: String, _ rc: Int) { description = "\(what): \(errorText(rc))" }
}

/// nghttp2's text for a library return code (NGHTTP2_ERR_*).
package func errorText(_ rc: Int) -> String { String(cString: nghttp2_strerror(Int32(truncatingIfNeeded: rc))) }

/// The name of an HTTP/2 error code ("REFUSED_STREAM").
package func errorCodeName(_ code: UInt32) -> String { String(cString: nghttp2_http2_strerror(code)) }

/// A callbacks table filled by `configure`, for sessions to copy: built once per side.
package func makeCallbacks(_ configure: (OpaquePointer) -> Void) -> OpaquePointer {
    var callbacks: OpaquePointer?
    precondition(nghttp2_session_callbacks_new(&callbacks) == 0 && callbacks != nil, "nghttp2_session_callbacks_new: out of memory")
    configure(callbacks!)
    return callbacks!
}

/// Owns one nghttp2_session; one thread at a time (the connection's).
package final class NGHTTP2Session {
    package enum Role { case client, server }

    package let handle: OpaquePointer

    /// `userData` arrives in every callback; `configureOptions` sets session options (the
    /// option object lives only for this call: nghttp2 copies it).
    package init(_ role: Role, callbacks: OpaquePointer, userData: UnsafeMutableRawPointer?,
                 configureOptions: (OpaquePointer) -> Void = { _ in }) throws(NGHTTP2Error) {
        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { throw NGHTTP2Error("nghttp2_option_new: out of memory") }
        defer { nghttp2_option_del(option) }
        configureOptions(option)
        var session: OpaquePointer?
        let rc = role == .client
            ? nghttp2_session_client_new2(&session, callbacks, userData, option)
            : nghttp2_session_server_new2(&session, callbacks, userData, option)
        guard rc == 0, let session else {
            throw NGHTTP2Error(role == .client ? "nghttp2_session_client_new" : "nghttp2_session_server_new", Int(rc))
        }
        handle = session
    }

    deinit { nghttp2_session_del(handle) }

    /// What callbacks receive as user_data, when it cannot be given at creation.
    package func setUserData(_ data: UnsafeMutableRawPointer?) { nghttp2_session_set_user_data(handle, data) }

    /// False once the session is finished (GOAWAY exchanged and no stream left, or a fatal error).
    package var wantsIO: Bool { nghttp2_session_want_read(handle) != 0 || nghttp2_session_want_write(handle) != 0 }
    package var wantsWrite: Bool { nghttp2_session_want_write(handle) != 0 }

    /// Hands received bytes to nghttp2 (callbacks run inside). Negative: a fatal protocol error,
    /// after which nghttp2 has queued a GOAWAY.
    package func receive(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return 0 }
        return nghttp2_session_mem_recv(handle, base.assumingMemoryBound(to: UInt8.self), bytes.count)
    }

    /// Appends the frames nghttp2 has ready to `out`, until it has none or `out` holds `limit`.
    package func send(into out: inout [UInt8], limit: Int = .max) throws(NGHTTP2Error) {
        while out.count < limit {
            var data: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(handle, &data)
            if n < 0 { throw NGHTTP2Error("HTTP/2", n) }
            if n == 0 { return }
            out.append(contentsOf: UnsafeBufferPointer(start: data!, count: n))
        }
    }

    /// Queues one SETTINGS frame with `entries` (id, value).
    package func submitSettings(_ entries: [(nghttp2_settings_id, UInt32)]) throws(NGHTTP2Error) {
        var iv = entries.map { nghttp2_settings_entry(settings_id: Int32($0.0.rawValue), value: $0.1) }
        let rc = nghttp2_submit_settings(handle, UInt8(NGHTTP2_FLAG_NONE.rawValue), &iv, iv.count)
        guard rc == 0 else { throw NGHTTP2Error("SETTINGS", Int(rc)) }
    }

    /// RST_STREAM; it can only fail for a stream nghttp2 already closed, which needs no reset.
    package func resetStream(_ id: Int32, _ code: nghttp2_error_code) {
        _ = nghttp2_submit_rst_stream(handle, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code.rawValue)
    }

    /// Queues a PING; nil on success, else nghttp2's message (out of memory only).
    package func ping() -> String? {
        let rc = nghttp2_submit_ping(handle, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        return rc == 0 ? nil : "cannot send PING: \(errorText(Int(rc)))"
    }

    /// GOAWAY(NO_ERROR) naming `lastStreamID`, best effort.
    package func goAway(lastStreamID: Int32) {
        _ = nghttp2_submit_goaway(handle, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastStreamID, NGHTTP2_NO_ERROR.rawValue, nil, 0)
    }

    /// GOAWAY(NO_ERROR) and no new streams, best effort.
    package func terminate() { _ = nghttp2_session_terminate_session(handle, NGHTTP2_NO_ERROR.rawValue) }

    /// The highest stream id nghttp2 handed to the callbacks.
    package var lastProcessedStreamID: Int32 { nghttp2_session_get_last_proc_stream_id(handle) }

    package func remoteSetting(_ id: nghttp2_settings_id) -> UInt32 { nghttp2_session_get_remote_settings(handle, id) }

    package func setStreamUserData(_ id: Int32, _ data: UnsafeMutableRawPointer?) {
        _ = nghttp2_session_set_stream_user_data(handle, id, data)
    }

    /// The connection-level receive window (not a SETTING).
    package func setLocalWindowSize(_ size: Int32) throws(NGHTTP2Error) {
        let rc = nghttp2_session_set_local_window_size(handle, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, size)
        guard rc == 0 else { throw NGHTTP2Error("connection window", Int(rc)) }
    }
}

/// The data-provider step both sides take: copies the next part of `body` from `offset` into
/// nghttp2's buffer, sets EOF on the last part, and returns how many bytes it copied.
package func copyBody(_ body: [UInt8], from offset: Int, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
                      flags: UnsafeMutablePointer<UInt32>) -> Int {
    let n = min(length, body.count - offset)
    if n > 0 { body.withUnsafeBufferPointer { buffer.update(from: $0.baseAddress! + offset, count: n) } }
    if offset + n == body.count { flags.pointee |= UInt32(NGHTTP2_DATA_FLAG_EOF.rawValue) }
    return n
}
