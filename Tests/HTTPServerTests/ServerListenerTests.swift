// The listening socket when accepting fails (Listener.swift): a broken listener stops that loop
// accepting, told once, without spinning or starving the loop; a shortage pauses with a
// back-off; a number that is no longer the listener's socket is never closed by the server.
import Foundation
@testable import HTTPServer
import Synchronization
import Testing

/// The descriptor of this process's socket listening on `port` (its inode from /proc/net/tcp,
/// found among /proc/self/fd), nil if there is none.
func listeningDescriptor(port: Int) -> Int32? {
    guard let table = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return nil }
    let suffix = ":" + String(format: "%04X", port)
    // sl local_address rem_address st ... inode: state 0A is LISTEN, the inode is field 9.
    guard let inode = table.split(separator: "\n").dropFirst().lazy
        .map({ $0.split(separator: " ") })
        .first(where: { $0.count > 9 && $0[1].hasSuffix(suffix) && $0[3] == "0A" })?[9] else { return nil }
    let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return fds.first { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)) == "socket:[\(inode)]" }
        .flatMap { Int32($0) }
}

@Suite struct ServerListenerTests {
    /// The listening socket shut down under the server (as happens when its descriptor is closed
    /// elsewhere and the number reused): accept fails with EINVAL. libuv's accept loop retried
    /// at once, forever, on the loop thread: nothing else on that loop ran again and stop()
    /// never returned. Now the loop stops accepting, says so once, and goes on serving.
    @Test func aBrokenListenerStopsAcceptingOnceAndTheLoopServesOn() throws {
        let told = Mutex<[String]>([])
        var config = HTTPServerConfiguration()
        config.onAcceptError = { message in told.withLock { $0.append(message) } }
        try withServer(config) { server in
            let early = try RawClient(port: server.localPort)
            try early.send("GET /before HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(early.readResponse()?.status == 200)
            let fd = try #require(listeningDescriptor(port: server.localPort), "the server's listening socket")
            #expect(shutdown(fd, Int32(SHUT_RDWR)) == 0)
            let deadline = Date().addingTimeInterval(10)
            while told.withLock({ $0.isEmpty }) && Date() < deadline { usleep(10_000) }
            // The loop still runs: the connection accepted before is answered.
            try early.send("GET /after HTTP/1.1\r\nHost: t\r\n\r\n")
            #expect(early.readResponse()?.text == "GET /after 0")
            let messages = told.withLock { $0 }
            #expect(messages.count == 1, "\(messages)")
            #expect(messages.first?.contains("listener broken (accept: Invalid argument)") == true, "\(messages)")
            #expect(server.metrics.acceptFailures == 1)
        }
    }

    /// The listener's number taken over by another socket (dup2 here; in the CI run a close by
    /// another test and a reuse): stopping the server must not close that socket.
    @Test func stopLeavesANumberThatNoLongerNamesTheListenerOpen() throws {
        let server = try HTTPServer(configuration: HTTPServerConfiguration(), handler: echoHandler)
        try server.start()
        let fd = try #require(listeningDescriptor(port: server.localPort), "the server's listening socket")
        var pair: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        try #require(dup2(pair[0], fd) == fd)
        defer { close(fd) }
        server.stop(grace: .milliseconds(500))
        var byte: UInt8 = 0x2a
        #expect(send(fd, &byte, 1, Int32(MSG_NOSIGNAL)) == 1, "the server closed descriptor \(fd), no longer its listener")
        #expect(recv(pair[1], &byte, 1, Int32(MSG_DONTWAIT)) == 1)
    }

    @Test func acceptFailuresAreClassified() {
        #expect(AcceptFailure(errno: EAGAIN) == .drained)
        for e in [EINTR, ECONNABORTED, EPROTO, ENETDOWN, EHOSTUNREACH, EPERM] { #expect(AcceptFailure(errno: e) == .retry, "\(e)") }
        for e in [EMFILE, ENFILE, ENOBUFS, ENOMEM] { #expect(AcceptFailure(errno: e) == .pause, "\(e)") }
        for e in [EBADF, EINVAL, ENOTSOCK, EOPNOTSUPP] { #expect(AcceptFailure(errno: e) == .broken, "\(e)") }
    }

    @Test func shortagesBackOffFrom10msTo1sAndStartOverAfterAnAccept() {
        var b = AcceptBackoff()
        let idle = b.succeeded()
        #expect(!idle)
        var pauses: [UInt64] = []
        var starts: [Bool] = []
        for _ in 0..<9 {
            let (ms, first) = b.failed()
            pauses.append(ms)
            starts.append(first)
        }
        #expect(pauses == [10, 20, 40, 80, 160, 320, 640, 1000, 1000])
        #expect(starts == [true] + Array(repeating: false, count: 8))
        let ended = b.succeeded(), endedAgain = b.succeeded()
        #expect(ended && !endedAgain)
        let again = b.failed()
        #expect(again.milliseconds == 10 && again.startsEpisode)
    }
}
