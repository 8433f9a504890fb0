// relayctl check-config: everything relay-server would trip over at start (or weeks later, when
// a certificate expires), checked without starting it. The config is parsed by RelayCore's own
// loader, so "check-config passes" and "relay-server accepts the config" cannot disagree.
import Foundation
import RelayCore
internal import OpenSSLSupport

#if canImport(Glibc)
import Glibc
#endif

extension RelayCtl {
    static var checkConfig: Command {
        .leaf("check-config", "Validate a config without starting the server.",
              discussion: """
              Parses the config with relay-server's loader (unknown keys, invalid values, environment
              overrides), then checks every file it names: readable; .p8 keys are EC P-256 PKCS#8;
              certificates parse, are already valid and do not expire within --expiry-days; private
              keys match their certificates; the SQLite directory exists (an existing database, or a
              PostgreSQL store, is opened read-only and must have a schema this build knows); the
              listen and admin ports are free. Exit 0 when every
              check passes (warnings allowed), 1 otherwise.
              """,
              arguments: [ArgumentSpec(name: "file", help: "The config to check (default: \(defaultConfigPath)).", required: false)],
              options: [
                  .value("expiry-days", "n", "Fail certificates expiring within n days, 0...3650 (default 30).", required: false),
                  .flag("skip-ports", "Do not check that the ports are free (e.g. the config of the running server)."),
              ], run: CheckConfigCommand.run)
    }
}

enum CheckConfigCommand {
    struct Check: Encodable {
        enum Status: String, Encodable { case ok, warn, fail }
        var status: Status
        var subject: String
        var detail: String
    }

    struct Output: Encodable { var config: String; var ok: Bool; var checks: [Check] }

    final class Checks {
        var list: [Check] = []
        func ok(_ subject: String, _ detail: String) { list.append(Check(status: .ok, subject: subject, detail: detail)) }
        func warn(_ subject: String, _ detail: String) { list.append(Check(status: .warn, subject: subject, detail: detail)) }
        func fail(_ subject: String, _ detail: String) { list.append(Check(status: .fail, subject: subject, detail: detail)) }
    }

    static func run(_ args: ParsedArguments, _ console: Console) throws {
        let path = args.positionals.first ?? defaultConfigPath
        let expiryDays = try args.optionalInt("expiry-days", in: 0...3650) ?? 30
        let checks = Checks()
        check(path: path, expiryDays: expiryDays, ports: !args.flag("skip-ports"), into: checks)

        let ok = !checks.list.contains { $0.status == .fail }
        if args.flag("json") {
            emit(console, try renderJSON(Output(config: path, ok: ok, checks: checks.list)))
        } else {
            let width = checks.list.map(\.subject.count).max() ?? 0
            console.out(checks.list.map { "\($0.status.rawValue.uppercased().padding(4))  \($0.subject.padding(width))  \($0.detail)" }
                .joined(separator: "\n"))
        }
        if !ok {
            throw RuntimeFailure("\(path): \(checks.list.filter { $0.status == .fail }.count) check(s) failed")
        }
    }

    static func check(path: String, expiryDays: Int, ports: Bool, into checks: Checks) {
        let config: RelayConfig
        do {
            config = try RelayConfig.load(path: path)
            checks.ok("config", "\(path) parses: \(config.apps.count) app(s), listen \(config.listen.host):\(config.listen.port)")
        } catch {
            checks.fail("config", "\(error)")
            return
        }
        let threshold = Date().addingTimeInterval(Double(expiryDays) * 86_400)
        // The same warnings relay-server logs at start: exposed secret files, an unverified
        // PostgreSQL connection, cleartext to APNs.
        for w in config.warnings(configPath: path) { checks.warn(w.key, w.message) }
        checkStore(config, into: checks)
        checkWebhooks(config, into: checks)
        checkListeners(config, ports: ports, threshold: threshold, expiryDays: expiryDays, into: checks)
        checkApps(config, threshold: threshold, expiryDays: expiryDays, into: checks)
    }

    static func checkStore(_ config: RelayConfig, into checks: Checks) {
        if config.store.kind != "sqlite" {
            let where_ = OutboxStores.describe(config.store)
            do {
                let store = try OutboxStores.open(config.store, readOnly: true)
                let pending = try store.counts().pending
                store.close()
                checks.ok("store", "\(config.store.kind) \(where_): reachable, schema current, \(pending) pending")
            } catch {
                checks.fail("store", "\(config.store.kind) \(where_): \(error)")
            }
        } else {
            let db = config.store.path
            let dir = (db as NSString).deletingLastPathComponent.isEmpty ? "." : (db as NSString).deletingLastPathComponent
            if FileManager.default.fileExists(atPath: db) {
                do {
                    let store = try OutboxStores.open(config.store, readOnly: true)
                    let pending = try store.counts().pending
                    store.close()
                    checks.ok("store.path", "\(db): schema v\(SQLiteOutboxStore.schemaVersion), \(pending) pending")
                } catch {
                    checks.fail("store.path", "\(db): \(error)")
                }
            } else {
                var isDir: ObjCBool = false
                if FileManager.default.fileExists(atPath: dir, isDirectory: &isDir), isDir.boolValue {
                    checks.ok("store.path", "\(db) does not exist yet; relay-server creates it in \(dir)")
                } else {
                    checks.fail("store.path", "directory \(dir) does not exist")
                }
            }
            if db.hasPrefix("/etc/") || db.hasPrefix("/usr/") {
                checks.warn("store.path", "\(db) is read-only under the systemd unit (ProtectSystem=strict); use /var/lib/accessory-relay/")
            }
        }
    }

    /// Webhooks (docs/events.md): the secret file's lines, the CA file.
    static func checkWebhooks(_ config: RelayConfig, into checks: Checks) {
        for (i, webhook) in config.events.webhooks.enumerated() {
            do {
                let secrets = try config.webhookSecrets(i)
                checks.ok("events.webhooks[\(i)]", "\(webhook.name) -> \(webhook.url): \(secrets.count == 2 ? "2 secrets (rotating: both sign)" : "1 secret")")
            } catch { checks.fail("events.webhooks[\(i)].secretFile", "\(error)") }
            if let ca = webhook.caFile {
                do {
                    let cert = try KeyMaterial.certificate(atPath: ca)
                    checks.ok("events.webhooks[\(i)].caFile", "\(ca): \(cert.subject), until \(isoDay(cert.notAfter))")
                } catch { checks.fail("events.webhooks[\(i)].caFile", "\(error)") }
            }
        }
    }

    static func checkListeners(_ config: RelayConfig, ports: Bool, threshold: Date, expiryDays: Int, into checks: Checks) {
        if let tls = config.listen.tls {
            certificateAndKey("listen.tls", certificate: tls.certificatePath, key: tls.privateKeyPath, passphrase: nil, threshold: threshold, expiryDays: expiryDays, into: checks)
            if let ca = tls.clientCAPath {
                do {
                    let cert = try KeyMaterial.certificate(atPath: ca)
                    checks.ok("listen.tls.clientCA", "\(ca): \(cert.subject), until \(isoDay(cert.notAfter)); clients must present a certificate it issued")
                } catch { checks.fail("listen.tls.clientCA", "\(error)") }
            }
        } else if !RelayConfig.isLoopbackHost(config.listen.host) {
            checks.warn("listen", "\(config.listen.host):\(config.listen.port) without TLS: terminate TLS in front of it")
        }
        if config.adminEnabled {
            if !RelayConfig.isLoopbackHost(config.admin.host) {
                checks.warn("admin", "\(config.admin.host):\(config.admin.port) is not loopback: /metrics and /readyz are unauthenticated")
            }
            if config.admin.host == config.listen.host && config.admin.port == config.listen.port && config.listen.port != 0 {
                checks.fail("admin", "same address as listen (\(config.listen.host):\(config.listen.port))")
            }
        }
        if ports {
            portFree("listen", config.listen.host, config.listen.port, into: checks)
            if config.adminEnabled { portFree("admin", config.admin.host, config.admin.port, into: checks) }
        }
    }

    static func checkApps(_ config: RelayConfig, threshold: Date, expiryDays: Int, into checks: Checks) {
        for (i, app) in config.apps.enumerated() {
            let subject = "apps[\(i)] \(app.bundleID)"
            if let ca = app.caFile {
                do {
                    let cert = try KeyMaterial.certificate(atPath: ca)
                    checks.ok("\(subject) caFile", "\(ca): \(cert.subject), until \(isoDay(cert.notAfter))")
                } catch { checks.fail("\(subject) caFile", "\(error)") }
            }
            switch app.credentials {
            case .token(let p8Path, let keyID, let teamID):
                do {
                    let key = try KeyMaterial.privateKey(atPath: p8Path)
                    if key.type == "EC", key.curve == "prime256v1" {
                        checks.ok("\(subject) token", "\(p8Path): EC P-256 key (ES256)")
                    } else {
                        checks.fail("\(subject) token", "\(p8Path): \(key.type) \(key.curve ?? "\(key.bits) bits") key; APNs tokens need EC P-256")
                    }
                } catch { checks.fail("\(subject) token", "\(error)") }
                if !isAppleID(keyID) { checks.fail("\(subject) token.keyID", "'\(keyID)' is not a 10-character key ID") }
                if !isAppleID(teamID) { checks.fail("\(subject) token.teamID", "'\(teamID)' is not a 10-character team ID") }
            case .certificate(let certPath, let keyPath, let passphraseFile):
                var passphrase: String?
                if let passphraseFile {
                    if let data = FileManager.default.contents(atPath: passphraseFile) {
                        passphrase = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .newlines)
                    } else {
                        checks.fail("\(subject) certificate", "passphrase file \(passphraseFile) is not readable")
                    }
                }
                certificateAndKey("\(subject) certificate", certificate: certPath, key: keyPath, passphrase: passphrase,
                                  threshold: threshold, expiryDays: expiryDays, into: checks)
            }
        }
    }

    static func certificateAndKey(_ subject: String, certificate: String, key: String, passphrase: String?,
                                  threshold: Date, expiryDays: Int, into checks: Checks) {
        do {
            let cert = try KeyMaterial.certificate(atPath: certificate, passphrase: passphrase)
            let now = Date()
            if cert.notBefore > now {
                checks.fail(subject, "\(certificate) is not valid before \(isoDay(cert.notBefore))")
            } else if cert.notAfter <= now {
                checks.fail(subject, "\(certificate) expired on \(isoDay(cert.notAfter))")
            } else if cert.notAfter <= threshold {
                checks.fail(subject, "\(certificate) expires on \(isoDay(cert.notAfter)), within \(expiryDays) days")
            } else {
                checks.ok(subject, "\(certificate): \(cert.subject), valid until \(isoDay(cert.notAfter))")
            }
        } catch {
            checks.fail(subject, "\(error)")
            return
        }
        do {
            if PKCS12File.isPKCS12Path(certificate) {
                if try KeyMaterial.keyMatchesCertificate(certificatePath: certificate, keyPath: key, passphrase: passphrase) {
                    checks.ok("\(subject) key", "the key inside \(certificate) matches its certificate")
                } else {
                    checks.fail("\(subject) key", "the key inside \(certificate) is not its certificate's private key")
                }
                return
            }
            _ = try KeyMaterial.privateKey(atPath: key, passphrase: passphrase)
            if try KeyMaterial.keyMatchesCertificate(certificatePath: certificate, keyPath: key, passphrase: passphrase) {
                checks.ok("\(subject) key", "\(key) matches the certificate")
            } else {
                checks.fail("\(subject) key", "\(key) is not the certificate's private key")
            }
        } catch {
            checks.fail("\(subject) key", "\(error)")
        }
    }

    /// Binds the address the way the server will (SO_REUSEADDR, so TIME_WAIT is no false alarm).
    static func portFree(_ subject: String, _ host: String, _ port: Int, into checks: Checks) {
        guard port != 0 else { return checks.ok("\(subject) port", "ephemeral (0): always free") }
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, String(port), &hints, &result)
        guard rc == 0, let first = result else {
            return checks.fail("\(subject) port", "cannot resolve \(host): \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(result) }
        let fd = socket(first.pointee.ai_family, first.pointee.ai_socktype, first.pointee.ai_protocol)
        guard fd >= 0 else { return checks.fail("\(subject) port", "socket: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 {
            checks.ok("\(subject) port", "\(host):\(port) is free")
        } else {
            let why = errno == EADDRINUSE ? "in use (is relay-server already running? --skip-ports)" : String(cString: strerror(errno))
            checks.fail("\(subject) port", "\(host):\(port): \(why)")
        }
    }


    static func isAppleID(_ s: String) -> Bool { s.count == 10 && s.allSatisfy { $0.isASCII && ($0.isUppercase || $0.isNumber) } }

    static func isoDay(_ date: Date) -> String { String(isoTime(Int64(date.timeIntervalSince1970 * 1000)).prefix(10)) }
}
