// How relayctl sends sealed responses to a relay, shared by `accessory send` and `send-test`: the
// advanced ratchet is persisted before a sealed message leaves, POSTs go over libcurl, and a
// transport failure, 5xx or 429 is retried with the same sealed bytes (the relay deduplicates).
import Basics
import Foundation
import HTTPClient
import Ratchet

struct ResponseSender {
    /// Who the responses claim to come from (the ingest body's addressing fields).
    struct Identity {
        var pushToken: String
        var sessionIdentifier: String
        var keyID: [UInt8]
        var app: String?
    }

    struct Outcome {
        var index: UInt32
        /// 0 when no HTTP answer arrived (transport failure on the last attempt).
        var status: Int
        var id: String?
        var state: String?
        var error: String?
        var httpVersion: String
        var attempts: Int
        /// The TLS handshake was refused in a way no retry changes (not retried).
        var tlsRefused = false
        var accepted: Bool { status == 200 || status == 202 }
    }

    let client: CurlClient
    let base: String
    let credential: String
    let retries: Int

    /// The retries option both commands take.
    static let retriesOption = OptionSpec.value("retries", "n", "Attempts per response after the first, 0...100 (default 5).", required: false)

    init(_ args: ParsedArguments, options: CurlClient.Options = .init()) throws {
        base = try Self.baseURL(args)
        credential = try Self.readCredential(try args.string("credential"))
        retries = try args.optionalInt("retries", in: 0...100) ?? 5
        client = CurlClient(options)
    }

    static func baseURL(_ args: ParsedArguments) throws -> String {
        let base = try args.string("url").trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        guard let url = URL(string: base), ["http", "https"].contains(url.scheme ?? ""), url.host != nil else {
            throw UsageError("--url: expected http(s)://host:port, got '\(base)'")
        }
        return base
    }

    static func readCredential(_ value: String) throws -> String {
        guard value.hasPrefix("@") else { return value }
        let path = String(value.dropFirst())
        guard let data = FileManager.default.contents(atPath: path) else { throw RuntimeFailure("cannot read credential file \(path)") }
        let secret = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard !secret.isEmpty else { throw RuntimeFailure("credential file \(path) is empty") }
        return secret
    }

    /// A response body as the codec encodes it (default action, the given user text).
    static func plaintext(source: String, text: String) throws -> [UInt8] {
        let body = NotificationResponseBody(notificationIdentifier: UUID().uuidString, sourceIdentifier: source,
                                            actionIdentifier: "com.apple.UNNotificationDefaultActionIdentifier", userText: text)
        do { return try body.encoded() } catch { throw UsageError("response body: \(error)") }
    }

    /// Seals `plaintext` with the ratchet's next key (`persist` must make the advanced state
    /// durable: it runs before the sealed bytes exist outside this process) and POSTs it.
    func send(_ plaintext: [UInt8], ratchet: SendingRatchet, as identity: Identity,
              persist: (SendingRatchetState) throws -> Void) throws -> Outcome {
        let (index, sealed) = try ratchet.seal(plaintext, persist: persist)
        var json: [String: Any] = [
            "pushToken": identity.pushToken, "sessionIdentifier": identity.sessionIdentifier,
            "keyID": Base64.encode(identity.keyID),
            "messageIndex": Int(index), "encryptedData": Base64.encode(sealed),
        ]
        if let app = identity.app { json["app"] = app }
        let payload = [UInt8](try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys]))
        var outcome = Outcome(index: index, status: 0, httpVersion: "", attempts: 0)
        while true {
            outcome.attempts += 1
            var delay = min(8, 0.2 * pow(2, Double(outcome.attempts - 1)))
            do {
                let reply = try client.post(base + "/v1/responses", bearer: credential, json: payload)
                let fields = Self.fields(reply)
                outcome.status = reply.status
                outcome.id = fields["id"] as? String
                outcome.state = fields["state"] as? String
                outcome.error = (fields["error"] as? String).map { e in [e, fields["field"] as? String].compactMap { $0 }.joined(separator: ": ") }
                if (300..<400).contains(reply.status) { outcome.error = "redirect to \(reply.location ?? "nowhere") not followed" }
                outcome.httpVersion = reply.httpVersion
                if reply.status == 429, let after = reply.retryAfter { delay = min(30, max(0.05, after)) }
                guard reply.status == 429 || reply.status >= 500 else { break }
            } catch {
                outcome = Outcome(index: index, status: 0, error: "\(error)", httpVersion: "", attempts: outcome.attempts,
                                  tlsRefused: error.tlsRefused)
                // A refused certificate stays refused: retrying would only repeat the handshake.
                if error.tlsRefused { break }
            }
            guard outcome.attempts <= retries else { break }
            Thread.sleep(forTimeInterval: delay)
        }
        return outcome
    }

    /// GET /v1/responses/<id>: the HTTP status and the JSON fields.
    func lookup(_ id: String) throws -> (status: Int, fields: [String: Any]) {
        let reply = try client.get(base + "/v1/responses/" + id, bearer: credential)
        return (reply.status, Self.fields(reply))
    }

    private static func fields(_ reply: CurlClient.Reply) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(reply.body))) as? [String: Any] ?? [:]
    }
}
