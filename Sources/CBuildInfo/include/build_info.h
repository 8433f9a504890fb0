// The git commit this build was made from, compiled in by build_info.c.
#ifndef RELAY_BUILD_INFO_H
#define RELAY_BUILD_INFO_H

/// "<12 hex digits>" or "<12 hex digits>-dirty" when `make` (scripts/build-info.sh) recorded it,
/// "unknown" for a plain `swift build` from a tree where it never ran. Static storage.
const char *relay_build_commit(void);

#endif
