#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks: initdb in a temp dir, a free loopback
# port, trust auth for one superuser, small settings for a shared 2-core machine. Uses the
# binaries of Debian's `postgresql` package (/usr/lib/postgresql/<v>/bin). As root it runs the
# server as the `postgres` system user (initdb refuses root).
#
#   scripts/pg-test.sh start DIR     start a cluster in DIR (created if missing); prints its URL
#   scripts/pg-test.sh stop DIR      stop it (immediate) and remove DIR
#   scripts/pg-test.sh restart DIR   restart on the same port
#   scripts/pg-test.sh crash DIR     restart with -m immediate: no shutdown checkpoint, the
#                                    server runs crash recovery from the WAL (reliability tests)
#   scripts/pg-test.sh pause DIR     stop the server (fast: connections are cut), keep the data
#   scripts/pg-test.sh resume DIR    start it again on the same port (outage tests)
#   scripts/pg-test.sh standby DIR SDIR  a streaming standby of DIR's cluster in SDIR
#                                    (pg_basebackup -R, its own port); prints its URL
#   scripts/pg-test.sh promote SDIR  promote that standby to a primary
#   scripts/pg-test.sh sql DIR SQL   run SQL on DIR's cluster (psql -Atc), print the result
#   scripts/pg-test.sh run -- CMD..  start a cluster in a temp dir, run CMD with RELAY_TEST_PG_URL
#                                    set, stop and remove the cluster whatever CMD's outcome,
#                                    exit with CMD's status. If RELAY_TEST_PG_URL is already
#                                    set, CMD runs against that server instead.
#
# Tests that need PostgreSQL read RELAY_TEST_PG_URL and skip with a message when it is unset.
set -euo pipefail

bindir() {
  local d
  for d in "${PG_BINDIR:-}" /usr/lib/postgresql/*/bin; do
    [ -n "$d" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
  done
  command -v pg_ctl >/dev/null && { dirname "$(command -v pg_ctl)"; return; }
  echo "pg-test: no PostgreSQL server binaries (apt-get install postgresql, or make deps)" >&2
  exit 1
}

BIN=$(bindir)

# Runs a PostgreSQL binary as a non-root user.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# DIR created if missing, owned by postgres when run as root, mode 700; prints its absolute path.
private_dir() {
  mkdir -p "$1"
  local dir
  dir=$(cd "$1" && pwd)
  [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  chmod 700 "$dir"
  printf %s "$dir"
}

# Records DIR's port and URL and starts the cluster in DIR/data on it (its log in DIR/server.log,
# shown if it does not come up).
serve() {
  local dir=$1 port=$2
  echo "$port" >"$dir/port"
  echo "postgresql://relay@127.0.0.1:$port/relay" >"$dir/url"
  as_pg "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null || {
    cat "$dir/server.log" >&2
    exit 1
  }
}

start() {
  local dir
  dir=$(private_dir "$1")
  local port
  port=$(free_port)
  as_pg "$BIN/initdb" -D "$dir/data" -U relay --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    exit 1
  }
  cat >>"$dir/data/postgresql.conf" <<EOF
# pg-test.sh: small settings for a shared 2-core machine. fsync stays on: durability is what
# the tests and benchmarks measure.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
shared_buffers = 64MB
max_connections = 50
max_wal_size = 256MB
log_min_messages = warning
log_line_prefix = '%m [%p] '
EOF
  serve "$dir" "$port"
  local url; url=$(cat "$dir/url")
  as_pg "$BIN/createdb" -h 127.0.0.1 -p "$port" -U relay relay
  echo "$url"
}

stop() {
  local dir=$1
  [ -d "$dir/data" ] || return 0
  as_pg "$BIN/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}

restart() {
  local dir=$1
  as_pg "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart >/dev/null
}

crash() {
  as_pg "$BIN/pg_ctl" -D "$1/data" -l "$1/server.log" -m immediate -w -t 60 restart >/dev/null
}

pause() {
  as_pg "$BIN/pg_ctl" -D "$1/data" -m fast -w -t 60 stop >/dev/null
}

resume() {
  as_pg "$BIN/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 start >/dev/null
}

standby() {
  local primary=$1 dir
  dir=$(private_dir "$2")
  local port
  port=$(free_port)
  as_pg "$BIN/pg_basebackup" -h 127.0.0.1 -p "$(cat "$primary/port")" -U relay -D "$dir/data" -R -X stream -c fast >"$dir/basebackup.log" 2>&1 || {
    cat "$dir/basebackup.log" >&2
    exit 1
  }
  # The copied postgresql.conf names the primary's port and socket directory: later lines win.
  printf "port = %s\nunix_socket_directories = '%s'\n" "$port" "$dir" >>"$dir/data/postgresql.conf"
  serve "$dir" "$port"
  local url; url=$(cat "$dir/url")
  echo "$url"
}

promote() {
  as_pg "$BIN/pg_ctl" -D "$1/data" -w -t 60 promote >/dev/null
}

sql() {
  as_pg "$BIN/psql" -h 127.0.0.1 -p "$(cat "$1/port")" -U relay -d relay -v ON_ERROR_STOP=1 -Atc "$2"
}

case "${1:-}" in
  start) start "${2:?usage: pg-test.sh start DIR}" ;;
  stop) stop "${2:?usage: pg-test.sh stop DIR}" ;;
  restart) restart "${2:?usage: pg-test.sh restart DIR}" ;;
  crash) crash "${2:?usage: pg-test.sh crash DIR}" ;;
  pause) pause "${2:?usage: pg-test.sh pause DIR}" ;;
  resume) resume "${2:?usage: pg-test.sh resume DIR}" ;;
  standby) standby "${2:?usage: pg-test.sh standby DIR SDIR}" "${3:?usage: pg-test.sh standby DIR SDIR}" ;;
  promote) promote "${2:?usage: pg-test.sh promote SDIR}" ;;
  sql) sql "${2:?usage: pg-test.sh sql DIR SQL}" "${3:?usage: pg-test.sh sql DIR SQL}" ;;
  run)
    shift
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || { echo "usage: pg-test.sh run -- COMMAND..." >&2; exit 64; }
    if [ -n "${RELAY_TEST_PG_URL:-}" ]; then
      exec "$@"
    fi
    dir=$(mktemp -d /tmp/relay-pg.XXXXXX)
    trap 'stop "$dir"' EXIT
    trap 'exit 130' INT TERM
    RELAY_TEST_PG_URL=$(start "$dir")
    export RELAY_TEST_PG_URL
    echo "pg-test: PostgreSQL for tests at $RELAY_TEST_PG_URL" >&2
    set +e
    "$@"
    status=$?
    set -e
    exit $status
    ;;
  *)
    echo "usage: pg-test.sh start DIR | stop DIR | restart DIR | crash DIR | pause DIR | resume DIR | standby DIR SDIR | promote SDIR | sql DIR SQL | run -- COMMAND..." >&2
    exit 64
    ;;
esac
