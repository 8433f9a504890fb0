// A tiny HTTP server for scripts/bench-http.sh: answers every request with a 13-byte body
// (`/echo` echoes the request body). Prints the bound port on stdout, runs until SIGINT/SIGTERM.
// Usage: http-bench-server [--port N] [--threads N] [--tls CERT KEY]
import HTTPServer
#if canImport(Glibc)
import Glibc
#endif

var configuration = HTTPServerConfiguration()
var args = CommandLine.arguments.dropFirst()
func usage(_ message: String) -> Never {
    let text = "http-bench-server: \(message)\nusage: http-bench-server [--port N] [--threads N] [--tls CERT KEY]\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
    exit(64)
}
while let a = args.popFirst() {
    switch a {
    case "--port":
        guard let v = args.popFirst(), let p = Int(v), (0...65535).contains(p) else { usage("--port needs 0...65535") }
        configuration.port = p
    case "--threads":
        guard let v = args.popFirst(), let n = Int(v), n >= 1 else { usage("--threads needs a positive integer") }
        configuration.loopThreads = n
    case "--tls":
        guard let cert = args.popFirst(), let key = args.popFirst() else { usage("--tls needs CERT and KEY paths") }
        configuration.tls = TLSConfiguration(certificatePath: cert, privateKeyPath: key)
    case "--help", "-h":
        usage("help")
    default:
        usage("unknown argument \(a)")
    }
}

let hello: [UInt8] = Array("Hello, world!".utf8)
let plain = HTTPHeaders([("content-type", "text/plain")])
let helloResponse = HTTPReply(status: 200, headers: plain, body: hello)

// Block the signals before any thread starts so sigwait below receives them.
var signals = sigset_t()
sigemptyset(&signals)
sigaddset(&signals, SIGINT)
sigaddset(&signals, SIGTERM)
pthread_sigmask(SIG_BLOCK, &signals, nil)

let server: HTTPServer
do {
    server = try HTTPServer(configuration: configuration) { req, res in
        if req.path == "/echo" {
            res.respond(HTTPReply(status: 200, headers: plain, body: req.body))
        } else {
            res.respond(helloResponse)
        }
    }
    try server.start()
} catch {
    let text = "http-bench-server: \(error)\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
    exit(1)
}
let line = "\(server.localPort)\n"
_ = line.withCString { write(1, $0, strlen($0)) }

var received: Int32 = 0
sigwait(&signals, &received)
server.stop(grace: .seconds(2))
