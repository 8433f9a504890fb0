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

version() { command -v "$1" >/dev/null || { echo "not installed"; return; }; { "$@" 2>&1 || true; } | head -1 | tr -d '\r'; }
mkdir -p .build; log=.build/bench.log
ran=()
if [ -n "${BENCH_REASSEMBLE:-}" ]; then
  # Re-assemble docs/benchmarks.md from the last run's sections (.build/bench-sections.md),
  # e.g. after changing this script's summary; measures nothing.
  cp .build/bench-sections.md "$sections"
  mapfile -t ran < .build/bench-ran.txt
  when=$(cat .build/bench-when.txt)
else
: > "$log"
when="$(date -u '+%Y-%m-%d %H:%M UTC'); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
for s in scripts/bench-*.sh; do
  [ -x "$s" ] || continue
  name=$(basename "$s" .sh); name=${name#bench-}
  if [ -n "${BENCH_ONLY:-}" ] && [[ " $BENCH_ONLY " != *" $name "* ]]; then continue; fi
  # KeyExchange vs Python needs a venv with cryptography: `make bench-kex` (or BENCH_ONLY=kex).
  if [ "$name" = kex ] && [[ " ${BENCH_ONLY:-} " != *" kex "* ]]; then continue; fi
  # Tools that take release directories as arguments, not sections: bench-ab.sh (an A/B of two
  # builds) and bench-webhook-load.sh (bench-pipeline.sh runs it and shows its table).
  if [ "$name" = ab ] || [ "$name" = webhook-load ]; then continue; fi
  echo "== $s" | tee -a "$log" >&2
  start=$(date +%s)
  if ! "$s" >> "$sections" 2> >(tee -a "$log" >&2); then
    echo "benchmark $s failed" >&2
    printf '\n## %s\n\nFAILED in this run (see .build/bench.log).\n' "$s" >> "$sections"
  fi
  ran+=("\`$s\` ($(( $(date +%s) - start )) s)")
  echo >> "$sections"
done
when="$(date -u '+%Y-%m-%d %H:%M UTC'); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${BENCH_ONLY:-}" ] && [ -f "$out" ]; then
  # A subset run keeps the other sections of the previous docs/benchmarks.md, their headings
  # marked with the run they come from, so the page and its summary stay complete.
  python3 - "$out" "$sections" <<'PY'
import re, sys
old, new = open(sys.argv[1]).read(), open(sys.argv[2]).read()
m = re.search(r"finished (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", old)
origin = m.group(1) if m else "an earlier run"
have = {l[3:].split(" — not re-measured")[0].strip() for l in new.splitlines() if l.startswith("## ")}
parts = re.split(r"(?m)^(?=## )", old)
keep = []
for part in parts[1:]:
    title = part.splitlines()[0][3:].strip()
    base = title.split(" — not re-measured")[0].strip()
    if base.startswith("Summary") or base in have:
        continue
    if " — not re-measured" not in title:
        part = part.replace(title, f"{title} — not re-measured: from the run finished {origin}", 1)
    keep.append(part.rstrip() + "\n\n")
with open(sys.argv[2], "a") as f:
    f.write("".join(keep))
PY
fi
cp "$sections" .build/bench-sections.md
printf '%s\n' "${ran[@]}" > .build/bench-ran.txt
echo "$when" > .build/bench-when.txt
fi

{
  echo "# Benchmarks"
  echo
  echo "Measured by \`make bench\` (\`scripts/bench.sh\`), finished $when. Every ratio compares"
  echo "figures measured in the same run on the same machine; absolute figures depend on the machine"
  echo "and on what else it was doing (this VM was shared with other build and test jobs)."
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
  echo "| Redis | $(version redis-server --version) |"
  echo "| PostgreSQL | $(version pgbench --version) |"
  echo "| python3 | $(version python3 --version) |"
  echo
  echo "Scripts run: ${ran[*]:-none}."
  echo
  echo "## Summary: every ratio against its anchor, and every target"
  echo
  python3 - "$sections" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
# Targets from the issues for rows whose own table does not carry one.
KNOWN = {"pushclient / h2load": ">= 0.8x (issue 4)", "pushclient / aioapns": ">= 10x (issue 4)"}
section, header, rows = "", None, []
def clean(c): return c.replace("**", "").strip()
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
    name = clean(cells[0])
    if re.fullmatch(r"[0-9.]+", name):
        name = f"{header[0]} {name}: " + " vs ".join(header[1:3])
    ri = next((i for i, h in enumerate(header) if re.search(r"\bratio\b", h)), None)   # not "operation"
    ti = next((i for i, h in enumerate(header) if "target" in h and i != ri), None)
    target = cells[ti] if ti is not None and ti < len(cells) else ""
    if ri is not None and ri < len(cells) and cells[ri] and cells[ri] not in ("–", "-", "n/a"):
        value = cells[ri]
        if not target:
            m = re.search(r"\(([^)]*)\)\s*$", value)
            if m:
                target, value = m.group(1), value[:m.start()].strip()
    elif " / " in name and cells[0].startswith("**"):
        value = "; ".join(f"{header[i]}: {clean(c)}" for i, c in enumerate(cells[1:], 1) if i < len(header))
    elif target and target not in ("–", "-"):
        value = cells[1] if len(cells) > 1 else ""
    else:
        continue
    if not target:
        target = next((t for k, t in KNOWN.items() if k in name.lower()), "")
    rows.append((section, name, value, target))
print("| section | measurement | figure / ratio | target |")
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
