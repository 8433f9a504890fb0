// Settings relay-server accepts but an operator should hear about: secret files other users can
// read, a PostgreSQL connection that does not verify its server, cleartext to APNs. relay-server
// logs them at start (and prints them with --check-config); relayctl check-config lists them.
import FoundationEssentials
import Glibc

extension RelayConfig {
    /// Each warning names the key it comes from; `configPath` is the file the config was read from.
    public func warnings(configPath: String?, environment: [String: String] = ProcessInfo.processInfo.environment) -> [ConfigError] {
        var out: [ConfigError] = []
        var secrets: [(key: String, path: String)] = []
        if let configPath { secrets.append(("config", configPath)) }
        if let tls = listen.tls { secrets.append(("listen.tls.privateKey", tls.privateKeyPath)) }
        for (i, app) in apps.enumerated() {
            switch app.credentials {
            case .token(let p8, _, _): secrets.append(("apps[\(i)].token.p8Path", p8))
            case .certificate(_, let key, let passphrase):
                // A .p12 certificatePath is its own privateKeyPath.
                secrets.append(("apps[\(i)].certificate.privateKeyPath", key))
                if let passphrase { secrets.append(("apps[\(i)].certificate.passphraseFile", passphrase)) }
            }
            if case .custom(let url) = app.environment, url.hasPrefix("http://"), !Self.isLoopbackHost(Self.urlHost(url)) {
                out.append(ConfigError(key: "apps[\(i)].url", message: "\(url) is cleartext (allowInsecureTransport): the APNs token and every push cross the network unencrypted"))
            }
        }
        for (i, webhook) in events.webhooks.enumerated() {
            secrets.append(("events.webhooks[\(i)].secretFile", webhook.secretFile))
            if webhook.url.hasPrefix("http://"), !Self.isLoopbackHost(Self.urlHost(webhook.url)) {
                out.append(ConfigError(key: "events.webhooks[\(i)].url", message: "\(webhook.url) is cleartext (allowInsecureTransport): every event crosses the network unencrypted"))
            }
        }
        for s in secrets {
            if let exposure = Self.exposure(of: s.path) { out.append(ConfigError(key: s.key, message: "\(s.path) \(exposure)")) }
        }
        if store.kind == "postgres", let url = store.url, let problem = Self.postgresTransportProblem(url, environment: environment) {
            out.append(ConfigError(key: "store.url", message: problem))
        }
        return out
    }

    /// "localhost", 127.0.0.0/8 or ::1 (with or without brackets).
    public static func isLoopbackHost(_ host: String) -> Bool {
        let h = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if h == "localhost" || h == "::1" { return true }
        var v4 = in_addr()
        return inet_pton(AF_INET, h, &v4) == 1 && UInt32(bigEndian: v4.s_addr) >> 24 == 127
    }

    /// The host of an `http(s)://[user@]host[:port][/path]` URL ("[::1]" keeps its brackets).
    static func urlHost(_ url: String) -> String {
        guard let scheme = url.firstRange(of: "://") else { return "" }
        var authority = url[scheme.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
        if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") { return String(authority[...close]) }
        return String(authority.prefix { $0 != ":" })
    }

    /// Why a file holding a secret is exposed, nil if only its owner (and this process's own
    /// groups) can read or write it. Group access is judged against this process's groups
    /// (the unit's accessory-relay group); as root, where that cannot be told, only "other" counts.
    static func exposure(of path: String) -> String? {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }  // unreadableFile() reports missing files
        return exposure(mode: st.st_mode, group: st.st_gid, asRoot: geteuid() == 0, processGroups: processGroups())
    }

    static func exposure(mode fullMode: mode_t, group: gid_t, asRoot: Bool, processGroups: Set<gid_t>) -> String? {
        let mode = fullMode & 0o777
        let octal = "0" + String(mode, radix: 8)
        if mode & 0o006 != 0 {
            return "can be \(mode & 0o004 != 0 ? "read" : "written") by every user (mode \(octal)): chmod o-rwx"
        }
        if mode & 0o060 != 0, !asRoot, !processGroups.contains(group) {
            let name = getgrgid(group).map { String(cString: $0.pointee.gr_name) } ?? "\(group)"
            return "can be \(mode & 0o040 != 0 ? "read" : "written") by group \(name), which this process is not in (mode \(octal)): chmod g-rw, or chgrp it to the service's group"
        }
        return nil
    }

    static func processGroups() -> Set<gid_t> {
        var groups = [gid_t](repeating: 0, count: Int(max(getgroups(0, nil), 0)))
        let n = getgroups(Int32(groups.count), &groups)
        return Set(groups.prefix(Int(max(n, 0)))).union([getegid(), getgid()])
    }

    /// A PostgreSQL connection that crosses the network without verifying the server (libpq's
    /// reading of the URL, then PGHOST/PGSSLMODE as libpq would apply them).
    static func postgresTransportProblem(_ url: String, environment: [String: String]) -> String? {
        guard let info = PostgresConnInfo(url) else { return nil }  // refused at load
        // libpq connects to hostaddr[i] when given, else host[i] (host then only names the server).
        let names = (info["host"] ?? "").split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        let addresses = (info["hostaddr"] ?? "").split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        var hosts = (0..<max(names.count, addresses.count)).map { i in
            i < addresses.count && !addresses[i].isEmpty ? addresses[i] : (i < names.count ? names[i] : "")
        }
        if hosts.allSatisfy(\.isEmpty) { hosts = (environment["PGHOST"] ?? "").split(separator: ",").map(String.init) }
        // No host: libpq's Unix socket. "/dir" and "@abstract" are sockets too.
        let remote = hosts.filter { !$0.isEmpty && !$0.hasPrefix("/") && !$0.hasPrefix("@") && !isLoopbackHost($0) }
        guard !remote.isEmpty else { return nil }
        let mode = info["sslmode"] ?? environment["PGSSLMODE"] ?? (info["requiressl"] == "1" ? "require" : "prefer")
        guard mode != "verify-full" else { return nil }
        return "connects to \(remote.joined(separator: ",")) with sslmode=\(mode): the password and every row cross the network to a server that is not verified; add sslmode=verify-full (and sslrootcert=<the server's CA file>)"
    }
}
