// The only file that calls libsystemd: sd_notify (READY=1, STOPPING=1, WATCHDOG=1, STATUS=...)
// and sd_watchdog_enabled. Without NOTIFY_SOCKET every call is a no-op, as systemd documents.
import Dispatch
import FoundationEssentials
import Glibc
import POSIXThreads
internal import CSystemd

public enum SystemdNotifier {
    /// True when started by systemd with Type=notify (NOTIFY_SOCKET set).
    public static var isSupervised: Bool { ProcessInfo.processInfo.environment["NOTIFY_SOCKET"] != nil }

    /// Sends `state` (e.g. "READY=1\nSTATUS=listening"). Returns false when systemd is absent or
    /// the datagram could not be sent; the relay keeps running either way.
    @discardableResult
    public static func notify(_ state: String) -> Bool {
        guard isSupervised else { return false }
        return csd_notify(state) > 0
    }

    /// Watchdog interval requested by the unit's WatchdogSec (WATCHDOG_USEC), if any.
    public static func watchdogInterval() -> Duration? {
        var usec: UInt64 = 0
        let rc = sd_watchdog_enabled(0, &usec)
        guard rc > 0, usec > 0 else { return nil }
        return .microseconds(Int64(usec))
    }
}

/// Pings the systemd watchdog at half its interval while `healthy()` holds, so a wedged
/// dispatcher or writer gets the process restarted.
public final class WatchdogPinger: Lifecycle, @unchecked Sendable {
    // @unchecked Sendable: `stopped` and `started` are only touched under `condition`.
    private let condition = Condition()
    private var stopped = false
    private var started = false
    private let done = DispatchSemaphore(value: 0)
    private let half: Double
    private let healthy: @Sendable () -> Bool

    /// nil when the unit asks for no watchdog (no WatchdogSec).
    public init?(healthy: @escaping @Sendable () -> Bool) {
        guard let interval = SystemdNotifier.watchdogInterval() else { return nil }
        half = Double(interval.components.seconds) / 2 + Double(interval.components.attoseconds) / 2e18
        self.healthy = healthy
    }

    public func start() {
        let go = condition.withLock {
            guard !started && !stopped else { return false }
            started = true
            return true
        }
        guard go else { return }
        let t = OSThread { [self] in
            while true {
                condition.lock()
                if !stopped { _ = condition.wait(until: Date().addingTimeInterval(half)) }
                let stop = stopped
                condition.unlock()
                if stop { break }
                if healthy() { SystemdNotifier.notify("WATCHDOG=1") }
            }
            done.signal()
        }
        t.name = "relay-watchdog"
        t.start()
    }

    /// Wakes the thread and waits for it (`grace` is not needed: a ping is one datagram).
    public func stop(grace: Duration = .zero) {
        condition.lock()
        let wasStarted = started && !stopped
        stopped = true
        condition.signal()
        condition.unlock()
        if wasStarted { done.wait() }
    }
}
