#!/usr/bin/env bash
# A/B of two release builds in one session: the figures a refactoring must keep (issue 26's
# done-when), each measured by its own script against OLD_BIN's and NEW_BIN's binaries, the two
# builds alternating run by run (old first in odd rounds, new first in even ones) so the machine's
# load hits both alike.
#   scripts/bench-ab.sh OLD_BIN NEW_BIN
# OLD_BIN and NEW_BIN each hold relay-server, mock-apns, relayctl and http-bench-server (a
# `swift build -c release` of each commit, e.g. in a `git worktree add` of the old one).
# Measurements (BENCH_AB_ONLY="ingest ingest-cg conns cg http" picks some; all by default):
#   ingest   durable 202/s and relay CPU µs per row at BENCH_TOKENS (1,000) interleaved push
#            tokens, SQLite FULL, APNs stalled: scripts/bench-ingest.sh, system relay-small (and
#            relay-pg, the PostgreSQL backend on its own throwaway cluster, with BENCH_AB_PG=1), and
#            the CPU per row of its writer and HTTP loop threads;
#   ingest-cg  instructions per durable row at 1,000 interleaved tokens, APNs stalled, wrk -t2 -c64
#            for 8 s under callgrind: scripts/relay-callgrind.sh OUT 1 8 1000, with a fit of the
#            rounds into instructions per row and per group commit (OUT/icg-old-rN.cg.1
#            and OUT/icg-new-rN.cg.1 kept: callgrind_annotate --inclusive=yes for the threads);
#   conns    pipeline stage 2, durable 202/s with wrk at BENCH_AB_CONNS (64) connections, mock-apns
#            answering: BENCH_CONNS_ONLY=1 scripts/bench-pipeline.sh (it runs its nginx anchor too;
#            its webhook rounds only with BENCH_HOOK_ROUNDS=N, their table left in the log);
#   cg       pipeline stage 5, instructions per response end to end (callgrind):
#            BENCH_CG_ONLY=1 scripts/bench-pipeline.sh, the callgrind outputs kept for
#            scripts/cg-diff.py in OUT/cg-old-rN and OUT/cg-new-rN;
#   http     http-bench-server's instructions per request, HTTP/1.1 and HTTP/2 (callgrind):
#            BENCH_HTTP_CG_ONLY=1 scripts/bench-http.sh.
# BENCH_AB_ROUNDS (3) rounds of the throughput figures; the instruction counts (which repeat
# to a fraction of a percent) in the first BENCH_AB_CG_ROUNDS (2). Raw outputs, results.tsv
# (round, build, figure, value, 1-minute load average when it was taken) and the callgrind
# files go to BENCH_AB_OUT (default /tmp/bench-ab.<time>); the summary (median, min-max and
# new/old of the medians per figure) is printed on stdout as a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/bench-ab.sh OLD_BIN NEW_BIN" >&2; exit 2; }
OLD=$(realpath "$1"); NEW=$(realpath "$2")
for b in "$OLD" "$NEW"; do
  for p in relay-server mock-apns relayctl http-bench-server; do
    [ -x "$b/$p" ] || { echo "bench-ab: $b/$p missing (a release build of every product)" >&2; exit 1; }
  done
done
ROUNDS=${BENCH_AB_ROUNDS:-3}
CG_ROUNDS=${BENCH_AB_CG_ROUNDS:-2}
ONLY=${BENCH_AB_ONLY:-"ingest ingest-cg conns cg http"}
OUT=${BENCH_AB_OUT:-/tmp/bench-ab.$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
RES="$OUT/results.tsv"
: > "$RES"
echo "bench-ab: old $OLD ($("$OLD/relay-server" --version)), new $NEW ($("$NEW/relay-server" --version)); out $OUT" >&2

wants() { [[ " $ONLY " == *" $1 "* ]]; }
load1() { cut -d' ' -f1 /proc/loadavg; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(load1)" >> "$RES"; }   # round build figure value

measure() {  # round build(old|new) measurement
  local r=$1 b=$2 m=$3 bin log
  bin=$OLD; [ "$b" = new ] && bin=$NEW
  log="$OUT/$m-$b-r$r"
  echo "== round $r: $m, $b (load $(load1))" >&2
  case $m in
    ingest)
      local systems="relay-small"
      [ -n "${BENCH_AB_PG:-}" ] && systems+=" relay-pg"
      BENCH_BIN=$bin BENCH_INGEST_SYSTEMS=$systems BENCH_INGEST_ROUNDS=1 scripts/bench-ingest.sh > "$log.md" 2> "$log.err"
      cp .build/bench-ingest-results.tsv "$log.tsv"
      # system round records/s cpu_us_per_record bytes_written_per_record extra
      while IFS=$'\t' read -r sys _ rps us bytes extra; do
        record "$r" "$b" "$sys 202/s" "$rps"
        record "$r" "$b" "$sys CPU µs per row" "$us"
        record "$r" "$b" "$sys bytes written per row" "$bytes"
        # the two threads ingest runs on: the SQLite writer and the HTTP loop (main thread's name)
        for th in relay-sqlite-wr relay-server; do
          record "$r" "$b" "$sys thread $th CPU µs per row" "$(sed -n "s/.*threads µs per row:.* $th \([0-9.]*\).*/\1/p" <<<"$extra")"
        done
      done < "$log.tsv"
      ;;
    ingest-cg)
      BENCH_BIN=$bin scripts/relay-callgrind.sh "$OUT/icg-$b-r$r" 1 8 1000 > "$log.md" 2> "$log.err"
      local rows total commits
      rows=$(sed -n 's/^rows=\([0-9]*\) .*/\1/p' "$log.md")
      total=$(awk '/^(summary|totals):/{print $2; exit}' "$OUT/icg-$b-r$r.cg.1")
      commits=$(sed -n 's/^rows=.* commits=\([0-9]*\).*/\1/p' "$log.md")
      record "$r" "$b" "ingest instructions per row, 1,000 tokens" "$((total / rows))"
      record "$r" "$b" "ingest rows under callgrind (8 s)" "$rows"
      record "$r" "$b" "ingest rows per commit under callgrind" "$(awk -v r="$rows" -v c="$commits" 'BEGIN{if (c > 0) printf "%.2f", r / c}')"
      # raw, for the fit in the summary (not printed as figures of their own)
      record "$r" "$b" "_cg total" "$total"; record "$r" "$b" "_cg rows" "$rows"; record "$r" "$b" "_cg commits" "$commits"
      ;;
    conns)
      BENCH_BIN=$bin BENCH_CONNS_ONLY=1 BENCH_CONNS="${BENCH_AB_CONNS:-64}" BENCH_HOOK_ROUNDS=${BENCH_HOOK_ROUNDS:-0} scripts/bench-pipeline.sh > "$log.md" 2> "$log.err"
      awk -F'|' '$2 ~ /^ *[0-9]+ *$/ {gsub(/ /, "", $2); gsub(/ /, "", $3); print $2 "\t" $3}' "$log.md" |
        while IFS=$'\t' read -r c rps; do record "$r" "$b" "pipeline 202/s at $c connections" "$rps"; done
      record "$r" "$b" "pipeline 202/s at 64 connections, synchronous=NORMAL" "$(sed -n 's/^synchronous=NORMAL at 64 connections: \([0-9.]*\) .*/\1/p' "$log.md")"
      ;;
    cg)
      rm -rf "$OUT/cg-$b-r$r"
      BENCH_BIN=$bin BENCH_CG_ONLY=1 BENCH_CG_KEEP="$OUT/cg-$b-r$r" scripts/bench-pipeline.sh > "$log.md" 2> "$log.err"
      record "$r" "$b" "pipeline instructions per response" "$(awk '{print $1; exit}' "$log.md")"
      ;;
    http)
      BENCH_BIN=$bin BENCH_HTTP_CG_ONLY=1 scripts/bench-http.sh > "$log.md" 2> "$log.err"
      record "$r" "$b" "HTTP/1.1 instructions per request" "$(awk '$1 == "h1" {print $2}' "$log.md")"
      record "$r" "$b" "HTTP/2 instructions per request" "$(awk '$1 == "h2" {print $2}' "$log.md")"
      ;;
  esac
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg); START=$(date -u '+%Y-%m-%d %H:%M')
for r in $(seq 1 "$ROUNDS"); do
  order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
  for m in ingest ingest-cg conns cg http; do
    wants "$m" || continue
    if { [ "$m" = cg ] || [ "$m" = http ]; } && [ "$r" -gt "$CG_ROUNDS" ]; then continue; fi
    for b in $order; do measure "$r" "$b" "$m"; done
  done
done

python3 - "$RES" "$START" "$(date -u '+%H:%M UTC')" "$LOAD_START" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import statistics, sys
res, start, end, load0, load1 = sys.argv[1:]
rows = {}
for line in open(res):
    r, b, fig, val, load = line.rstrip("\n").split("\t")
    if val:
        rows.setdefault(fig, {}).setdefault(b, []).append((int(r), float(val), float(load)))
print(f"A/B {start}-{end}, load average {load0} at the start, {load1} at the end.\n")
print("| figure | old median (min-max) | new median (min-max) | new / old | rounds: old, new (1-min load) |")
print("|---|---:|---:|---:|---|")
for fig, by in rows.items():
    if fig.startswith("_"):
        continue
    o, n = by.get("old", []), by.get("new", [])
    if not o or not n:
        continue
    mo, mn = statistics.median(v for _, v, _ in o), statistics.median(v for _, v, _ in n)
    fmt = (lambda v: f"{v:,.1f}") if max(v for _, v, _ in o + n) < 1000 else (lambda v: f"{v:,.0f}")
    span = lambda xs: f"{fmt(min(v for _, v, _ in xs))}-{fmt(max(v for _, v, _ in xs))}"
    each = lambda xs: " ".join(f"{fmt(v)} ({l:.1f})" for _, v, l in sorted(xs))
    print(f"| {fig} | {fmt(mo)} ({span(o)}) | {fmt(mn)} ({span(n)}) | {mn / mo:.3f} | {each(o)}; {each(n)} |")

# Under callgrind the writer commits 6-11 rows a batch, differently from run to run, and a
# batch's own work (BEGIN, COMMIT, its fsync and hand-overs) is spread over them: a build that
# ran slower commits smaller batches and looks dearer per row. Least squares over the rounds,
# total = perRow * rows + perCommit * commits, separates the two; both builds are then compared
# at the same batch size (the old build's median).
def fit(b):
    pts = {}
    for key in ("_cg total", "_cg rows", "_cg commits"):
        for r, v, _ in rows.get(key, {}).get(b, []):
            pts.setdefault(r, {})[key] = v
    pts = [(p["_cg total"], p["_cg rows"], p["_cg commits"]) for p in pts.values() if len(p) == 3 and p["_cg commits"] > 0]
    if len(pts) < 2:
        return None
    srr = sum(r * r for _, r, _ in pts); scc = sum(c * c for _, _, c in pts); src = sum(r * c for _, r, c in pts)
    str_ = sum(t * r for t, r, _ in pts); stc = sum(t * c for t, _, c in pts)
    det = srr * scc - src * src
    if abs(det) < 1e-9 * srr * scc:
        return None
    a = (str_ * scc - stc * src) / det
    c = (srr * stc - src * str_) / det
    worst = max(abs(a * r + c * k - t) / t for t, r, k in pts)
    return a, c, len(pts), worst, statistics.median(r / k for _, r, k in pts)

fo, fn = fit("old"), fit("new")
if fo and fn:
    bs = fo[4]
    at = lambda f: f[0] + f[1] / bs
    print(f"\nIngest instructions, fitted over the callgrind rounds (total = per row x rows + per commit x commits):\n")
    print("| build | per row | per commit | rounds | worst residual | per row at {:.1f} rows a commit |".format(bs))
    print("|---|---:|---:|---:|---:|---:|")
    for name, f in (("old", fo), ("new", fn)):
        print(f"| {name} | {f[0]:,.0f} | {f[1]:,.0f} | {f[2]} | {100 * f[3]:.1f} % | {at(f):,.0f} |")
    print(f"\nnew / old at the same batch size: {at(fn) / at(fo):.3f}; per row alone: {fn[0] / fo[0]:.3f}")
PY
echo "bench-ab: raw outputs in $OUT" >&2
