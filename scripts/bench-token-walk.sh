#!/usr/bin/env bash
# A 410 for a push token with BENCH_WALK_ROWS (default 1,000,000) queued rows while ingest runs
# at full speed (a markdown section on stdout; progress on stderr). Run by `make bench` via
# scripts/bench.sh (BENCH_ONLY=token-walk), or alone: scripts/bench-token-walk.sh.
#  - The token's rows are inserted directly in SQLite (v4-shaped ids, as bench-relay.sh), not due
#    before DUE; one start and stop of the relay gives them their dedupe-index entries (the tail
#    read at start is merged at close), so the token's rows are in response_keys as a relay
#    that had stored them itself would have them.
#  - mock-apns answers 410 Unregistered for that token only (200 for every other).
#  - wrk POSTs fresh responses (other tokens) for BENCH_DURATION s before DUE (baseline) and for
#    BENCH_WALK_WINDOW s from DUE (the first of the token's rows is pushed, answered 410, the
#    cutoff scan runs, then claims fail the rest); wrk's p99 of both windows and their ratio.
#  - Walk time: DUE to the last of the token's rows leaving `queued` (polled through the claim
#    index every 0.5 s); the final count of its rows failed with reason Unregistered.
# Leaves no processes behind (trap kills what it started, by pid). BENCH_BIN=DIR: prebuilt binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
WINDOW=${BENCH_WALK_WINDOW:-30}   # long enough for the walk over 1,000,000 rows
CONNECTIONS=${BENCH_CONNECTIONS:-64}
ROWS=${BENCH_WALK_ROWS:-1000000}
TOKEN=$(printf 'ee%.0s' $(seq 1 32))
. scripts/lib-bench.sh
bench_prologue bench-token-walk wrk openssl sqlite3 curl python3
sync

start_bench_mock --fault "status=410,reason=Unregistered,token=$TOKEN"

RELAY_PORT=$(free_port); ADMIN_PORT=$(free_port)
DB="$WORK/walk.db"
cat > "$WORK/relay.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$RELAY_PORT},"admin":{"host":"127.0.0.1","port":$ADMIN_PORT},
 "store":{"path":"$DB","synchronous":"FULL","maxPending":5000000},
 $(bench_relay_members),
 "log":{"format":"json","level":"warning"}}
EOF
RELAY_PID=""
start_relay() { "$BIN/relay-server" --config "$WORK/relay.json" 2>>"$WORK/relay.log" & RELAY_PID=$!; PIDS+=($RELAY_PID); }
stop_relay() { kill -TERM "$RELAY_PID" 2>/dev/null || true; wait "$RELAY_PID" 2>/dev/null || true; }

start_relay   # creates the schema
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
stop_relay
sqlite3 "$DB" ".timeout 5000" "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_bench0000','bench',X'$HASH','com.example.bench',0)"
echo "== inserting $ROWS queued rows for one token" >&2
NOW_MS=$(($(date +%s) * 1000))
FAR=9000000000000000
sqlite3 "$DB" <<EOF
PRAGMA synchronous=OFF;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                       attempts, next_attempt_at, created_at, expires_at, updated_at)
SELECT (i << 16) | 16384, printf('%08x-%04x-4000-8%03x-%012x', i >> 16, i & 65535, random() & 4095, random() & 281474976710655),
       'com.example.bench', '$TOKEN', 'B1D0C8A4-1111-4222-8333-444455556666', X'01020304', i, randomblob(48), 'cred_bench0000',
       'queued', 0, $FAR, $NOW_MS, $NOW_MS + 86400000, $NOW_MS FROM n;
UPDATE outbox_stats SET pending = pending + $ROWS, minted_through = (SELECT max(id_high) FROM responses);
EOF
MAXFIX=$(sqlite3 "$DB" "SELECT max(id_high) FROM responses")
start_relay   # reads the rows into the dedupe tail; the stop merges them into response_keys
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
stop_relay
KEYS=$(sqlite3 "$DB" "SELECT count(*) FROM response_keys")
[ "$KEYS" -ge "$ROWS" ] || { echo "bench-token-walk: only $KEYS of $ROWS rows have dedupe-index entries" >&2; exit 1; }

# DUE leaves the start and the whole baseline window before it.
DUE_MS=$(( $(date +%s%3N) + 6000 + DURATION * 1000 ))
sqlite3 "$DB" "PRAGMA synchronous=OFF; UPDATE responses SET next_attempt_at = $DUE_MS WHERE state = 'queued' AND next_attempt_at = $FAR; PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null
sync
start_relay
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
write_post_lua "$WORK/post.lua"
sleep_until() { python3 -c "import time; time.sleep(max(0, $1 / 1000 - time.time()))"; }
# Writer counters (/metrics): "commits jobs transaction-seconds".
store_counters() {
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^relay_store_commits_total /{c=$2} /^relay_store_jobs_total /{j=$2}
    /^relay_store_transaction_seconds_total /{t=$2} END{printf "%d %d %.6f\n", c, j, t}'
}
run_wrk() {  # seconds out-file: also out-file.store, the writer's commits, jobs and busy share over the run,
  # and out-file.ingest, the 202s the relay counted per second and its other answers (ingest_result)
  local a b c0 c1
  a=$(store_counters); c0=$(ingest_counts "$ADMIN_PORT")
  RELAY_CRED="$SECRET" wrk --latency -t2 -c"$CONNECTIONS" -d"${1}s" -s "$WORK/post.lua" "http://127.0.0.1:$RELAY_PORT" > "$2"
  b=$(store_counters); c1=$(ingest_counts "$ADMIN_PORT")
  ingest_result "$c0" "$c1" "$2" > "$2.ingest"
  awk -v a="$a" -v b="$b" -v d="$1" 'BEGIN{split(a,x," "); split(b,y," "); c=y[1]-x[1];
    printf "%d commits, %.1f jobs per commit, writer in a transaction %.0f%% of the time\n", c, (c > 0 ? (y[2]-x[2])/c : 0), (y[3]-x[3])/d*100}' > "$2.store"
}
# A warm-up (discarded) up to the baseline window: the first seconds after a start are not ingest's steady state.
run_wrk $(( (DUE_MS - DURATION * 1000 - 500 - $(date +%s%3N)) / 1000 )) "$WORK/wrk-warm.txt"
sleep_until $((DUE_MS - DURATION * 1000 - 500))
echo "== baseline: wrk ${DURATION}s before the token's rows are due" >&2
run_wrk "$DURATION" "$WORK/wrk-base.txt"
# The walk's end, polled through responses_claim (no row read): the token's rows still queued.
left() {
  sqlite3 "$DB" ".timeout 5000" "SELECT count(*) FROM responses WHERE state = 'queued' AND next_attempt_at >= $DUE_MS AND next_attempt_at < $DUE_MS + 3600000 AND id_high <= $MAXFIX" 2>/dev/null || echo "?"
}
(
  sleep_until "$DUE_MS"
  while :; do
    n=$(left)
    if [ "$n" = 0 ]; then date +%s%3N > "$WORK/walk-done"; break; fi
    sleep 0.5
  done
) & POLL=$!; PIDS+=($POLL)
echo "== walk window: wrk ${WINDOW}s from DUE" >&2
sleep_until $((DUE_MS - 500))
run_wrk "$WINDOW" "$WORK/wrk-walk.txt"
# The walk may outlast the window: wait for it (up to 10 minutes), no load.
for _ in $(seq 1 1200); do [ -f "$WORK/walk-done" ] && break; sleep 0.5; done
kill "$POLL" 2>/dev/null || true
WALK_MS=$( [ -f "$WORK/walk-done" ] && echo $(( $(cat "$WORK/walk-done") - DUE_MS )) || echo "not finished in 10 min" )
stop_relay
FAILED=$(sqlite3 "$DB" "SELECT count(*) FROM responses WHERE id_high <= $MAXFIX AND state = 'failed' AND last_reason = 'Unregistered'")
OTHER=$(sqlite3 "$DB" "SELECT state || ':' || count(*) FROM responses WHERE id_high <= $MAXFIX GROUP BY state" | tr '\n' ' ')
CUTOFF=$(sqlite3 "$DB" "SELECT apns_timestamp - $NOW_MS FROM unregistered_tokens WHERE token = '$TOKEN'")
PUSHED_410=$(curl -fsS "http://127.0.0.1:$CONTROL_PORT/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["byStatusReason"].get("410 Unregistered", 0))')

p99() { awk '/ 99%/{print $2}' "$1"; }
rps() { awk '{print $1 " (other answers: " $2 ")"}' "$1.ingest"; }
ms() { python3 -c "import re,sys; m=re.match(r'([0-9.]+)(us|ms|s)$', '$1'); v=float(m[1]); print(v/1000 if m[2]=='us' else v*1000 if m[2]=='s' else v)"; }
B99=$(p99 "$WORK/wrk-base.txt"); W99=$(p99 "$WORK/wrk-walk.txt")
RATIO=$(python3 -c "print(f'{$(ms "$W99")/$(ms "$B99"):.2f}')")
cat <<EOF
## Token walk: a 410 for a token with $ROWS queued rows under full ingest

Command: \`BENCH_WALK_ROWS=$ROWS scripts/bench-token-walk.sh\` (wrk -t2 -c$CONNECTIONS, ${DURATION}s baseline then
${WINDOW}s from the moment the token's rows fall due; relay-server release, SQLite synchronous=FULL, mock-apns answering 410
Unregistered for that token and 200 for the rest, all on the same 2 cores).

| figure | baseline (before) | while the 410 is applied | ratio |
|---|---|---|---|
| ingest p99 (wrk) | $B99 | $W99 | ${RATIO}x |
| ingest 202/s (counted by the relay) | $(rps "$WORK/wrk-base.txt") | $(rps "$WORK/wrk-walk.txt") | – |
| writer | $(cat "$WORK/wrk-base.txt.store") | $(cat "$WORK/wrk-walk.txt.store") | – |

Walk: ${WALK_MS} ms from the rows falling due to the last leaving \`queued\` (polled every 0.5 s);
$FAILED of $ROWS rows failed with reason Unregistered (by state: $OTHER); $PUSHED_410 pushes answered 410
(the rows in flight when the first 410 came back); cutoff = creation time + ${CUTOFF} ms.
EOF
