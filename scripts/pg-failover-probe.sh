#!/usr/bin/env bash
# The failover probe of docs/postgres.md "Failover": a throwaway primary and a streaming standby
# (pg_basebackup -R), relay-server (debug build) with both hosts in store.url, the standby first,
# and target_session_attrs=read-write. Ingest goes to the primary; then the primary is stopped
# and the standby promoted: ingest answers 503 meanwhile and 202 again from the new primary,
# without a restart. Usage: scripts/pg-failover-probe.sh (needs curl, openssl).
set -uo pipefail
W=$(cd "$(dirname "$0")/.." && pwd); B=${RELAY_BIN:-$W/.build/debug}; D=$(mktemp -d); chmod 755 $D
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
url=$($W/scripts/pg-test.sh start $D/pg)
pport=$(cat $D/pg/port)
sport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
relay=""
trap '[ -n "$relay" ] && kill $relay 2>/dev/null; as_pg $BIN/pg_ctl -D $D/standby -m immediate stop >/dev/null 2>&1; $W/scripts/pg-test.sh stop $D/pg >/dev/null 2>&1; rm -rf $D' EXIT
mkdir -m 700 $D/standby; [ "$(id -u)" -eq 0 ] && chown postgres: $D/standby
as_pg $BIN/pg_basebackup -h 127.0.0.1 -p $pport -U relay -D $D/standby -R -X stream -c fast >/dev/null
as_pg $BIN/pg_ctl -D $D/standby -l $D/standby/standby.log -o "-p $sport -c unix_socket_directories=$D/standby" -w start >/dev/null
echo "standby in recovery: $(as_pg $BIN/psql -h 127.0.0.1 -p $sport -U relay -d relay -Atc 'SELECT pg_is_in_recovery()')"
both="postgresql://relay@127.0.0.1:$sport,127.0.0.1:$pport/relay?target_session_attrs=read-write"
. $W/scripts/lib-pg-probe.sh
probe_relay "$both" failover-1
echo "standby listed first, target_session_attrs=read-write: ingest $(post 1) $(post 2)"
echo "relay sessions on the primary: $(as_pg $BIN/psql -h 127.0.0.1 -p $pport -U relay -d relay -Atc "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'relay-pg-%'")"
sleep 1  # let the standby replay the rows
as_pg $BIN/pg_ctl -D $D/pg/data -m fast stop >/dev/null
as_pg $BIN/pg_ctl -D $D/standby -w promote >/dev/null
t0=$(date +%s.%N); codes=""
for i in $(seq 3 200); do c=$(post $i); codes="$codes $c"; [ "$c" = 202 ] && break; sleep 0.1; done
echo "primary stopped, standby promoted: answers until the first 202:$codes ($(python3 -c "import time; print(round(time.time()-$t0,2))") s)"
echo "readyz: $(curl -s -w ' %{http_code}' 127.0.0.1:$admin/readyz)"
echo "rows on the new primary: $(as_pg $BIN/psql -h 127.0.0.1 -p $sport -U relay -d relay -Atc 'SELECT count(*) FROM responses')"
