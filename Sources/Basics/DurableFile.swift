// Files relayctl and relay-server create: never through a symbolic link, never over a file
// that is already there unless replacing it is the point, and durable before they are used.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public enum DurableFile {
    public struct Failure: Error, CustomStringConvertible, Equatable {
        public let description: String
        public init(_ description: String) { self.description = description }
    }

    /// Creates `path`, which must not exist in any form: O_CREAT|O_EXCL|O_NOFOLLOW, so a file,
    /// a symbolic link (dangling or not) or anything else at the name is refused and nothing is
    /// written through it. Returns the open descriptor (write-only); the caller closes it.
    public static func createNew(_ path: String, mode: mode_t = 0o600) throws(Failure) -> Int32 {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
        guard fd >= 0 else {
            let e = errno
            if e == EEXIST {
                throw Failure(isSymbolicLink(path) ? "\(path) is a symbolic link; refusing to create a file through it"
                                                   : "\(path) exists; refusing to overwrite it")
            }
            throw Failure("cannot create \(path): \(errorText(e))")
        }
        return fd
    }

    /// Writes `bytes` to a new temporary file beside `path` (created as `createNew` does), fsyncs
    /// it, renames it over `path` and fsyncs the directory: after a crash `path` holds the old or
    /// the new contents, and the new ones are on disk before this returns. A symbolic link at
    /// `path` is refused; rename(2) replaces the name itself, so a link planted meanwhile is
    /// replaced, never written through.
    public static func replace(_ path: String, with bytes: [UInt8], mode: mode_t = 0o600) throws(Failure) {
        try replace(path, with: bytes, mode: mode, temporary: path + ".tmp-" + Hex.encode(randomSuffix()))
    }

    /// `temporary`: the name written first (tests choose it to plant a link there).
    static func replace(_ path: String, with bytes: [UInt8], mode: mode_t, temporary: String) throws(Failure) {
        if isSymbolicLink(path) { throw Failure("\(path) is a symbolic link; refusing to replace it (give the file's own path)") }
        let fd = try createNew(temporary, mode: mode)
        let writeError = FileDescriptor.writeAll(fd, bytes)
        let synced = writeError == nil ? fsync(fd) : 0
        let syncError = errno
        close(fd)
        if let e = writeError ?? (synced == 0 ? nil : syncError) {
            unlink(temporary)
            throw Failure("cannot write \(temporary): \(errorText(e))")
        }
        guard rename(temporary, path) == 0 else {
            let e = errno
            unlink(temporary)
            throw Failure("cannot rename \(temporary) to \(path): \(errorText(e))")
        }
        try syncDirectory(of: path)
    }

    /// fsync of the directory holding `path`, so a create or rename in it survives a crash.
    public static func syncDirectory(of path: String) throws(Failure) {
        let dir = directory(of: path)
        let dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw Failure("cannot open directory \(dir) to sync it: \(errorText(errno))") }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw Failure("cannot sync directory \(dir): \(errorText(errno))") }
    }

    /// True when the name itself is a symbolic link (lstat: the link, not its target).
    public static func isSymbolicLink(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFLNK
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    private static func randomSuffix() -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<8).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    private static func errorText(_ e: Int32) -> String { String(cString: strerror(e)) }
}
