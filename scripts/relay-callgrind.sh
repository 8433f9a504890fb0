#!/usr/bin/env bash
# Instructions per durable ingest request: relay-server (release, debug info stripped for
# valgrind 3.19) under callgrind, wrk -t2 -c64 POSTs as in scripts/bench-relay.sh. Counters are
# zeroed after start-up and a warm-up, dumped after the load; rows counted in the database.
# usage: scripts/relay-callgrind.sh OUT_PREFIX [stall=1 (mock-apns answers nothing) | 0] [seconds=8] [tokens=0]
#   tokens=0: one push token per wrk thread (write_post_lua); N > 0: N push tokens interleaved with
#   200-400-byte ciphertexts (write_tokens_lua, the traffic of scripts/bench-ingest.sh).
# BENCH_BIN=DIR runs the relay-server and mock-apns found there instead of building them.
# BENCH_PLAIN=1 runs relay-server without valgrind (the same load at full speed): prints 202/s and
# the relay's CPU (utime+stime) per row instead of writing a profile.
# then:  callgrind_annotate OUT_PREFIX.cg.1 ; divide by the printed row count.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1; STALL=${2:-1}; DUR=${3:-8}; TOKENS=${4:-0}
if [ -n "${BENCH_BIN:-}" ]; then
  BIN=$BENCH_BIN   # a prebuilt release relay-server and mock-apns (A/B runs of two builds)
else
  swift build -c release --product relay-server >&2
  swift build -c release --product mock-apns >&2
  BIN=$(swift build -c release --show-bin-path)
fi
WORK=$(mktemp -d /tmp/relay-callgrind.XXXXXX)
LUA="$WORK/post.lua"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
. scripts/lib-bench.sh
if [ "$TOKENS" -gt 0 ]; then write_tokens_lua "$LUA"; else write_post_lua "$LUA"; fi
export WRK_TOKENS=$TOKENS WRK_THREADS=2
objcopy --strip-debug "$BIN/relay-server" "$WORK/relay-server"
start_bench_mock
[ "$STALL" = 1 ] && curl -fsS -X POST "http://127.0.0.1:$CONTROL_PORT/faults" -H 'Content-Type: application/json' -d '{"stall":true}' >/dev/null
RELAY_PORT=$(free_port); ADMIN_PORT=$(free_port)
cat > "$WORK/relay.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$RELAY_PORT},"admin":{"host":"127.0.0.1","port":$ADMIN_PORT},
 "store":{"path":"$WORK/ingest.db","synchronous":"FULL","maxPending":5000000},
 $(bench_relay_members),
 "log":{"format":"json","level":"warning"}}
EOF
PLAIN=${BENCH_PLAIN:-0}
if [ "$PLAIN" = 1 ]; then
  "$BIN/relay-server" --config "$WORK/relay.json" 2>"$WORK/relay.log" &
else
  valgrind --tool=callgrind --callgrind-out-file="$OUT.cg" --separate-threads=no "$WORK/relay-server" --config "$WORK/relay.json" 2>"$WORK/relay.log" &
fi
RP=$!; PIDS+=($RP)
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
secret="rk_$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')"
hash=$(printf %s "$secret" | openssl dgst -sha256 -binary | od -An -tx1 | tr -d ' \n')
sqlite3 "$WORK/ingest.db" ".timeout 5000" "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_$(openssl rand -hex 6)','bench',X'$hash','com.example.bench',0)"
# warm up then zero
RELAY_CRED="$secret" WRK_THREADS=1 WRK_SEED=1 wrk -t1 -c8 -d2s -s "$LUA" "http://127.0.0.1:$RELAY_PORT" >/dev/null
sleep 1
# Group commits: the writer's per-batch work (BEGIN, COMMIT, fsync, hand-overs) is spread over
# the rows a batch holds, and under callgrind that number varies from run to run.
commits() { curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '$1 == "relay_store_commits_total" {print $2}'; }
C0=$(commits)
R0=$(sqlite3 "$WORK/ingest.db" ".timeout 5000" "SELECT count(*) FROM responses")
D0=$(sqlite3 "$WORK/ingest.db" ".timeout 5000" "SELECT count(*) FROM attempts")
if [ "$PLAIN" = 1 ]; then T0=$(cpu_ticks $RP); else callgrind_control -z $RP >/dev/null; fi
RELAY_CRED="$secret" wrk -t2 -c64 -d${DUR}s -s "$LUA" "http://127.0.0.1:$RELAY_PORT" > "$OUT.wrk"
sleep 2
if [ "$PLAIN" = 1 ]; then T1=$(cpu_ticks $RP); else callgrind_control -d $RP >/dev/null; fi
C1=$(commits)
R1=$(sqlite3 "$WORK/ingest.db" ".timeout 5000" "SELECT count(*) FROM responses")
D1=$(sqlite3 "$WORK/ingest.db" ".timeout 5000" "SELECT count(*) FROM attempts")
CPU=""
[ "$PLAIN" = 1 ] && CPU=" relay_cpu_us_per_row=$(awk -v t=$((T1-T0)) -v n=$((R1-R0)) -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", (n > 0 ? t * 1e6 / hz / n : 0)}')"
echo "rows=$((R1-R0)) attempts=$((D1-D0)) commits=$((C1-C0))$CPU" | tee "$OUT.rows"
grep -E "Requests/sec" "$OUT.wrk"
