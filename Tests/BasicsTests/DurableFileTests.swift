import Foundation
import Testing
@testable import Basics

/// A fresh directory with a victim file outside it, as an attacker's link would point at.
private struct Scratch {
    let dir: String
    let victim: String

    init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("durable-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        victim = dir + "-victim"
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: dir)
        try? FileManager.default.removeItem(atPath: victim)
    }

    func contents(_ path: String) -> String? { FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) } }
    func names() throws -> [String] { try FileManager.default.contentsOfDirectory(atPath: dir).sorted() }
    func link(_ name: String, to target: String) throws { try FileManager.default.createSymbolicLink(atPath: dir + "/" + name, withDestinationPath: target) }
    func mode(_ path: String) throws -> Int { try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int ?? -1 }
}

@Suite struct DurableFileTests {
    @Test func replaceCreatesThenReplacesMode0600AndLeavesNoTemporary() throws {
        let s = try Scratch()
        defer { s.remove() }
        let path = s.dir + "/state.json"
        try DurableFile.replace(path, with: Array("one".utf8))
        #expect(s.contents(path) == "one")
        #expect(try s.mode(path) == 0o600)
        try DurableFile.replace(path, with: Array("two".utf8))
        #expect(s.contents(path) == "two")
        #expect(try s.names() == ["state.json"])
    }

    @Test("a symbolic link at the target is refused, to an existing file or to none; the link's target is not written")
    func replaceRefusesALinkAtTheTarget() throws {
        let s = try Scratch()
        defer { s.remove() }
        try s.link("state.json", to: s.victim)   // dangling
        #expect(throws: DurableFile.Failure("\(s.dir)/state.json is a symbolic link; refusing to replace it (give the file's own path)")) {
            try DurableFile.replace(s.dir + "/state.json", with: Array("secret".utf8))
        }
        #expect(!FileManager.default.fileExists(atPath: s.victim))
        try Data("victim".utf8).write(to: URL(fileURLWithPath: s.victim))
        #expect(throws: DurableFile.Failure.self) { try DurableFile.replace(s.dir + "/state.json", with: Array("secret".utf8)) }
        #expect(s.contents(s.victim) == "victim")
        #expect(try s.names() == ["state.json"], "the link stays, no temporary is left")
    }

    @Test("a symbolic link at the temporary name is refused (O_EXCL|O_NOFOLLOW); its target is neither created nor written")
    func replaceRefusesALinkAtTheTemporaryName() throws {
        let s = try Scratch()
        defer { s.remove() }
        let path = s.dir + "/state.json"
        try s.link("state.json.tmp-x", to: s.victim)
        #expect(throws: DurableFile.Failure("\(path).tmp-x is a symbolic link; refusing to create a file through it")) {
            try DurableFile.replace(path, with: Array("secret".utf8), mode: 0o600, temporary: path + ".tmp-x")
        }
        #expect(!FileManager.default.fileExists(atPath: s.victim))
        try Data("victim".utf8).write(to: URL(fileURLWithPath: s.victim))
        #expect(throws: DurableFile.Failure.self) { try DurableFile.replace(path, with: Array("secret".utf8), mode: 0o600, temporary: path + ".tmp-x") }
        #expect(s.contents(s.victim) == "victim")
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    @Test func createNewRefusesAnyExistingName() throws {
        let s = try Scratch()
        defer { s.remove() }
        let fresh = s.dir + "/new.db"
        let fd = try DurableFile.createNew(fresh)
        close(fd)
        #expect(try s.mode(fresh) == 0o600)
        #expect(throws: DurableFile.Failure("\(fresh) exists; refusing to overwrite it")) { _ = try DurableFile.createNew(fresh) }
        try s.link("link.db", to: s.victim)
        #expect(throws: DurableFile.Failure("\(s.dir)/link.db is a symbolic link; refusing to create a file through it")) {
            _ = try DurableFile.createNew(s.dir + "/link.db")
        }
        #expect(!FileManager.default.fileExists(atPath: s.victim))
        #expect(throws: DurableFile.Failure.self) { _ = try DurableFile.createNew(s.dir + "/no/such/dir/x") }
    }

    @Test func directoryOfAPath() {
        #expect(DurableFile.directory(of: "a/b/c") == "a/b")
        #expect(DurableFile.directory(of: "/c") == "/")
        #expect(DurableFile.directory(of: "c") == ".")
    }
}
