#!/usr/bin/env bash
# A/B under load: what one webhook costs ingest and pushes (issue 24: at most 5 %). relay-server
# (SQLite, synchronous=FULL) and mock-apns answering; each round runs the relay without, then
# with one webhook (python3 http.server answering 204; WEBHOOK_RECEIVER=fast: http-bench-server,
# libuv, answering 200), a fresh database each run, under `wrk -t2 -c64 -d${D}s` with
# write_tokens_lua: BENCH_TOKENS (default 1,000) push tokens interleaved, 200-400-byte ciphertexts.
# Usage: scripts/bench-webhook-load.sh BIN_DIR [ROUNDS] (release relay-server, relayctl, mock-apns
# and http-bench-server in BIN_DIR; ROUNDS default 3; D=seconds per wrk run, default 8).
# Figures of a run: 202/s = the 202s the relay counted (relay_ingest_requests_total, admin
# /metrics) over wrk's measured seconds, every other answer listed apart (wrk's Requests/sec
# counts 503s and 429s too); pushes/s = responses delivered to mock-apns by the end of wrk over
# the same seconds; events committed and delivered to the receiver by then (webhook_delivered_count).
# stdout: one line per run, then a markdown table: each figure's median over the rounds without
# and with the webhook and the median of the paired ratios (with / without, same round).
# bench-pipeline.sh (stage 2) runs this and shows that table. docs/events.md, "Cost of a webhook".
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/bench-webhook-load.sh BIN_DIR [ROUNDS]" >&2; exit 64; }
ROUNDS=${2:-3}; D=${D:-8}; TOKENS=${BENCH_TOKENS:-1000}
. scripts/lib-bench.sh
BENCH_BIN=$1 bench_prologue bench-webhook-load wrk sqlite3 curl python3 openssl
start_bench_mock
write_tokens_lua "$WORK/tokens.lua"
start_webhook_receiver
# MAX_CONCURRENT: the webhook's maxConcurrent (default: the relay's, 8); SENDER_NICENESS:
# events.senderNiceness (default: the relay's, 10; a relay before that key refuses it: leave unset there).
HOOK='"events":{"webhooks":[{"name":"bench","url":"http://127.0.0.1:'$HOOK_PORT'/hook","secretFile":"'$WORK'/webhook-secret"'${MAX_CONCURRENT:+,\"maxConcurrent\":$MAX_CONCURRENT}'}]'${SENDER_NICENESS:+,\"senderNiceness\":$SENDER_NICENESS}'},'
RELAY_PORT=$(free_port); ADMIN_PORT=$(free_port)
RUNS="$WORK/runs.tsv"   # case round 202/s others pushes/s events delivered
: > "$RUNS"
run() {  # case(without|with) round events-member
  local db="$WORK/$1-$2.db" pid cred c0 c1 secs acc others pushed ev del
  cat > "$WORK/relay.json" <<JSON
{"listen":{"host":"127.0.0.1","port":$RELAY_PORT},"admin":{"host":"127.0.0.1","port":$ADMIN_PORT},
 "store":{"path":"$db","synchronous":"FULL","maxPending":5000000},
 $(bench_relay_members),
 $3
 "log":{"format":"json","level":"warning"}}
JSON
  "$BIN/relay-server" --config "$WORK/relay.json" 2>>"$WORK/relay.log" &
  pid=$!
  PIDS+=("$pid")
  wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
  cred=$("$BIN/relayctl" credentials create --config "$WORK/relay.json" --name bench --apps com.example.bench --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
  echo "== round $2: $1 a webhook" >&2
  c0=$(ingest_counts "$ADMIN_PORT")
  WRK_THREADS=2 WRK_TOKENS=$TOKENS WRK_SEED=$2 RELAY_CRED="$cred" \
    wrk -t2 -c64 -d"${D}s" -s "$WORK/tokens.lua" "http://127.0.0.1:$RELAY_PORT" > "$WORK/wrk.txt"
  c1=$(ingest_counts "$ADMIN_PORT")
  read -r acc others < <(ingest_result "$c0" "$c1" "$WORK/wrk.txt")
  secs=$(wrk_seconds "$WORK/wrk.txt")
  pushed=$(sqlite3 "file:$db?mode=ro" ".timeout 5000" "SELECT count(*) FROM responses WHERE state='delivered'" 2>/dev/null || echo 0)
  ev=$(sqlite3 "file:$db?mode=ro" ".timeout 5000" "SELECT count(*) FROM events" 2>/dev/null || echo 0)
  del=$(webhook_delivered_count "$db")
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  pushed=$(awk -v n="$pushed" -v s="$secs" 'BEGIN{printf "%.0f", (s > 0 ? n / s : 0)}')
  echo "$1-$2 202/s=$acc non202=$others pushes/s=$pushed events=$ev webhook_delivered_by_end=$del wrk_requests/s=$(awk '/Requests\/sec/{print $2}' "$WORK/wrk.txt")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$acc" "$others" "$pushed" "$ev" "$del" >> "$RUNS"
  rm -f "$db"*
}
for r in $(seq 1 "$ROUNDS"); do
  run without "$r" ""
  run with "$r" "$HOOK"
done
echo
python3 - "$RUNS" "$ROUNDS" "$D" "$TOKENS" "${WEBHOOK_RECEIVER:-python}" <<'PY'
import statistics, sys
path, rounds, secs, tokens, receiver = sys.argv[1:]
runs = {}
for line in open(path):
    case, rnd, acc, others, pushes, events, delivered = line.rstrip("\n").split("\t")
    runs[(case, int(rnd))] = dict(acc=float(acc), others=others, pushes=float(pushes), events=int(events), delivered=int(delivered))
rs = sorted({r for _, r in runs})
def col(case, k):
    return [runs[(case, r)][k] for r in rs if (case, r) in runs]
def fig(case, k):
    v = col(case, k)
    return f"{statistics.median(v):.0f} ({', '.join(f'{x:.0f}' for x in v)})" if v else "–"
def paired(k):
    p = [runs[("with", r)][k] / runs[("without", r)][k] for r in rs
         if ("with", r) in runs and ("without", r) in runs and runs[("without", r)][k] > 0]
    return f"{statistics.median(p):.2f}x (per round: {', '.join(f'{x:.2f}x' for x in p)})" if p else "n/a"
recv = "http-bench-server" if receiver == "fast" else "python3 http.server"
print(f"| one webhook ({recv} answering), wrk -t2 -c64 -d{secs}s, {int(tokens):,} tokens: median of {len(rs)} round{'s' if len(rs) != 1 else ''} (each round) | without a webhook | with one webhook | ratio (with / without, paired) | target |")
print("|---|---|---|---|---|")
print(f"| one webhook / none: durable ingest 202/s (counted by the relay) | {fig('without', 'acc')} | {fig('with', 'acc')} | {paired('acc')} | >= 0.95x (issue 24) |")
print(f"| one webhook / none: pushes/s (responses delivered to mock-apns by the end of wrk) | {fig('without', 'pushes')} | {fig('with', 'pushes')} | {paired('pushes')} | >= 0.95x (issue 24) |")
others = lambda case: ", ".join(runs[(case, r)]["others"] for r in rs if (case, r) in runs)
print(f"| answers other than 202 (per round) | {others('without')} | {others('with')} | – | – |")
print(f"| events committed by the end of wrk | {fig('without', 'events')} | {fig('with', 'events')} | – | – |")
print(f"| events delivered to the receiver by the end of wrk | – | {fig('with', 'delivered')} | – | – |")
PY
