#!/usr/bin/env bash
# End-to-end pipeline benchmarks (issue 7), a markdown section on stdout, progress on stderr.
# Run by `make bench` via scripts/bench.sh (which also draws the plots from $BENCH_DATA), or alone.
#  1. Ingest -> APNs latency p50/p99/p99.9 at several offered loads (relay + mock-apns, TLS).
#  2. Durable ingest 202/s vs client connections (wrk, BENCH_TOKENS push tokens interleaved, default
#     1,000: write_tokens_lua), nginx static at the same connections; then at 64 connections
#     without and with one webhook (scripts/bench-webhook-load.sh, its receiver http-bench-server:
#     BENCH_HOOK_ROUNDS alternating rounds, default 3, 0 skips them, of BENCH_HOOK_SECONDS each,
#     default BENCH_DURATION): medians and paired ratios (issue 24: at most 5 %).
#  3. Dispatcher drain rate of a backlog of BENCH_DRAIN_ROWS (default 1,000,000) queued rows.
#  4. Growth: ingest 202/s and drain rate with 10k, 100k and 1M rows already queued.
#  5. Instructions per response end to end (callgrind on a stripped copy; differential between
#     two request counts so start-up cancels out).
# BENCH_CG_ONLY=1 runs stage 5 alone and prints its figure; BENCH_CG_KEEP=DIR keeps the symbols
# (strips debug info only, as valgrind 3.19 needs) and copies both callgrind outputs to DIR, so
# two builds can be compared function by function: scripts/cg-diff.py OLD_DIR NEW_DIR.
# BENCH_CONNS_ONLY=1 runs stage 2 alone and prints its tables (A/B runs: scripts/bench-ab.sh).
# Every 202/s is the 202s the relay counted (relay_ingest_requests_total on its admin /metrics)
# over wrk's measured seconds, other answers shown apart (ingest_result in lib-bench.sh).
# Delivery events: stage 5 also measures the relay with one webhook configured (docs/events.md),
# its loopback receiver answering 204 to each event (python3 http.server; it does not verify), and
# waits until every event was delivered to it, so sending them is inside the figure.
# BENCH_WEBHOOK=1 configures that webhook on every relay this script starts (stages 1-5; with
# BENCH_CG_ONLY=1 the one figure printed is then the one with the webhook).
# Leaves no processes behind (the trap stops what it started, by pid).
set -euo pipefail
cd "$(dirname "$0")/.."

LOADS=${BENCH_LOADS:-"250 500 1000 2000"}
LAT_SECONDS=${BENCH_LAT_SECONDS:-8}
CONNS=${BENCH_CONNS:-"1 4 16 64 256"}
DURATION=${BENCH_DURATION:-5}
TOKENS=${BENCH_TOKENS:-1000}
HOOK_ROUNDS=${BENCH_HOOK_ROUNDS:-3}
HOOK_SECONDS=${BENCH_HOOK_SECONDS:-$DURATION}
DRAIN_ROWS=${BENCH_DRAIN_ROWS:-1000000}
DRAIN_SECONDS=${BENCH_DRAIN_SECONDS:-180}   # the drain is measured for at most this long
GROWTH=${BENCH_GROWTH:-"10000 100000 1000000"}
DATA=${BENCH_DATA:-$(mktemp -d /tmp/bench-data.XXXXXX)}
mkdir -p "$DATA"
for tool in wrk nginx openssl sqlite3 curl python3 valgrind objcopy; do
  command -v "$tool" >/dev/null || { echo "bench-pipeline: $tool missing (make deps bench-deps)" >&2; exit 1; }
done

if [ -n "${BENCH_BIN:-}" ]; then
  BIN=$BENCH_BIN   # prebuilt binaries (e.g. while iterating on this script)
else
  for p in relay-server mock-apns relayctl http-bench-server; do swift build -c release --product "$p" >&2; done
  BIN=$(swift build -c release --show-bin-path)
fi
WORK=$(mktemp -d /tmp/bench-pipeline.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
H=scripts/bench_pipeline.py

. scripts/lib-bench.sh

start_bench_mock --deliveries-log "$WORK/deliveries.jsonl"

EVENTS=""
HOOK_EVENTS=""
start_hook_receiver() {  # sets HOOK_EVENTS: the config member of one webhook to it
  [ -n "$HOOK_EVENTS" ] && return
  start_webhook_receiver
  HOOK_EVENTS='"events":{"webhooks":[{"name":"bench","url":"http://127.0.0.1:'$HOOK_PORT'/hook","secretFile":"'$WORK'/webhook-secret"}]},'
}
if [ -n "${BENCH_WEBHOOK:-}" ]; then start_hook_receiver; EVENTS=$HOOK_EVENTS; fi

RELAY_PORT=$(free_port); ADMIN_PORT=$(free_port)
write_config() {  # db path [synchronous]
  cat > "$WORK/relay.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$RELAY_PORT},"admin":{"host":"127.0.0.1","port":$ADMIN_PORT},
 "store":{"path":"$1","synchronous":"${2:-FULL}","maxPending":5000000},
 $(bench_relay_members),
 $EVENTS
 "log":{"format":"json","level":"warning"}}
EOF
}
RELAY_PID=""
start_relay() {  # [wrapper...]
  "$@" "$BIN/relay-server" --config "$WORK/relay.json" 2>>"$WORK/relay.log" &
  RELAY_PID=$!
  PIDS+=($RELAY_PID)
  wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
}
stop_relay() { kill -TERM "$RELAY_PID" 2>/dev/null || true; wait "$RELAY_PID" 2>/dev/null || true; }
new_credential() {  # -> secret
  "$BIN/relayctl" credentials create --config "$WORK/relay.json" --name bench --apps com.example.bench --json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])'
}
schema_db() {  # path: an empty database with the relay's schema
  write_config "$1"
  start_relay
  stop_relay
}

# The same request script as bench-relay.sh (one request formatted per wrk thread, the message
# index spliced in; unique push token and session per thread and run): stage 4.
write_post_lua "$WORK/post.lua"
# Stage 2: BENCH_TOKENS push tokens interleaved, as bench-ingest.sh.
write_tokens_lua "$WORK/tokens.lua"
wrk_rps() { awk '/Requests\/sec/{print $2}' "$1"; }
# wrk_relay OUT THREADS CONNECTIONS LUA [env...] -> "ACCEPTED_PER_S OTHERS" (ingest_result) of a
# wrk run against the relay started last, its output in OUT.
wrk_relay() {
  local out=$1 t=$2 c=$3 lua=$4 c0 c1
  shift 4
  c0=$(ingest_counts "$ADMIN_PORT")
  env "$@" RELAY_CRED="$CRED" wrk -t"$t" -c"$c" -d"${DURATION}s" -s "$lua" "http://127.0.0.1:$RELAY_PORT" > "$out"
  c1=$(ingest_counts "$ADMIN_PORT")
  ingest_result "$c0" "$c1" "$out"
}

if [ -z "${BENCH_CG_ONLY:-}" ]; then   # stages 1-4
if [ -z "${BENCH_CONNS_ONLY:-}" ]; then   # stage 1
# --- 1. latency at several offered loads ---------------------------------------------------
write_config "$WORK/latency.db"
start_relay
CRED=$(new_credential)
LAT_ROWS=""
echo "rate,achieved,matched,p50,p99,p999,max" > "$DATA/latency-summary.csv"
for rate in $LOADS; do
  echo "== latency at $rate/s" >&2
  read -r offered achieved matched p50 p99 p999 max < <(python3 $H latency "$RELAY_PORT" "$CRED" "$WORK/deliveries.jsonl" "$rate" "$LAT_SECONDS" "$DATA/latency-$rate.csv")
  echo "$offered,$achieved,$matched,$p50,$p99,$p999,$max" >> "$DATA/latency-summary.csv"
  LAT_ROWS+="| $offered/s | $achieved/s | $matched | $p50 | $p99 | $p999 | $max |"$'\n'
done
stop_relay

fi   # stage 1

# --- 2. ingest 202/s vs connections, nginx alongside ---------------------------------------
start_nginx_anchor
write_config "$WORK/conns.db"
start_relay
CRED=$(new_credential)
echo "connections,relay_rps,nginx_rps" > "$DATA/connections.csv"
CONN_ROWS=""
for c in $CONNS; do
  t=$(( c < 2 ? 1 : 2 ))
  echo "== wrk -c$c relay / nginx" >&2
  read -r r others < <(wrk_relay "$WORK/wrk-r.txt" "$t" "$c" "$WORK/tokens.lua" WRK_THREADS="$t" WRK_TOKENS="$TOKENS" WRK_SEED="$c")
  wrk -t$t -c"$c" -d"${DURATION}s" "http://127.0.0.1:$NGINX_PORT/" > "$WORK/wrk-n.txt"
  n=$(wrk_rps "$WORK/wrk-n.txt")
  echo "$c,$r,$n" >> "$DATA/connections.csv"
  CONN_ROWS+="| $c | $r | $n | $(python3 -c "print(f'{float($r)/float($n):.2f}')") | $others |"$'\n'
done
stop_relay
# The same at 64 connections with synchronous=NORMAL (no fsync per commit; process-crash safe
# only): how much of the gap to nginx is the disk's fsync latency.
write_config "$WORK/conns-normal.db" NORMAL
start_relay
CRED=$(new_credential)
read -r NORMAL_RPS NORMAL_OTHERS < <(wrk_relay "$WORK/wrk-r.txt" 2 64 "$WORK/tokens.lua" WRK_THREADS=2 WRK_TOKENS="$TOKENS")
stop_relay
stop_nginx_anchor
# The same at 64 connections without and with one webhook, its receiver answering, in alternating
# rounds (a relay, a mock-apns and a fresh database per run: bench-webhook-load.sh).
HOOK_TABLE="(not measured: BENCH_HOOK_ROUNDS=0)"
if [ "$HOOK_ROUNDS" -gt 0 ]; then
  echo "== one webhook: $HOOK_ROUNDS rounds without / with (bench-webhook-load.sh)" >&2
  D=$HOOK_SECONDS WEBHOOK_RECEIVER=fast BENCH_TOKENS=$TOKENS scripts/bench-webhook-load.sh "$BIN" "$HOOK_ROUNDS" > "$WORK/hook-ab.txt"
  grep -v '^|' "$WORK/hook-ab.txt" | sed '/^$/d' >&2
  HOOK_TABLE=$(grep '^|' "$WORK/hook-ab.txt")
fi
FSYNC=$(python3 - "$WORK" <<'EOF'
import os, sys, time
fd = os.open(os.path.join(sys.argv[1], "fsync-probe"), os.O_WRONLY | os.O_CREAT)
ts = []
for _ in range(100):
    os.write(fd, b"x" * 4096); t = time.perf_counter(); os.fsync(fd); ts.append((time.perf_counter() - t) * 1000)
ts.sort(); print(f"p50 {ts[50]:.2f} ms, p99 {ts[98]:.2f} ms")
EOF
)
if [ -n "${BENCH_CONNS_ONLY:-}" ]; then
  printf '| connections | relay 202/s | nginx 200/s | ratio | relay answers other than 202 |\n|---|---|---|---|---|\n%s' "$CONN_ROWS"
  echo "synchronous=NORMAL at 64 connections: $NORMAL_RPS 202/s (other answers: $NORMAL_OTHERS); 4 KiB write + fsync: $FSYNC"
  echo
  echo "$HOOK_TABLE"
  exit 0
fi

# --- 3. drain a backlog --------------------------------------------------------------------
echo "== drain of $DRAIN_ROWS queued rows" >&2
schema_db "$WORK/drain.db"
python3 $H prefill "$WORK/drain.db" "$DRAIN_ROWS" 0
start_relay
read -r drained drain_s drain_rate < <(python3 $H drain "$ADMIN_PORT" "$WORK/drain.db" "$DRAIN_ROWS" "$DRAIN_SECONDS" "$DATA/drain.csv" "$RELAY_PID")
DRAIN_RSS=$(awk '/VmHWM/{print $2}' "/proc/$RELAY_PID/status")
stop_relay
rm -f "$WORK"/drain.db*

# --- 4. growth: ingest and drain with N rows already queued --------------------------------
echo "queued,ingest_rps,drain_rate" > "$DATA/growth.csv"
GROWTH_ROWS=""
for n in $GROWTH; do
  echo "== growth: $n queued" >&2
  db="$WORK/growth-$n.db"
  schema_db "$db"
  python3 $H prefill "$db" "$n" 86400          # not due for a day: ingest sees a full table
  start_relay
  CRED=$(new_credential)
  read -r g_ingest g_others < <(wrk_relay "$WORK/wrk-g.txt" 2 64 "$WORK/post.lua")
  stop_relay
  sqlite3 "$db" "UPDATE responses SET next_attempt_at = 0 WHERE state = 'queued'; DELETE FROM responses WHERE state != 'queued';"
  sample=$(( n < 20000 ? n : 20000 ))
  start_relay
  read -r _ g_s g_rate < <(python3 $H drain "$ADMIN_PORT" "$db" "$sample" 30 "$WORK/g.csv")
  stop_relay
  echo "$n,$g_ingest,$g_rate" >> "$DATA/growth.csv"
  GROWTH_ROWS+="| $n | $g_ingest (other answers: $g_others) | $(python3 -c "print(f'{1e6/max(1.0,float($g_ingest)):.0f}')") | $g_rate (first $sample or 30 s) | $(python3 -c "print(f'{1e6/max(1.0,float($g_rate)):.0f}')") |"$'\n'
  rm -f "$db"*
done

fi   # stages 1-4

# --- 5. instructions per response (callgrind, stripped copy) -------------------------------
echo "== callgrind" >&2
if [ -n "${BENCH_CG_KEEP:-}" ]; then
  mkdir -p "$BENCH_CG_KEEP"
  objcopy --strip-debug "$BIN/relay-server" "$WORK/relay-server-stripped"
else
  objcopy --strip-all "$BIN/relay-server" "$WORK/relay-server-stripped"
fi
ir_run() {  # requests -> total instructions of the relay process
  local n=$1 db="$WORK/cg-$1.db"
  write_config "$db"
  rm -f "$WORK"/callgrind.out.*
  valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" --trace-children=no \
    "$WORK/relay-server-stripped" --config "$WORK/relay.json" 2>>"$WORK/valgrind.log" &
  local pid=$!
  PIDS+=($pid)
  wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
  local cred
  cred=$(new_credential)
  python3 - "$RELAY_PORT" "$cred" "$n" <<'EOF'
import http.client, json, os, sys, uuid
port, cred, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
tok, ses = os.urandom(32).hex(), str(uuid.uuid4()).upper()
for i in range(n):
    c.request("POST", "/v1/responses", json.dumps({"pushToken": tok, "sessionIdentifier": ses, "keyID": "AQIDBA==", "messageIndex": i,
              "encryptedData": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIj"}),
              {"Content-Type": "application/json", "Authorization": "Bearer " + cred})
    r = c.getresponse(); r.read()
    assert r.status == 202, r.status
EOF
  # wait until every response was pushed, so dispatch is inside the measurement
  for _ in $(seq 1 600); do
    [ "$(sqlite3 "file:$db?mode=ro" "SELECT count(*) FROM responses WHERE state='delivered'" 2>/dev/null || echo 0)" -ge "$n" ] && break
    sleep 0.2
  done
  # with a webhook: until every event was delivered to it, so sending them is inside it too
  for _ in $(seq 1 600); do
    [ -z "$EVENTS" ] && break
    [ "$(webhook_delivered_count "$db")" -ge "$n" ] && break
    sleep 0.2
  done
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  if [ -n "${BENCH_CG_KEEP:-}" ]; then cp "$WORK"/callgrind.out.* "$BENCH_CG_KEEP/cg-$n.out"; fi
  awk '/^summary:|^totals:/{print $2; exit}' "$WORK"/callgrind.out.*
  rm -f "$db"*
}
N1=${BENCH_CG_N1:-300}; N2=${BENCH_CG_N2:-1300}
IR1=$(ir_run "$N1"); IR2=$(ir_run "$N2")
IR_PER=$(( (IR2 - IR1) / (N2 - N1) ))
if [ -n "${BENCH_CG_ONLY:-}" ]; then
  echo "$IR_PER instructions per response end to end: ($IR2 - $IR1) / ($N2 - $N1) sequential requests${EVENTS:+, one webhook}"
  exit 0
fi
if [ -z "$EVENTS" ]; then   # the same with one webhook answering 204
  start_hook_receiver
  EVENTS=$HOOK_EVENTS
  HIR1=$(ir_run "$N1"); HIR2=$(ir_run "$N2")
  EVENTS=""
  HOOK_IR_PER=$(( (HIR2 - HIR1) / (N2 - N1) ))
  HOOK_LINE="With one webhook configured and its receiver answering 204 to every event: $HOOK_IR_PER
instructions per response, ($HIR2 - $HIR1) / ($N2 - $N1), every event delivered before the process
stops: $(python3 -c "print(f'{$HOOK_IR_PER/$IR_PER:.3f}')")x the figure without (docs/events.md, Cost)."
else
  HOOK_LINE="(Measured with one webhook configured, BENCH_WEBHOOK=1.)"
fi

cat <<EOF
## Pipeline: ingest -> outbox -> APNs (mock)

Commands: \`scripts/bench-pipeline.sh\` (release relay-server and mock-apns on loopback, TLS to the
mock, SQLite \`synchronous=FULL\`, rate limits off). Latency is the client's send time to
mock-apns' \`receivedAt\` (millisecond resolution, same clock): the durable commit, the 202,
the dispatcher and the push over HTTP/2 are all inside it. Plots: [latency CDF](latency-cdf.svg),
[throughput vs connections](throughput-connections.svg), [drain](drain.svg), [growth](growth.svg).

### Ingest -> APNs latency at offered loads (${LAT_SECONDS} s each; target issue 5: p99 < 5 ms at 1000/s)

| offered | achieved | matched | p50 ms | p99 ms | p99.9 ms | max ms |
|---|---|---|---|---|---|---|
${LAT_ROWS}
![latency CDF](latency-cdf.svg)

### Durable ingest 202/s vs connections (\`wrk -d${DURATION}s\`, ${TOKENS} push tokens interleaved, unique bodies; nginx static in the same run)

202/s: the 202s the relay counted (\`relay_ingest_requests_total\`) over wrk's measured seconds;
any other answer is in the last column (wrk's own Requests/sec would count them too).

| connections | relay 202/s | nginx 200/s | ratio | relay answers other than 202 |
|---|---|---|---|---|
${CONN_ROWS}
With \`synchronous=NORMAL\` (no fsync per commit) at 64 connections: ${NORMAL_RPS} 202/s (other
answers: ${NORMAL_OTHERS}). One 4 KiB write + fsync on this machine's disk (where the database lives): ${FSYNC}.

### One webhook configured, its receiver answering (issue 24: ingest and pushes within 5 %)

\`scripts/bench-webhook-load.sh\` at 64 connections, ${HOOK_SECONDS} s per run, rounds alternating
without / with one webhook (receiver: \`http-bench-server\` on the same cores, answering 200);
each run its own relay, mock-apns (no deliveries log, unlike the table above) and fresh database.
The ratio is the median of the per-round ratios (with / without). bench-ingest.sh runs with APNs
stalled: no outcome, so no event, and a webhook would have nothing to send there.

${HOOK_TABLE}

![throughput vs connections](throughput-connections.svg)

### Drain of a ${DRAIN_ROWS}-row backlog (measured for at most ${DRAIN_SECONDS} s)

| rows delivered | seconds | rate (pushes/s) | peak RSS while draining |
|---|---|---|---|
| $drained | $drain_s | $drain_rate | $(( ${DRAIN_RSS:-0} / 1024 )) MB |

![drain](drain.svg)

### Growth with the outbox already holding N queued rows

| queued rows | ingest 202/s (wrk -c64) | µs per ingest | drain pushes/s | µs per push |
|---|---|---|---|---|
${GROWTH_ROWS}
![growth](growth.svg)

### Instructions per response (callgrind)

$IR_PER instructions per response end to end (HTTP/1.1 ingest, validation, group commit, claim,
JWT-authenticated HTTP/2 push over TLS, outcome write), from \`valgrind --tool=callgrind\` on a
stripped copy of relay-server: ($IR2 - $IR1) / ($N2 - $N1) sequential requests, every one pushed
before the process stops, so start-up and shutdown cancel out.

$HOOK_LINE

EOF
