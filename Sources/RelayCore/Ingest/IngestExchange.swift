// One request's way back through IngestService: what its answer and log line need, and where
// the answer goes. The ingest POST's answer is ready on the store's thread after COMMIT; it is
// handed on there as a reply source (`APIAnswer.later`), and built where the reply is written.
import FoundationEssentials

extension IngestService {
    /// A class rather than a closure so that the store's completion captures this one reference
    /// (a closure capturing a single object needs no context of its own): the closure contexts
    /// of `finish` and of the store's completion would be built and freed per ingest. Called as
    /// `finish(response, note)` for an answer known on the caller's thread.
    // @unchecked Sendable: `ingest` is set on the request's thread before the store gets the
    // request, `storeResult` by the store's completion before `respond(.later(self))`;
    // `makeReply` reads them after that hand-over, on the thread the answer was handed to (the
    // HTTP loop, through its task queue's lock). Nothing else touches them.
    final class Exchange: APIReplySource, @unchecked Sendable {
        let service: IngestService
        // The request's identity, not the request (body, credential): this lives until the
        // store answered.
        let requestID: String
        let method: String
        let path: String
        let clientKey: String
        let start: Int64
        let respond: @Sendable (APIAnswer) -> Void
        /// The stored request, kept so that it is freed where it was allocated (the HTTP loop,
        /// in `makeReply`), not on the store's thread: the store's job lets go of it before its
        /// completion runs (SQLiteOutboxStore.IngestJob).
        var ingest: IngestRequest?
        private var storeResult: Result<IngestOutcome, StoreError>?

        init(service: IngestService, request: APIRequest, start: Int64, respond: @escaping @Sendable (APIAnswer) -> Void) {
            self.service = service
            requestID = request.requestID
            method = request.method
            path = request.path
            clientKey = request.clientKey
            self.start = start
            self.respond = respond
        }

        func callAsFunction(_ response: APIReply, _ note: String?) {
            respond(.now(finished(response, note)))
        }

        /// The store's answer, on its thread: handed on unbuilt.
        func stored(_ result: Result<IngestOutcome, StoreError>) {
            storeResult = result
            respond(.later(self))
        }

        func makeReply() -> APIReply {
            guard let result = storeResult else {
                return finished(.error(ClientError(status: 500, code: "internal_error", field: nil, message: "the server could not form a valid response")), "no store result")
            }
            storeResult = nil
            let (reply, note) = service.storedReply(result, self)
            ingest = nil
            return finished(reply, note)
        }

        /// The reply with its x-request-id and content type, counted and logged.
        private func finished(_ response: APIReply, _ note: String?) -> APIReply {
            var r = response
            r.headers.reserveCapacity(r.headers.count + 2)
            r.headers.append(("x-request-id", requestID))
            if !r.headers.contains(where: { $0.0 == "content-type" }) { r.headers.append(("content-type", "application/json")) }
            let micros = monotonicMicros() - start
            service.metrics.ingest(status: r.status, seconds: method == "POST" && path == "/v1/responses" ? Double(micros) / 1e6 : nil)
            let level: RelayLogger.Level = r.status >= 500 ? .warning : .debug
            // Checked here so the field list (and its Strings) is not built for a line that is
            // dropped: at the default level every 2xx would pay for it.
            let logger = service.logger
            if level >= logger.minimum {
                if level == .debug {
                    logger.log(level, "request", ["request_id": requestID, "method": method, "path": path,
                                                  "status": r.status, "duration_us": micros, "note": note ?? ""])
                } else {
                    // A 5xx is refused load or a storage failure: it comes in storms, one line
                    // per 10 s per status and note (5xx notes are fixed strings).
                    logger.limited(level, "request", key: "request \(r.status) \(note ?? "")",
                                   ["request_id": requestID, "method": method, "path": path,
                                    "status": r.status, "duration_us": micros, "note": note ?? ""])
                }
            }
            return r
        }
    }
}
