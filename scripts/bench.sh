#!/usr/bin/env bash
# Runs every benchmark side by side with its anchor in this one session and assembles
# docs/benchmarks.md. Each scripts/bench-<area>.sh prints a markdown section on stdout
# (machine-independent commands, measured figures, ratios vs the anchor measured in the same run).
# This script adds the machine and tool versions, a summary of every ratio (collected from the
# sections' tables that have a "ratio" column) and the plots: scripts that leave CSV files in
# $BENCH_DATA get them drawn as SVG under docs/ by scripts/bench-plots.py.
#   scripts/bench.sh                 # everything
#   BENCH_ONLY="relay pipeline" scripts/bench.sh   # only bench-relay.sh and bench-pipeline.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/benchmarks.md
tmp=$(mktemp)
sections=$(mktemp)
export BENCH_DATA
BENCH_DATA=$(mktemp -d /tmp/bench-data.XXXXXX)
trap 'rm -rf "$tmp" "$sections" "$BENCH_DATA"' EXIT

version() { "$@" 2>&1 | head -1 | tr -d '\r' || echo "not installed"; }
mkdir -p .build; log=.build/bench.log
: > "$log"
ran=()
for s in scripts/bench-*.sh; do
  [ -x "$s" ] || continue
  name=$(basename "$s" .sh); name=${name#bench-}
  if [ -n "${BENCH_ONLY:-}" ] && [[ " $BENCH_ONLY " != *" $name "* ]]; then continue; fi
  echo "== $s" | tee -a "$log" >&2
  start=$(date +%s)
  if ! "$s" >> "$sections" 2> >(tee -a "$log" >&2); then
    echo "benchmark $s failed" >&2
    printf '\n## %s\n\nFAILED in this run (see .build/bench.log).\n' "$s" >> "$sections"
  fi
  ran+=("\`$s\` ($(( $(date +%s) - start )) s)")
done

{
  echo "# Benchmarks"
  echo
  echo "Measured by \`make bench\` (\`scripts/bench.sh\`) on $(date -u '+%Y-%m-%d %H:%M UTC'). Every ratio compares"
  echo "figures measured in the same run on the same machine; absolute figures depend on the machine"
  echo "and on what else it was doing (load average at the start of the assembly: $(cut -d' ' -f1-3 /proc/loadavg))."
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| CPU | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores |"
  echo "| memory | $(free -g | awk '/Mem:/{print $2}') GiB |"
  echo "| kernel | $(uname -sr) |"
  echo "| OS | $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}") |"
  echo "| Swift | $(version swift --version) |"
  echo "| nginx | $(version nginx -v) |"
  echo "| wrk | $(version wrk --version) |"
  echo "| h2load | $(version h2load --version) |"
  echo "| SQLite | $(version sqlite3 --version | cut -d' ' -f1) |"
  echo "| OpenSSL | $(version openssl version) |"
  echo "| libcurl | $(version curl --version) |"
  echo "| valgrind | $(version valgrind --version) |"
  echo "| python3 | $(version python3 --version) |"
  echo
  echo "Scripts run: ${ran[*]:-none}."
  echo
  echo "## Summary: every ratio against its anchor"
  echo
  python3 - "$sections" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section, header, rows = "", None, []
for line in text.splitlines():
    if line.startswith("## "):
        section, header = line[3:].strip(), None
        continue
    if not line.startswith("|"):
        header = None
        continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if header is None:
        header = [c.lower() for c in cells]
        continue
    if all(set(c) <= set("-: ") for c in cells):
        continue
    ri = next((i for i, h in enumerate(header) if "ratio" in h), None)
    if ri is None or ri >= len(cells) or not cells[ri] or cells[ri] in ("–", "-", "n/a"):
        continue
    ti = next((i for i, h in enumerate(header) if "target" in h), None)
    target = cells[ti] if ti is not None and ti < len(cells) else ""
    if not target:
        m = re.search(r"\(([<>]=?[^)]*)\)", cells[ri])
        target = m.group(1) if m else ""
    rows.append((section, cells[0], cells[ri], target))
print("| section | measurement | ratio | target |")
print("|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
if not rows:
    print("| – | no ratio rows in this run | | |")
PY
  echo
  echo "Shortfalls against the targets are explained in the section that measures them and in"
  echo "[docs/benchmarks-analysis.md](benchmarks-analysis.md) (profiles)."
  echo
  cat "$sections"
} > "$tmp"

plots=$(python3 scripts/bench-plots.py "$BENCH_DATA" docs 2>>"$log" || true)
[ -n "$plots" ] && echo "plots: $plots" >&2
mv "$tmp" "$out"
trap 'rm -rf "$sections" "$BENCH_DATA"' EXIT
echo "wrote $out (log: $log)" >&2
