import Foundation
import Testing
@testable import RelayCore

/// listen.proxyProtocol and ingest.trustedProxies: parsed, checked against each other, and
/// every mistake named by its key.
@Suite struct ProxyConfigTests {
    func parse(listen: String = "", ingest: String = "") throws -> RelayConfig {
        let json = ConfigTests.minimal.replacingOccurrences(of: #"{"apps""#, with: #"{"listen":{\#(listen)},"ingest":{\#(ingest)},"apps""#)
        return try RelayConfig.parse(Array(json.utf8))
    }

    @Test func onWithTrustedProxies() throws {
        let c = try parse(listen: #""proxyProtocol":true"#, ingest: #""trustedProxies":["10.0.0.0/8","2001:db8::/32","192.0.2.7"]"#)
        #expect(c.listen.proxyProtocol)
        #expect(c.ingest.trustedProxies == ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"])
        let off = try parse()
        #expect(!off.listen.proxyProtocol && off.ingest.trustedProxies.isEmpty)
    }

    @Test(arguments: [
        (#""proxyProtocol":true"#, "", "ingest.trustedProxies"),
        (#""proxyProtocol":true"#, #""trustedProxies":[]"#, "ingest.trustedProxies"),
        ("", #""trustedProxies":["10.0.0.0/8"]"#, "ingest.trustedProxies"),
        (#""proxyProtocol":true"#, #""trustedProxies":["10.0.0.0/8","10.0.0.0/33"]"#, "ingest.trustedProxies[1]"),
        (#""proxyProtocol":true"#, #""trustedProxies":["lb.example"]"#, "ingest.trustedProxies[0]"),
        (#""proxyProtocol":true"#, #""trustedProxies":[10]"#, "ingest.trustedProxies[0]"),
        (#""proxyProtocol":true"#, #""trustedProxies":"10.0.0.0/8""#, "ingest.trustedProxies"),
        (#""proxyProtocol":"yes""#, #""trustedProxies":["10.0.0.0/8"]"#, "listen.proxyProtocol"),
    ])
    func mistakesNameTheirKey(listen: String, ingest: String, key: String) {
        do {
            _ = try parse(listen: listen, ingest: ingest)
            Issue.record("accepted: \(listen) \(ingest)")
        } catch let e as ConfigError {
            #expect(e.key == key, "\(e)")
        } catch {
            Issue.record("\(error)")
        }
    }
}
