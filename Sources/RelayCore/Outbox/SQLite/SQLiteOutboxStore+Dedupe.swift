// SQLiteOutboxStore: the dedupe key's index (schema v6, docs/storage.md "Dedupe index").
// A key (app, push token, session, key id, message index; the app since v7) is found through a
// 64-bit keyed hash `h` whose high half hashes the token alone (a token's rows, whatever their
// app, are one range of h). Keys of rows up
// to `merged_through` are in `response_keys (h, id_high)`; the younger ones (the tail) are kept
// in memory by the one ingesting store and merged into the table in large sorted batches, in
// a transaction of their own, so an ingest COMMIT only appends. Every hash match is verified
// against the row itself, so a collision or a stale entry never decides alone.
import Basics
import FoundationEssentials
import Glibc
import POSIXThreads

/// The dedupe index's keyed hash.
typealias KeyedHash = SipHash24

/// A dedupe hash for tests (forced collisions): its high 32 bits must depend on the token only.
public typealias DedupeHashFunction = @Sendable (_ app: String, _ pushToken: String, _ sessionID: String, _ keyID: [UInt8], _ messageIndex: UInt32) -> Int64

/// h of a key under the database's SipHash key (outbox_stats.dedupe_key). Writer thread only.
final class DedupeHasher {
    private let mac: KeyedHash
    private let override: DedupeHashFunction?

    init(key: [UInt8], override: DedupeHashFunction?) throws {
        guard let mac = KeyedHash(key: key) else {
            throw StoreError.invalid("cannot set up the dedupe hash (SipHash-2-4 needs a 16-byte key; the key has \(key.count) bytes)")
        }
        self.mac = mac
        self.override = override
    }

    /// The key's encoding: each field length-prefixed (so no two keys encode alike), the
    /// token first, the index and the prefixes big-endian. Written into one stack buffer: the
    /// writer hashes every row, and appends to a stored array paid exclusivity checks per field.
    private struct Encoder {
        var out: UnsafeMutableRawBufferPointer
        var at = 0

        mutating func word(_ n: UInt32) {
            out.storeBytes(of: n.bigEndian, toByteOffset: at, as: UInt32.self)
            at += 4
        }

        mutating func field(_ bytes: UnsafeBufferPointer<UInt8>) {
            word(UInt32(truncatingIfNeeded: bytes.count))
            if let base = bytes.baseAddress { (out.baseAddress! + at).copyMemory(from: base, byteCount: bytes.count) }
            at += bytes.count
        }

        mutating func field(_ text: String) {
            var text = text
            text.withUTF8 { field($0) }
        }

        var written: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: out[..<at]) }
    }

    private func tokenWord(_ token: String) -> UInt64 {
        withUnsafeTemporaryAllocation(byteCount: 4 + token.utf8.count, alignment: 1) { buffer in
            var e = Encoder(out: buffer)
            e.field(token)
            return mac.hash(e.written) & 0xffff_ffff_0000_0000
        }
    }

    /// The low half covers the whole key, the app last (schema v7; v6 hashed the other four).
    func hash(_ app: String, _ token: String, _ session: String, _ keyID: [UInt8], _ index: UInt32) -> Int64 {
        if let override { return override(app, token, session, keyID, index) }
        let size = 20 + token.utf8.count + session.utf8.count + keyID.count + app.utf8.count   // five prefixes or words
        return withUnsafeTemporaryAllocation(byteCount: size, alignment: 1) { buffer in
            var e = Encoder(out: buffer)
            e.field(token)
            let high = mac.hash(e.written) & 0xffff_ffff_0000_0000
            e.field(session)
            keyID.withUnsafeBufferPointer { e.field($0) }
            e.word(index)
            e.field(app)
            return Int64(bitPattern: high | mac.hash(e.written) >> 32)
        }
    }

    /// `app`: the one the request was admitted for (StoreRules.admit), not the body's field.
    func hash(app: String, _ r: NewResponse) -> Int64 { hash(app, r.pushToken, r.sessionIdentifier, r.keyID, r.messageIndex) }

    /// The h range of a token's keys (signed order keeps it contiguous: one high half).
    func tokenRange(_ token: String) -> ClosedRange<Int64> {
        let high = override.map { UInt64(bitPattern: $0("", token, "", [], 0)) & 0xffff_ffff_0000_0000 } ?? tokenWord(token)
        return Int64(bitPattern: high)...Int64(bitPattern: high | 0xffff_ffff)
    }
}

/// Keys of committed rows above merged_through (and those of the open batch), in memory.
struct DedupeTail {
    private var byKey: [Int64: Int64] = [:]
    /// Further rows under an h already in byKey (a hash collision: rare).
    private var more: [Int64: [Int64]] = [:]
    private var byToken: [Int64: [Int64]] = [:]
    private var batch: [(h: Int64, id: Int64)] = []
    private(set) var count = 0

    mutating func add(_ h: Int64, _ id: Int64, inBatch: Bool) {
        if byKey[h] == nil { byKey[h] = id } else { more[h, default: []].append(id) }
        byToken[h >> 32, default: []].append(id)
        if inBatch { batch.append((h, id)) }
        count += 1
    }

    /// The rows under h: the first, then any collisions.
    func candidates(_ h: Int64) -> [Int64] {
        guard let first = byKey[h] else { return [] }
        return [first] + (more[h] ?? [])
    }

    func tokenIDs(_ range: ClosedRange<Int64>) -> [Int64] { byToken[range.lowerBound >> 32] ?? [] }

    /// Every entry, sorted by (h, id): the merge's insert order.
    func sorted() -> [(h: Int64, id: Int64)] {
        var all: [(h: Int64, id: Int64)] = []
        all.reserveCapacity(count)
        for (h, id) in byKey { all.append((h, id)) }
        for (h, ids) in more { for id in ids { all.append((h, id)) } }
        return all.sorted { $0.h != $1.h ? $0.h < $1.h : $0.id < $1.id }
    }

    mutating func batchCommitted() { batch.removeAll(keepingCapacity: true) }

    /// The open batch rolled back: its keys go, newest first.
    mutating func batchRolledBack() {
        for (h, id) in batch.reversed() {
            if var list = more[h], let i = list.lastIndex(of: id) {
                list.remove(at: i)
                more[h] = list.isEmpty ? nil : list
            } else if byKey[h] == id {
                if var list = more[h], !list.isEmpty {
                    byKey[h] = list.removeFirst()
                    more[h] = list.isEmpty ? nil : list
                } else {
                    byKey[h] = nil
                }
            }
            if var ids = byToken[h >> 32], let i = ids.lastIndex(of: id) {
                ids.remove(at: i)
                byToken[h >> 32] = ids.isEmpty ? nil : ids
            }
            count -= 1
        }
        batch.removeAll(keepingCapacity: true)
    }

    /// After a merge: only the keys of rows above `upTo` stay.
    mutating func remove(through upTo: Int64) {
        var kept = DedupeTail()
        for (h, id) in sorted() where id > upTo { kept.add(h, id, inBatch: false) }
        self = kept
    }
}

/// A merge under way: the sorted keys up to `upTo`, written up to `next`.
struct DedupeMerge {
    var upTo: Int64
    var entries: [(h: Int64, id: Int64)]
    var next = 0
}

/// Who ingests into a database: one store at a time, since the tail lives in its memory.
/// flock(2) on `<database>-ingest`: released by the kernel when the process dies.
final class IngestLock {
    let path: String
    private let fd: Int32

    init(database: String) throws {
        path = database + "-ingest"
        // Kept across runs, so not O_EXCL; O_NOFOLLOW: a symbolic link at the name is refused,
        // never created or opened through.
        let fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let e = errno
            if e == ELOOP { throw StoreError.invalid("the ingest lock \(path) is a symbolic link; refusing to open it (remove the link)") }
            throw StoreError.invalid("cannot open the ingest lock \(path): \(String(cString: strerror(e)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let e = errno
            Glibc.close(fd)
            if e == EWOULDBLOCK {
                throw StoreError.invalid("another relay-server ingests into \(database) (it holds \(path)): one relay-server per SQLite database; stop the other one, or give each its own store.path")
            }
            throw StoreError.invalid("cannot lock \(path): \(String(cString: strerror(e)))")
        }
        self.fd = fd
    }

    deinit { Glibc.close(fd) }   // releases the flock
}

/// The dedupe index as the ingesting store holds it: the hash, the tail of keys not yet merged
/// into response_keys with its watermarks, the merge under way and the ingest lock. Writer
/// thread only (SQLiteOutboxStore's writer jobs and batch steps).
final class DedupeIndex {
    /// Tail keys at which the writer merges them into response_keys (after a batch, in
    /// transactions of their own, `defaultMergeChunk` keys each); ingest refuses (503) above
    /// four times as many (merges failing).
    static let defaultMergeRows = 32_768
    static let defaultMergeChunk = 4096

    var hasher: DedupeHasher!
    var tail = DedupeTail()
    private(set) var ingestLock: IngestLock?
    var databasePath = ""
    private(set) var mergedThrough: Int64 = 0
    /// The highest id_high committed (minted_through), and minted in the open batch.
    private(set) var committedHigh: Int64 = 0
    private(set) var mintedInBatch: Int64 = 0
    var mergeRows = DedupeIndex.defaultMergeRows {
        didSet { tailLimit = 4 * mergeRows }
    }
    var mergeChunk = DedupeIndex.defaultMergeChunk
    private var merge: DedupeMerge?
    private var mergeRetryAt = 0
    private(set) var tailLimit = 4 * DedupeIndex.defaultMergeRows
    /// Merge the whole tail after the current batch (close, tests).
    var mergeRequested = false
    private(set) var merges = 0
    private(set) var mergeFailures = 0
    /// Tests: runs inside a merge transaction right before its COMMIT (a throw fails it).
    var beforeMergeCommit: (() throws -> Void)?
    var logger: RelayLogger?
    private var lookupKey: SQLiteStatement?
    private var readKeyRow: SQLiteStatement?

    /// This store ingests (its tail is rebuilt and held).
    var isPrepared: Bool { ingestLock != nil }
    /// The newest id minted, committed or in the open batch.
    var newestID: Int64 { max(committedHigh, mintedInBatch) }

    /// Takes the lock (or the one given) and rebuilds the tail from the rows above
    /// merged_through. Returns minted_through: ids minted from now on must be above it.
    func prepare(_ db: SQLiteDatabase, lock taken: IngestLock? = nil) throws -> Int64? {
        guard ingestLock == nil else { return nil }
        let lock = try taken ?? IngestLock(database: databasePath)
        let row = try db.query("SELECT merged_through, minted_through FROM outbox_stats WHERE id = 1").first
        let merged = row?[0].int ?? 0, minted = row?[1].int ?? 0
        var rebuilt = DedupeTail()
        let scan = try db.statement("SELECT id_high, app, push_token, session_id, key_id, message_index FROM responses WHERE id_high > ? AND id_high <= ?")
        defer { scan.reset() }
        try scan.bind(1, merged)
        try scan.bind(2, minted)
        while try scan.next() {
            let h = hasher.hash(scan.text(1), scan.text(2), scan.text(3), scan.blob(4), UInt32(truncatingIfNeeded: scan.int64(5)))
            rebuilt.add(h, scan.int64(0), inBatch: false)
        }
        tail = rebuilt
        mergedThrough = merged
        committedHigh = minted
        ingestLock = lock
        return minted
    }

    /// The writer thread has exited: the lock goes with the store.
    func releaseLock() { ingestLock = nil }

    /// A row inserted in the open batch.
    func added(_ h: Int64, id high: Int64) {
        tail.add(h, high, inBatch: true)
        mintedInBatch = max(mintedInBatch, high)
    }

    /// Whether the open batch minted past the committed watermark (minted_through to write).
    var mintedPastCommitted: Bool { mintedInBatch > committedHigh }

    func batchCommitted() {
        tail.batchCommitted()
        committedHigh = max(committedHigh, mintedInBatch)
        mintedInBatch = 0
    }

    func batchRolledBack() {
        tail.batchRolledBack()
        mintedInBatch = 0
    }

    /// Ingest refuses once the tail outgrew its bound (merges failing).
    func checkTailBound() throws {
        guard tail.count < tailLimit else {
            throw StoreError.unavailable("the dedupe index is not being merged (\(mergeFailures) failed merges); see the log")
        }
    }

    /// The stored row with r's dedupe key under `app`, if any: tail and index candidates, each verified.
    func existing(_ r: NewResponse, app: String, h: Int64, db: SQLiteDatabase) throws -> ExistingRow? {
        for id in tail.candidates(h) {
            if let row = try verified(id, r, app: app, db: db) { return row }
        }
        let lookup = try db.held(&lookupKey, "SELECT id_high FROM response_keys WHERE h = ?")
        try lookup.bind(1, h)
        var ids: [Int64] = []
        while try lookup.next() { ids.append(lookup.int64(0)) }
        lookup.reset()
        for id in ids {
            if let row = try verified(id, r, app: app, db: db) { return row }
        }
        return nil
    }

    private func verified(_ id: Int64, _ r: NewResponse, app: String, db: SQLiteDatabase) throws -> ExistingRow? {
        let read = try db.held(&readKeyRow,
            "SELECT id, state, credential_id, push_token, session_id, key_id, message_index, app, encrypted_data FROM responses WHERE id_high = ?")
        defer { read.reset() }
        try read.bind(1, id)
        guard try read.next(), read.text(3) == r.pushToken, read.text(4) == r.sessionIdentifier, read.blob(5) == r.keyID,
              read.int64(6) == Int64(r.messageIndex), read.text(7) == app, let s = ResponseState(rawValue: read.text(1)) else { return nil }
        return ExistingRow(id: read.text(0), state: s, credentialID: read.text(2), encryptedData: read.blob(8))
    }

    /// One step of a merge of the tail into response_keys, in a transaction of its own. The
    /// first step takes the tail's keys up to the newest committed id, sorted by h, leaving out
    /// rows deleted since; each step writes `mergeChunk` of them (a short pause for ingest,
    /// and each chunk's keys share the leaves of their h range); the last one also advances
    /// merged_through, then the merged keys leave the tail. Keys written by earlier steps are
    /// in both places meanwhile, which lookups tolerate; after a crash the rebuilt tail holds
    /// them again and INSERT OR IGNORE skips them. A failed step changes nothing.
    func mergeStep(_ db: SQLiteDatabase) throws {
        guard ingestLock != nil, merge != nil || committedHigh > mergedThrough else { return }
        do {
            try db.execute("BEGIN IMMEDIATE")
            if merge == nil {
                let upTo = committedHigh
                var present: Set<Int64> = []
                present.reserveCapacity(tail.count)
                let scan = try db.statement("SELECT id_high FROM responses WHERE id_high > ? AND id_high <= ?")
                try scan.bind(1, mergedThrough)
                try scan.bind(2, upTo)
                while try scan.next() { present.insert(scan.int64(0)) }
                scan.reset()
                merge = DedupeMerge(upTo: upTo, entries: tail.sorted().filter { present.contains($0.id) })
            }
            guard let step = merge else { return }
            let end = min(step.entries.count, step.next + max(1, mergeChunk))
            let insert = try db.statement("INSERT OR IGNORE INTO response_keys (h, id_high) VALUES (?, ?)")
            for e in step.entries[step.next..<end] {
                try insert.bind(1, e.h)
                try insert.bind(2, e.id)
                try insert.stepOnce()
            }
            let last = end == step.entries.count
            if last { try db.run("UPDATE outbox_stats SET merged_through = ? WHERE id = 1", [.integer(step.upTo)]) }
            try beforeMergeCommit?()
            try db.execute("COMMIT")
            merge?.next = end
            if last {
                tail.remove(through: step.upTo)
                mergedThrough = step.upTo
                merge = nil
                merges += 1
            }
        } catch {
            if !db.isAutocommit { try? db.execute("ROLLBACK") }
            mergeFailures += 1
            throw error
        }
    }

    /// After each batch (writer thread): a merge step when the tail holds `mergeRows` keys or
    /// a merge is under way; the whole merge on request (close). After a failed step the next
    /// try waits for a quarter of `mergeRows` more keys.
    func maybeMerge(_ db: SQLiteDatabase) {
        guard ingestLock != nil else { return }
        let due = merge != nil || tail.count >= mergeRows
        guard mergeRequested || (due && tail.count >= mergeRetryAt) else { return }
        let all = mergeRequested
        mergeRequested = false
        do {
            repeat {
                try mergeStep(db)
            } while all && (merge != nil || committedHigh > mergedThrough)
            mergeRetryAt = 0
        } catch {
            mergeRetryAt = tail.count + max(1, mergeRows / 4)
            logger?.error("dedupe index merge failed (the keys stay in memory and answer as before; retried later)",
                          ["error": "\(error)", "tailKeys": tail.count, "failures": mergeFailures])
        }
    }
}

extension SQLiteOutboxStore {
    /// Takes the ingest lock, once per store: relay-server calls it at start, so a second
    /// server on the same file fails there, naming the lock (otherwise the first ingest takes
    /// it). The tail is rebuilt by the writer's next job: ingests queue behind it, and the
    /// start does not wait for it (32,768 rows after a kill -9).
    public func prepareIngest() throws {
        guard let writer else { throw StoreError.invalid("store opened read-only") }
        let state = writerState
        let lock: IngestLock
        do {
            lock = try IngestLock(database: path)
        } catch {
            // This store's own writer may hold it already (its first ingest took it).
            if (try? write { _ in state.dedupe.isPrepared }) == true { return }
            throw error
        }
        writer.enqueue({ db in try Self.prepareIngest(db, state: state, lock: lock) }, completion: { _ in })
    }

    /// The dedupe tail rebuilt, and ids minted from now on above every key minted before (a
    /// clock stepped back, a restart), so they are above the watermark and in the tail.
    static func prepareIngest(_ db: SQLiteDatabase, state: WriterState, lock: IngestLock? = nil) throws {
        if let minted = try state.dedupe.prepare(db, lock: lock) { state.ids.advance(pastHigh: minted) }
    }

    /// Schema v6's start of the index: a fresh SipHash key, and both watermarks at the newest
    /// v7 id (only v7 ids are time-ordered; a migrated v4 id's random high word is no
    /// watermark). The rows' keys are written by v7's `fillDedupeIndex`, which follows.
    static func startDedupeIndex(_ db: SQLiteDatabase) throws {
        let newest = try db.scalar("SELECT coalesce(max(id_high), 0) FROM responses WHERE (id_high >> 12) & 15 = 7").int ?? 0
        try db.run("UPDATE outbox_stats SET dedupe_key = ?, minted_through = ?, merged_through = ? WHERE id = 1",
                   [.blob(RelayCrypto.randomBytes(16)), .integer(newest), .integer(newest)])
    }

    /// Schema v7's index over every stored row: its key with the app, under the database's
    /// SipHash key, sorted so the table is appended to. Every row up to minted_through then has
    /// its entry, so merged_through moves there and no tail is left to rebuild.
    static func fillDedupeIndex(_ db: SQLiteDatabase, override: DedupeHashFunction?) throws {
        guard let key = try db.scalar("SELECT dedupe_key FROM outbox_stats WHERE id = 1").bytes else {
            throw StoreError.invalid("schema v7 migration: outbox_stats has no dedupe key (schema v6 sets one)")
        }
        let hasher = try DedupeHasher(key: key, override: override)
        var entries: [(h: Int64, id: Int64)] = []
        let scan = try db.statement("SELECT id_high, app, push_token, session_id, key_id, message_index FROM responses")
        while try scan.next() {
            entries.append((hasher.hash(scan.text(1), scan.text(2), scan.text(3), scan.blob(4), UInt32(truncatingIfNeeded: scan.int64(5))),
                            scan.int64(0)))
        }
        scan.reset()
        entries.sort { $0.h != $1.h ? $0.h < $1.h : $0.id < $1.id }
        let insert = try db.statement("INSERT INTO response_keys (h, id_high) VALUES (?, ?)")
        for e in entries {
            try insert.bind(1, e.h)
            try insert.bind(2, e.id)
            try insert.stepOnce()
        }
        try db.execute("UPDATE outbox_stats SET merged_through = minted_through WHERE id = 1")
    }
}
