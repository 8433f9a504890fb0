// libsystemd from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CSYSTEMD_SHIM_H
#define CSYSTEMD_SHIM_H
#include <systemd/sd-daemon.h>

// sd_notify takes a const char* state string, which imports fine; the wrapper exists to keep
// `unset_environment` a plain int and to give RelayCore one prefixed entry point (csd_).
static inline int csd_notify(const char *state) { return sd_notify(0, state); }
#endif
