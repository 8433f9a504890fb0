// OpenSSL's per-thread error queue, turned into text once for every module that reports
// OpenSSL failures (each wraps the text in its own error type).
internal import COpenSSL

/// A failed OpenSSL call: the operation and what OpenSSL queued about it (nil: nothing).
package struct OpenSSLFailure: Error, Equatable, CustomStringConvertible {
    package let operation: String
    package let detail: String?

    package init(operation: String, detail: String?) {
        self.operation = operation
        self.detail = detail
    }

    /// Drains the queue into a failure of `operation`.
    package static func drained(_ operation: String) -> OpenSSLFailure {
        let text = OpenSSLErrors.drain()
        return OpenSSLFailure(operation: operation, detail: text.isEmpty ? nil : text)
    }

    /// "operation: detail", or "operation failed" when OpenSSL queued nothing.
    package var description: String { detail.map { "\(operation): \($0)" } ?? "\(operation) failed" }
}

package enum OpenSSLErrors {
    /// Every queued error, oldest first, "; "-separated; `ifNone` when the queue was empty.
    package static func drain(ifNone: String = "") -> String {
        var buffer = [CChar](repeating: 0, count: 1024)
        guard cossl_drain_errors(&buffer, buffer.count) > 0 else { return ifNone }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Forgets queued errors (before a call whose failure is an answer, or after one).
    package static func clear() { ERR_clear_error() }
}
