// WAL checkpoints off the 202's path. The writer connection never checkpoints inside a COMMIT
// (its WAL hook replaces wal_autocheckpoint and only counts frames); this thread, on its own
// connection, copies WAL pages into the database file in PASSIVE checkpoints, so a page changed
// by many commits is written to the database once, and the database file's fsync no longer
// holds up the clients of the batch that crossed a threshold. What only the writer can do
// happens between its batches, after their 202s are out: the last few frames' copy that lets
// its next transaction start the WAL over (so the file stops growing), and a PASSIVE checkpoint
// of its own when the WAL passes the hard limit. Durability is SQLite's: every checkpoint syncs
// the WAL before and the database file after copying (synchronous as the writer's), and a WAL
// is only reused once all of it is in the synced database file. docs/storage.md "Checkpoints".
import Dispatch
import FoundationEssentials
import POSIXThreads
import Synchronization

/// Thresholds of the background checkpoints, in WAL frames (one page each).
public struct SQLiteCheckpointPolicy: Sendable, Equatable {
    /// Frames not yet in the database file that start a background pass.
    public var passivePages = 1024
    /// WAL size from which the checkpointer catches up and has the writer restart the WAL.
    /// Small on purpose: every commit appends its hot pages again, and SQLite's lookup of a page
    /// in the WAL walks all of that page's entries (docs/storage.md "Checkpoints").
    public var restartPages = 1024
    /// Frames the writer copies itself to restart the WAL (the checkpointer catches up first).
    public var restartResiduePages = 256
    /// WAL size from which the writer checkpoints itself between batches (the checkpointer is
    /// failing, or a reader pins the WAL); commits continue either way.
    public var hardLimitPages = 65536
    /// A pass after this long without a commit, when the WAL holds frames not yet copied.
    public var idleMillis: Int64 = 250

    public init() {}

    public init(passivePages: Int, restartPages: Int, restartResiduePages: Int, hardLimitPages: Int, idleMillis: Int64) {
        self.passivePages = passivePages
        self.restartPages = restartPages
        self.restartResiduePages = restartResiduePages
        self.hardLimitPages = hardLimitPages
        self.idleMillis = idleMillis
    }
}

final class SQLiteCheckpointer: @unchecked Sendable {
    // @unchecked Sendable: `db` and the pass bookkeeping (`backfilled`, `lastPassFrames`, ...)
    // are used only by the checkpointer thread, and by `stop()` after that thread has exited
    // (`exited` orders it); everything the writer thread touches is an Atomic or under `wake`.
    private let db: SQLiteDatabase
    let policy: SQLiteCheckpointPolicy
    private let logger: RelayLogger?
    private let wake = Condition()
    private let exited = DispatchSemaphore(value: 0)
    private var stopping = false       // under `wake`
    private var started = false        // under `wake`

    // Written by the writer thread (WAL hook, between batches), read by the checkpointer.
    private let walFrames = Atomic<Int>(0)
    private let commits = Atomic<Int>(0)
    private let wakeAt = Atomic<Int>(0)
    private let restartWanted = Atomic<Bool>(false)
    private let writerLastAt = Atomic<Int>(0)    // writer thread only; Atomic for Sendable
    private let overHardLimit = Atomic<Bool>(false)
    /// Set by the checkpointer when everything is copied and it sleeps until the next commit.
    private let sleepsUntilCommit = Atomic<Bool>(false)

    // /metrics.
    private let passes = Atomic<Int>(0)
    private let writerCheckpoints = Atomic<Int>(0)
    private let restarts = Atomic<Int>(0)
    private let failures = Atomic<Int>(0)
    private let steps = Atomic<Int>(0)

    // Checkpointer thread only.
    private var backfilled = 0
    private var stuckAt = 0
    private var lastPassFrames = -1
    private var lastSeenCommits = 0
    private var lastCommitSeenAt: Int64 = 0
    private var idleTicks = 0
    private var chase = true   // the first step checkpoints what a previous run left
    private var failureStreak = 0

    /// Opens the checkpointer's own connection (busy timeout 0: a checkpoint that meets a lock
    /// gives up at once and is tried again later, it never makes anyone wait).
    init(path: String, synchronous: SQLiteStoreOptions.Synchronous, policy: SQLiteCheckpointPolicy, logger: RelayLogger?) throws {
        db = try SQLiteDatabase(path: path, busyTimeoutMillis: 0)
        // The checkpoint's syncs follow this connection's level: never below the writer's.
        try db.execute("PRAGMA synchronous=\(synchronous.rawValue)")
        self.policy = policy
        self.logger = logger
        wakeAt.store(policy.passivePages, ordering: .relaxed)
    }

    // MARK: writer thread

    /// The writer's WAL hook: called after each of its COMMITs with the WAL's frame count.
    func committed(walFrames frames: Int) {
        let before = walFrames.exchange(frames, ordering: .relaxed)
        commits.add(1, ordering: .sequentiallyConsistent)
        if sleepsUntilCommit.exchange(false, ordering: .sequentiallyConsistent) {
            wake.withLock { wake.signal() }
        }
        if frames < before {
            restarts.add(1, ordering: .relaxed)   // this commit started the WAL over
            wakeAt.store(policy.passivePages, ordering: .relaxed)
            overHardLimit.store(false, ordering: .relaxed)
        }
        if frames >= wakeAt.load(ordering: .relaxed) {
            wakeAt.store(Int.max, ordering: .relaxed)   // one signal per crossing
            wake.withLock { wake.signal() }
        }
    }

    /// Called on the writer thread between batches (its connection outside any transaction):
    /// copies the WAL's last frames when the checkpointer asked for a restart, or checkpoints
    /// when the WAL is past the hard limit (at most once per `passivePages` new frames).
    func betweenBatches(_ writer: SQLiteDatabase) {
        let frames = walFrames.load(ordering: .relaxed)
        var due = restartWanted.exchange(false, ordering: .relaxed)
        if frames >= policy.hardLimitPages && frames >= writerLastAt.load(ordering: .relaxed) + policy.passivePages {
            due = true
            if !overHardLimit.exchange(true, ordering: .relaxed) {
                logger?.warning("the SQLite WAL passed its hard limit: the writer checkpoints itself; a long read transaction (relayctl, a backup) may keep the WAL from being reused",
                                ["walFrames": frames, "hardLimitPages": policy.hardLimitPages])
            }
        }
        guard due else { return }
        writerLastAt.store(frames, ordering: .relaxed)
        do {
            _ = try writer.checkpoint(.passive)
            writerCheckpoints.add(1, ordering: .relaxed)
        } catch {
            failures.add(1, ordering: .relaxed)
            logger?.error("SQLite checkpoint by the writer failed (the WAL keeps every committed row; retried later)", ["error": "\(error)"])
        }
    }

    // MARK: checkpointer thread

    func start() {
        wake.withLock { started = true }
        let t = OSThread { [self] in
            while !isStopping { step() }
            exited.signal()
        }
        t.name = "relay-checkpoint"
        t.start()
    }

    private var isStopping: Bool { wake.withLock { stopping } }

    /// One decision: a pass when enough frames wait (or the WAL is idle, or the restart needs
    /// the checkpointer to catch up), else sleep until the writer's hook or the idle tick.
    private func step() {
        steps.add(1, ordering: .relaxed)
        // The commit count before the frame count: the hook publishes frames, then the count, so
        // a count read here comes with its frames (a sleep below waits only for later commits).
        let seen = commits.load(ordering: .sequentiallyConsistent)
        let frames = walFrames.load(ordering: .relaxed)
        if frames < max(backfilled, stuckAt) { (backfilled, stuckAt) = (0, 0) }   // the WAL was started over
        // Frames a pass could copy. After a pass that copied nothing (a reader holds them),
        // only frames written since count: no loop of empty passes.
        let floor = max(backfilled, stuckAt)
        let waiting = frames - floor
        let now = monotonicMicros()
        if seen != lastSeenCommits { (lastSeenCommits, lastCommitSeenAt) = (seen, now) }
        let idle = now - lastCommitSeenAt >= policy.idleMillis * 1000
        // Idle: once per new frame count, and again every few ticks (a reader that pinned the
        // WAL may have left), never in a loop.
        let idlePass = idle && frames > backfilled && (frames != lastPassFrames || idleTicks >= 4)
        if chase || waiting >= policy.passivePages || idlePass {
            idleTicks = 0
            pass(frames: frames)
            return
        }
        idleTicks += 1
        let threshold = floor + policy.passivePages
        // Everything copied: nothing to do until a commit, so no idle ticks meanwhile.
        let quiet = frames <= backfilled
        wake.lock()
        defer { wake.unlock() }
        wakeAt.store(threshold, ordering: .relaxed)
        // Checked under the lock the hook signals under: a crossing after the load above is
        // either seen here or wakes the wait.
        if stopping || walFrames.load(ordering: .relaxed) >= threshold { return }
        if quiet {
            // Flag first, then look for a commit since `seen`: the hook bumps the count before
            // it reads the flag, so either this sees the commit or the hook signals.
            sleepsUntilCommit.store(true, ordering: .sequentiallyConsistent)
            if commits.load(ordering: .sequentiallyConsistent) == seen { wake.wait() }
            sleepsUntilCommit.store(false, ordering: .sequentiallyConsistent)
            return
        }
        _ = wake.wait(until: Date().addingTimeInterval(Double(policy.idleMillis) / 1000))
    }

    private func pass(frames: Int) {
        let before = backfilled
        lastPassFrames = frames
        do {
            let r = try db.checkpoint(.passive)
            failureStreak = 0
            passes.add(1, ordering: .relaxed)
            guard r.walFrames >= 0, r.backfilled >= 0 else { chase = false; return }
            stuckAt = r.backfilled > before ? 0 : max(frames, r.walFrames)
            backfilled = r.backfilled
            // The first pass finds the WAL a previous run left; later the writer's hook counts.
            if r.walFrames > 0 { _ = walFrames.compareExchange(expected: 0, desired: r.walFrames, ordering: .relaxed) }
            // Past the restart size: catch up while each pass makes progress, then leave the
            // last frames (and the restart that only the writer can do) to the writer.
            if r.walFrames >= policy.restartPages && !r.busy {
                if r.walFrames - r.backfilled <= policy.restartResiduePages {
                    restartWanted.store(true, ordering: .relaxed)
                    chase = false
                } else {
                    chase = r.backfilled > before
                }
            } else {
                chase = false
            }
            if r.busy { sleep(millis: 5) }   // another connection's checkpoint: let it finish
        } catch {
            failures.add(1, ordering: .relaxed)
            chase = false
            failureStreak += 1
            if failureStreak == 1 || failureStreak % 20 == 0 {
                logger?.error("SQLite checkpoint failed (the WAL keeps every committed row; retrying)",
                              ["error": "\(error)", "consecutiveFailures": failureStreak])
            }
            // 50 ms, doubling up to 5 s: a full disk is not hammered, a transient error heals fast.
            sleep(millis: min(5000, 50 << min(failureStreak - 1, 7)))
        }
    }

    private func sleep(millis: Int64) {
        wake.lock()
        defer { wake.unlock() }
        if !stopping { _ = wake.wait(until: Date().addingTimeInterval(Double(millis) / 1000)) }
    }

    /// Stops the thread, then (the writer closed first, so nothing writes meanwhile) copies the
    /// whole WAL into the database file and truncates it, when no other connection is in the
    /// way. Safe to call more than once.
    func stop() {
        let wasStarted: Bool = wake.withLock {
            let s = started && !stopping
            stopping = true
            wake.broadcast()
            return s
        }
        guard wasStarted else { return }
        exited.wait()
        do {
            let r = try db.checkpoint(.truncate)
            if r.busy { logger?.info("SQLite WAL left for the next start: another connection is using it", ["walFrames": r.walFrames]) }
        } catch {
            logger?.error("SQLite checkpoint at shutdown failed (the WAL keeps every committed row; the next start recovers it)", ["error": "\(error)"])
        }
    }

    // MARK: observability

    struct Stats: Equatable {
        var walFrames, passes, writerCheckpoints, restarts, failures: Int
        /// Turns of the checkpointer's loop (tests: an idle store's thread sleeps).
        var steps = 0
    }

    var stats: Stats {
        Stats(walFrames: walFrames.load(ordering: .relaxed), passes: passes.load(ordering: .relaxed),
              writerCheckpoints: writerCheckpoints.load(ordering: .relaxed), restarts: restarts.load(ordering: .relaxed),
              failures: failures.load(ordering: .relaxed), steps: steps.load(ordering: .relaxed))
    }

    func collectMetrics(into r: inout PrometheusRegistry) {
        let s = stats
        r.gauge("relay_store_wal_frames", help: "Frames (pages) in the SQLite WAL after the writer's last commit.", s.walFrames)
        r.declare("relay_store_checkpoints_total", .counter,
                  help: "SQLite checkpoints run, by who ran them (the writer only to restart the WAL or past its hard limit).")
        r.sample("relay_store_checkpoints_total", ["by": "checkpointer"], s.passes)
        r.sample("relay_store_checkpoints_total", ["by": "writer"], s.writerCheckpoints)
        r.counter("relay_store_checkpoint_failures_total",
                  help: "SQLite checkpoints that failed (I/O errors; retried, the WAL keeps the rows).", s.failures)
        r.counter("relay_store_wal_restarts_total", help: "Times the writer started the SQLite WAL over from its beginning.", s.restarts)
    }
}
