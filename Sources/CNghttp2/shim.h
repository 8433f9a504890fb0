// libnghttp2 from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CNGHTTP2_SHIM_H
#define CNGHTTP2_SHIM_H
#include <nghttp2/nghttp2.h>
#endif
