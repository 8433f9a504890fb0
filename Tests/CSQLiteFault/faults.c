// Test-only fault injection for SQLite's unix VFS, in the spirit of SQLite's own test_syscall.c:
// the VFS's "pwrite64" and "write" system calls (xSetSystemCall) are replaced by wrappers that
// fail, shorten or interrupt writes to the files a test armed, and pass every other write
// straight on. Working at the system-call level keeps the unix VFS's own handling of short
// writes, EINTR and errno (SQLITE_FULL for ENOSPC/EDQUOT/EFBIG, SQLITE_IOERR_WRITE otherwise)
// under test, and needs no change to how the store opens its connections.
//
// The wrappers are installed by a constructor before main, while the process has one thread:
// xSetSystemCall swaps a plain function pointer SQLite reads without a lock. Rules live in a
// fixed table under a mutex; a write to an unarmed process costs one atomic load.
#include "CSQLiteFault.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <sqlite3.h>

#define SLOTS 64

typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);

static pwrite64_fn realPwrite64;
static write_fn realWrite;
static int installed = -1;    // -1 = not tried, 0 = ok, -1 after trying = failed
static int tried;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t unblocked = PTHREAD_COND_INITIALIZER;   // a rule changed: blocked writes look again
static int armedCount;        // atomic: rules armed now

typedef struct Slot {
    int used;
    char prefix[4096];
    size_t prefixLen;
    csqlitefault_rule rule;
    csqlitefault_counts counts;
} Slot;
static Slot slots[SLOTS];

// What the wrapper decided for one call: -1 with `err` = fail, else the byte count to pass on.
typedef struct Decision { int fail; int err; size_t n; Slot *slot; } Decision;

// `offset` -1: a write() at the descriptor's current position.
static Decision decide(int fd, size_t n, off_t offset) {
    Decision d = { 0, 0, n, NULL };
    if (__atomic_load_n(&armedCount, __ATOMIC_ACQUIRE) == 0) return d;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, sizeof path - 1);
    if (len <= 0) return d;
    path[len] = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++) {
        Slot *s = &slots[i];
        if (!s->used || (size_t)len < s->prefixLen || memcmp(path, s->prefix, s->prefixLen) != 0) continue;
        if (s->rule.exact && (size_t)len != s->prefixLen) continue;
        d.slot = s;
        csqlitefault_rule *r = &s->rule;
        s->counts.writes++;
        if (r->block_after == 0) {
            // Wait for update() or disarm, holding nothing else; then decide afresh below.
            s->counts.blocked++;
            while (s->used && s->rule.block_after == 0) pthread_cond_wait(&unblocked, &lock);
            s->counts.blocked--;
            if (!s->used) { d.slot = NULL; break; }
        } else if (r->block_after > 0) {
            r->block_after--;
        }
        if (r->eintr_every > 0 && s->counts.writes % r->eintr_every == 0) {
            s->counts.interrupted++;
            d.fail = 1; d.err = EINTR;
            break;
        }
        if (r->fail_errno && r->fail_times != 0) {
            if (r->fail_after > 0) {
                r->fail_after--;
            } else {
                if (r->fail_times > 0) r->fail_times--;
                s->counts.failed++;
                d.fail = 1; d.err = r->fail_errno;
                break;
            }
        }
        if (r->short_max > 0 && d.n > (size_t)r->short_max) d.n = (size_t)r->short_max;
        if (r->budget >= 0) {
            // Only bytes past the end of the file take space: a WAL restarted after a
            // checkpoint rewrites blocks it already has, as on a real full file system.
            struct stat st;
            off_t at = offset >= 0 ? offset : lseek(fd, 0, SEEK_CUR);
            off_t size = fstat(fd, &st) == 0 ? st.st_size : 0;
            int64_t inside = at < size ? (int64_t)(size - at) : 0;
            int64_t room = inside + r->budget;
            if (room <= 0 && d.n > 0) {
                s->counts.failed++;
                d.fail = 1; d.err = ENOSPC;
                break;
            }
            if ((int64_t)d.n > room) d.n = (size_t)room;
            if ((int64_t)d.n > inside) r->budget -= (int64_t)d.n - inside;
        }
        if (d.n < n) s->counts.short_writes++;
        break;   // the first matching rule decides
    }
    pthread_mutex_unlock(&lock);
    return d;
}

static void wrote(Slot *s, ssize_t n) {
    if (!s || n <= 0) return;
    pthread_mutex_lock(&lock);
    s->counts.bytes += n;
    pthread_mutex_unlock(&lock);
}

static ssize_t faultPwrite64(int fd, const void *buf, size_t n, off_t offset) {
    Decision d = decide(fd, n, offset);
    if (d.fail) { errno = d.err; return -1; }
    ssize_t r = realPwrite64(fd, buf, d.n, offset);
    wrote(d.slot, r);
    return r;
}

static ssize_t faultWrite(int fd, const void *buf, size_t n) {
    Decision d = decide(fd, n, -1);
    if (d.fail) { errno = d.err; return -1; }
    ssize_t r = realWrite(fd, buf, d.n);
    wrote(d.slot, r);
    return r;
}

int csqlitefault_install(void) {
    pthread_mutex_lock(&lock);
    if (!tried) {
        tried = 1;
        sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
        if (vfs && vfs->iVersion >= 3 && vfs->xGetSystemCall && vfs->xSetSystemCall) {
            realPwrite64 = (pwrite64_fn)vfs->xGetSystemCall(vfs, "pwrite64");
            realWrite = (write_fn)vfs->xGetSystemCall(vfs, "write");
            if (realPwrite64 && realWrite
                && vfs->xSetSystemCall(vfs, "pwrite64", (sqlite3_syscall_ptr)faultPwrite64) == SQLITE_OK
                && vfs->xSetSystemCall(vfs, "write", (sqlite3_syscall_ptr)faultWrite) == SQLITE_OK) {
                installed = 0;
            }
        }
    }
    int rc = installed;
    pthread_mutex_unlock(&lock);
    return rc;
}

__attribute__((constructor)) static void installEarly(void) { (void)csqlitefault_install(); }

int csqlitefault_arm(const char *prefix, csqlitefault_rule rule) {
    size_t len = strlen(prefix);
    if (len == 0 || len >= sizeof slots[0].prefix) return -1;
    pthread_mutex_lock(&lock);
    int h = -1;
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].used) continue;
        memset(&slots[i], 0, sizeof slots[i]);
        memcpy(slots[i].prefix, prefix, len + 1);
        slots[i].prefixLen = len;
        slots[i].rule = rule;
        slots[i].used = 1;
        h = i;
        __atomic_add_fetch(&armedCount, 1, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&lock);
    return h;
}

void csqlitefault_update(int h, csqlitefault_rule rule) {
    if (h < 0 || h >= SLOTS) return;
    pthread_mutex_lock(&lock);
    if (slots[h].used) slots[h].rule = rule;
    pthread_cond_broadcast(&unblocked);
    pthread_mutex_unlock(&lock);
}

void csqlitefault_counts_get(int h, csqlitefault_counts *out) {
    memset(out, 0, sizeof *out);
    if (h < 0 || h >= SLOTS) return;
    pthread_mutex_lock(&lock);
    if (slots[h].used) *out = slots[h].counts;
    pthread_mutex_unlock(&lock);
}

void csqlitefault_disarm(int h) {
    if (h < 0 || h >= SLOTS) return;
    pthread_mutex_lock(&lock);
    if (slots[h].used) {
        slots[h].used = 0;
        __atomic_sub_fetch(&armedCount, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&unblocked);
    }
    pthread_mutex_unlock(&lock);
}
