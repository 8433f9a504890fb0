// The nghttp2 wrapper: one server session per HTTP/2 connection, driven with mem_recv/mem_send
// so nghttp2 never touches the socket. Requests are assembled per stream and handed to the
// connection's handler; responses go out through a data provider reading the stream's body.
// nghttp2 types stay in this file; the session itself, header blocks and the body copy are
// NGHTTP2Support's, shared with PushClient.
internal import CNghttp2
internal import NGHTTP2Support

/// A request stream being received, then answered.
final class H2Stream {
    let id: Int32
    /// Loop time of its first HEADERS frame: the request must be complete (END_STREAM) within
    /// headerTimeout + bodyTimeout of it, or the stream is reset (H2Session.resetExpiredStreams).
    let openedAt: UInt64
    /// Until END_STREAM arrives, or the stream is closed or reset.
    var receiving = true
    var method = ""
    var path = ""
    var authority: String?
    var headers: [HTTPField] = []
    var headerBytes = 0
    var body: [UInt8] = []
    /// Header and body bytes of this stream counted in its session's `bufferedBytes`.
    var held = 0
    /// Refused (too large): further data is dropped and the handler is never called.
    var rejected = false
    var dispatched = false
    var responded = false
    var responseBody: [UInt8] = []
    var responseOffset = 0

    init(id: Int32, openedAt: UInt64) {
        self.id = id
        self.openedAt = openedAt
    }
}

private func sessionFrom(_ userData: UnsafeMutableRawPointer?) -> H2Session {
    Unmanaged<H2Session>.fromOpaque(userData!).takeUnretainedValue()
}

/// nghttp2 callbacks, built once (capture-free closures; the session arrives as user_data).
/// nonisolated(unsafe): initialised once (Swift globals are initialised thread-safely) and only
/// read afterwards; nghttp2_session_server_new copies the callbacks.
nonisolated(unsafe) private let sharedCallbacks: OpaquePointer = makeCallbacks { cbs in
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs) { _, frame, userData in
        guard let frame else { return 0 }
        if frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue)
            && frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST {
            sessionFrom(userData).open(frame.pointee.hd.stream_id)
        }
        return 0
    }
    nghttp2_session_callbacks_set_on_header_callback(cbs) { _, frame, name, namelen, value, valuelen, _, userData in
        guard let frame, let name, let value else { return 0 }
        let s = sessionFrom(userData)
        guard let st = s.stream(frame.pointee.hd.stream_id) else { return 0 }
        // A second HEADERS frame on a request stream is its trailer section (nghttp2 refuses
        // any other shape): counted against the header limits, never merged into the headers.
        let isTrailer = frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue)
            && frame.pointee.headers.cat != NGHTTP2_HCAT_REQUEST
        return s.onHeader(st, UnsafeBufferPointer(start: name, count: namelen),
                          UnsafeBufferPointer(start: value, count: valuelen), isTrailer: isTrailer)
    }
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs) { _, _, streamID, data, len, userData in
        guard let data else { return 0 }
        let s = sessionFrom(userData)
        guard let st = s.stream(streamID), !st.rejected else { return 0 }
        s.onData(st, UnsafeBufferPointer(start: data, count: len))
        return 0
    }
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs) { _, frame, userData in
        guard let frame else { return 0 }
        let type = frame.pointee.hd.type
        let endStream = (frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue)) != 0
        if endStream && (type == UInt8(NGHTTP2_HEADERS.rawValue) || type == UInt8(NGHTTP2_DATA.rawValue)) {
            let s = sessionFrom(userData)
            if let st = s.stream(frame.pointee.hd.stream_id) {
                st.receiving = false
                s.dispatch(st)
            }
        }
        return 0
    }
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs) { _, streamID, _, userData in
        sessionFrom(userData).closed(streamID)
        return 0
    }
}

/// Session options (nghttp2_session_server_new2 copies them). The incoming RST_STREAM rate
/// limit is set explicitly rather than left to the library's default (burst 1000, 33/s): a
/// stream reset right after its request costs the server a handler call while the client pays
/// one frame (CVE-2023-44487, "rapid reset"). The call is in nghttp2 1.57, and in Debian 12's
/// 1.52.0-1+deb12u1 and later as a backport.
private func configureOptions(_ option: OpaquePointer, _ settings: HTTP2Settings) {
    nghttp2_option_set_stream_reset_rate_limit(option, settings.streamResetBurst, settings.streamResetRate)
    // CONTINUATION frames after one HEADERS frame (CVE-2024-28182); the library's default, named.
    nghttp2_option_set_max_continuations(option, 8)
}

/// "100" ... "599", built once.
private let statusCodeStrings: [String] = (0..<600).map { String($0) }

/// One connection's HTTP/2 session. Loop-thread only; owned by its `ServerConnection`.
final class H2Session {
    /// unowned(unsafe): the connection owns this session and drops it before it goes away.
    unowned(unsafe) let connection: ServerConnection
    private let session: NGHTTP2Session
    /// Owns the open streams; nghttp2's stream user data points at the same objects
    /// (unretained) so per-frame lookups skip hashing.
    private var streams: [Int32: H2Stream] = [:]
    private var goAwaySent = false
    /// GOAWAY decided but not yet handed to nghttp2: submitted by `pump`, after the read that
    /// led to it was fully processed (see `submitGoAway`).
    private var goAwayPending: Int32?
    private let maxHeaderListSize: Int
    /// Streams still receiving their request, in the order they opened, so by deadline. Those
    /// that stopped receiving are dropped lazily from the front (receiveDeadline).
    private var receivingQueue: [H2Stream] = []
    private var receivingHead = 0
    /// Header and body bytes held by streams not yet handed to the handler, and their cap:
    /// without it a client could park maxConcurrentStreams half-sent requests of up to
    /// maxHeaderListSize + maxBodyBytes each on one connection (100 x 48 KiB on relay-server),
    /// where HTTP/1 holds at most one.
    private(set) var bufferedBytes = 0
    /// Streams handed to the handler and not answered yet: while there are none, open streams
    /// only wait on the peer (its flow-control window, or its end of a stream), which the idle
    /// timeout covers; a client that opened no window used to hold the connection for ever.
    private(set) var handlersWorking = 0
    private let maxBufferedBytes: Int
    /// Cap on `handlersWorking`: beyond it new requests are refused (REFUSED_STREAM). Open
    /// streams are capped by SETTINGS_MAX_CONCURRENT_STREAMS, but a stream the client resets
    /// after sending its request closes at once while its handler goes on working.
    private let maxUnansweredRequests: Int

    /// When a stream last opened or closed: the idle timeout counts from here, so PING,
    /// SETTINGS or WINDOW_UPDATE frames alone do not keep a connection (as Go's http2 server:
    /// "PING frames are not considered activity for the purposes of IdleTimeout").
    private(set) var lastStreamActivity: UInt64

    init(connection: ServerConnection, settings: HTTP2Settings) throws {
        self.connection = connection
        self.lastStreamActivity = connection.loop.now
        self.maxHeaderListSize = Int(settings.maxHeaderListSize)
        self.maxBufferedBytes = max(2 * connection.core.maxBodyBytes, 64 << 10)
        self.maxUnansweredRequests = max(1, settings.maxUnansweredRequests)
        do throws(NGHTTP2Error) {
            session = try NGHTTP2Session(.server, callbacks: sharedCallbacks, userData: nil) { configureOptions($0, settings) }
            session.setUserData(Unmanaged.passUnretained(self).toOpaque())
            try session.submitSettings([
                (NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, settings.maxConcurrentStreams),
                (NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, settings.initialWindowSize),
                (NGHTTP2_SETTINGS_MAX_FRAME_SIZE, settings.maxFrameSize),
                (NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, settings.maxHeaderListSize),
            ])
            // The connection-level window is not a SETTING: raise it to match the stream window so
            // large uploads are not throttled to 64 KiB per round trip.
            if settings.initialWindowSize > 65535 { try session.setLocalWindowSize(Int32(clamping: settings.initialWindowSize)) }
        } catch {
            throw HTTPServerError.http2(error.description)
        }
    }

    var openStreams: Int { streams.count }

    fileprivate func open(_ id: Int32) {
        let st = H2Stream(id: id, openedAt: connection.loop.now)
        lastStreamActivity = st.openedAt
        st.headers.reserveCapacity(8)
        streams[id] = st
        receivingQueue.append(st)
        session.setStreamUserData(id, Unmanaged.passUnretained(st).toOpaque())
    }

    fileprivate func stream(_ id: Int32) -> H2Stream? {
        guard let p = nghttp2_session_get_stream_user_data(session.handle, id) else { return nil }
        return Unmanaged<H2Stream>.fromOpaque(p).takeUnretainedValue()
    }

    fileprivate func closed(_ id: Int32) {
        guard let st = streams.removeValue(forKey: id) else { return }
        lastStreamActivity = connection.loop.now
        st.receiving = false
        // Reset by the client: its answer will be dropped, but its handler still counts in
        // handlersWorking until it answers (handlerAnswered).
        if st.dispatched { st.responded = true }
        dropBody(st)
    }

    /// Frees a stream's partial request (refused, reset, closed or handed to the handler).
    private func dropBody(_ st: H2Stream) {
        bufferedBytes -= st.held
        st.held = 0
        st.body = []
        st.headers = []
    }

    /// Refuses a stream that would take the connection's buffered requests past their cap
    /// (REFUSED_STREAM: not processed, a client may retry it) rather than buffer more.
    private func refuseOverBudget(_ st: H2Stream) {
        st.rejected = true
        dropBody(st)
        connection.core.recordParseError("h2_buffered_body_limit")
        session.resetStream(st.id, NGHTTP2_REFUSED_STREAM)
    }

    /// When the oldest stream still receiving its request runs out of time (nil: none is).
    /// Without it a client could hold streams half-sent for ever, each with up to maxBodyBytes
    /// buffered, since no other timeout runs while a stream is open.
    func receiveDeadline(timeoutMs: UInt64) -> UInt64? {
        while receivingHead < receivingQueue.count, !receivingQueue[receivingHead].receiving { receivingHead += 1 }
        if receivingHead == receivingQueue.count {
            if receivingHead > 0 {
                receivingQueue.removeAll(keepingCapacity: true)
                receivingHead = 0
            }
            return nil
        }
        if receivingHead >= 64 {
            receivingQueue.removeFirst(receivingHead)
            receivingHead = 0
        }
        return receivingQueue[receivingHead].openedAt + timeoutMs
    }

    /// Resets (RST_STREAM CANCEL) every stream whose request is not complete by `now`, dropping
    /// what it buffered; the handler never sees them. Returns how many.
    func resetExpiredStreams(now: UInt64, timeoutMs: UInt64) -> Int {
        var count = 0
        while receivingHead < receivingQueue.count {
            let st = receivingQueue[receivingHead]
            if st.receiving {
                guard st.openedAt + timeoutMs <= now else { break }
                st.receiving = false
                st.rejected = true
                dropBody(st)
                session.resetStream(st.id, NGHTTP2_CANCEL)
                count += 1
            }
            receivingHead += 1
        }
        return count
    }

    /// False once the session is finished (GOAWAY exchanged and no stream left, or a fatal error).
    var wantsIO: Bool { session.wantsIO }

    func receive(_ bytes: UnsafeRawBufferPointer) {
        if session.receive(bytes) < 0 {
            // Protocol error: nghttp2 queued a GOAWAY; send it, then close.
            connection.state.closeAfterFlush()
        }
    }

    /// Moves every frame nghttp2 has ready into the connection's output buffer.
    func pump() {
        if let requested = goAwayPending {
            goAwayPending = nil
            session.goAway(lastStreamID: max(requested, session.lastProcessedStreamID))
        }
        do throws(NGHTTP2Error) { try session.send(into: &connection.out) } catch { connection.state.closeAfterFlush() }
    }

    // MARK: Receiving

    fileprivate func onHeader(_ st: H2Stream, _ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>,
                              isTrailer: Bool) -> Int32 {
        st.headerBytes += name.count + value.count + 32
        let core = connection.core
        if st.headerBytes > maxHeaderListSize || st.headerBytes > core.maxHeaderBytes + 32 * core.maxHeaderCount
            || st.headers.count >= core.maxHeaderCount {
            connection.core.recordParseError("h2_header_too_large")
            st.rejected = true
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue   // RST_STREAM for this stream only
        }
        // RFC 9110 6.5.1: a trailer never stands in for a header (HTTP/1.1 drops them too).
        if isTrailer || st.rejected { return 0 }
        let added = name.count + value.count + 32
        if bufferedBytes + added > maxBufferedBytes {
            refuseOverBudget(st)
            return 0
        }
        bufferedBytes += added
        st.held += added
        if name.first == UInt8(ascii: ":") {
            // nghttp2 already checked the pseudo-header names: the second byte tells them apart.
            switch name.count > 1 ? name[1] : 0 {
            case UInt8(ascii: "m"): st.method = String(decoding: value, as: UTF8.self)
            case UInt8(ascii: "p") where name.count == 5: st.path = String(decoding: value, as: UTF8.self)
            case UInt8(ascii: "a"): st.authority = String(decoding: value, as: UTF8.self)
            default: break   // :scheme (validated by nghttp2), :protocol
            }
        } else {
            st.headers.append(HTTPField(name: String(decoding: name, as: UTF8.self), value: String(decoding: value, as: UTF8.self)))
        }
        return 0
    }

    fileprivate func onData(_ st: H2Stream, _ data: UnsafeBufferPointer<UInt8>) {
        if st.body.count + data.count > connection.core.maxBodyBytes {
            st.rejected = true
            dropBody(st)
            connection.core.recordParseError("h2_body_too_large")
            respond(streamID: st.id, response: connection.core.errorResponse(413, "body_too_large"), isHEAD: false, action: .keep)
            return
        }
        if bufferedBytes + data.count > maxBufferedBytes {
            refuseOverBudget(st)
            return
        }
        st.body.append(contentsOf: data)
        bufferedBytes += data.count
        st.held += data.count
    }

    fileprivate func dispatch(_ st: H2Stream) {
        guard !st.rejected, !st.dispatched else { return }
        if connection.goAwayAtStart {
            // HTTPAdmission.goAwayAtStart: a request that raced the GOAWAY is not processed.
            st.rejected = true
            dropBody(st)
            session.resetStream(st.id, NGHTTP2_REFUSED_STREAM)
            return
        }
        if handlersWorking >= maxUnansweredRequests {
            st.rejected = true
            dropBody(st)
            connection.core.recordParseError("h2_unanswered_limit")
            session.resetStream(st.id, NGHTTP2_REFUSED_STREAM)
            return
        }
        st.dispatched = true
        handlersWorking += 1
        if let a = st.authority, !st.headers.contains(where: { $0.name == "host" }) {
            st.headers.append(HTTPField(name: "host", value: a))   // nghttp2 validated the value
        }
        let headers = HTTPHeaders(lowercasedFields: st.headers)
        st.headers = []
        let req = HTTPRequest(method: st.method, target: st.path, version: .http2, headers: headers,
                              body: st.body, remoteAddress: connection.remoteAddress, tls: connection.tlsInfo,
                              connectionID: connection.id, streamID: st.id, clientKey: connection.clientKey)
        dropBody(st)
        let writer = HTTPReplyWriter(connection: connection, sequence: 0, streamID: st.id,
                                      isHEAD: st.method == "HEAD")
        connection.core.handler(req, writer)
    }

    // MARK: Sending

    /// A handler's answer (from its writer): it stops counting in `handlersWorking` even
    /// when its stream is gone, then goes out if the stream is still open.
    func handlerAnswered(streamID: Int32, response: HTTPReply, isHEAD: Bool, action: ConnectionAction) {
        handlersWorking -= 1
        respond(streamID: streamID, response: response, isHEAD: isHEAD, action: action)
    }

    func respond(streamID: Int32, response: HTTPReply, isHEAD: Bool, action: ConnectionAction) {
        guard let st = stream(streamID), !st.responded else { return }
        st.responded = true
        let r = connection.core.safeResponse(response)
        connection.core.recordStatus(r.status)

        let bodyless = r.status < 200 || r.status == 204 || r.status == 304
        let sendBody = !bodyless && !isHEAD && !r.body.isEmpty
        st.responseBody = sendBody ? r.body : []
        st.responseOffset = 0

        // nghttp2 copies names and values during submit: size one block for the copied ones
        // (the handler's fields, content-length's and date's values), then fill it.
        var hasDate = false
        var total = 3
        var fields = 1
        for h in r.headers {
            switch classifyResponseHeader(h.name) {
            case .framing: continue   // connection-specific: forbidden in HTTP/2; length is ours
            case .date: hasDate = true
            case .server, .none: break
            }
            total += h.name.utf8.count + h.value.utf8.count
            fields += 1
        }
        let lengthText = bodyless ? "" : String(r.body.count)
        if !bodyless { total += lengthText.utf8.count; fields += 1 }
        let date = hasDate ? "" : connection.loop.dateValue
        if !hasDate { total += date.utf8.count; fields += 1 }

        let session = self.session.handle
        let rc = withHeaderBlock(bytes: total, fields: fields) { block in
            block.append(":status", statusCodeStrings[r.status])
            for h in r.headers where classifyResponseHeader(h.name) != .framing { block.append(copyingName: h.name, h.value) }
            if !bodyless { block.append("content-length", lengthText) }
            if !hasDate { block.append("date", date) }
            guard sendBody else { return nghttp2_submit_response(session, streamID, block.nva, block.count, nil) }
            var provider = nghttp2_data_provider(
                source: nghttp2_data_source(ptr: nil),
                read_callback: { _, streamID, buf, length, flags, _, userData in
                    let s = sessionFrom(userData)
                    guard let st = s.stream(streamID), let buf, let flags else {
                        return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
                    }
                    let n = copyBody(st.responseBody, from: st.responseOffset, into: buf, length: length, flags: flags)
                    st.responseOffset += n
                    if st.responseOffset == st.responseBody.count {
                        st.responseBody = []
                        st.responseOffset = 0
                    }
                    return n
                })
            return nghttp2_submit_response(session, streamID, block.nva, block.count, &provider)
        }
        if rc != 0 { self.session.resetStream(streamID, NGHTTP2_INTERNAL_ERROR) }
        if action == .goAway {
            submitGoAway(lastStreamID: streamID)
        }
    }

    /// GOAWAY(NO_ERROR). The last stream is never below the last stream nghttp2 handed us: a
    /// stream the handler already received may be answered (and acted on), and a client retries
    /// every stream above the announced id as unprocessed, so announcing less would make it send
    /// those requests twice. nghttp2 ignores streams opened after this frame is sent, but a
    /// handler answering synchronously decides while nghttp2 is still parsing the same read:
    /// streams later in that read are still handed to the handler (and answered). So the frame
    /// is submitted by the next `pump`, after the read, naming every stream received by then.
    func submitGoAway(lastStreamID: Int32? = nil) {
        guard !goAwaySent else { return }
        goAwaySent = true
        goAwayPending = lastStreamID ?? 0
    }

    func submitMaxConcurrentStreams(_ n: UInt32) {
        _ = try? session.submitSettings([(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, n)])
    }
}
