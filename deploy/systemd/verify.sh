#!/usr/bin/env bash
# Checks a relay-server unit (plus optional drop-ins) with systemd-analyze, without a running
# systemd and without the binary installed: ExecStart is pointed at a stand-in executable.
#   deploy/systemd/verify.sh <unit> [drop-in.conf[.example]...]
# Fails on any warning from `verify`, and when `security --offline` rates the exposure above
# MAX_EXPOSURE (default 2.0, "OK"; the shipped unit scores 1.2). Exit 77 = systemd-analyze missing.
set -euo pipefail
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not installed" >&2; exit 77; }
unit=$(realpath "$1"); shift
name=$(basename "$unit")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/units/$name.d"
printf '#!/bin/sh\nexit 0\n' > "$tmp/bin/stand-in"; chmod 0755 "$tmp/bin/stand-in"
sed -E "s#^(Exec[A-Za-z]+=[-@:+!]*)/[^ ]+#\1$tmp/bin/stand-in#" "$unit" > "$tmp/units/$name"
for d in "$@"; do cp "$d" "$tmp/units/$name.d/$(basename "$d" .example)"; done

if ! systemd-analyze verify --man=no "$tmp/units/$name" > "$tmp/verify.out" 2>&1 || [ -s "$tmp/verify.out" ]; then
  echo "systemd-analyze verify failed for $name:" >&2; cat "$tmp/verify.out" >&2; exit 1
fi
echo "verify: ok ($name${*:+ + $*})"
max=${MAX_EXPOSURE:-2.0}
if ! systemd-analyze security --offline=yes --threshold="$(awk -v m="$max" 'BEGIN{print int(m*10)}')" \
    "$tmp/units/$name" > "$tmp/security.out" 2>&1; then
  cat "$tmp/security.out" >&2; echo "exposure above $max" >&2; exit 1
fi
grep -a "Overall exposure level" "$tmp/security.out"
