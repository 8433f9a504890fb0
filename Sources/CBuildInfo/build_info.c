// Why C: the commit comes from a header scripts/build-info.sh writes (gitignored) and that a
// fresh clone lacks; only the C preprocessor can include a file when it exists and fall back when
// it does not (__has_include). Swift has no optional include and SwiftPM no codegen without plugins.
#include "build_info.h"

#if __has_include("build_commit.h")
#include "build_commit.h"
#endif

#ifndef RELAY_BUILD_COMMIT
#define RELAY_BUILD_COMMIT "unknown"
#endif

const char *relay_build_commit(void) { return RELAY_BUILD_COMMIT; }
