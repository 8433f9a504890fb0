#!/usr/bin/env bash
# The stalled-database probe of docs/postgres.md "Deadlines": relay-server (debug build) on a
# throwaway cluster; a second relay-server with the same nodeId (refused); then the postmaster and
# every backend SIGSTOPped (a fully stalled server): ingest and /readyz timed; SIGCONT; recovery
# timed; the stalled requests retried. Usage: scripts/pg-stall-probe.sh (needs curl, openssl).
set -uo pipefail
W=$(cd "$(dirname "$0")/.." && pwd); B=${RELAY_BIN:-$W/.build/debug}; D=$(mktemp -d); chmod 755 $D
url=$($W/scripts/pg-test.sh start $D/pg)
relay=""
trap '[ -n "$relay" ] && kill $relay 2>/dev/null; $W/scripts/pg-test.sh stop $D/pg >/dev/null 2>&1; rm -rf $D' EXIT
POST_FORMAT="%{http_code} %{time_total}s"
. $W/scripts/lib-pg-probe.sh
probe_relay "$url" probe-1
echo "before: $(post 1)"
$B/relay-server --config $D/relay.json >$D/second.log 2>&1; echo "second relay-server, same nodeId: exit $?: $(tail -1 $D/second.log)"
pm=$(head -1 $D/pg/data/postmaster.pid)
pids="$pm $(pgrep -P $pm | tr '\n' ' ')"
kill -STOP $pids
echo "STOPPED postmaster and all backends"
for i in 2 3 4; do echo "ingest during stall: $(post $i)"; done
curl -s -i -m 60 -X POST 127.0.0.1:$port/v1/responses -H "Authorization: Bearer $secret" -H 'Content-Type: application/json' \
  -d "$(post_body 9)" | grep -iE "^HTTP|retry-after|storage"
echo "readyz during stall: $(curl -s -o /dev/null -w '%{http_code} %{time_total}s' -m 60 127.0.0.1:$admin/readyz)"
kill -CONT $pids
t0=$(date +%s.%N)
for i in $(seq 100); do r=$(post 5); case $r in 202*) break;; esac; sleep 0.1; done
echo "after SIGCONT: $r, first 202 after $(python3 -c "import time; print(round(time.time()-$t0,2))") s"
echo "readyz after: $(curl -s -w ' %{http_code}' 127.0.0.1:$admin/readyz)"
echo "retry of request 3 (503'd during the stall): $(post 3)"
