// The one write-all loop: every byte, across short writes and EINTR.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public enum FileDescriptor {
    /// Writes all of `bytes` to `fd`, retrying short writes and EINTR. Nil when everything was
    /// written, else the errno of the failing write (EIO if write returned 0 for a non-empty
    /// buffer, which would otherwise loop forever).
    @discardableResult
    public static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Int32? {
        writeAll(fd, bytes, using: { fd, p, n in write(fd, p, n) })
    }

    @discardableResult
    public static func writeAll(_ fd: Int32, _ text: String) -> Int32? {
        var text = text
        return text.withUTF8 { writeAll(fd, UnsafeRawBufferPointer($0)) }
    }

    @discardableResult
    public static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Int32? {
        bytes.withUnsafeBytes { writeAll(fd, $0) }
    }

    /// The loop, with the syscall injectable so tests can return EINTR and short counts.
    static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer,
                         using write: (Int32, UnsafeRawPointer, Int) -> Int) -> Int32? {
        guard let base = bytes.baseAddress else { return nil }
        var done = 0
        while done < bytes.count {
            let n = write(fd, base + done, bytes.count - done)
            if n > 0 {
                done += n
            } else if n == 0 {
                return EIO
            } else {
                let e = errno
                if e == EINTR { continue }
                return e
            }
        }
        return nil
    }
}
