// relay-walbatch: a wrapper SQLite VFS that coalesces the writes SQLite makes to a WAL file.
//
// WHY. In WAL mode SQLite writes every frame with two xWrite calls (the 24-byte frame header,
// then the page), and the default unix VFS turns each into a pwrite64. Measured on the relay
// (strace -c, perf): ~1.8 pwrite64 per ingested row at ~22 rows per COMMIT, ~9 % of the relay's
// CPU, all of it on the single SQLite writer thread, the critical path of durable ingest
// (docs/benchmarks-analysis.md). This VFS makes it one pwrite64 per transaction.
//
// WHAT. Everything delegates to the default VFS (sqlite3_vfs_find(NULL), "unix" here); it opens,
// locks, maps and closes every file, so its per-inode POSIX lock bookkeeping and its shared
// memory (wal-index) stay exactly as they are for the other connections of the process, which
// keep using it directly. Only files opened with SQLITE_OPEN_WAL are buffered: a write that
// continues the buffer (offset == end of buffer) is appended to a heap buffer; the buffer is
// written with one pwrite loop (EINTR retried, short writes continued, ENOSPC -> SQLITE_FULL,
// any other error -> SQLITE_IOERR_WRITE), and that happens BEFORE the default VFS sees any
// xSync, xRead, xTruncate, xFileSize, xLock, xUnlock, xFileControl or xClose of the WAL, before
// a write that does not continue the buffer, and when the buffer would pass CAP bytes. So the
// WAL file receives exactly the bytes SQLite wrote, in the order SQLite wrote them, only later
// -- and never later than the next sync, read, size query, truncation or close. Every other
// file (the database, journals, temp files) forwards every method unchanged, including the
// shared-memory methods (iVersion 2) and xFetch/xUnfetch (iVersion 3) the main database file
// needs for the wal-index and mmap.
//
// The flush cannot go through the default VFS's xWrite: the unix VFS masks every write to 17
// bits (seekAndWriteFd: nBuf &= 0x1ffff, SQLite never writes more than a 64 KiB page + header),
// so a flush of 128 KiB or more fails with SQLITE_FULL after a partial write (our checkpoint
// test hit exactly that). So each buffered WAL file gets a second, write-only descriptor of its
// own, opened by name right after the default VFS opened the file, used only for the flush's
// pwrite. That is safe where opening the *database* file would not be: closing any descriptor
// of a file drops every POSIX lock the process holds on that file, but SQLite takes no lock on
// the WAL file at all (the unix VFS opens every file but the main database with its no-lock
// methods; WAL locking lives in the -shm file and the database). The name names the same file
// the default VFS opened: SQLite opens the WAL holding at least a SHARED lock on the database,
// and the WAL is only deleted under an EXCLUSIVE one. xSync still goes to the default VFS's
// descriptor: fdatasync writes back the file's (inode's) dirty data, whichever descriptor
// wrote it. If that second open fails, the flush falls back to the default VFS's xWrite in
// pieces below its limit (still far fewer writes than two per frame).
//
// WHY IT IS SAFE (with synchronous=FULL or EXTRA only; checked against sqlite3WalFrames in
// SQLite's wal.c). At a commit, walFrames() writes the frames, then -- when WAL_SYNC_FLAGS is
// non-zero, i.e. synchronous is FULL or EXTRA -- calls xSync on the WAL, and only AFTER that
// appends the frames to the wal-index (walIndexAppend) and publishes the new mxFrame in the
// wal-index header (walIndexWriteHdr). Our xSync flushes first, so no other connection (the
// relay's readers, relayctl, a checkpointer) can be told to read a frame that is still in our
// buffer. Frames of a transaction still being built are only visible to this connection, and it
// flushes before reading the WAL itself. A crash loses at most the buffer, i.e. writes that were
// not synced yet; the OS may lose those too, and WAL recovery already handles it: it keeps the
// checksummed prefix of frames that ends with a commit frame, so a transaction whose commit
// frame did not reach the disk is ignored. A commit is acknowledged only after xSync returned
// SQLITE_OK, which needs the flush to have succeeded.
// With synchronous=NORMAL or OFF, walFrames() does not sync at commit and publishes frames that
// would still be in our buffer, so the relay opens its writer connection with this VFS only at
// FULL or EXTRA (SQLiteOutboxStore). As a second line of defence, the main database file's
// xShmBarrier flushes its WAL's buffer first: walIndexWriteHdr() calls the barrier between
// writing the two copies of the wal-index header, before the copy readers trust. At FULL the
// buffer is already empty whenever a commit gets there; the barrier flush matters only if the
// writer's synchronous were ever lowered.
//
// FAILURES. A failed flush is returned by the call that triggered it (xSync at COMMIT: the
// COMMIT fails and SQLite rolls the transaction back; the relay answers 503, never a false 202).
// The bytes it could not write stay buffered and are retried at the next flush point: the xWrite
// calls that queued them returned SQLITE_OK, and SQLite may continue a transaction after an
// error that only rolled back one statement (SQLITE_FULL with a statement journal). They always
// lie after the last synced commit (every commit flushed and synced), and they are written in
// order before anything SQLite writes later, so they are overwritten or ignored like any
// leftover frame.
//
// Our own code; no SQLite source is copied. See docs/architecture.md, "WAL write coalescing".
#include "CSQLiteWAL.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sqlite3.h>

// A flush is forced when the buffer would grow past this (one transaction with more than
// ~1000 dirty pages); the relay's batches are ~20-100 frames.
#define CAP (4 * 1024 * 1024)
// A buffer grown past this (a migration's or a very large batch's transaction) is freed at the
// next sync instead of staying allocated for the life of the connection.
#define KEEP (1024 * 1024)
// The fallback flush's piece size: below the unix VFS's 17-bit write limit.
#define PIECE (64 * 1024)

typedef struct WalBatchFile WalBatchFile;
struct WalBatchFile {
    sqlite3_file base;      // must be first: SQLite sees this
    sqlite3_file *inner;    // the default VFS's file, in the same allocation right after us
    int isWal;
    int fd;                 // WAL files: our write-only descriptor, -1 = flush through `inner`
    // WAL files: the pending bytes [start, start + len), and the test hook.
    unsigned char *buf;
    size_t len, cap;
    sqlite3_int64 start;
    int failNext;           // non-zero: the next flush fails with this code (test hook)
    csqlitewal_stats stats; // updated with relaxed atomics, read by csqlitewal_stats_get
    // Main database files: the name pointer SQLite passed to xOpen (the pager's), and the WAL
    // opened for the same pager. WAL files: that main file. Linked under `registry`.
    const char *name;
    WalBatchFile *wal;
    WalBatchFile *mainFile;
    WalBatchFile *nextMain;
};

static sqlite3_vfs *inner;           // the default VFS we delegate to
static sqlite3_vfs vfs;
static sqlite3_io_methods methods[3]; // iVersion 1..3, matching the inner file's methods
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int registerResult = SQLITE_ERROR;
// Open main database files, so a WAL can find the main file of its own pager (for the
// xShmBarrier flush). Only touched at open and close.
static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
static WalBatchFile *mainFiles;

static void count(int64_t *counter, int64_t n) { __atomic_fetch_add(counter, n, __ATOMIC_RELAXED); }

// Writes `n` bytes at `offset`: one pwrite on our descriptor (looping only on EINTR and short
// writes), or pieces through the default VFS when we have no descriptor.
static int writeAll(WalBatchFile *p, const unsigned char *data, size_t n, sqlite3_int64 offset) {
    while (n > 0) {
        if (p->fd < 0) {
            int piece = n < PIECE ? (int)n : PIECE;
            count(&p->stats.writes_forwarded, 1);
            int rc = p->inner->pMethods->xWrite(p->inner, data, piece, offset);
            if (rc != SQLITE_OK) return rc;
            data += piece;
            n -= (size_t)piece;
            offset += piece;
            continue;
        }
        count(&p->stats.writes_forwarded, 1);
        ssize_t wrote = pwrite(p->fd, data, n, (off_t)offset);
        if (wrote < 0) {
            if (errno == EINTR) continue;
            return errno == ENOSPC ? SQLITE_FULL : SQLITE_IOERR_WRITE;
        }
        if (wrote == 0) return SQLITE_FULL;   // as the unix VFS reads a write that made no progress
        data += wrote;
        n -= (size_t)wrote;
        offset += wrote;
    }
    return SQLITE_OK;
}

// Writes the pending bytes. On failure they stay pending (see FAILURES above).
static int flush(WalBatchFile *p) {
    if (p->len == 0) return SQLITE_OK;
    int rc;
    if (p->failNext) {
        rc = p->failNext;
        p->failNext = 0;
    } else {
        rc = writeAll(p, p->buf, p->len, p->start);
    }
    if (rc != SQLITE_OK) {
        count(&p->stats.flush_failures, 1);
        return rc;
    }
    count(&p->stats.bytes_forwarded, (int64_t)p->len);
    count(&p->stats.flushes, 1);
    p->start += (sqlite3_int64)p->len;
    p->len = 0;
    return SQLITE_OK;
}

// Makes room for `need` pending bytes; 0 when the allocation failed (the caller writes through).
static int reserve(WalBatchFile *p, size_t need) {
    if (need <= p->cap) return 1;
    size_t cap = p->cap ? p->cap : 64 * 1024;
    while (cap < need) cap *= 2;
    unsigned char *b = realloc(p->buf, cap);
    if (!b) return 0;
    p->buf = b;
    p->cap = cap;
    __atomic_store_n(&p->stats.buffer_capacity, (int64_t)cap, __ATOMIC_RELAXED);
    return 1;
}

// MARK: io methods

static int wbClose(sqlite3_file *f) {
    WalBatchFile *p = (WalBatchFile *)f;
    int rc = p->isWal ? flush(p) : SQLITE_OK;
    pthread_mutex_lock(&registry);
    if (p->isWal) {
        if (p->mainFile) p->mainFile->wal = NULL;
    } else if (p->name) {
        for (WalBatchFile **q = &mainFiles; *q; q = &(*q)->nextMain) {
            if (*q == p) { *q = p->nextMain; break; }
        }
        if (p->wal) p->wal->mainFile = NULL;
    }
    pthread_mutex_unlock(&registry);
    if (p->fd >= 0) close(p->fd);   // no POSIX locks on a WAL file to lose (header comment)
    p->fd = -1;
    int crc = p->inner->pMethods->xClose(p->inner);
    free(p->buf);
    p->buf = NULL;
    return rc != SQLITE_OK ? rc : crc;
}

static int wbRead(sqlite3_file *f, void *out, int amount, sqlite3_int64 offset) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
    }
    return p->inner->pMethods->xRead(p->inner, out, amount, offset);
}

static int wbWrite(sqlite3_file *f, const void *data, int amount, sqlite3_int64 offset) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (!p->isWal) return p->inner->pMethods->xWrite(p->inner, data, amount, offset);
    count(&p->stats.writes_received, 1);
    if (offset == 0) count(&p->stats.header_writes, 1);
    int rc;
    if (p->len > 0 && (offset != p->start + (sqlite3_int64)p->len || p->len + (size_t)amount > CAP)) {
        if ((rc = flush(p)) != SQLITE_OK) return rc;
    }
    if ((size_t)amount >= CAP || !reserve(p, p->len + (size_t)amount)) {
        // Too big to buffer, or no memory: write what is pending, then this write, straight through.
        if (p->len > 0 && (rc = flush(p)) != SQLITE_OK) return rc;
        rc = writeAll(p, data, (size_t)amount, offset);
        if (rc == SQLITE_OK) count(&p->stats.bytes_forwarded, amount);
        return rc;
    }
    if (p->len == 0) p->start = offset;
    memcpy(p->buf + p->len, data, (size_t)amount);
    p->len += (size_t)amount;
    return SQLITE_OK;
}

static int wbTruncate(sqlite3_file *f, sqlite3_int64 size) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
    }
    return p->inner->pMethods->xTruncate(p->inner, size);
}

static int wbSync(sqlite3_file *f, int flags) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
        if (p->cap > KEEP) {
            free(p->buf);
            p->buf = NULL;
            p->cap = 0;
        }
        __atomic_store_n(&p->stats.buffer_capacity, (int64_t)p->cap, __ATOMIC_RELAXED);
    }
    return p->inner->pMethods->xSync(p->inner, flags);
}

static int wbFileSize(sqlite3_file *f, sqlite3_int64 *size) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
    }
    return p->inner->pMethods->xFileSize(p->inner, size);
}

static int wbLock(sqlite3_file *f, int level) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
    }
    return p->inner->pMethods->xLock(p->inner, level);
}

static int wbUnlock(sqlite3_file *f, int level) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
    }
    return p->inner->pMethods->xUnlock(p->inner, level);
}

static int wbCheckReservedLock(sqlite3_file *f, int *out) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xCheckReservedLock(p->inner, out);
}

static int wbFileControl(sqlite3_file *f, int op, void *arg) {
    WalBatchFile *p = (WalBatchFile *)f;
    if (p->isWal) {
        int rc = flush(p);
        if (rc != SQLITE_OK) return rc;
    }
    return p->inner->pMethods->xFileControl(p->inner, op, arg);
}

static int wbSectorSize(sqlite3_file *f) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xSectorSize(p->inner);
}

static int wbDeviceCharacteristics(sqlite3_file *f) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xDeviceCharacteristics(p->inner);
}

static int wbShmMap(sqlite3_file *f, int region, int size, int extend, void volatile **out) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xShmMap(p->inner, region, size, extend, out);
}

static int wbShmLock(sqlite3_file *f, int offset, int n, int flags) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xShmLock(p->inner, offset, n, flags);
}

static void wbShmBarrier(sqlite3_file *f) {
    WalBatchFile *p = (WalBatchFile *)f;
    // Second line of defence (header comment): frames reach the file before a wal-index header
    // naming them becomes valid. Only this connection's thread opens, closes and uses its WAL,
    // so `wal` needs no lock here. A failure cannot be returned from a barrier; the bytes stay
    // pending and the next flush point (xSync at FULL) reports it.
    if (p->wal && p->wal->len > 0) (void)flush(p->wal);
    p->inner->pMethods->xShmBarrier(p->inner);
}

static int wbShmUnmap(sqlite3_file *f, int deleteFlag) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xShmUnmap(p->inner, deleteFlag);
}

static int wbFetch(sqlite3_file *f, sqlite3_int64 offset, int amount, void **out) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xFetch(p->inner, offset, amount, out);
}

static int wbUnfetch(sqlite3_file *f, sqlite3_int64 offset, void *page) {
    WalBatchFile *p = (WalBatchFile *)f;
    return p->inner->pMethods->xUnfetch(p->inner, offset, page);
}

// MARK: vfs methods (all but xOpen forward to the default VFS, with ITS vfs pointer: the unix
// VFS keeps its locking-style finder in pAppData)

static int wbOpen(sqlite3_vfs *self, sqlite3_filename name, sqlite3_file *f, int flags, int *outFlags) {
    (void)self;
    WalBatchFile *p = (WalBatchFile *)f;
    memset(p, 0, sizeof *p);
    p->fd = -1;
    p->inner = (sqlite3_file *)(p + 1);
    int rc = inner->xOpen(inner, name, p->inner, flags, outFlags);
    if (p->inner->pMethods == NULL) {
        // The default VFS left nothing to close: neither do we (SQLite will not call xClose).
        f->pMethods = NULL;
        return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
    }
    int version = p->inner->pMethods->iVersion;
    if (version < 1) version = 1;
    if (version > 3) version = 3;
    f->pMethods = &methods[version - 1];
    if (rc != SQLITE_OK) return rc;   // SQLite calls our xClose, which closes the inner file
    p->isWal = (flags & SQLITE_OPEN_WAL) != 0;
    if (p->isWal && name && (flags & SQLITE_OPEN_READWRITE)) {
        // Our flush descriptor (header comment); -1 on failure = flush through `inner`.
        p->fd = open(name, O_WRONLY | O_CLOEXEC);
    }
    if (name && (flags & SQLITE_OPEN_MAIN_DB)) {
        p->name = name;
        pthread_mutex_lock(&registry);
        p->nextMain = mainFiles;
        mainFiles = p;
        pthread_mutex_unlock(&registry);
    } else if (name && p->isWal) {
        // The pager's WAL name lives in the same allocation as its database name, so
        // sqlite3_filename_database returns the very pointer the main file was opened with.
        const char *db = sqlite3_filename_database(name);
        pthread_mutex_lock(&registry);
        for (WalBatchFile *m = mainFiles; m; m = m->nextMain) {
            if (m->name == db) {
                m->wal = p;
                p->mainFile = m;
                break;
            }
        }
        pthread_mutex_unlock(&registry);
    }
    return SQLITE_OK;
}

static int wbDelete(sqlite3_vfs *self, const char *name, int syncDir) {
    (void)self;
    return inner->xDelete(inner, name, syncDir);
}

static int wbAccess(sqlite3_vfs *self, const char *name, int flags, int *out) {
    (void)self;
    return inner->xAccess(inner, name, flags, out);
}

static int wbFullPathname(sqlite3_vfs *self, const char *name, int n, char *out) {
    (void)self;
    return inner->xFullPathname(inner, name, n, out);
}

static void *wbDlOpen(sqlite3_vfs *self, const char *name) {
    (void)self;
    return inner->xDlOpen(inner, name);
}

static void wbDlError(sqlite3_vfs *self, int n, char *out) {
    (void)self;
    inner->xDlError(inner, n, out);
}

static void (*wbDlSym(sqlite3_vfs *self, void *handle, const char *symbol))(void) {
    (void)self;
    return inner->xDlSym(inner, handle, symbol);
}

static void wbDlClose(sqlite3_vfs *self, void *handle) {
    (void)self;
    inner->xDlClose(inner, handle);
}

static int wbRandomness(sqlite3_vfs *self, int n, char *out) {
    (void)self;
    return inner->xRandomness(inner, n, out);
}

static int wbSleep(sqlite3_vfs *self, int micros) {
    (void)self;
    return inner->xSleep(inner, micros);
}

static int wbCurrentTime(sqlite3_vfs *self, double *out) {
    (void)self;
    return inner->xCurrentTime(inner, out);
}

static int wbGetLastError(sqlite3_vfs *self, int n, char *out) {
    (void)self;
    return inner->xGetLastError ? inner->xGetLastError(inner, n, out) : 0;
}

static int wbCurrentTimeInt64(sqlite3_vfs *self, sqlite3_int64 *out) {
    (void)self;
    return inner->xCurrentTimeInt64(inner, out);
}

static int wbSetSystemCall(sqlite3_vfs *self, const char *name, sqlite3_syscall_ptr call) {
    (void)self;
    return inner->xSetSystemCall(inner, name, call);
}

static sqlite3_syscall_ptr wbGetSystemCall(sqlite3_vfs *self, const char *name) {
    (void)self;
    return inner->xGetSystemCall(inner, name);
}

static const char *wbNextSystemCall(sqlite3_vfs *self, const char *name) {
    (void)self;
    return inner->xNextSystemCall(inner, name);
}

static void registerOnce(void) {
    inner = sqlite3_vfs_find(NULL);
    if (!inner) { registerResult = SQLITE_ERROR; return; }
    for (int v = 1; v <= 3; v++) {
        sqlite3_io_methods *m = &methods[v - 1];
        m->iVersion = v;
        m->xClose = wbClose;
        m->xRead = wbRead;
        m->xWrite = wbWrite;
        m->xTruncate = wbTruncate;
        m->xSync = wbSync;
        m->xFileSize = wbFileSize;
        m->xLock = wbLock;
        m->xUnlock = wbUnlock;
        m->xCheckReservedLock = wbCheckReservedLock;
        m->xFileControl = wbFileControl;
        m->xSectorSize = wbSectorSize;
        m->xDeviceCharacteristics = wbDeviceCharacteristics;
        if (v >= 2) {
            m->xShmMap = wbShmMap;
            m->xShmLock = wbShmLock;
            m->xShmBarrier = wbShmBarrier;
            m->xShmUnmap = wbShmUnmap;
        }
        if (v >= 3) {
            m->xFetch = wbFetch;
            m->xUnfetch = wbUnfetch;
        }
    }
    // Our file header, rounded up to 8 bytes, then the default VFS's file.
    int header = (int)((sizeof(WalBatchFile) + 7) & ~(size_t)7);
    vfs.iVersion = inner->iVersion < 3 ? inner->iVersion : 3;
    vfs.szOsFile = header + inner->szOsFile;
    vfs.mxPathname = inner->mxPathname;
    vfs.zName = CSQLITEWAL_VFS_NAME;
    vfs.pAppData = NULL;
    vfs.xOpen = wbOpen;
    vfs.xDelete = wbDelete;
    vfs.xAccess = wbAccess;
    vfs.xFullPathname = wbFullPathname;
    vfs.xDlOpen = inner->xDlOpen ? wbDlOpen : NULL;
    vfs.xDlError = inner->xDlError ? wbDlError : NULL;
    vfs.xDlSym = inner->xDlSym ? wbDlSym : NULL;
    vfs.xDlClose = inner->xDlClose ? wbDlClose : NULL;
    vfs.xRandomness = wbRandomness;
    vfs.xSleep = wbSleep;
    vfs.xCurrentTime = wbCurrentTime;
    vfs.xGetLastError = wbGetLastError;
    if (vfs.iVersion >= 2) vfs.xCurrentTimeInt64 = inner->xCurrentTimeInt64 ? wbCurrentTimeInt64 : NULL;
    if (vfs.iVersion >= 3) {
        vfs.xSetSystemCall = inner->xSetSystemCall ? wbSetSystemCall : NULL;
        vfs.xGetSystemCall = inner->xGetSystemCall ? wbGetSystemCall : NULL;
        vfs.xNextSystemCall = inner->xNextSystemCall ? wbNextSystemCall : NULL;
    }
    registerResult = sqlite3_vfs_register(&vfs, 0);
}

int csqlitewal_register(void) {
    pthread_once(&once, registerOnce);
    return registerResult;
}

// The WAL file of `db`'s main schema when it is open through this VFS, else NULL.
static WalBatchFile *walOf(struct sqlite3 *db) {
    sqlite3_file *f = NULL;
    if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &f) != SQLITE_OK || !f || !f->pMethods) return NULL;
    if (f->pMethods != &methods[0] && f->pMethods != &methods[1] && f->pMethods != &methods[2]) return NULL;
    WalBatchFile *p = (WalBatchFile *)f;
    return p->isWal ? p : NULL;
}

int csqlitewal_stats_get(struct sqlite3 *db, csqlitewal_stats *out) {
    WalBatchFile *p = walOf(db);
    if (!p) return SQLITE_NOTFOUND;
    out->writes_received = __atomic_load_n(&p->stats.writes_received, __ATOMIC_RELAXED);
    out->writes_forwarded = __atomic_load_n(&p->stats.writes_forwarded, __ATOMIC_RELAXED);
    out->bytes_forwarded = __atomic_load_n(&p->stats.bytes_forwarded, __ATOMIC_RELAXED);
    out->flushes = __atomic_load_n(&p->stats.flushes, __ATOMIC_RELAXED);
    out->flush_failures = __atomic_load_n(&p->stats.flush_failures, __ATOMIC_RELAXED);
    out->header_writes = __atomic_load_n(&p->stats.header_writes, __ATOMIC_RELAXED);
    out->buffer_capacity = __atomic_load_n(&p->stats.buffer_capacity, __ATOMIC_RELAXED);
    return SQLITE_OK;
}

int csqlitewal_fail_next_flush(struct sqlite3 *db, int rc) {
    WalBatchFile *p = walOf(db);
    if (!p) return SQLITE_NOTFOUND;
    p->failNext = rc;
    return SQLITE_OK;
}

int csqlitewal_flush_through_default_vfs(struct sqlite3 *db) {
    WalBatchFile *p = walOf(db);
    if (!p) return SQLITE_NOTFOUND;
    int rc = flush(p);
    if (rc != SQLITE_OK) return rc;
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    return SQLITE_OK;
}
