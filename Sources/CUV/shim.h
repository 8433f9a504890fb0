// libuv from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CUV_SHIM_H
#define CUV_SHIM_H
#include <uv.h>
#endif
