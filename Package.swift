// swift-tools-version:6.0
//
// The relay's package. One target per concern, one `C<Lib>` system-library target per C
// library (module map + shim.h of static inline wrappers). The data path reads straight through
// the tree: HTTPServer (in) -> RelayCore (validate, store, dispatch) -> PushClient (out to APNs).
import PackageDescription

let package = Package(
    name: "accessory-relay",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "relay-server", targets: ["relay-server"]),
        .executable(name: "relayctl", targets: ["relayctl"]),
        .executable(name: "mock-apns", targets: ["mock-apns"]),
        .library(name: "Ratchet", targets: ["Ratchet"]),
        .library(name: "PushClient", targets: ["PushClient"]),
        .library(name: "KeyExchange", targets: ["KeyExchange"]),
    ],
    targets: [
        // MARK: C libraries from Debian apt (see ../shared/INTEROP.md and each shim.h)
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CNghttp2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CUV", pkgConfig: "libuv", providers: [.apt(["libuv1-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // Client side only (HTTPClient: relayctl accessory send, send-test).
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "CPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),

        // libcurl through dlopen for RelayCore's webhook sender: loaded only when webhooks are
        // configured, so relay-server still does not link it (LinkageTests). Headers only from
        // libcurl4-openssl-dev.
        .target(name: "CCurlLoader"),

        // MARK: Libraries
        // Hex, base64, UUID text, JSON string escaping and tokens, RFC 3339 times, write-all, files created
        // without following symbolic links (DurableFile): once, no Foundation, no C.
        .target(name: "Basics"),
        // The package version and the git commit a build was made from (--version, /metrics).
        // The commit is a header `make` writes (scripts/build-info.sh): C only for __has_include.
        .target(name: "CBuildInfo"),
        .target(name: "BuildInfo", dependencies: ["CBuildInfo"]),
        // The OpenSSL pieces every module shares: error text, SHA-256, CSPRNG, constant-time
        // compare and wipe, PEM keys, ES256 (raw r||s), certificates, the P-256 group.
        .target(name: "OpenSSLSupport", dependencies: ["COpenSSL"]),
        // nghttp2 sessions driven with mem_recv/mem_send, header blocks, the body copy: once for
        // HTTPServer's server sessions and PushClient's client sessions.
        .target(name: "NGHTTP2Support", dependencies: ["CNghttp2"]),
        // Apple's Symmetric Key Ratchet, HKDF, AES-GCM, wire codecs.
        .target(name: "Ratchet", dependencies: ["Basics", "OpenSSLSupport", "COpenSSL"]),
        // Apple's accessory key exchange: ML-KEM-768 (Swift), X-Wing, HPKE (RFC 9180), the derivations.
        .target(name: "KeyExchange", dependencies: ["Ratchet", "OpenSSLSupport", "COpenSSL"]),
        // Event-loop HTTP/1.1 + HTTP/2 server core (libuv, OpenSSL, nghttp2).
        .target(name: "HTTPServer", dependencies: ["CUV", "OpenSSLSupport", "COpenSSL", "NGHTTP2Support", "CNghttp2", "POSIXThreads"], 
                // Release only: runtime exclusivity checks on class properties cost ~1.7k instructions
                // per request on the hot path (measured with callgrind); debug builds and tests keep them.
                swiftSettings: [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]),
        // Named pthreads and a condition variable for modules that must not link Foundation.
        .target(name: "POSIXThreads"),
        // APNs HTTP/2 client (nghttp2 client sessions over OpenSSL), ES256 JWT, result classification.
        .target(name: "PushClient", dependencies: ["Basics", "POSIXThreads", "NGHTTP2Support", "CNghttp2", "OpenSSLSupport", "COpenSSL"]),
        // The APNs look-alike used by tests, benchmarks and users' own tests.
        .target(name: "MockAPNs", dependencies: ["Basics", "HTTPServer", "POSIXThreads", "Ratchet", "KeyExchange", "PushClient", "OpenSSLSupport", "COpenSSL"]),
        // A blocking HTTP client on libcurl, http/https only, no redirects, bounded replies (relayctl's
        // accessory simulator; relay-server does not link it).
        .target(name: "HTTPClient", dependencies: ["CCurl"]),
        // The relay itself: config, validation, credentials, SQLite/PostgreSQL outbox, dispatcher, ingest API,
        // delivery events' webhook sender.
        .target(name: "RelayCore", dependencies: ["Basics", "BuildInfo", "HTTPServer", "PushClient", "POSIXThreads", "CSQLite", "CPQ", "CSystemd", "OpenSSLSupport", "CCurlLoader"]),

        // MARK: Executables (thin: parse arguments, start a service)
        .executableTarget(name: "relay-server", dependencies: ["Basics", "BuildInfo", "RelayCore"], path: "Sources/RelayServer"),
        .executableTarget(name: "relayctl", dependencies: ["Basics", "BuildInfo", "RelayCore", "Ratchet", "KeyExchange", "HTTPClient", "OpenSSLSupport"]),
        .executableTarget(name: "mock-apns", dependencies: ["BuildInfo", "MockAPNs"]),
        // Release-built micro-benchmark of the Ratchet module for scripts/bench-ratchet.sh.
        .executableTarget(name: "ratchet-bench", dependencies: ["Ratchet"]),
        // KeyExchange driven by scripts: scripts/kex-crosscheck.py (make test) and scripts/bench-kex.sh.
        .executableTarget(name: "kex-tool", dependencies: ["KeyExchange", "Ratchet"]),
        // Tiny echo server for scripts/bench-http.sh (HTTPServer vs nginx / nghttpd).
        .executableTarget(name: "http-bench-server", dependencies: ["HTTPServer"]),
        // Release-built PushClient load driver for scripts/bench-push.sh (vs h2load, aioapns).
        .executableTarget(name: "push-bench", dependencies: ["PushClient"]),

        // MARK: Tests (mirror the source targets; integration tests drive the real binaries)
        // Helpers shared by the test targets (seeded PRNG, loopback sockets); no Foundation.
        .target(name: "TestSupport", dependencies: ["POSIXThreads"], path: "Tests/TestSupport"),
        // Test-only fault injection under SQLite's unix VFS (ENOSPC, EIO, short writes, EINTR).
        .target(name: "CSQLiteFault", dependencies: ["CSQLite"], path: "Tests/CSQLiteFault"),
        .testTarget(name: "BasicsTests", dependencies: ["Basics", "COpenSSL"]),
        .testTarget(name: "OpenSSLSupportTests", dependencies: ["OpenSSLSupport"]),
        .testTarget(name: "RatchetTests", dependencies: ["Ratchet", "TestSupport"], exclude: ["Vectors"]),
        .testTarget(name: "KeyExchangeTests", dependencies: ["KeyExchange", "Ratchet", "COpenSSL"]),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer", "POSIXThreads", "TestSupport"]),
        .testTarget(name: "HTTPClientTests", dependencies: ["HTTPClient", "TestSupport"]),
        .testTarget(name: "PushClientTests", dependencies: ["PushClient", "MockAPNs", "POSIXThreads", "TestSupport"]),
        .testTarget(name: "MockAPNsTests", dependencies: ["MockAPNs", "KeyExchange", "Ratchet"]),
        .testTarget(name: "RelayCoreTests", dependencies: ["RelayCore", "HTTPServer", "PushClient", "MockAPNs", "Ratchet", "POSIXThreads", "TestSupport", "CSQLiteFault"]),
        .testTarget(name: "IntegrationTests", dependencies: ["BuildInfo", "Ratchet", "RelayCore", "TestSupport"], exclude: ["Golden"]),
    ],
    swiftLanguageModes: [.v6]
)
