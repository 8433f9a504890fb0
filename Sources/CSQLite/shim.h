// libsqlite3 from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CSQLITE_SHIM_H
#define CSQLITE_SHIM_H
#include <sqlite3.h>

// SQLITE_TRANSIENT is a macro casting -1 to a function pointer: Swift cannot import it. Binding
// text/blob with it makes SQLite copy the bytes, so Swift buffers may move or die after the call.
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
#endif
