// `events.webhooks`: where delivery events are sent (docs/events.md, "Webhooks";
// docs/configuration.md). Parsed with the rest of the config; the secret files are read when the
// sender starts (and by --check-config), so a rotated secret needs only a restart.
import Basics
import FoundationEssentials
import Glibc

extension RelayConfig {
    static func parseWebhooks(_ entries: [ConfigReader], apps configuredApps: Set<String>) throws -> [Webhook] {
        var webhooks: [Webhook] = []
        var names = Set<String>()
        for var w in entries {
            try w.object(allowed: ["name", "url", "secretFile", "types", "apps", "caFile", "timeoutMs", "retryForSeconds",
                                   "maxConcurrent", "allowInsecureTransport"])
            // The name labels metrics and relayctl output and keys the store's delivery rows.
            guard let name = try w.string("name"), !name.isEmpty, name.count <= 64,
                  name.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || $0 == 0x2D || $0 == 0x5F || $0 == 0x2E })
            else {
                throw ConfigError(key: w.key("name"), message: "required: 1 to 64 letters, digits, '-', '_' or '.' (it names the webhook in metrics and relayctl)")
            }
            guard names.insert(name).inserted else { throw ConfigError(key: w.key("name"), message: "\(name) is configured twice") }
            guard let url = try w.string("url"), url.hasPrefix("https://") || url.hasPrefix("http://"), !Self.urlHost(url).isEmpty else {
                throw ConfigError(key: w.key("url"), message: "required: an http(s) URL such as https://hooks.example.com/relay")
            }
            guard !url.contains(where: { $0 == " " || $0 == "#" || $0.isNewline }) else {
                throw ConfigError(key: w.key("url"), message: "must not contain spaces, line breaks or a fragment")
            }
            let allowInsecure = try w.bool("allowInsecureTransport") ?? false
            // Cleartext would show every event (push tokens, apps) and its signature to the path.
            if url.hasPrefix("http://"), !allowInsecure, !Self.isLoopbackHost(Self.urlHost(url)) {
                throw ConfigError(key: w.key("url"), message: "\(url) is cleartext to a host other than loopback: every event would cross the network unencrypted; use https://, or set \"allowInsecureTransport\": true in this webhook")
            }
            guard let secretFile = try w.path("secretFile") else {
                throw ConfigError(key: w.key("secretFile"), message: "required: a file holding whsec_<base64> (make one with `echo whsec_$(openssl rand -base64 32)`)")
            }
            var webhook = Webhook(name: name, url: url, secretFile: secretFile)
            webhook.allowInsecureTransport = allowInsecure
            if let types = try w.array("types") {
                guard !types.isEmpty else { throw ConfigError(key: w.key("types"), message: "must not be empty (leave it out for every type)") }
                webhook.types = []
                for entry in types {
                    guard case .string(let text) = entry.value, let type = EventType(rawValue: text) else {
                        throw ConfigError(key: entry.path, message: "must be one of \(EventType.allCases.map { "\"\($0.rawValue)\"" }.joined(separator: ", "))")
                    }
                    webhook.types.insert(type)
                }
            }
            if let apps = try w.array("apps") {
                guard !apps.isEmpty else { throw ConfigError(key: w.key("apps"), message: "must not be empty (leave it out for every app)") }
                var set = Set<String>()
                for entry in apps {
                    guard case .string(let bundle) = entry.value, configuredApps.contains(bundle) else {
                        throw ConfigError(key: entry.path, message: "must be the bundleID of an app in \"apps\" (\(configuredApps.sorted().joined(separator: ", ")))")
                    }
                    set.insert(bundle)
                }
                webhook.apps = set
            }
            webhook.caFile = try w.path("caFile")
            webhook.timeoutMillis = try w.int("timeoutMs", 100...600_000) ?? webhook.timeoutMillis
            webhook.retryForSeconds = try w.int("retryForSeconds", 0...(30 * 86_400)) ?? webhook.retryForSeconds
            webhook.maxConcurrent = try w.int("maxConcurrent", 1...256) ?? webhook.maxConcurrent
            webhooks.append(webhook)
        }
        return webhooks
    }

    /// Reads `events.webhooks[index].secretFile`: one or two non-empty lines `whsec_<base64>`
    /// (blank lines and surrounding spaces ignored). Errors name the key, never the secret.
    public func webhookSecrets(_ index: Int) throws -> [WebhookSecret] {
        let key = "events.webhooks[\(index)].secretFile"
        let path = events.webhooks[index].secretFile
        var bytes: [UInt8]
        do { bytes = try readSmallFile(path, limit: 4096) } catch { throw ConfigError(key: key, message: "cannot read \(path): \(error)") }
        defer { wipe(&bytes) }
        let lines = bytes.split(whereSeparator: { $0 == 0x0A || $0 == 0x0D })
            .map { ASCII.trimLines(String(decoding: $0, as: UTF8.self)) }
            .filter { !$0.isEmpty }
        guard (1...2).contains(lines.count) else {
            throw ConfigError(key: key, message: "\(path) holds \(lines.count) secrets; expected one line whsec_<base64>, or two while rotating")
        }
        var secrets: [WebhookSecret] = []
        for (n, line) in lines.enumerated() {
            do { secrets.append(try WebhookSecret(parsing: line)) } catch {
                throw ConfigError(key: key, message: "\(path) line \(n + 1): \(error)")
            }
        }
        return secrets
    }
}

/// A small file's bytes, refusing one larger than `limit` (a secret file is a few lines).
private func readSmallFile(_ path: String, limit: Int) throws -> [UInt8] {
    struct ReadError: Error, CustomStringConvertible { var description: String }
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw ReadError(description: String(cString: strerror(errno))) }
    defer { close(fd) }
    var out = [UInt8](repeating: 0, count: limit + 1)
    var used = 0
    while used < out.count {
        let n = out.withUnsafeMutableBytes { read(fd, $0.baseAddress! + used, $0.count - used) }
        if n < 0 { if errno == EINTR { continue }; throw ReadError(description: String(cString: strerror(errno))) }
        if n == 0 { break }
        used += n
    }
    guard used <= limit else { wipe(&out); throw ReadError(description: "larger than \(limit) bytes") }
    out.removeSubrange(used...)
    return out
}

private func wipe(_ bytes: inout [UInt8]) {
    for i in bytes.indices { bytes[i] = 0 }
}
