// libsystemd from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CSYSTEMD_SHIM_H
#define CSYSTEMD_SHIM_H
#include <systemd/sd-daemon.h>
#endif
