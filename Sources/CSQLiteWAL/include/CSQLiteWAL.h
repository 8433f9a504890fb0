// A wrapper SQLite VFS that turns the many small writes SQLite makes to a WAL file during one
// transaction into one write per commit (why, and why it is safe: walbatch.c's header comment
// and docs/architecture.md, "WAL write coalescing"). Only RelayCore's SQLite.swift imports this.
#ifndef CSQLITEWAL_H
#define CSQLITEWAL_H

#include <stdint.h>

// Forward declaration only: including <sqlite3.h> here as well as in CSQLite's shim.h would
// give Swift the same C API through two modules.
struct sqlite3;

// The name the VFS is registered under (never as the default VFS).
#define CSQLITEWAL_VFS_NAME "relay-walbatch"

// Registers the VFS on top of the default VFS (sqlite3_vfs_find(NULL)), once per process;
// safe to call from any thread, any number of times. Returns SQLITE_OK or the error of the
// first (only) registration attempt.
int csqlitewal_register(void);

// Counters of one connection's WAL file (the "main" schema). Monotonic, per open WAL file,
// except buffer_capacity.
typedef struct csqlitewal_stats {
    int64_t writes_received;   // xWrite calls SQLite made to the WAL
    int64_t writes_forwarded;  // writes passed on to the default VFS (one pwrite each)
    int64_t bytes_forwarded;   // bytes in those writes
    int64_t flushes;           // buffer flushes that succeeded
    int64_t flush_failures;    // buffer flushes that failed (the triggering call returned the error)
    int64_t header_writes;     // writes at offset 0: the WAL header, once per WAL (re)start
    int64_t buffer_capacity;   // bytes allocated for the buffer now (not a counter)
} csqlitewal_stats;

// Fills `out` for `db`'s main WAL. Returns 0 (SQLITE_OK), or 12 (SQLITE_NOTFOUND) when the
// connection's WAL is not open, or not open through this VFS. Call it on the thread that owns
// `db` (it reads the connection's pager).
int csqlitewal_stats_get(struct sqlite3 *db, csqlitewal_stats *out);

// Test hook: the next flush of `db`'s main WAL fails with `rc` (e.g. SQLITE_FULL, or
// SQLITE_IOERR_WRITE = 778) before writing anything, as a full or failing disk would make it.
// Same return codes and thread rule as csqlitewal_stats_get.
int csqlitewal_fail_next_flush(struct sqlite3 *db, int rc);

// Test hook: `db`'s main WAL gives up its own descriptor and flushes through the default VFS's
// xWrite in pieces (the fallback when that descriptor cannot be opened). Same return codes.
int csqlitewal_flush_through_default_vfs(struct sqlite3 *db);

#endif
