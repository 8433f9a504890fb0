// The HTTP/2 engine's own behaviour against mock-apns and other loopback servers: the server's
// stream limit, PING on idle connections and dead-connection detection, h2c, ALPN and
// certificate-name failures, IPv6 and host names.
import Foundation
import MockAPNs
import Synchronization
import Testing
@testable import PushClient

@Suite(.serialized) struct EngineTests {
    /// A server that never raises SETTINGS_MAX_CONCURRENT_STREAMS above 1: the client queues
    /// locally and never has two streams open (exceeding an acknowledged limit would be a
    /// connection error, and the mock would refuse or fail the extra streams).
    @Test func maxConcurrentStreamsOfOneIsRespected() throws {
        let rig = try MockRig(streams: (initial: 1, max: 1))
        let client = try rig.client(connections: 1)
        defer { client.shutdown() }
        let results = sendAll(client, (0..<40).map { push(index: UInt32($0)) })
        #expect(results.allSatisfy { $0.map(isDelivered) == true }, "\(results.filter { $0.map(isDelivered) != true })")
        #expect(client.engineStats.maxStreamsInFlight == 1)
        #expect(rig.mock.stats.connectionsSeen == 1)
        #expect(rig.mock.stats.byStatusReason.keys.allSatisfy { $0 == "200" })
    }

    /// APNs' pattern: 1 stream until the first valid token succeeds, then many. The client
    /// follows the raised limit on the same connection.
    /// Timeouts far above what 300 pushes take (0.1 s alone, 0.7 s sharing a core with six
    /// busy loops): at the rig's 5 s requestTimeout a stalled run put the connection on
    /// probation and PINGed it, and a PING unanswered for 10 s replaced it, which is not
    /// what this test is about.
    @Test func raisedLimitIsUsedOnTheSameConnection() throws {
        let rig = try MockRig(streams: (initial: 1, max: 1000))
        let client = try rig.client(connections: 1, requestTimeout: .seconds(60))
        defer { client.shutdown() }
        let results = sendAll(client, (0..<300).map { push(index: UInt32($0)) }, upTo: 120)
        #expect(results.allSatisfy { $0.map(isDelivered) == true }, "\(results.filter { $0.map(isDelivered) != true }.prefix(5))")
        #expect(client.engineStats.maxStreamsInFlight > 1)
        #expect(rig.mock.stats.connectionsSeen == 1)
    }

    /// An idle connection is PINGed every pingInterval; ACKs keep it in use.
    @Test func idleConnectionIsPingedAndKept() async throws {
        let rig = try MockRig()
        let client = try rig.client(pingInterval: .milliseconds(100))
        defer { client.shutdown() }
        #expect(isDelivered(await client.send(push())))
        #expect(eventually { client.engineStats.pingAcks >= 3 })
        #expect(isDelivered(await client.send(push())))
        let stats = client.engineStats
        #expect(stats.deadConnections == 0)
        #expect(stats.connectionsOpened == 1)
        #expect(rig.mock.stats.connectionsSeen == 1)
    }

    /// A connection that stops carrying bytes (black-holed between client and server) is found
    /// dead by an unanswered PING and replaced before the next push needs it: that push is
    /// delivered on a new connection instead of timing out on the dead one.
    @Test func unansweredPingReplacesTheConnection() async throws {
        let rig = try MockRig()
        let proxy = try FreezableProxy(targetPort: rig.mock.port)
        defer { proxy.close() }
        let client = try rig.client(requestTimeout: .seconds(3), pingInterval: .milliseconds(100),
                                    url: "https://127.0.0.1:\(proxy.port)")
        defer { client.shutdown() }
        #expect(isDelivered(await client.send(push())))
        proxy.freezeExisting()
        // pingTimeout is max(pingInterval, 1 s): the dead connection is noticed within ~1.1 s.
        #expect(eventually { client.engineStats.deadConnections >= 1 })
        let r = await client.send(push())
        #expect(isDelivered(r), "\(r)")
        #expect(proxy.connectionCount == 2)
        #expect(rig.mock.deliveries.count == 2)
    }

    @Test func cleartextHTTP2AgainstTheMock() throws {
        let rig = try MockRig(cleartext: true)
        let client = try rig.client(connections: 2)
        defer { client.shutdown() }
        let requests = (0..<50).map { push(index: UInt32($0)) }
        let results = sendAll(client, requests)
        #expect(results.allSatisfy { $0.map(isDelivered) == true })
        #expect(Set(rig.mock.deliveries.map(\.apnsID)) == Set(requests.map(\.apnsIDString)))
    }

    @Test func serverWithoutHTTP2IsAClearTransportFailure() async throws {
        let server = try NoALPNServer()
        defer { server.stop() }
        let dir = try TempDir()
        let client = try PushClient(configuration: .init(environment: .custom(url: "https://127.0.0.1:\(server.port)"),
                                                         credentials: try tokenCredentials(dir), caFile: server.caFile,
                                                         requestTimeout: .seconds(5)))
        defer { client.shutdown() }
        let r = await client.send(push())
        guard case .transportFailure(let m) = r else { Issue.record("expected a transport failure, got \(r)"); return }
        #expect(m.contains("ALPN") && m.contains("HTTP/2"), "\(m)")
    }

    @Test func certificateForAnotherHostIsRejected() async throws {
        let rig = try MockRig(tlsFault: .wrongHost)
        let client = try rig.client()
        defer { client.shutdown() }
        let r = await client.send(push())
        guard case .transportFailure(let m) = r else { Issue.record("expected a TLS failure, got \(r)"); return }
        #expect(m.contains("certificate") && m.lowercased().contains("mismatch"), "\(m)")
        #expect(rig.mock.deliveries.isEmpty)
    }

    @Test func certificateFromAnUntrustedCAIsRejected() async throws {
        let rig = try MockRig(tlsFault: .untrusted)
        let client = try rig.client()
        defer { client.shutdown() }
        let r = await client.send(push())
        guard case .transportFailure(let m) = r else { Issue.record("expected a TLS failure, got \(r)"); return }
        #expect(m.contains("certificate"), "\(m)")
        #expect(rig.mock.deliveries.isEmpty)
    }

    /// Host names go through getaddrinfo, SNI and DNS-name verification; IPv6 literals through
    /// brackets and IP verification.
    @Test func hostNameAndIPv6Literal() async throws {
        let v4 = try MockRig()
        let byName = try v4.client(url: "https://localhost:\(v4.mock.port)")
        defer { byName.shutdown() }
        let named = await byName.send(push())
        #expect(isDelivered(named), "\(named)")

        let v6 = try MockRig(host: "::1")
        let client = try v6.client(url: "https://[::1]:\(v6.mock.port)")
        defer { client.shutdown() }
        let r = await client.send(push())
        #expect(isDelivered(r), "\(r)")
        #expect(v6.mock.deliveries.count == 1)
    }

    /// Certificate auth: the mock asks for a client certificate (UID = bundle ID) and then needs
    /// no provider token; the client presents the PEM chain and key, also when the key is
    /// encrypted (passphrase).
    @Test func certificateAuthWithPlainAndEncryptedKey() async throws {
        let rig = try MockRig(clientCertificateFor: bundle)
        let cert = rig.dir.file("client.pem"), key = rig.dir.file("client.key")
        func client(key: String, passphrase: String?) throws -> PushClient {
            try PushClient(configuration: .init(environment: .custom(url: rig.url),
                                                credentials: .certificate(certificatePath: cert, privateKeyPath: key, passphrase: passphrase),
                                                caFile: rig.dir.file("ca.pem")))
        }
        let plain = try client(key: key, passphrase: nil)
        defer { plain.shutdown() }
        let r = await plain.send(push())
        #expect(isDelivered(r), "\(r)")
        #expect(rig.mock.deliveries.count == 1)

        let encrypted = rig.dir.file("client-enc.key")
        let out = try run("openssl", ["pkey", "-in", key, "-aes256", "-passout", "pass:s3cret", "-out", encrypted])
        #expect(out.status == 0, "\(out.output)")
        let locked = try client(key: encrypted, passphrase: "s3cret")
        defer { locked.shutdown() }
        let r2 = await locked.send(push())
        #expect(isDelivered(r2), "\(r2)")
        #expect(throws: PushClientError.self) { try client(key: encrypted, passphrase: "wrong") }
        #expect(throws: PushClientError.self) { try client(key: rig.dir.file("missing.key"), passphrase: nil) }
    }

    /// PKCS#12 (.p12, as Keychain Access exports a push certificate): certificate and key from
    /// one file, its password as the passphrase; a wrong password fails at init, naming the file.
    @Test func certificateAuthFromAPKCS12File() async throws {
        let rig = try MockRig(clientCertificateFor: bundle)
        let p12 = rig.dir.file("push.p12")
        let out = try run("openssl", ["pkcs12", "-export", "-in", rig.dir.file("client.pem"), "-inkey", rig.dir.file("client.key"),
                                      "-passout", "pass:p12-pass", "-out", p12])
        #expect(out.status == 0, "\(out.output)")
        func client(_ passphrase: String?) throws -> PushClient {
            try PushClient(configuration: .init(environment: .custom(url: rig.url),
                                                credentials: .certificate(certificatePath: p12, privateKeyPath: "", passphrase: passphrase),
                                                caFile: rig.dir.file("ca.pem")))
        }
        let c = try client("p12-pass")
        defer { c.shutdown() }
        let r = await c.send(push())
        #expect(isDelivered(r), "\(r)")
        #expect(rig.mock.deliveries.count == 1)
        do {
            _ = try client("wrong")
            Issue.record("a wrong PKCS#12 password was accepted")
        } catch let e as PushClientError {
            #expect("\(e)".contains("push.p12") && "\(e)".contains("PKCS#12"), "\(e)")
        }
    }
}
