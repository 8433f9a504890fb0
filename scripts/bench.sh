#!/usr/bin/env bash
# Runs every benchmark side by side with its anchor in this one session and assembles
# docs/benchmarks.md. Each scripts/bench-<area>.sh prints a markdown section on stdout
# (machine-independent commands, measured figures, ratios vs the anchor measured in the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/benchmarks.md
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
  echo "# Benchmarks"
  echo
  echo "Measured by \`make bench\` on $(date -u +%Y-%m-%d) on $(nproc) cores,"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB."
  echo "Swift: $(swift --version 2>&1 | head -1). Every ratio compares figures measured in the same run."
  echo
} > "$tmp"
for s in scripts/bench-*.sh; do
  [ -x "$s" ] || continue
  echo "== $s" >&2
  if ! "$s" >> "$tmp"; then
    echo "benchmark $s failed" >&2
    printf '\n## %s\n\nFAILED in this run (see the make bench log).\n' "$s" >> "$tmp"
  fi
done
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out" >&2
