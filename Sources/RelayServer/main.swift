// relay-server: parse arguments, load the config, run the service until SIGTERM/SIGINT (SIGHUP
// reloads certificates and keys). Everything else lives in RelayCore (RelayService.swift), including
// the signal handling.
import Glibc
import Basics
import BuildInfo
import RelayCore

let usage = """
    Usage: relay-server [--config <file>] [--check-config] | --version

    Accepts encrypted AccessoryNotifications responses over HTTP, stores each durably in an
    SQLite outbox before answering 202, and delivers them to APNs.

    Options:
      --config <file>   JSON configuration (default: \(RelayConfig.defaultPath)).
                        Every key is documented in config/relay.example.json.
      --check-config    Load and validate the configuration (and that the files it names
                        are readable), print its warnings, then exit.
      --version         Print the version and the git commit it was built from.
      -h, --help        Show this help.

    Signals: SIGTERM/SIGINT drain and stop (exit 0). SIGHUP reloads the ingest TLS
    certificate, key and client CA and the apps' APNs key files and caFile without dropping
    connections (a file that does not load keeps the previous one); other changes need a
    restart.
    Exit codes: 64 usage, 1 runtime failure.

    """

func output(_ text: String, to fd: Int32) {
    FileDescriptor.writeAll(fd, text)  // stderr gone: nothing left to tell
}

func fail(_ message: String, code: Int32) -> Never {
    output("relay-server: \(message)\n", to: 2)
    exit(code)
}

var configPath = RelayConfig.defaultPath
var checkOnly = false
var args = CommandLine.arguments.dropFirst()
while let arg = args.popFirst() {
    switch arg {
    case "-h", "--help":
        output(usage, to: 1)
        exit(0)
    case "--version":
        output(BuildInfo.versionLine("relay-server") + "\n", to: 1)
        exit(0)
    case "--config":
        guard let p = args.popFirst(), !p.isEmpty else { fail("--config needs a file path\n\n\(usage)", code: 64) }
        configPath = p
    case "--check-config":
        checkOnly = true
    default:
        if arg.hasPrefix("--config=") {
            configPath = String(arg.dropFirst("--config=".count))
        } else {
            fail("unknown argument \(arg)\n\n\(usage)", code: 64)
        }
    }
}

let config: RelayConfig
do {
    config = try RelayConfig.load(path: configPath)
} catch {
    fail("invalid configuration \(configPath): \(error)", code: 1)
}
if let unreadable = config.unreadableFile() {
    fail("invalid configuration \(configPath): \(unreadable)", code: 1)
}
// Webhook secret files hold one or two whsec_ lines (the error names the key, never the secret).
for i in config.events.webhooks.indices {
    do { _ = try config.webhookSecrets(i) } catch { fail("invalid configuration \(configPath): \(error)", code: 1) }
}
let warnings = config.warnings(configPath: configPath)
if checkOnly {
    for w in warnings { output("relay-server: warning: \(w)\n", to: 2) }
    output("configuration \(configPath) is valid\n", to: 1)
    exit(0)
}

let logger = RelayLogger(minimum: config.log.level, format: config.log.format)
logger.info("relay-server starting", ["version": BuildInfo.version, "commit": BuildInfo.commit, "config": configPath])
for w in warnings { logger.warning(w.message, ["key": w.key]) }
let service = RelayService(config: config, logger: logger, makeTransport: { try PushClientTransport.make(app: $0, config: $1) })
do {
    try service.start()
} catch {
    logger.error("startup failed", ["error": "\(error)"])
    service.stop()
    fail("startup failed: \(error)", code: 1)
}
exit(service.runUntilSignal())
