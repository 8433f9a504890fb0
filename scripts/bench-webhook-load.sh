#!/usr/bin/env bash
# A/B under load: relay (SQLite, FULL) + mock-apns; wrk -t2 -c64 -d${D}s with post.lua; runs
# alternate without / with one webhook (python ThreadingHTTPServer answering 204), ROUNDS each.
# Usage: scripts/bench-webhook-load.sh BIN_DIR [ROUNDS] (release relay-server, relayctl, mock-apns in BIN_DIR;
# D=seconds per wrk run, default 8; WEBHOOK_RECEIVER=fast: http-bench-server as the receiver). One line per run: ingest 202/s, and what the database holds
# when wrk ends (responses pushed, events, deliveries the webhook answered 2xx). docs/events.md, "Cost of a webhook".
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$1; ROUNDS=${2:-3}; D=${D:-8}
WORK=$(mktemp -d /tmp/bench-webhook-load.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
. scripts/lib-bench.sh
start_bench_mock
write_post_lua "$WORK/post.lua"
start_webhook_receiver
# MAX_CONCURRENT: the webhook's maxConcurrent (default: the relay's, 8); SENDER_NICENESS:
# events.senderNiceness (default: the relay's, 10; a relay before that key refuses it: leave unset there).
HOOK='"events":{"webhooks":[{"name":"bench","url":"http://127.0.0.1:'$HOOK_PORT'/hook","secretFile":"'$WORK'/webhook-secret"'${MAX_CONCURRENT:+,\"maxConcurrent\":$MAX_CONCURRENT}'}]'${SENDER_NICENESS:+,\"senderNiceness\":$SENDER_NICENESS}'},'
RELAY_PORT=$(free_port); ADMIN_PORT=$(free_port)
run() {  # label events-member
  local db="$WORK/$1.db"
  cat > "$WORK/relay.json" <<JSON
{"listen":{"host":"127.0.0.1","port":$RELAY_PORT},"admin":{"host":"127.0.0.1","port":$ADMIN_PORT},
 "store":{"path":"$db","synchronous":"FULL","maxPending":5000000},
 $(bench_relay_members),
 $2
 "log":{"format":"json","level":"warning"}}
JSON
  "$BIN/relay-server" --config "$WORK/relay.json" 2>>"$WORK/relay.log" &
  local pid=$!
  PIDS+=($pid)
  wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
  local cred
  cred=$("$BIN/relayctl" credentials create --config "$WORK/relay.json" --name bench --apps com.example.bench --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
  local t0=$(date +%s.%N)
  RELAY_CRED="$cred" wrk -t2 -c64 -d${D}s -s "$WORK/post.lua" "http://127.0.0.1:$RELAY_PORT" > "$WORK/wrk.txt"
  local rps=$(awk '/Requests\/sec/{print $2}' "$WORK/wrk.txt")
  local ev=$(sqlite3 "file:$db?mode=ro" "SELECT count(*) FROM events" 2>/dev/null || echo 0)
  local del=$(webhook_delivered_count "$db")
  local pushed=$(sqlite3 "file:$db?mode=ro" "SELECT count(*) FROM responses WHERE state='delivered'" 2>/dev/null || echo 0)
  kill -TERM $pid; wait $pid 2>/dev/null || true
  echo "$1 rps=$rps pushed_by_end=$pushed events=$ev webhook_delivered_by_end=$del"
  rm -f "$db"*
}
for r in $(seq 1 "$ROUNDS"); do
  run "nohook-$r" ""
  run "hook-$r" "$HOOK"
done
