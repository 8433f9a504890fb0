#!/usr/bin/env bash
# Logging never blocks a loop (issue 25): durable 202/s of relay-server
#   debug-pipe: log.level debug (one line per request) with stderr a pipe nobody reads (a
#               FIFO this script holds open and never reads: it is full after 64 KiB);
#   info-null:  log.level info (no line per 202) with stderr /dev/null: what the log queue
#               costs at the default level, as relay CPU per 202;
# each for BENCH_DURATION seconds (default 10) of `wrk -t2 -c64` with write_post_lua, mock-apns
# stalled (only the ingest path runs), SQLite synchronous=FULL, a fresh database per run. Then
# SIGTERM, and the time to exit (the stop drains the log queue for at most 2 s; a relay blocked
# on stderr is killed after 15 s). BENCH_BIN=DIR runs the relay-server and mock-apns found
# there (an A/B against an older release build); BENCH_LOG_CASES="debug-pipe" runs only those.
# A markdown table on stdout, progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
CASES=${BENCH_LOG_CASES:-debug-pipe info-null}
. scripts/lib-bench.sh
bench_prologue bench-log wrk openssl sqlite3 curl python3

start_bench_mock
curl -fsS -X POST "http://127.0.0.1:$CONTROL_PORT/faults" -H 'Content-Type: application/json' -d '{"stall":true}' >/dev/null
write_post_lua "$WORK/one.lua"
mkfifo "$WORK/stderr.fifo"
exec 3<>"$WORK/stderr.fifo"   # held open, never read: the relay's writes fill it and then block

echo "| case | 202/s | relay CPU µs per 202 | relay_log_dropped_total | SIGTERM to exit |"
echo "|---|---|---|---|---|"
n=0
for c in $CASES; do
  n=$((n + 1))
  case $c in
    debug-pipe) level=debug; target="$WORK/stderr.fifo" ;;
    info-null) level=info; target=/dev/null ;;
    *) echo "bench-log: unknown case $c" >&2; exit 64 ;;
  esac
  port=$(free_port); admin=$(free_port)
  cat > "$WORK/relay-$n.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$port},"admin":{"host":"127.0.0.1","port":$admin},
 "store":{"path":"$WORK/relay-$n.db","synchronous":"FULL","maxPending":5000000},
 $(bench_relay_members),
 "watchdog":false,"log":{"format":"json","level":"$level"}}
EOF
  "$BIN/relay-server" --config "$WORK/relay-$n.json" 2>"$target" &
  pid=$!; PIDS+=("$pid")
  wait_url "http://127.0.0.1:$admin/readyz"
  sqlite3 "$WORK/relay-$n.db" ".timeout 5000" "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_bench','bench',X'$HASH','com.example.bench',0)"
  echo "== $c ($BIN)" >&2
  a0=$(metric "$admin" 'relay_ingest_requests_total{status="202"}'); t0=$(proc_ticks "$pid")
  RELAY_CRED="$SECRET" wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" --timeout 5s -s "$WORK/one.lua" "http://127.0.0.1:$port" > "$WORK/wrk-$n.txt" || true
  a1=$(metric "$admin" 'relay_ingest_requests_total{status="202"}'); t1=$(proc_ticks "$pid")
  dropped=$(metric "$admin" relay_log_dropped_total)
  stop0=$(date +%s.%N)
  kill -TERM "$pid"
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    stopped="killed after 15 s"; kill -KILL "$pid"
  else
    stopped=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f} s')" "$stop0" "$(date +%s.%N)")
  fi
  wait "$pid" 2>/dev/null || true
  python3 - "$c" "$((a1 - a0))" "$DURATION" "$((t1 - t0))" "$(getconf CLK_TCK)" "$dropped" "$stopped" <<'PY'
import sys
case, n, secs, ticks, hz, dropped, stopped = sys.argv[1:]
n, secs, ticks, hz = int(n), float(secs), int(ticks), int(hz)
us = ticks / hz * 1e6 / n if n else 0
print(f"| {case} | {n / secs:,.0f} | {us:.1f} | {int(float(dropped)):,} | {stopped} |")
PY
done
