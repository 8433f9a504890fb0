#!/usr/bin/env bash
# PostgreSQL store benchmark (a markdown section on stdout; progress on stderr). Run by
# `make bench` via scripts/bench.sh, or alone: scripts/bench-postgres.sh.
#
# Same run, same machine, same mock-apns:
#   anchor: one relay-server node on SQLite (synchronous=FULL)
#   vs 1, 2 and 3 relay-server nodes sharing one PostgreSQL (fsync on, synchronous_commit on,
#   shared_buffers 64MB: scripts/pg-test.sh).
#  1. Durable ingest: 202/s with 64 keep-alive connections in total, split evenly over the nodes
#     (one wrk per node, unique bodies), while the nodes also deliver to mock-apns; 202/s is the
#     202s the nodes counted (relay_ingest_requests_total) over wrk's seconds, other answers apart.
#  2. Drain: BENCH_PG_DRAIN_ROWS rows inserted queued while the nodes are down, then the nodes
#     start; rows delivered to mock-apns per second until the queue is empty.
# CPU seconds used by relay-server, PostgreSQL and wrk during the ingest window show where the
# ceiling is. Leaves no processes behind (the trap stops what it started, by pid).
# BENCH_BIN=DIR: run the release binaries in DIR instead of building (A/B runs of two builds).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-8}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
DRAIN_ROWS=${BENCH_PG_DRAIN_ROWS:-20000}
. scripts/lib-bench.sh
bench_prologue bench-postgres wrk openssl sqlite3 curl python3 psql
now_ms() { python3 -c 'import time; print(int(time.time()*1000))'; }
# CPU seconds (user+system) of the given pids, summed.
cpu_of() { python3 - "$@" <<'EOF'
import os, sys
hz = os.sysconf("SC_CLK_TCK"); total = 0
for p in sys.argv[1:]:
    try:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        total += int(f[11]) + int(f[12])
    except Exception: pass
print(f"{total / hz:.2f}")
EOF
}
pg_pids() { pgrep -u postgres -f "$WORK/pg" | tr '\n' ' '; pgrep -u postgres -P "$(head -1 "$WORK/pg/data/postmaster.pid")" | tr '\n' ' '; }

start_bench_mock

echo "== starting PostgreSQL (scripts/pg-test.sh)" >&2
PG_URL=$(scripts/pg-test.sh start "$WORK/pg" 2>"$WORK/pg-start.log" </dev/null | tail -1)
PG_ADMIN="${PG_URL%/relay}/postgres"

# write_config NAME STORE_JSON -> $WORK/NAME.json with fresh ports in NAME.ports
write_config() {
  local name=$1 store=$2 port admin
  port=$(free_port); admin=$(free_port)
  echo "$port $admin" > "$WORK/$name.ports"
  cat > "$WORK/$name.json" <<EOF
{"listen":{"host":"127.0.0.1","port":$port},"admin":{"host":"127.0.0.1","port":$admin},
 "store":$store,
 $(bench_relay_members),
 "watchdog":false,"log":{"format":"json","level":"warning"}}
EOF
}

NODE_PIDS=()
start_nodes() {  # names...
  NODE_PIDS=()
  for n in "$@"; do
    "$BIN/relay-server" --config "$WORK/$n.json" 2>>"$WORK/$n.log" &
    NODE_PIDS+=($!)
    PIDS+=($!)
  done
  for n in "$@"; do wait_url "http://127.0.0.1:$(cut -d' ' -f2 "$WORK/$n.ports")/readyz"; done
}
stop_nodes() {
  for p in "${NODE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${NODE_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}

# Sum of relay_store_commits_total over the given nodes (PostgreSQL: ingest transactions).
commits_of() {
  local total=0 v
  for n in "$@"; do
    v=$(curl -fsS "http://127.0.0.1:$(cut -d' ' -f2 "$WORK/$n.ports")/metrics" | awk '/^relay_store_commits_total /{print $2}')
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

write_post_lua "$WORK/post.lua" count

# ingest LABEL names... : one wrk per node, CONNECTIONS split evenly; prints "rps non202 relay_cpu pg_cpu":
# rps the 202s the nodes counted (relay_ingest_requests_total) over wrk's seconds, summed over the
# nodes; non202 their other answers ("node:status:count,...", or 0).
ingest() {
  local label=$1; shift
  local k=$# per=$((CONNECTIONS / $#)) i=0 wpids=() pgp relay0 pg0 wrk_cpu=0 c0=() rps=0 non="" r o
  pgp=$(pg_pids)
  relay0=$(cpu_of "${NODE_PIDS[@]}"); pg0=$(cpu_of $pgp)
  for n in "$@"; do c0+=("$(ingest_counts "$(cut -d' ' -f2 "$WORK/$n.ports")")"); done
  for n in "$@"; do
    i=$((i + 1))
    WRK_SEED=$i RELAY_CRED="$SECRET" wrk -t1 -c"$per" -d"${DURATION}s" -s "$WORK/post.lua" \
      "http://127.0.0.1:$(cut -d' ' -f1 "$WORK/$n.ports")" > "$WORK/wrk-$label-$n.txt" &
    wpids+=($!)
  done
  # CPU of the nodes and PostgreSQL is sampled just before wrk ends (wrk's own from its exit).
  sleep $((DURATION - 1))
  local relay1 pg1
  relay1=$(cpu_of "${NODE_PIDS[@]}"); pg1=$(cpu_of $pgp)
  for p in "${wpids[@]}"; do wait "$p"; done
  i=0
  for n in "$@"; do
    read -r r o < <(ingest_result "${c0[$i]}" "$(ingest_counts "$(cut -d' ' -f2 "$WORK/$n.ports")")" "$WORK/wrk-$label-$n.txt")
    rps=$((rps + r)); i=$((i + 1))
    [ "$o" = 0 ] || non+="${non:+,}$n:$o"
  done
  echo "$rps ${non:-0} $(python3 -c "import sys; print(f'{float(sys.argv[2])-float(sys.argv[1]):.1f} {float(sys.argv[4])-float(sys.argv[3]):.1f}')" "$relay0" "$relay1" "$pg0" "$pg1")"
}

# drain LABEL COUNT_CMD names... : times delivery of DRAIN_ROWS pre-queued rows; prints rows/s
drain() {
  local label=$1 count_cmd=$2; shift 2
  local t0 t1 delivered=0
  t0=$(now_ms)
  start_nodes "$@"
  for _ in $(seq 1 1200); do
    delivered=$(eval "$count_cmd")
    [ "$delivered" -ge "$DRAIN_ROWS" ] && break
    sleep 0.1
  done
  t1=$(now_ms)
  stop_nodes
  if [ "$delivered" -lt "$DRAIN_ROWS" ]; then echo "bench-postgres: $label drained only $delivered of $DRAIN_ROWS" >&2; echo 0; return; fi
  python3 -c "print(f'{$DRAIN_ROWS / (($t1 - $t0) / 1000):.0f}')"
}

NOW=$(($(date +%s) * 1000))

# --- anchor: one SQLite node ----------------------------------------------------------------
echo "== SQLite, 1 node: ingest" >&2
write_config sqlite "{\"kind\":\"sqlite\",\"path\":\"$WORK/sqlite.db\",\"synchronous\":\"FULL\",\"maxPending\":5000000}"
start_nodes sqlite
sqlite3 "$WORK/sqlite.db" ".timeout 5000" "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_bench','bench',X'$HASH','com.example.bench',0)"
read -r S_RPS S_NON S_RELAYCPU _ <<< "$(ingest sqlite sqlite)"
stop_nodes
echo "== SQLite, 1 node: drain $DRAIN_ROWS" >&2
sqlite3 "$WORK/sqlite.db" ".timeout 5000" "DELETE FROM responses; DELETE FROM attempts;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $DRAIN_ROWS)
-- id_high is the id's first 64 bits (schema v5): v4-shaped ids whose first 64 bits are (i << 16) | 0x4000
INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                       attempts, next_attempt_at, created_at, expires_at, updated_at)
SELECT (i << 16) | 16384, printf('%08x-%04x-4000-8%03x-%012x', i >> 16, i & 65535, random() & 4095, random() & 281474976710655),
       'com.example.bench', printf('%064x', i), 'B1D0C8A4-1111-4222-8333-444455556666', X'01020304', i, randomblob(48), 'cred_bench',
       'queued', 0, $NOW, $NOW, $NOW + 86400000, $NOW FROM n;"
S_DRAIN=$(drain sqlite "sqlite3 '$WORK/sqlite.db' '.timeout 5000' \"SELECT count(*) FROM responses WHERE state = 'delivered'\"" sqlite)

# --- 1, 2, 3 nodes on one PostgreSQL --------------------------------------------------------
declare -A P_RPS P_NON P_RELAYCPU P_PGCPU P_DRAIN P_BATCH
for k in 1 2 3; do
  db="bench$k"
  psql -q "$PG_ADMIN" -c "CREATE DATABASE $db" >/dev/null
  url="${PG_URL%/relay}/$db"
  names=()
  for i in $(seq 1 "$k"); do
    write_config "pg$k-n$i" "{\"kind\":\"postgres\",\"url\":\"$url\",\"nodeId\":\"bench-$k-$i\",\"maxPending\":5000000}"
    names+=("pg$k-n$i")
  done
  echo "== PostgreSQL, $k node(s): ingest" >&2
  start_nodes "${names[@]}"
  psql -q "$url" -c "INSERT INTO credentials (id,name,hash,apps,created_at) VALUES ('cred_bench','bench','\\x$HASH','com.example.bench',0)" >/dev/null
  c0=$(commits_of "${names[@]}")
  read -r P_RPS[$k] P_NON[$k] P_RELAYCPU[$k] P_PGCPU[$k] <<< "$(ingest "pg$k" "${names[@]}")"
  c1=$(commits_of "${names[@]}")
  rows=$(psql -Atq "$url" -c "SELECT count(*) FROM responses")
  P_BATCH[$k]=$(python3 -c "print(f'{$rows / max(1, $c1 - $c0):.1f}')")
  stop_nodes
  echo "== PostgreSQL, $k node(s): drain $DRAIN_ROWS" >&2
  psql -q "$url" -c "TRUNCATE responses, attempts; INSERT INTO responses (id, app, push_token, session_id, key_id, message_index,
      encrypted_data, credential_id, state, attempts, next_attempt_at, created_at, expires_at, updated_at)
    SELECT gen_random_uuid()::text, 'com.example.bench', lpad(to_hex(i), 64, '0'), 'B1D0C8A4-1111-4222-8333-444455556666',
      '\\x01020304'::bytea, i, decode(repeat('ab', 48), 'hex'), 'cred_bench', 'queued', 0, $NOW, $NOW, $NOW + 86400000, $NOW
    FROM generate_series(1, $DRAIN_ROWS) i; ANALYZE responses;" >/dev/null
  P_DRAIN[$k]=$(drain "pg$k" "psql -Atq '$url' -c \"SELECT count(*) FROM responses WHERE state = 'delivered'\"" "${names[@]}")
done

LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
ratio() { python3 -c "a, b = float('$1'), float('$2'); print(f'{a / b:.2f}x' if b > 0 else 'n/a')"; }

cat <<EOF
## PostgreSQL store: 1, 2, 3 nodes vs one SQLite node (scripts/bench-postgres.sh)

Durable ingest: \`wrk\` with $CONNECTIONS keep-alive connections in total, split evenly over the
nodes (one wrk per node), ${DURATION} s, unique bodies; 202/s is the 202s the nodes counted
(\`relay_ingest_requests_total\`) over wrk's seconds, "non-202" their other answers (node:status:count);
every 202 is committed (SQLite
\`synchronous=FULL\`; PostgreSQL \`fsync=on\`, \`synchronous_commit=on\`, \`shared_buffers=64MB\`
from scripts/pg-test.sh) while the nodes also deliver to mock-apns. Drain: $DRAIN_ROWS rows
inserted \`queued\` while the nodes are down; rows delivered to mock-apns per second from node
start until the queue is empty. CPU: seconds of CPU used during the ingest window (2 cores
give at most $((2 * DURATION)) s). Load average at the end: $LOAD.

| store | nodes | ingest 202/s | vs SQLite | non-202 | rows per commit | relay CPU s | PostgreSQL CPU s | drain rows/s | vs SQLite |
|---|---|---|---|---|---|---|---|---|---|
| SQLite | 1 | $S_RPS | 1.00x | $S_NON | – | $S_RELAYCPU | – | $S_DRAIN | 1.00x |
| PostgreSQL | 1 | ${P_RPS[1]} | $(ratio "${P_RPS[1]}" "$S_RPS") | ${P_NON[1]} | ${P_BATCH[1]} | ${P_RELAYCPU[1]} | ${P_PGCPU[1]} | ${P_DRAIN[1]} | $(ratio "${P_DRAIN[1]}" "$S_DRAIN") |
| PostgreSQL | 2 | ${P_RPS[2]} | $(ratio "${P_RPS[2]}" "$S_RPS") | ${P_NON[2]} | ${P_BATCH[2]} | ${P_RELAYCPU[2]} | ${P_PGCPU[2]} | ${P_DRAIN[2]} | $(ratio "${P_DRAIN[2]}" "$S_DRAIN") |
| PostgreSQL | 3 | ${P_RPS[3]} | $(ratio "${P_RPS[3]}" "$S_RPS") | ${P_NON[3]} | ${P_BATCH[3]} | ${P_RELAYCPU[3]} | ${P_PGCPU[3]} | ${P_DRAIN[3]} | $(ratio "${P_DRAIN[3]}" "$S_DRAIN") |

"rows per commit": rows ingested per ingest transaction (relay_store_commits_total summed
over the nodes), i.e. how much group commit batches; one WAL flush serves a whole batch.

$(python3 - "$DURATION" "$S_RELAYCPU" "${P_RELAYCPU[1]}" "${P_PGCPU[1]}" "${P_RELAYCPU[3]}" "${P_PGCPU[3]}" "$LOAD" <<'PY'
import sys
d, load = sys.argv[1], sys.argv[7]
s_relay, r1, p1, r3, p3 = map(float, sys.argv[2:7])
budget = 2 * float(d)
print(f"Where the ceiling is (this run): the CPU budget of the ingest window is {budget:.0f} s "
      f"(2 cores). One PostgreSQL node used {r1 + p1:.1f} s (relay {r1:.1f}, PostgreSQL {p1:.1f}); three "
      f"nodes {r3 + p3:.1f} s (relay {r3:.1f}, PostgreSQL {p3:.1f}); the SQLite node {s_relay:.1f} s; wrk "
      f"and the other work on the machine (load average {load}) used the rest. On 2 shared cores extra "
      f"nodes only split the same CPU and each adds PostgreSQL backends and round trips, so 2-3 nodes "
      f"cannot be expected to beat one here; PostgreSQL's CPU per row and about six round trips per "
      f"batch are the cost against SQLite's in-process commit. fsync is not the limit while batches hold "
      f"several rows. On separate machines each node brings its own CPU and the ceiling moves to the one "
      f"PostgreSQL server: its CPU for ingest statements, claims and outcome writes, then its WAL flush rate.")
PY
)
EOF
