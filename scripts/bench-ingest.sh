#!/usr/bin/env bash
# Durable ingest under realistic traffic against the peers a user would otherwise put in front of
# APNs (issue 18). A markdown section on stdout, progress on stderr; run by `make bench` via
# scripts/bench.sh, or alone: scripts/bench-ingest.sh. In each of BENCH_INGEST_ROUNDS rounds,
# alternating, all on loopback with 64 client connections and APNs stalled (mock-apns answers
# nothing, so only the ingest path runs):
#   relay-server, SQLite synchronous=FULL: one push token per wrk thread (the old figure), 1,000
#     and 100,000 push tokens interleaved with 200-400-byte ciphertexts (write_tokens_lua);
#   Redis 7, appendonly yes + appendfsync always: redis-benchmark -c 64 -d 400 -t lpush;
#   PostgreSQL 15, synchronous_commit on: pgbench -c 64 of one 400-byte INSERT, and the relay's
#     PostgreSQL backend (1,000 tokens) on the same cluster and database;
#   nginx answering a static 200 (stores nothing): the HTTP ceiling.
# Server CPU per durable record: /proc/<pid>/stat utime+stime deltas of the server processes
# (relay-server; redis-server; the whole PostgreSQL cluster: postmaster, backends, walwriter,
# checkpointer..., see tree_ticks) divided by the records stored. Every server runs from a
# temp dir and is stopped by the EXIT trap, by pid, even on failure.
# BENCH_INGEST_SYSTEMS="relay-small redis ..." runs only those (A/B runs); BENCH_SQLITE_PAGE_SIZE=N
# creates the relay's SQLite databases with that page size (an experiment: the relay keeps it).
# BENCH_PERF=DIR: also `perf record -g` relay-server during the middle of round 1 of
# BENCH_PERF_SYSTEM (default relay-small) into DIR/SYSTEM.perf.data (then: perf report -i ...
# --no-children). BENCH_BIN=DIR runs the relay-server and mock-apns found there instead of
# building them (A/B runs against an older release build). BENCH_PG_SETTINGS="k = v; ..." adds
# settings to the benchmark cluster's postgresql.conf (e.g. pg_stat_statements for a profile);
# BENCH_PG_STATS=FILE then writes the cluster's top statements (pg_stat_statements: calls, rows,
# total and mean execution time) to FILE after the rounds, e.g. with
# BENCH_PG_SETTINGS="shared_preload_libraries = 'pg_stat_statements'" BENCH_INGEST_SYSTEMS=relay-pg.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
ROUNDS=${BENCH_INGEST_ROUNDS:-2}
SMALL=${BENCH_TOKENS:-1000}
LARGE=${BENCH_TOKENS_LARGE:-100000}
REDIS_REQUESTS=${BENCH_REDIS_REQUESTS:-400000}
. scripts/lib-bench.sh
wanted() { [ -z "${BENCH_INGEST_SYSTEMS:-}" ] || [[ " $BENCH_INGEST_SYSTEMS " == *" $1 "* ]]; }
# The peers' tools only when their systems run (an A/B of relay-small needs neither nginx nor Redis).
TOOLS=(wrk pgbench psql openssl sqlite3 curl python3 timeout)
if wanted nginx; then TOOLS+=(nginx); fi
if wanted redis; then TOOLS+=(redis-server redis-benchmark redis-cli); fi
bench_prologue bench-ingest "${TOOLS[@]}"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
sync   # earlier benchmarks' dirty pages would compete with every server's fsyncs

start_bench_mock
curl -fsS -X POST "http://127.0.0.1:$CONTROL_PORT/faults" -H 'Content-Type: application/json' -d '{"stall":true}' >/dev/null

echo "== starting PostgreSQL (scripts/pg-test.sh), max_connections 120 for pgbench -c $CONNECTIONS" >&2
PG_URL=$(scripts/pg-test.sh start "$WORK/pg" 2>"$WORK/pg-start.log" </dev/null | tail -1)
echo "max_connections = 120" >> "$WORK/pg/data/postgresql.conf"
if [ -n "${BENCH_PG_SETTINGS:-}" ]; then tr ';' '\n' <<<"$BENCH_PG_SETTINGS" >> "$WORK/pg/data/postgresql.conf"; fi
scripts/pg-test.sh restart "$WORK/pg" >&2
PG_MASTER=$(head -1 "$WORK/pg/data/postmaster.pid")
PAYLOAD=$(python3 -c 'import random, string; r = random.Random(18); print("".join(r.choice(string.ascii_letters + string.digits) for _ in range(400)))')
if [ -n "${BENCH_PG_STATS:-}" ]; then psql -q "$PG_URL" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null; fi
psql -q "$PG_URL" -c "CREATE TABLE records (id bigserial PRIMARY KEY, token int NOT NULL, payload text NOT NULL)" >/dev/null
cat > "$WORK/insert.sql" <<EOF
\\set token random(1, $SMALL)
INSERT INTO records (token, payload) VALUES (:token, '$PAYLOAD');
EOF

write_post_lua "$WORK/one.lua"
write_tokens_lua "$WORK/tokens.lua"
RESULTS="$WORK/results.txt"   # system round records/s cpu_us_per_record bytes_written_per_record extra
: > "$RESULTS"

# Bytes a process caused to be written to storage (/proc/PID/io write_bytes: WAL, AOF, checkpoints).
io_written() { awk '/^write_bytes/{print $2}' "/proc/$1/io"; }
# PostgreSQL's WAL position in bytes: the difference of two readings is the WAL written between.
wal_bytes() { psql -Atq "$PG_URL" -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"; }
# Connections mock-apns has accepted so far (the stalled mock answers no push: PushClient's reconnects).
mock_connections() { curl -fsS "http://127.0.0.1:$CONTROL_PORT/stats" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("connectionsTotal", 0))'; }

# relay SYSTEM ROUND KIND(sqlite|postgres) LUA TOKENS
relay() {
  local system=$1 round=$2 kind=$3 lua=$4 tokens=$5 port admin store pid a0 a1 c0 c1 t0 t1 p0=0 p1=0 w0 w1 m0 m1 secs
  port=$(free_port); admin=$(free_port)
  if [ "$kind" = sqlite ]; then
    store="{\"path\":\"$WORK/$system-$round.db\",\"synchronous\":\"FULL\",\"maxPending\":5000000}"
    if [ -n "${BENCH_SQLITE_PAGE_SIZE:-}" ]; then
      sqlite3 "$WORK/$system-$round.db" "PRAGMA page_size=$BENCH_SQLITE_PAGE_SIZE; PRAGMA journal_mode=WAL;" >/dev/null
    fi
  else
    psql -q "$PG_URL" -c "DO \$\$ BEGIN IF to_regclass('responses') IS NOT NULL THEN TRUNCATE responses, attempts; END IF; END \$\$" >/dev/null
    store="{\"kind\":\"postgres\",\"url\":\"$PG_URL\",\"nodeId\":\"bench-$round\",\"maxPending\":5000000}"
  fi
  cat > "$WORK/relay.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$port},"admin":{"host":"127.0.0.1","port":$admin},
 "store":$store,
 $(bench_relay_members),
 "watchdog":false,"log":{"format":"json","level":"warning"}}
EOF
  "$BIN/relay-server" --config "$WORK/relay.json" 2>>"$WORK/relay.log" &
  pid=$!; PIDS+=("$pid")
  wait_url "http://127.0.0.1:$admin/readyz"
  if [ "$kind" = sqlite ]; then
    sqlite3 "$WORK/$system-$round.db" ".timeout 5000" "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_bench','bench',X'$HASH','com.example.bench',0)"
  else
    psql -q "$PG_URL" -c "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_bench','bench','\\x$HASH','com.example.bench',0) ON CONFLICT DO NOTHING" >/dev/null
  fi
  echo "== round $round: $system" >&2
  a0=$(metric "$admin" 'relay_ingest_requests_total{status="202"}'); c0=$(metric "$admin" relay_store_commits_total)
  t0=$(proc_ticks "$pid"); w0=$(io_written "$pid"); m0=$(mock_connections); th0=$(thread_ticks "$pid")
  if [ "$kind" = postgres ]; then p0=$(tree_ticks "$PG_MASTER"); w0=$(wal_bytes); fi
  local perf_pid=""
  if [ -n "${BENCH_PERF:-}" ] && [ "$system" = "${BENCH_PERF_SYSTEM:-relay-small}" ] && [ "$round" = 1 ] && command -v perf >/dev/null; then
    mkdir -p "$BENCH_PERF"
    (sleep 1; exec perf record -q -F 999 -g -p "$pid" -o "$BENCH_PERF/$system.perf.data" -- sleep $((DURATION - 2))) >/dev/null 2>&1 &
    perf_pid=$!
  fi
  WRK_THREADS=2 WRK_TOKENS=$tokens WRK_SEED=$round RELAY_CRED="$SECRET" \
    wrk --latency -t2 -c"$CONNECTIONS" -d"${DURATION}s" -s "$lua" "http://127.0.0.1:$port" > "$WORK/wrk-$system-$round.txt"
  t1=$(proc_ticks "$pid"); w1=$(io_written "$pid"); m1=$(mock_connections); th1=$(thread_ticks "$pid")
  if [ "$kind" = postgres ]; then p1=$(tree_ticks "$PG_MASTER"); w1=$(wal_bytes); fi
  a1=$(metric "$admin" 'relay_ingest_requests_total{status="202"}'); c1=$(metric "$admin" relay_store_commits_total)
  if [ -n "$perf_pid" ]; then wait "$perf_pid" || true; fi
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  secs=$(wrk_seconds "$WORK/wrk-$system-$round.txt")
  python3 - "$system" "$round" "$((a1 - a0))" "$secs" "$((t1 - t0))" "$((p1 - p0))" "$((c1 - c0))" "$(getconf CLK_TCK)" "$((w1 - w0))" "$((m1 - m0))" \
    "$(awk '/ 99%/{print $2}' "$WORK/wrk-$system-$round.txt")" "$th0" "$th1" >> "$RESULTS" <<'PY'
import sys
system, rnd, n, secs, t, p, commits, hz, w, apns, p99, th0, th1 = sys.argv[1:]
n, secs, t, p, commits, hz = int(n), float(secs), int(t), int(p), int(commits), int(hz)
us = (t + p) / hz * 1e6 / n if n else 0
extra = (f"rows per commit {n / commits:.1f}; " if commits else "") + f"wrk p99 {p99}; APNs connections opened {apns}"
if p:
    extra += f"; relay {t / hz * 1e6 / n:.1f} µs + PostgreSQL {p / hz * 1e6 / n:.1f} µs"
# The relay's threads by name, busiest first (relay-sqlite-wr is the SQLite writer).
a, b = (dict((k, int(v)) for k, v in (l.split() for l in x.splitlines() if l.strip())) for x in (th0, th1))
busy = sorted(((b[k] - a.get(k, 0), k) for k in b if b[k] > a.get(k, 0)), reverse=True)
if n and busy:
    extra += "; threads µs per row: " + ", ".join(f"{k} {d / hz * 1e6 / n:.1f}" for d, k in busy)
print(f"{system}\t{rnd}\t{n / secs:.0f}\t{us:.1f}\t{int(w) / n if n else 0:.0f}\t{extra}")
PY
}

redis() {  # ROUND
  local round=$1 dir port pid t0 t1 w0 w1 n rps
  dir="$WORK/redis-$round"; mkdir -p "$dir"; port=$(free_port)
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --appendonly yes --appendfsync always --save '' \
    --protected-mode no --daemonize no --logfile "$dir/redis.log" &
  pid=$!; PIDS+=("$pid")
  for _ in $(seq 1 400); do [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break; sleep 0.025; done
  echo "== round $round: Redis" >&2
  t0=$(proc_ticks "$pid"); w0=$(io_written "$pid")
  timeout 300 redis-benchmark -h 127.0.0.1 -p "$port" -c "$CONNECTIONS" -d 400 -t lpush -n "$REDIS_REQUESTS" --csv > "$WORK/redis-$round.csv"
  t1=$(proc_ticks "$pid"); w1=$(io_written "$pid")
  n=$(redis-cli -p "$port" llen mylist)
  rps=$(awk -F'"' '$2 == "LPUSH" {printf "%.0f", $4}' "$WORK/redis-$round.csv")
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  printf 'redis\t%s\t%s\t%s\t%s\t%s\n' "$round" "$rps" "$(us_per_req $((t1 - t0)) "$n")" "$(( (w1 - w0) / (n > 0 ? n : 1) ))" \
    "$n records in the AOF list; p99 $(awk -F'"' '$2 == "LPUSH" {print $14}' "$WORK/redis-$round.csv") ms" >> "$RESULTS"
}

pgbench_run() {  # ROUND
  local round=$1 r0 r1 t0 t1 w0 w1 tps
  psql -q "$PG_URL" -c "TRUNCATE records" >/dev/null
  echo "== round $round: pgbench" >&2
  r0=$(psql -Atq "$PG_URL" -c "SELECT count(*) FROM records"); t0=$(tree_ticks "$PG_MASTER"); w0=$(wal_bytes)
  timeout 300 pgbench -n -M prepared -c "$CONNECTIONS" -j 2 -T "$DURATION" -f "$WORK/insert.sql" "$PG_URL" > "$WORK/pgbench-$round.txt" 2>&1
  sleep 0.5   # the backends exit and are reaped into the postmaster's cutime
  t1=$(tree_ticks "$PG_MASTER"); w1=$(wal_bytes); r1=$(psql -Atq "$PG_URL" -c "SELECT count(*) FROM records")
  tps=$(awk '/^tps = /{printf "%.0f", $3}' "$WORK/pgbench-$round.txt")
  printf 'pgbench\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tps" "$(us_per_req $((t1 - t0)) $((r1 - r0)))" "$(( (w1 - w0) / (r1 > r0 ? r1 - r0 : 1) ))" \
    "$((r1 - r0)) rows; latency average $(awk '/^latency average/{print $4, $5}' "$WORK/pgbench-$round.txt")" >> "$RESULTS"
}

if wanted nginx; then
  start_nginx_anchor
fi
nginx_run() {  # ROUND
  local round=$1 t0 t1 n
  echo "== round $round: nginx" >&2
  t0=$(proc_ticks $NGINX_WORKERS)
  wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$NGINX_PORT/" > "$WORK/wrk-nginx-$round.txt"
  t1=$(proc_ticks $NGINX_WORKERS)
  n=$(awk '/requests in/{print $1}' "$WORK/wrk-nginx-$round.txt")
  printf 'nginx\t%s\t%s\t%s\t0\t%s\n' "$round" "$(awk '/Requests\/sec/{printf "%.0f", $2}' "$WORK/wrk-nginx-$round.txt")" \
    "$(us_per_req $((t1 - t0)) "$n")" "stores nothing" >> "$RESULTS"
}

for round in $(seq 1 "$ROUNDS"); do
  if wanted nginx; then nginx_run "$round"; fi
  if wanted relay-1; then relay relay-1 "$round" sqlite "$WORK/one.lua" 2; fi
  if wanted relay-small; then relay relay-small "$round" sqlite "$WORK/tokens.lua" "$SMALL"; fi
  if wanted redis; then redis "$round"; fi
  if wanted relay-large; then relay relay-large "$round" sqlite "$WORK/tokens.lua" "$LARGE"; fi
  if wanted pgbench; then pgbench_run "$round"; fi
  if wanted relay-pg; then relay relay-pg "$round" postgres "$WORK/tokens.lua" "$SMALL"; fi
done
if wanted nginx; then stop_nginx_anchor; fi
if [ -n "${BENCH_PG_STATS:-}" ]; then
  psql -q "$PG_URL" -c "\\pset footer off" -c "SELECT calls, rows, round(total_exec_time::numeric, 1) AS total_ms,
    round((total_exec_time / calls * 1000)::numeric, 1) AS mean_us, left(regexp_replace(query, '\\s+', ' ', 'g'), 300) AS query
    FROM pg_stat_statements WHERE calls > 0 ORDER BY total_exec_time DESC LIMIT 25" > "$BENCH_PG_STATS"
fi
cp "$RESULTS" .build/bench-ingest-results.tsv 2>/dev/null || true

python3 - "$RESULTS" "${BENCH_DATA:-}" "$DURATION" "$CONNECTIONS" "$ROUNDS" "$SMALL" "$LARGE" "$REDIS_REQUESTS" \
  "$LOAD_START" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(command -v redis-server >/dev/null && redis-server --version | awk '{sub(/^v=/, "", $3); print $3}')" \
  "$(pgbench --version | awk '{print $3}')" <<'PY'
import csv, os, sys
res, data, dur, conns, rounds, small, large, rreq, load0, load1, rver, pver = sys.argv[1:]
small, large = int(small), int(large)
runs = {}
for line in open(res):
    f = line.rstrip("\n").split("\t")
    if len(f) < 4 or not f[2]:
        continue
    runs.setdefault(f[0], []).append((int(f[1]), float(f[2]), float(f[3]), f[5] if len(f) > 5 else "", float(f[4])))
best = {k: max(v, key=lambda r: r[1]) for k, v in runs.items()}
def g(k, i):
    return best[k][i] if k in best else float("nan")
NAMES = [
    ("relay-1", f"relay-server, SQLite FULL, 1 push token per wrk thread (the old figure)", f"wrk -t2 -c{conns}, write_post_lua"),
    ("relay-small", f"relay-server, SQLite FULL, {small:,} push tokens interleaved, 200-400-byte ciphertexts", f"wrk -t2 -c{conns}, write_tokens_lua"),
    ("relay-large", f"relay-server, SQLite FULL, {large:,} push tokens interleaved, 200-400-byte ciphertexts", f"wrk -t2 -c{conns}, write_tokens_lua"),
    ("redis", f"Redis {rver}, appendonly yes, appendfsync always", f"redis-benchmark -c {conns} -d 400 -t lpush -n {rreq}"),
    ("pgbench", f"PostgreSQL {pver}, synchronous_commit on, one 400-byte INSERT", f"pgbench -n -M prepared -c {conns} -j 2 -T {dur}"),
    ("relay-pg", f"relay-server, PostgreSQL backend on the same database, {small:,} push tokens", f"wrk -t2 -c{conns}, write_tokens_lua; CPU = relay + cluster"),
    ("nginx", "nginx static 200 (stores nothing: the HTTP ceiling)", f"wrk -t2 -c{conns} GET"),
]
print("## Durable ingest vs Redis and PostgreSQL, realistic traffic (scripts/bench-ingest.sh)\n")
print(f"Same run, loopback, {conns} client connections each, APNs stalled for the relay (mock-apns answers")
print(f"nothing, so only ingest runs), {rounds} alternating rounds of {dur} s (Redis: {rreq} LPUSHes);")
print("the best round per server is shown, every round in the last column. \"Server CPU\" is")
print("utime+stime of the server's processes over the run (/proc/<pid>/stat) divided by the")
print("durable records: relay-server alone (all threads); redis-server; the whole PostgreSQL")
print("cluster (postmaster, backends, walwriter, checkpointer...). Clients are not counted.")
print("\"Bytes written\": /proc/<pid>/io write_bytes of relay-server (SQLite WAL + checkpoints) and")
print("redis-server (AOF); for PostgreSQL the WAL bytes (pg_current_wal_lsn difference).")
print(f"Load average at the start {load0}, at the end {load1} (2 cores, shared with other jobs).\n")
print("| server | client | durable records/s | server CPU µs per record | bytes written per record | notes (best round) | all rounds: records/s (CPU µs) |")
print("|---|---|---:|---:|---:|---|---|")
for k, name, client in NAMES:
    if k not in runs:
        continue
    _, rps, us, extra, wb = best[k]
    allr = ", ".join(f"{r[1]:.0f} ({r[2]:.1f})" for r in sorted(runs[k]))
    print(f"| {name} | `{client}` | {rps:.0f} | {us:.1f} | {wb:.0f} | {extra} | {allr} |")
def ratio(a, b):
    return f"{a / b:.2f}x" if b == b and a == a and b > 0 else "n/a"
print("\n| measurement | figures | ratio | target |")
print("|---|---|---|---|")
rows = [
    (f"relay {small:,} tokens / Redis AOF always: throughput", "relay-small", "redis", 1, ">= 0.6x (goal 1.0x)"),
    (f"relay {small:,} tokens / Redis AOF always: server CPU per record", "relay-small", "redis", 2, "<= 1.0x"),
    (f"relay {large:,} tokens / Redis AOF always: throughput", "relay-large", "redis", 1, "–"),
    (f"relay {large:,} tokens / Redis AOF always: server CPU per record", "relay-large", "redis", 2, "–"),
    (f"relay {large:,} tokens / relay {small:,} tokens: throughput", "relay-large", "relay-small", 1, ">= 0.8x"),
    (f"relay {small:,} tokens / PostgreSQL pgbench INSERT: throughput", "relay-small", "pgbench", 1, "–"),
    (f"relay {small:,} tokens / PostgreSQL pgbench INSERT: server CPU per record", "relay-small", "pgbench", 2, "–"),
    (f"relay PostgreSQL backend / pgbench INSERT, same database: throughput", "relay-pg", "pgbench", 1, ">= 1.5x"),
    (f"relay PostgreSQL backend / pgbench INSERT, same database: CPU per record (relay + cluster / cluster)", "relay-pg", "pgbench", 2, "–"),
    (f"relay {small:,} tokens / relay 1 token per thread: throughput", "relay-small", "relay-1", 1, "–"),
    (f"relay {small:,} tokens / nginx static: throughput", "relay-small", "nginx", 1, "–"),
]
for label, a, b, i, target in rows:
    if a not in best or b not in best:
        continue
    unit = "/s" if i == 1 else " µs"
    ra = {r[0]: r for r in runs[a]}
    paired = [f"{ra[r[0]][i] / r[i]:.2f}x" for r in sorted(runs[b]) if r[0] in ra and r[i] > 0]
    print(f"| {label} | {g(a, i):.{0 if i == 1 else 1}f}{unit} vs {g(b, i):.{0 if i == 1 else 1}f}{unit} (best rounds); same round: {', '.join(paired)} | {ratio(g(a, i), g(b, i))} | {target} |")
print("\nThe analysis of these figures, with the profile of the relay at 1,000 tokens, is in")
print("[docs/benchmarks-analysis.md](benchmarks-analysis.md) (\"Realistic traffic and the peers\").")
print("The plots: [throughput](peers-throughput.svg), [CPU per record](peers-cpu.svg).\n")
print("![durable records per second](peers-throughput.svg)\n")
print("![server CPU per durable record](peers-cpu.svg)\n")
if data:
    os.makedirs(data, exist_ok=True)
    labels = {"relay-1": "relay, 1 token/thread", "relay-small": f"relay, {small:,} tokens", "relay-large": f"relay, {large:,} tokens",
              "redis": "Redis AOF always", "pgbench": "PostgreSQL pgbench", "relay-pg": f"relay on PostgreSQL, {small:,}",
              "nginx": "nginx static (no storage)"}
    with open(os.path.join(data, "peers.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "rps", "cpu_us"])
        for k, _, _ in NAMES:
            if k in best:
                w.writerow([labels[k], f"{best[k][1]:.0f}", f"{best[k][2]:.1f}"])
PY
