// Test-only fault injection under SQLite's default (unix) VFS: ENOSPC after a partial write,
// EIO, EDQUOT, EFBIG, short writes and EINTR on the writes SQLite makes to chosen files, so the
// store's failure paths can be driven the way a full or failing disk drives them (faults.c says
// how). Only the test targets link this.
#ifndef CSQLITEFAULT_H
#define CSQLITEFAULT_H

#include <stdint.h>

// One fault rule. Writes (pwrite64/write through the unix VFS) to a file whose path starts with
// `prefix` are subject to it; several files may share one rule (the database and its WAL share
// a disk). All fields but `prefix` may be 0 (= off).
typedef struct csqlitefault_rule {
    // Free space, shared by the matching files like a file system's: bytes written past the end
    // of a file take from it (rewriting a file's existing bytes takes none); a write that needs
    // more than is left writes what fits (a short write) and the next one fails ENOSPC.
    // -1 = no limit.
    int64_t budget;
    // After this many more matching writes succeed, the next `fail_times` ones fail with
    // `fail_errno` (ENOSPC, EIO, EDQUOT, EFBIG) before writing anything. fail_times -1 = forever.
    int64_t fail_after;
    int fail_errno;
    int fail_times;
    // Every write writes at most this many bytes (the caller must continue), 0 = off.
    int short_max;
    // Every n-th write returns EINTR before writing anything (the caller must retry), 0 = off.
    int eintr_every;
    // 1: the rule matches only the file named exactly `prefix` (a database without its -wal).
    int exact;
    // After this many more matching writes pass, every further one waits (writing nothing yet)
    // until the rule is updated with block_after -1: a disk that hangs, or a thread caught in
    // the middle of its writes. -1 = off (0 blocks the very next write).
    int64_t block_after;
} csqlitefault_rule;

// Counters of one rule.
typedef struct csqlitefault_counts {
    int64_t writes;        // matching write calls
    int64_t bytes;         // bytes they wrote
    int64_t failed;        // calls failed with fail_errno or ENOSPC
    int64_t short_writes;  // calls that wrote less than asked
    int64_t interrupted;   // calls that returned EINTR
    int64_t blocked;       // calls waiting in block_after now
} csqlitefault_counts;

// Installs the hooks into the default VFS (once per process; the library's constructor already
// did it before main). Returns 0, or -1 when the default VFS has no pwrite64 hook to replace.
int csqlitefault_install(void);

// Arms a rule for files whose path starts with `prefix` (an absolute path as the kernel names
// it, /proc/self/fd). Returns a handle >= 0, or -1 when every slot is taken.
int csqlitefault_arm(const char *prefix, csqlitefault_rule rule);
// Replaces the rule of an armed handle (counters are kept), e.g. to free space.
void csqlitefault_update(int handle, csqlitefault_rule rule);
void csqlitefault_counts_get(int handle, csqlitefault_counts *out);
void csqlitefault_disarm(int handle);

#endif
