#!/usr/bin/env bash
# relay-server benchmarks (a markdown section on stdout; progress on stderr). Run by
# `make bench` via scripts/bench.sh, or alone: scripts/bench-relay.sh.
#  1. Durable ingest: 202/s at 64 keep-alive connections (wrk, unique bodies, synchronous=FULL)
#     vs nginx answering a tiny static response, same wrk settings, same run; also nginx answering
#     the same POSTs (the relay's wrk script: a second anchor), CPU microseconds per request of
#     relay-server, mock-apns, nginx and wrk (with their kernel share), the CPUs left idle, and the
#     group-commit batch size (jobs per COMMIT).
#  2. Ingest -> APNs latency p50/p99 at ~1000 responses/s against mock-apns.
#  3. Start-to-ready and peak RSS with 1,000,000 queued rows.
# Leaves no processes behind (trap kills what it started, by pid).
# BENCH_BIN=DIR: run the release binaries in DIR instead of building (A/B runs of two builds).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
ROWS=${BENCH_ROWS:-1000000}
. scripts/lib-bench.sh
bench_prologue bench-relay wrk nginx openssl sqlite3 curl python3

# Earlier benchmarks in `make bench` leave hundreds of MB of dirty pages (bench-pipeline's
# million-row databases); their writeback would compete with the relay's fsyncs (not with
# nginx, which writes nothing). Flush them first, so every run here starts from a quiet disk.
sync

start_bench_mock

RELAY_PORT=$(free_port); ADMIN_PORT=$(free_port)
write_config() {  # db path
  cat > "$WORK/relay.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$RELAY_PORT},"admin":{"host":"127.0.0.1","port":$ADMIN_PORT},
 "store":{"path":"$1","synchronous":"FULL","maxPending":5000000},
 $(bench_relay_members),
 "log":{"format":"json","level":"warning"}}
EOF
}
RELAY_PID=""
start_relay() {
  "$BIN/relay-server" --config "$WORK/relay.json" 2>>"$WORK/relay.log" &
  RELAY_PID=$!
  PIDS+=($RELAY_PID)
}
stop_relay() { kill -TERM "$RELAY_PID" 2>/dev/null || true; wait "$RELAY_PID" 2>/dev/null || true; }
new_credential() {  # db -> prints secret (same format and hash as RelayCore's Credentials)
  local secret hash
  secret="rk_$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')"
  hash=$(printf %s "$secret" | openssl dgst -sha256 -binary | od -An -tx1 | tr -d ' \n')
  sqlite3 "$1" ".timeout 5000" "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_$(openssl rand -hex 6)','bench',X'$hash','com.example.bench',0)"
  printf %s "$secret"
}

# --- 1. durable ingest vs nginx ---------------------------------------------------------
write_config "$WORK/ingest.db"
start_relay
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
CRED=$(new_credential "$WORK/ingest.db")
write_post_lua "$WORK/post.lua"
echo "== wrk relay-server POST (durable, synchronous=FULL)" >&2
# CPU accounting, to say where the 2 cores go: CPU time of each process over a run divided by
# the requests it completed. /proc/PID/stat utime+stime (after the command name, which may hold
# spaces) in clock ticks; wrk's own CPU from /usr/bin/time.
# proc_ticks and us_per_req: scripts/lib-bench.sh.
# The kernel's share alone (stime): socket reads and writes, epoll, fsync. nginx spends most of
# its time there, in the same calls the relay's loop makes (docs/benchmarks-analysis.md).
proc_sys_ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $13}'))); done; echo "$t"; }
# Share of both CPUs left idle between two /proc/stat readings ("idle total" in ticks): how well
# a run keeps the cores busy (nginx: ~0; the relay's commit pipeline leaves some).
cpu_ticks() { awk '/^cpu /{t=0; for (i=2; i<=NF; i++) t+=$i; print $5 + $6, t}' /proc/stat; }
idle_pct() { awk -v a="$1" -v b="$2" 'BEGIN{split(a,x," "); split(b,y," "); d=y[2]-x[2]; printf "%.0f", (d > 0 ? (y[1]-x[1])/d*100 : 0)}'; }
wrk_sys_us() { awk -v n="$2" 'NF==2{printf "%.0f", (n > 0 ? $2 * 1e6 / n : 0)}' "$1"; }
wrk_cpu_us() {  # /usr/bin/time output file, requests -> wrk CPU microseconds per request
  awk -v n="$2" 'NF==2{printf "%.0f", (n > 0 ? ($1 + $2) * 1e6 / n : 0)}' "$1"
}
wrk_requests() { awk '/requests in/{print $1}' "$1"; }
# Group-commit counters (relay_store_commits_total / relay_store_jobs_total on /metrics) around
# each run: jobs per COMMIT is the batch size the writer reached under this load.
# "commits jobs writer-transaction-seconds ingest-duration-sum ingest-duration-count"
store_counters() {
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^relay_store_commits_total /{c=$2} /^relay_store_jobs_total /{j=$2}
    /^relay_store_transaction_seconds_total /{t=$2} /^relay_ingest_duration_seconds_sum /{ds=$2} /^relay_ingest_duration_seconds_count /{dn=$2}
    END{printf "%d %d %.6f %.6f %d\n", c, j, t, ds, dn}'
}
# Between two store_counters: mean time in the relay's service per POST (ms) and the writer's
# share of the run's wall time inside transactions (%).
service_ms() { awk -v a="$1" -v b="$2" 'BEGIN{split(a,x," "); split(b,y," "); n=y[5]-x[5]; printf "%.2f", (n > 0 ? (y[4]-x[4])/n*1000 : 0)}'; }
writer_duty() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN{split(a,x," "); split(b,y," "); printf "%.0f", (y[3]-x[3])/d*100}'; }
jobs_per_commit() {  # "c0 j0" "c1 j1" -> jobs per commit between the two
  awk -v a="$1" -v b="$2" 'BEGIN{split(a,x," "); split(b,y," "); c=y[1]-x[1]; printf "%.1f", (c > 0 ? (y[2]-x[2])/c : 0)}'
}
S0=$(store_counters); R0=$(proc_ticks "$RELAY_PID"); M0=$(proc_ticks "$MOCK_PID"); A0=$(ingest_counts "$ADMIN_PORT")
RELAY_CRED="$CRED" /usr/bin/time -f "%U %S" -o "$WORK/time-relay.txt" \
  wrk --latency -t2 -c"$CONNECTIONS" -d"${DURATION}s" -s "$WORK/post.lua" "http://127.0.0.1:$RELAY_PORT" > "$WORK/wrk-relay.txt"
S1=$(store_counters); R1=$(proc_ticks "$RELAY_PID"); M1=$(proc_ticks "$MOCK_PID"); A1=$(ingest_counts "$ADMIN_PORT")
N_LIVE=$(wrk_requests "$WORK/wrk-relay.txt")
CPU_LIVE="relay $(us_per_req $((R1 - R0)) "$N_LIVE") µs, mock-apns $(us_per_req $((M1 - M0)) "$N_LIVE") µs, wrk+Lua $(wrk_cpu_us "$WORK/time-relay.txt" "$N_LIVE") µs"
# The 202s the relay counted over wrk's seconds; its other answers by status (wrk's Requests/sec
# counts every answer; the wrk script does not look at them, see lib-bench.sh).
read -r RELAY_RPS RELAY_NON202 < <(ingest_result "$A0" "$A1" "$WORK/wrk-relay.txt")
RELAY_P99=$(awk '/ 99%/{print $2}' "$WORK/wrk-relay.txt")
ROWS_STORED=$(sqlite3 "$WORK/ingest.db" "SELECT count(*) FROM responses")
RSS_INGEST=$(awk '/VmHWM/{print $2}' "/proc/$RELAY_PID/status")
# The same load with APNs stalled (mock answers nothing): the dispatcher fills its in-flight
# slots and idles, so this isolates the ingest path (validate + group commit) from the CPU that
# PushClient and mock-apns use on these same cores.
curl -fsS -X POST "http://127.0.0.1:$CONTROL_PORT/faults" -H 'Content-Type: application/json' -d '{"stall":true}' >/dev/null
echo "== wrk relay-server POST, APNs stalled" >&2
S2=$(store_counters); R2=$(proc_ticks "$RELAY_PID"); K2=$(proc_sys_ticks "$RELAY_PID"); I2=$(cpu_ticks); A2=$(ingest_counts "$ADMIN_PORT")
RELAY_CRED="$CRED" /usr/bin/time -f "%U %S" -o "$WORK/time-stalled.txt" \
  wrk --latency -t2 -c"$CONNECTIONS" -d"${DURATION}s" -s "$WORK/post.lua" "http://127.0.0.1:$RELAY_PORT" > "$WORK/wrk-relay-stalled.txt"
S3=$(store_counters); R3=$(proc_ticks "$RELAY_PID"); K3=$(proc_sys_ticks "$RELAY_PID"); I3=$(cpu_ticks); A3=$(ingest_counts "$ADMIN_PORT")
N_STALLED=$(wrk_requests "$WORK/wrk-relay-stalled.txt")
CPU_STALLED="relay $(us_per_req $((R3 - R2)) "$N_STALLED") µs (kernel $(us_per_req $((K3 - K2)) "$N_STALLED")), wrk+Lua $(wrk_cpu_us "$WORK/time-stalled.txt" "$N_STALLED") µs (kernel $(wrk_sys_us "$WORK/time-stalled.txt" "$N_STALLED"))"
read -r STALLED_RPS STALLED_NON202 < <(ingest_result "$A2" "$A3" "$WORK/wrk-relay-stalled.txt")
STALLED_WRK_MEAN=$(awk '/Latency/ && !/Distribution/{print $2; exit}' "$WORK/wrk-relay-stalled.txt")
curl -fsS -X DELETE "http://127.0.0.1:$CONTROL_PORT/faults" >/dev/null
stop_relay

start_nginx_anchor
echo "== wrk nginx static" >&2
X0=$(proc_ticks $NGINX_WORKERS); XK0=$(proc_sys_ticks $NGINX_WORKERS); XI0=$(cpu_ticks)
/usr/bin/time -f "%U %S" -o "$WORK/time-nginx.txt" wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$NGINX_PORT/" > "$WORK/wrk-nginx.txt"
X1=$(proc_ticks $NGINX_WORKERS); XK1=$(proc_sys_ticks $NGINX_WORKERS); XI1=$(cpu_ticks)
NGINX_RPS=$(awk '/Requests\/sec/{print $2}' "$WORK/wrk-nginx.txt")
N_NGINX=$(wrk_requests "$WORK/wrk-nginx.txt")
CPU_NGINX="nginx $(us_per_req $((X1 - X0)) "$N_NGINX") µs (kernel $(us_per_req $((XK1 - XK0)) "$N_NGINX")), wrk $(wrk_cpu_us "$WORK/time-nginx.txt" "$N_NGINX") µs (kernel $(wrk_sys_us "$WORK/time-nginx.txt" "$N_NGINX"))"
# The same nginx answering the very requests the relay gets (the relay's wrk script: same
# bytes, same client cost), as a second anchor. The plain GET above stays the primary one.
echo "== wrk nginx, relay POST script" >&2
Y0=$(proc_ticks $NGINX_WORKERS)
RELAY_CRED=x /usr/bin/time -f "%U %S" -o "$WORK/time-nginx-lua.txt" \
  wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" -s "$WORK/post.lua" "http://127.0.0.1:$NGINX_PORT/" > "$WORK/wrk-nginx-lua.txt"
Y1=$(proc_ticks $NGINX_WORKERS)
NGINX_LUA_RPS=$(awk '/Requests\/sec/{print $2}' "$WORK/wrk-nginx-lua.txt")
N_NGINX_LUA=$(wrk_requests "$WORK/wrk-nginx-lua.txt")
CPU_NGINX_LUA="nginx $(us_per_req $((Y1 - Y0)) "$N_NGINX_LUA") µs, wrk+Lua $(wrk_cpu_us "$WORK/time-nginx-lua.txt" "$N_NGINX_LUA") µs"
stop_nginx_anchor

# --- 2. ingest -> APNs latency at a fixed rate -----------------------------------------------
write_config "$WORK/latency.db"
start_relay
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
CRED=$(new_credential "$WORK/latency.db")
curl -fsS -X POST "http://127.0.0.1:$CONTROL_PORT/reset" >/dev/null || true
echo "== latency at ~1000/s" >&2
LAT=$(python3 - "$RELAY_PORT" "$CONTROL_PORT" "$CRED" <<'EOF'
import http.client, json, sys, threading, time, uuid, os, datetime
port, control, cred = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rate, seconds, nthreads = 1000, 10, 8
sent = {}
lock = threading.Lock()
def worker(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    token = os.urandom(32).hex(); session = str(uuid.uuid4()).upper()
    per = rate / nthreads; start = time.time(); i = 0
    while True:
        due = start + i / per
        if due - start >= seconds: break
        now = time.time()
        if due > now: time.sleep(due - now)
        body = json.dumps({"pushToken": token, "sessionIdentifier": session, "keyID": "AQIDBA==", "messageIndex": i,
                           "encryptedData": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIj"})
        t0 = time.time()
        c.request("POST", "/v1/responses", body, {"Content-Type": "application/json", "Authorization": "Bearer " + cred})
        r = c.getresponse(); data = r.read()
        if r.status == 202:
            with lock: sent[json.loads(data)["id"]] = t0
        i += 1
ts = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
begin = time.time()
for t in ts: t.start()
for t in ts: t.join()
elapsed = time.time() - begin
time.sleep(2)
c = http.client.HTTPConnection("127.0.0.1", control)
c.request("GET", "/deliveries"); d = json.loads(c.getresponse().read())
if isinstance(d, dict): d = d.get("deliveries", [])
lat = []
for x in d:
    t0 = sent.get(x.get("apnsId"))
    if t0 is None: continue
    ra = datetime.datetime.fromisoformat(x["receivedAt"].replace("Z", "+00:00")).timestamp()
    lat.append((ra - t0) * 1000)
lat.sort()
def pct(p): return lat[min(len(lat) - 1, int(len(lat) * p))] if lat else float("nan")
print(f"{len(sent)/elapsed:.0f} {len(sent)} {len(lat)} {pct(0.5):.2f} {pct(0.99):.2f}")
EOF
)
read -r LAT_RATE LAT_SENT LAT_MATCHED LAT_P50 LAT_P99 <<< "$LAT"
stop_relay

# --- 3. one million queued rows: start-to-ready, peak RSS --------------------------------
write_config "$WORK/million.db"
start_relay   # creates the schema
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
stop_relay
echo "== inserting $ROWS queued rows" >&2
NOW_MS=$(($(date +%s) * 1000))
sqlite3 "$WORK/million.db" <<EOF
PRAGMA synchronous=OFF;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
-- id_high is the id's first 64 bits (schema v5): v4-shaped ids whose first 64 bits are (i << 16) | 0x4000
INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                       attempts, next_attempt_at, created_at, expires_at, updated_at)
SELECT (i << 16) | 16384, printf('%08x-%04x-4000-8%03x-%012x', i >> 16, i & 65535, random() & 4095, random() & 281474976710655),
       'com.example.bench', printf('%064x', i), 'B1D0C8A4-1111-4222-8333-444455556666', X'01020304', i, randomblob(48), 'cred_bench',
       'queued', 0, $NOW_MS, $NOW_MS, $NOW_MS + 86400000, $NOW_MS FROM n;
EOF
# One start with APNs stalled (claimed rows go back to queued at stop) gives the fixture rows
# their dedupe-index entries (schema v6: rows above merged_through, up to minted_through, are
# read into memory at start and merged at close), so the timed start below is a relay that had
# stored them itself: index merged, empty tail. A pre-v6 binary has neither column.
sqlite3 "$WORK/million.db" "UPDATE outbox_stats SET minted_through = (SELECT max(id_high) FROM responses)" 2>/dev/null || true
curl -fsS -X POST "http://127.0.0.1:$CONTROL_PORT/faults" -H 'Content-Type: application/json' -d '{"stall":true}' >/dev/null
start_relay
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
stop_relay
curl -fsS -X DELETE "http://127.0.0.1:$CONTROL_PORT/faults" >/dev/null
if KEYS=$(sqlite3 "$WORK/million.db" "SELECT count(*) FROM response_keys" 2>/dev/null); then  # (a pre-v6 binary has no such table)
  [ "$KEYS" -ge "$ROWS" ] || { echo "bench-relay: only $KEYS of $ROWS fixture rows have dedupe-index entries" >&2; exit 1; }
fi
DB_MB=$(du -m "$WORK/million.db" | cut -f1)
T0=$(date +%s%N)
start_relay
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz"
T1=$(date +%s%N)
READY_MS=$(( (T1 - T0) / 1000000 ))
sleep 5
RSS_KB=$(awk '/VmHWM/{print $2}' "/proc/$RELAY_PID/status")
ANON_KB=$(awk '/RssAnon/{print $2}' "/proc/$RELAY_PID/status")
PSS_KB=$(awk '/^Pss:/{print $2}' "/proc/$RELAY_PID/smaps_rollup" 2>/dev/null || echo 0)
DRAINED=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -F' ' '/^relay_outbox_responses\{state="delivered"\}/{print $2}')
stop_relay

ratio() { python3 -c "a,b=float('$1' or 0),float('$2' or 0); print(f'{a/b:.2f}' if b else 'n/a')"; }
cat <<EOF
## relay-server

Commands: \`scripts/bench-relay.sh\` (wrk -t2 -c$CONNECTIONS -d${DURATION}s; relay-server and mock-apns
release builds on loopback; SQLite \`synchronous=FULL\`; rate limits disabled).

| measurement | figure | anchor (same run) | ratio | target |
|---|---|---|---|---|
| durable ingest, 202/s at $CONNECTIONS keep-alive connections, mock-apns answering on the same cores | $RELAY_RPS/s (non-202: $RELAY_NON202; rows stored: $ROWS_STORED; wrk p99 $RELAY_P99) | nginx static GET: $NGINX_RPS/s; nginx, same POSTs: $NGINX_LUA_RPS/s | $(ratio "$RELAY_RPS" "$NGINX_RPS")x static GET / $(ratio "$RELAY_RPS" "$NGINX_LUA_RPS")x same POSTs | >= 0.5x |
| durable ingest with APNs stalled (ingest path only) | $STALLED_RPS/s (non-202: $STALLED_NON202) | nginx static GET: $NGINX_RPS/s; nginx, same POSTs: $NGINX_LUA_RPS/s | $(ratio "$STALLED_RPS" "$NGINX_RPS")x static GET / $(ratio "$STALLED_RPS" "$NGINX_LUA_RPS")x same POSTs | >= 0.5x |
| nginx answering the relay's POSTs (client cost) | $NGINX_LUA_RPS/s | nginx static GET: $NGINX_RPS/s | $(ratio "$NGINX_LUA_RPS" "$NGINX_RPS") x nginx | – |
| CPU per request: relay live / stalled / nginx | $CPU_LIVE / $CPU_STALLED / $CPU_NGINX; nginx with the POST script: $CPU_NGINX_LUA | – | – | – |
| CPUs idle during the run (both cores, /proc/stat): relay stalled / nginx static GET | $(idle_pct "$I2" "$I3") % / $(idle_pct "$XI0" "$XI1") % | – | – | – |
| group commit: jobs per COMMIT (live / stalled) | $(jobs_per_commit "$S0" "$S1") / $(jobs_per_commit "$S2" "$S3") (ingests + dispatcher writes per transaction) | – | – | – |
| stalled run: where a round trip goes | wrk mean latency $STALLED_WRK_MEAN; in the relay's service (parsed request -> answer, \`relay_ingest_duration_seconds\`) $(service_ms "$S2" "$S3") ms; the writer inside transactions $(writer_duty "$S2" "$S3" "$DURATION") % of the run | – | – | – |
| ingest -> APNs (mock) latency at ${LAT_RATE}/s offered | p50 ${LAT_P50} ms, p99 ${LAT_P99} ms ($LAT_MATCHED of $LAT_SENT matched) | – | – | p99 < 5 ms |
| start to ready with $ROWS queued rows (DB ${DB_MB} MB) | ${READY_MS} ms (process start to /readyz 200) | – | – | < 300 ms |
| peak RSS with $ROWS queued rows, 5 s into draining | $((RSS_KB / 1024)) MB peak; now $((ANON_KB / 1024)) MB anonymous, PSS $((PSS_KB / 1024)) MB (delivered so far: ${DRAINED:-?}) | – | – | < 40 MB |
| peak RSS after the ingest run | $((RSS_INGEST / 1024)) MB | – | – | – |

The ratio column gives the relay against both anchors: nginx answering a plain GET (the primary
anchor, as in every earlier run) / nginx answering the same POST requests from the same wrk
script. The wrk script formats each request once and only splices the message index in, without
a response callback (scripts/lib-bench.sh), so the client costs about what a plain GET does;
the relay's 202/s are the 202s it counted (\`relay_ingest_requests_total\`) over wrk's measured
seconds, and non-202 its other answers by status (0: none).

Latency is measured per response from the client's send time to mock-apns' \`receivedAt\`
(millisecond resolution) on the same clock. Load average during the run: $(cut -d' ' -f1-3 /proc/loadavg)
(other processes share these $(nproc) cores). Most of the RSS is file-backed pages of shared
libraries (the Swift runtime, libcrypto, FoundationEssentials; relay-server links neither
Foundation/ICU nor libcurl, docs/storage.md "Memory"): the anonymous part does
not grow with the number of queued rows, which are never loaded into memory.

EOF
