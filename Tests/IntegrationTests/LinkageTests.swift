// relay-server must not link Foundation (with ICU) or libcurl: together they cost ~7 MB of
// resident memory per process (docs/storage.md, "Memory"). One Foundation-only call in any
// module relay-server depends on would bring them back silently, so the linkage is a test.
import Foundation
import Testing

@Suite struct LinkageTests {
    @Test func relayServerLinksNeitherFoundationNorICUNorLibcurl() throws {
        let binary = relayBinary("relay-server")
        let ldd = try Relayctl.runTool("/usr/bin/ldd", [binary])
        #expect(ldd.status == 0, "\(ldd.output)")
        let libraries = ldd.output.split(separator: "\n").compactMap { $0.split(whereSeparator: { $0 == " " || $0 == "\t" }).first.map(String.init) }
        #expect(libraries.contains("libFoundationEssentials.so"), "\(ldd.output)")   // proves the parsing saw the list
        for unwanted in ["libFoundation.so", "libFoundationInternationalization.so", "lib_FoundationICU.so", "libFoundationNetworking.so"] {
            #expect(!libraries.contains(unwanted), "\(unwanted) linked:\n\(ldd.output)")
        }
        #expect(!libraries.contains { $0.hasPrefix("libcurl") }, "\(ldd.output)")
    }
}
