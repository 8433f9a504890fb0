#!/usr/bin/env bash
# Records the git commit being built in Sources/CBuildInfo/build_commit.h (gitignored), which
# build_info.c compiles in (`--version`, relay_build_info). Run by every Makefile build target; a
# plain `swift build` keeps the last recorded commit, or "unknown" in a fresh clone.
# Rewrites the header (and touches build_info.c, which SwiftPM would not otherwise recompile when
# the header first appears) only when the commit changed, so an unchanged tree rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
header=Sources/CBuildInfo/build_commit.h

commit=unknown
if git rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git rev-parse --short=12 HEAD)
  # Tracked files only: build products and this header are ignored.
  git diff --quiet HEAD -- 2>/dev/null || commit="$commit-dirty"
fi
content="// Written by scripts/build-info.sh; not checked in.
#define RELAY_BUILD_COMMIT \"$commit\""
if [ ! -f "$header" ] || [ "$(cat "$header")" != "$content" ]; then
  printf '%s\n' "$content" > "$header"
  touch Sources/CBuildInfo/build_info.c
fi
echo "build-info: commit $commit"
