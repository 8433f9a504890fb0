// The only file in PushClient that touches nghttp2: one client session per HTTP/2 connection,
// driven with mem_recv/mem_send so nghttp2 never touches the socket (the connection moves the
// bytes through TLS or the plain socket). Callbacks never call back into the slot: they record
// what happened (finished streams, SETTINGS, PING ACK, GOAWAY) on the session, and the
// connection reads those after each `receive`, so nothing re-enters nghttp2 from a callback.
// The session itself, header blocks and the body copy are NGHTTP2Support's, shared with HTTPServer.
internal import CNghttp2
internal import NGHTTP2Support
import Glibc

/// One request stream: the push it carries and what came back. Slot-thread only.
final class ClientStream {
    let push: PendingPush
    let tokenGeneration: Int?
    var id: Int32 = 0
    /// Body bytes handed to nghttp2 (may not have reached the socket yet: counting them as
    /// written is the safe side, it only ever forbids a retry).
    var bodyBytesSent = 0
    var headersSent = false
    var status = 0
    var apnsID: String?
    var uniqueID: String?
    var responseBody: [UInt8] = []
    /// END_STREAM received from the server: the response is complete.
    var responseComplete = false
    /// How the stream ended (nghttp2 error code; 0 = NO_ERROR), set once.
    var closeCode: UInt32?
    /// HEADERS never left: nghttp2 refused to start the stream (after GOAWAY).
    var neverSent = false
    /// The push was completed (or handed back for a retry): later events are ignored.
    var done = false

    init(push: PendingPush, tokenGeneration: Int?) {
        self.push = push
        self.tokenGeneration = tokenGeneration
    }

    /// The server said the stream was not processed (RFC 9113 8.7): safe to send again.
    var refused: Bool { neverSent || closeCode == UInt32(NGHTTP2_REFUSED_STREAM.rawValue) }
}

/// What a request looks like apart from its body (already in the stream's push).
struct RequestHead {
    var path: String
    var fields: [(name: StaticString, value: String)]
}

private func sessionFrom(_ userData: UnsafeMutableRawPointer?) -> H2ClientSession {
    Unmanaged<H2ClientSession>.fromOpaque(userData!).takeUnretainedValue()
}

private func streamFrom(_ session: OpaquePointer?, _ id: Int32) -> ClientStream? {
    guard let p = nghttp2_session_get_stream_user_data(session, id) else { return nil }
    return Unmanaged<ClientStream>.fromOpaque(p).takeUnretainedValue()
}

private func bytesEqual(_ b: UnsafeBufferPointer<UInt8>, _ s: StaticString) -> Bool {
    guard b.count == s.utf8CodeUnitCount else { return false }
    return memcmp(b.baseAddress!, s.utf8Start, b.count) == 0
}

private func isAPNsID(_ name: StaticString) -> Bool {
    bytesEqual(UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount), "apns-id")
}

/// Callbacks, built once (capture-free closures; the session arrives as user_data).
/// nonisolated(unsafe): initialised once (Swift globals are initialised thread-safely) and only
/// read afterwards; nghttp2_session_client_new copies the callbacks.
nonisolated(unsafe) private let sharedCallbacks: OpaquePointer = makeCallbacks { cbs in
    nghttp2_session_callbacks_set_on_header_callback(cbs) { session, frame, name, namelen, value, valuelen, _, _ in
        guard let frame, let name, let value, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
              let st = streamFrom(session, frame.pointee.hd.stream_id) else { return 0 }
        let n = UnsafeBufferPointer(start: name, count: namelen)
        let v = UnsafeBufferPointer(start: value, count: valuelen)
        if bytesEqual(n, ":status") {
            var status = 0
            for b in v where b >= 0x30 && b <= 0x39 && status < 1000 { status = status * 10 + Int(b - 0x30) }
            // 1xx are interim: only the final status counts.
            if status >= 200 { st.status = status }
        } else if bytesEqual(n, "apns-id") {
            // Usually the id we sent: reuse that String instead of allocating a new one.
            let sent = st.push.apnsID
            var sentBytes = sent
            let same = sentBytes.withUTF8 { $0.count == v.count && memcmp($0.baseAddress!, v.baseAddress!, v.count) == 0 }
            st.apnsID = same ? sent : String(decoding: v, as: UTF8.self)
        } else if bytesEqual(n, "apns-unique-id") {
            st.uniqueID = String(decoding: v, as: UTF8.self)
        }
        return 0
    }
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs) { session, _, streamID, data, len, _ in
        guard let data, let st = streamFrom(session, streamID) else { return 0 }
        // APNs error bodies are tiny; cap what a misbehaving server can make us buffer.
        if st.responseBody.count < 65536 {
            st.responseBody.append(contentsOf: UnsafeBufferPointer(start: data, count: min(len, 65536)))
        }
        return 0
    }
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs) { session, frame, userData in
        guard let frame else { return 0 }
        let s = sessionFrom(userData)
        let hd = frame.pointee.hd
        switch UInt32(hd.type) {
        case NGHTTP2_SETTINGS.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 { s.settingsReceived = true }
        case NGHTTP2_PING.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0 { s.pingAcks += 1 }
        case NGHTTP2_GOAWAY.rawValue:
            let g = frame.pointee.goaway
            var debug = ""
            if let d = g.opaque_data, g.opaque_data_len > 0 {
                debug = String(decoding: UnsafeBufferPointer(start: d, count: min(g.opaque_data_len, 512)), as: UTF8.self)
            }
            s.goAway = (g.last_stream_id, g.error_code, debug)
        case NGHTTP2_HEADERS.rawValue, NGHTTP2_DATA.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0, let st = streamFrom(session, hd.stream_id) {
                st.responseComplete = true
            }
        default: break
        }
        return 0
    }
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs) { session, frame, _ in
        guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
              let st = streamFrom(session, frame.pointee.hd.stream_id) else { return 0 }
        st.headersSent = true
        return 0
    }
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs) { _, frame, _, userData in
        // A request whose HEADERS nghttp2 refused to send (GOAWAY received meanwhile): the
        // stream was never opened, so no close callback follows.
        guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
        sessionFrom(userData).notSent(frame.pointee.hd.stream_id)
        return 0
    }
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs) { _, streamID, errorCode, userData in
        sessionFrom(userData).closed(streamID, errorCode)
        return 0
    }
}

/// One connection's HTTP/2 client session. Slot-thread only; owned by its `H2Connection`.
final class H2ClientSession {
    private let session: NGHTTP2Session
    /// Owns the submitted streams; nghttp2's stream user data points at the same objects.
    private(set) var streams: [Int32: ClientStream] = [:]
    /// Streams that ended since the caller last took them.
    var finished: [ClientStream] = []
    fileprivate(set) var settingsReceived = false
    fileprivate(set) var pingAcks = 0
    fileprivate(set) var goAway: (lastStreamID: Int32, errorCode: UInt32, debug: String)?

    init() throws {
        // We answer nothing but PING ACKs and SETTINGS ACKs, which nghttp2 sends itself.
        session = try NGHTTP2Session(.client, callbacks: sharedCallbacks, userData: nil)
        session.setUserData(Unmanaged.passUnretained(self).toOpaque())
        // Server push off; our window sizes stay at the defaults (responses are tiny).
        try session.submitSettings([(NGHTTP2_SETTINGS_ENABLE_PUSH, 0)])
    }

    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS (meaningful once `settingsReceived`).
    var remoteMaxConcurrentStreams: Int { Int(session.remoteSetting(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)) }

    /// False once the session is finished (GOAWAY exchanged and no stream left, or fatal error).
    var wantsIO: Bool { session.wantsIO }

    var wantsWrite: Bool { session.wantsWrite }

    func receive(_ bytes: UnsafeRawBufferPointer) throws {
        let rc = session.receive(bytes)
        if rc < 0 { throw NGHTTP2Error("HTTP/2", rc) }
    }

    /// Appends frames nghttp2 has ready to `out` until it has nothing more or `out` holds `limit`.
    func produce(into out: inout [UInt8], limit: Int) throws {
        try session.send(into: &out, limit: limit)
    }

    /// Queues a POST with `head` (pseudo-headers first) and the push's body. nghttp2 copies the
    /// header block during this call; the body is read from the stream by the data provider.
    func submit(_ st: ClientStream, scheme: String, authority: String, head: RequestHead) throws {
        var total = scheme.utf8.count + authority.utf8.count + head.path.utf8.count + 4
        for (_, v) in head.fields { total += v.utf8.count }
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: nil),
            read_callback: { session, streamID, buf, length, flags, _, _ in
                guard let buf, let flags, let st = streamFrom(session, streamID) else {
                    return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
                }
                let n = copyBody(st.push.body, from: st.bodyBytesSent, into: buf, length: length, flags: flags)
                st.bodyBytesSent += n
                return n
            })
        let session = self.session.handle
        let id = withHeaderBlock(bytes: total, fields: 4 + head.fields.count) { block in
            block.append(":method", "POST")
            block.append(":scheme", scheme)
            block.append(":authority", authority)
            block.append(":path", head.path)
            // apns-id differs on every request: indexing it would evict the entries that do
            // repeat (authorization, topic, path) and make both sides re-encode them.
            for (n, v) in head.fields { block.append(n, v, neverIndex: isAPNsID(n)) }
            return nghttp2_submit_request(session, nil, block.nva, block.count, &provider, Unmanaged.passUnretained(st).toOpaque())
        }
        guard id > 0 else { throw NGHTTP2Error("cannot submit request", Int(id)) }
        st.id = id
        streams[id] = st
    }

    /// RST_STREAM(CANCEL): we gave up on the stream (its push timed out). It can only fail for
    /// a stream nghttp2 already closed, which needs no reset.
    func cancel(_ st: ClientStream) { session.resetStream(st.id, NGHTTP2_CANCEL) }

    /// Queues a PING; nil on success, else nghttp2's message (out of memory only).
    func ping() -> String? { session.ping() }

    /// GOAWAY(NO_ERROR) before we close a connection that has no stream left (best effort: the
    /// socket closes right after either way).
    func terminate() { session.terminate() }

    /// Takes every stream still open (the connection is gone); none of them will close normally.
    func abandonAll() -> [ClientStream] {
        let all = Array(streams.values)
        streams.removeAll()
        return all
    }

    fileprivate func closed(_ id: Int32, _ code: UInt32) {
        guard let st = streams.removeValue(forKey: id) else { return }
        st.closeCode = code
        finished.append(st)
    }

    fileprivate func notSent(_ id: Int32) {
        guard let st = streams.removeValue(forKey: id) else { return }
        st.neverSent = true
        finished.append(st)
    }

    /// Name of an HTTP/2 error code for messages ("REFUSED_STREAM").
    static func errorName(_ code: UInt32) -> String { errorCodeName(code) }
}
