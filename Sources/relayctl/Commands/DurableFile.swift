// Durable replace for relayctl's state files (they hold keys and ratchet positions).
import Basics
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Writes `data` to `path`.tmp (mode 0600), fsyncs it, renames it over `path` and fsyncs the
/// directory: after a crash the file holds either the old or the new contents, and the new ones
/// are durable before anything that depends on them is sent.
func replaceFileDurably(_ path: String, _ data: Data) throws {
    let dir = (path as NSString).deletingLastPathComponent
    let tmp = path + ".tmp"
    let fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw RuntimeFailure("cannot write \(tmp): \(String(cString: strerror(errno)))") }
    let writeError = data.withUnsafeBytes { FileDescriptor.writeAll(fd, $0) }
    let synced = fsync(fd)
    let syncError = errno
    close(fd)
    if let e = writeError ?? (synced == 0 ? nil : syncError) {
        throw RuntimeFailure("cannot write \(tmp): \(String(cString: strerror(e)))")
    }
    guard rename(tmp, path) == 0 else { throw RuntimeFailure("cannot rename \(tmp): \(String(cString: strerror(errno)))") }
    let dfd = open(dir.isEmpty ? "." : dir, O_RDONLY | O_DIRECTORY)
    if dfd >= 0 { _ = fsync(dfd); close(dfd) }
}
