// libFuzzer target for the ingest request path, built without SwiftPM by scripts/fuzz.sh:
//   swiftc -parse-as-library -sanitize=fuzzer,address -package-name fuzz <RelayCore ingest,
//          storage and support sources> main.swift   (file list and flags in fuzz.conf)
// Each input is one POST /v1/responses through IngestService.handle against a real SQLite
// outbox in a temp file, so the headers, the JSON reader, the validator and the store's
// checks all see it. Input layout: byte 0 = flags, then "authorization\ncontent-type\nbody".
//   flags bit 0: use the input's authorization line (else a valid credential)
//   flags bit 1: use the input's content-type line (else application/json)
//   flags bit 2: send the request twice (dedupe must answer 200 with the same id)
// Beyond "no crash, no memory error", every answer is checked:
//   1. the status is one the API documents, with a JSON object body naming the error;
//   2. it agrees with the pure validator: 2xx only for a body IngestValidation accepts and a
//      valid credential, and a validation failure is answered with exactly its status/code;
//   3. a 202 row reads back from the store with the canonical fields the validator produced
//      (a 200 names a row with the same dedupe key and sealed box, a 409 index_reused one with
//      the same key and another box);
//   4. the same request again is 200 with the same id (never a second row);
//   5. the validation fast path accepts only what the general path accepts, with the same result,
//      and the bearer hash taken from the header bytes equals the hash of the secret a plain
//      String parse finds (referenceBearerSecret).
// A violated check calls fatalError, which libFuzzer reports as a crash with the input saved.
import Foundation

private let app = "com.example.fuzz"

private final class Fixture: Sendable {
    let store: SQLiteOutboxStore
    let service: IngestService
    let secret: String
    let dbPath: String

    init() {
        dbPath = NSTemporaryDirectory() + "ingest-fuzz-\(getpid()).db"
        for suffix in ["", "-wal", "-shm"] { unlink(dbPath + suffix) }
        do {
            store = try SQLiteOutboxStore(path: dbPath, options: .init(synchronous: .normal))
            secret = try store.createCredential(name: "fuzz", apps: [app]).secret
        } catch {
            fatalError("fixture: \(error)")
        }
        var settings = IngestSettings()
        store.ingestSettings = IngestStoreSettings(configuredApps: [app])
        settings.perCredential = RateLimit(perSecond: 0, burst: 1)
        settings.perPushToken = RateLimit(perSecond: 0, burst: 1)
        // Every fuzz input comes "from" one address: a 401 budget would turn later inputs into 429s.
        settings.authFailuresPerAddress = RateLimit(perSecond: 0, burst: 1)
        service = IngestService(store: store, settings: settings, metrics: RelayMetrics(),
                                logger: RelayLogger(minimum: .error, capture: true),
                                workers: WorkerPool(name: "fuzz", threads: 1))
        let path = dbPath
        atexit_path.withLock { $0 = path }
        atexit { atexit_path.withLock { p in for s in ["", "-wal", "-shm"] { unlink(p + s) } } }
    }

    func post(headers: [String: String], body: [UInt8]) -> APIReply {
        let done = DispatchSemaphore(value: 0)
        let box = ResponseBox()
        service.handle(APIRequest(method: "POST", path: "/v1/responses", authorization: headers["authorization"],
                                  contentType: headers["content-type"], body: body, requestID: "fuzz")) {
            box.set($0.reply)
            done.signal()
        }
        if done.wait(timeout: .now() + 10) == .timedOut { fatalError("no answer within 10 s") }
        return box.get()
    }
}

import Synchronization
private let atexit_path = Mutex<String>("")

private final class ResponseBox: Sendable {
    private let value = Mutex<APIReply?>(nil)
    func set(_ r: APIReply) { value.withLock { $0 = r } }
    func get() -> APIReply { value.withLock { $0! } }
}

private let fixture = Fixture()
private let documented: Set<Int> = [200, 202, 400, 401, 403, 409, 410, 413, 415, 429, 503]

@_cdecl("LLVMFuzzerTestOneInput")
public func ingestFuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let flags = input[0]
    var rest = input[1...]
    func line() -> String {
        let end = rest.firstIndex(of: 0x0A) ?? rest.endIndex
        let s = String(decoding: rest[rest.startIndex..<end], as: UTF8.self)
        rest = end < rest.endIndex ? rest[(end + 1)...] : rest[rest.endIndex...]
        return s
    }
    let authLine = line()
    let typeLine = line()
    let body = Array(rest)
    var headers: [String: String] = [:]
    headers["authorization"] = flags & 1 != 0 ? authLine : "Bearer \(fixture.secret)"
    let contentType: String? = flags & 2 != 0 ? (typeLine.isEmpty ? nil : typeLine) : "application/json"
    if let contentType { headers["content-type"] = contentType }
    if flags & 1 != 0 && authLine.isEmpty { headers["authorization"] = nil }

    let first = fixture.post(headers: headers, body: body)
    check(first, headers: headers, contentType: contentType, body: body)
    if flags & 4 != 0 || first.status == 202 && input.count % 7 == 0 {
        let again = fixture.post(headers: headers, body: body)
        check(again, headers: headers, contentType: contentType, body: body)
        if first.status == 202 || first.status == 200 {
            guard again.status == 200, field(again, "id") == field(first, "id") else {
                fatalError("repeat of an accepted request: \(again.status) \(again.body) after \(first.body)")
            }
        }
    }
    return 0
}

private func field(_ r: APIReply, _ name: String) -> String? {
    (try? JSONSerialization.jsonObject(with: Data(r.body.utf8))) .flatMap { ($0 as? [String: Any])?[name] as? String }
}

private func check(_ r: APIReply, headers: [String: String], contentType: String?, body: [UInt8]) {
    guard documented.contains(r.status) else { fatalError("undocumented status \(r.status): \(r.body)") }
    guard let object = (try? JSONSerialization.jsonObject(with: Data(r.body.utf8))) as? [String: Any] else {
        fatalError("answer body is not a JSON object: \(r.body)")
    }
    guard r.header("x-request-id") == "fuzz" else { fatalError("x-request-id missing") }
    if r.status >= 400 {
        guard let code = object["error"] as? String, !code.isEmpty, object["message"] is String else {
            fatalError("error answer without error/message: \(r.body)")
        }
        if r.status == 401 && r.header("www-authenticate") == nil { fatalError("401 without WWW-Authenticate") }
    }
    let validated = IngestValidation.validate(contentType: contentType, body: body)
    // The one-pass fast path may only decline or agree with the general path exactly.
    if let fast = body.withUnsafeBufferPointer({ IngestValidation.fastValidate($0, limits: IngestLimits()) }),
       IngestValidation.validateInFull(body: body, limits: IngestLimits()) != .success(fast) {
        fatalError("fast path accepted \(fast), the general path answers \(IngestValidation.validateInFull(body: body, limits: IngestLimits()))")
    }
    // The header-bytes hash is the hash of the parsed secret.
    if IngestService.bearerHash(headers["authorization"]) != referenceBearerSecret(headers["authorization"]).map({ Credentials.hash(secret: $0) }) {
        fatalError("bearerHash disagrees with the reference parse for \(headers["authorization"] ?? "<none>")")
    }
    let validCredential = headers["authorization"] == "Bearer \(fixture.secret)"
    switch validated {
    case .failure(let e):
        if r.status < 300 { fatalError("accepted (\(r.status)) a body the validator refuses: \(e)") }
        if validCredential && (r.status != e.status || object["error"] as? String != e.code || object["field"] as? String != e.field) {
            fatalError("validation error \(e) answered as \(r.status) \(r.body)")
        }
    case .success(let response):
        if r.status < 300 && !validCredential {
            // Only the exact valid secret, however the header is spelled, may be accepted.
            guard let auth = headers["authorization"], auth.split(separator: " ", omittingEmptySubsequences: true).last.map(String.init) == fixture.secret else {
                fatalError("accepted with credential header \(headers["authorization"] ?? "<none>")")
            }
        }
        let reused = r.status == 409 && object["error"] as? String == "index_reused"
        guard r.status == 202 || r.status == 200 || reused else { return }
        guard let id = object["id"] as? String, UUID(uuidString: id) != nil, id == id.lowercased() else {
            fatalError("\(r.status) without a lowercase UUID id: \(r.body)")
        }
        let row: OutboxRow?
        do { row = try fixture.store.response(id: id) } catch { fatalError("store read: \(error)") }
        guard let row else { fatalError("answered id \(id) is not in the store") }
        // The dedupe key must match. A 202 stored exactly this request and a 200 names the row
        // stored with the same sealed box; a 409 index_reused names the one with another box.
        guard row.app == (response.app ?? app), row.pushToken == response.pushToken, row.sessionIdentifier == response.sessionIdentifier,
              row.keyID == response.keyID, row.messageIndex == response.messageIndex else {
            fatalError("answered id's row has another dedupe key: \(row) vs \(response)")
        }
        if (row.encryptedData == response.encryptedData) == reused {
            fatalError("\(r.status) \(r.body) for a row whose sealed box \(reused ? "is" : "is not") this request's: \(row) vs \(response)")
        }
        let token = row.pushToken.utf8
        guard token.count % 2 == 0, token.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else {
            fatalError("stored token not canonical: \(row.pushToken)")
        }
    }
}
