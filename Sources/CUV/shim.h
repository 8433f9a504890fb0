// libuv from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CUV_SHIM_H
#define CUV_SHIM_H
#include <uv.h>
#include <sys/socket.h>

// accept4(2) is a GNU extension: <sys/socket.h> declares it only under _GNU_SOURCE, which the
// Swift Glibc module is built without (and defining it in an imported header breaks the build).
// glibc exports the symbol; this is the man page's prototype. The HTTP server's listener
// (Listener.swift) needs the new socket non-blocking and close-on-exec atomically.
#ifndef __USE_GNU
int accept4(int sockfd, struct sockaddr *addr, socklen_t *addrlen, int flags);
#endif

/// One pending connection on listening socket `fd`, non-blocking and close-on-exec; -1 and
/// errno as accept(2).
static inline int cuv_accept(int fd) {
    return accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
}
#endif
