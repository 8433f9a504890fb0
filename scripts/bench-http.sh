#!/usr/bin/env bash
# HTTPServer vs its anchors, measured in this one run, printed as a markdown section:
#   HTTP/1.1 keep-alive, tiny response: http-bench-server vs nginx (`return 200`), wrk -t1 -c64
#   HTTP/2 (h2c prior knowledge):       http-bench-server vs nghttpd (static file), h2load
#   Instructions per request (callgrind on a stripped copy, differential between two request
#   counts so start-up cost cancels out): http-bench-server vs nginx, HTTP/1.1.
# Both servers run one event-loop thread / worker. Every process started here is stopped on exit.
# Environment: DURATION (seconds per load run, default 5), ROUNDS (default 3; best round kept);
# BENCH_BIN=DIR runs the http-bench-server found there instead of building it; BENCH_HTTP_CG_ONLY=1
# measures only ours' instructions per request (HTTP/1.1 and HTTP/2) and prints the two figures
# (A/B runs of two builds: scripts/bench-ab.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CG_ONLY=${BENCH_HTTP_CG_ONLY:-}
TOOLS=(h2load valgrind objcopy python3)
[ -n "$CG_ONLY" ] || TOOLS+=(wrk nginx nghttpd)
for tool in "${TOOLS[@]}"; do
  command -v "$tool" >/dev/null || { echo "bench-http: $tool missing (make deps bench-deps)" >&2; exit 1; }
done

if [ -n "${BENCH_BIN:-}" ]; then
  BIN="$BENCH_BIN/http-bench-server"
else
  swift build -c release --product http-bench-server >&2
  BIN="$(swift build -c release --show-bin-path)/http-bench-server"
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {  # port
  for _ in $(seq 1 200); do
    python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1',$1)))" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "bench-http: nothing listening on $1" >&2; return 1
}
stop() {  # pid
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

mkdir -p "$tmp/nginx" "$tmp/www"
printf 'Hello, world!' > "$tmp/www/index.html"
if [ -z "$CG_ONLY" ]; then   # throughput against the anchors
# --- servers -------------------------------------------------------------------------------
ours_port=$(free_port)
"$BIN" --port "$ours_port" > /dev/null &
ours_pid=$!; pids+=("$ours_pid")
wait_port "$ours_port"

nginx_port=$(free_port)
cat > "$tmp/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process off;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$nginx_port;
    location / { default_type text/plain; return 200 "Hello, world!"; }
  }
}
EOF
nginx -c "$tmp/nginx/nginx.conf" -p "$tmp/nginx" -e "$tmp/nginx/error.log" &
nginx_pid=$!; pids+=("$nginx_pid")
wait_port "$nginx_port"

nghttpd_port=$(free_port)
nghttpd --no-tls -d "$tmp/www" "$nghttpd_port" > /dev/null 2>&1 &
nghttpd_pid=$!; pids+=("$nghttpd_pid")
wait_port "$nghttpd_port"

# --- throughput ----------------------------------------------------------------------------
wrk_rps() { wrk -t1 -c64 -d"${DURATION}s" "$1" | awk '/^Requests\/sec:/{print int($2)}'; }
h2_rps() {
  h2load -t1 -c16 -m16 -D "$DURATION" "$1" 2>/dev/null | awk '/^finished in/{gsub(",","",$4); print int($4)}'
}
best() { printf '%s\n' "$@" | sort -n | tail -1; }

h1_ours=(); h1_nginx=(); h2_ours=(); h2_nghttpd=()
for _ in $(seq 1 "$ROUNDS"); do
  h1_ours+=("$(wrk_rps "http://127.0.0.1:$ours_port/")")
  h1_nginx+=("$(wrk_rps "http://127.0.0.1:$nginx_port/")")
  h2_ours+=("$(h2_rps "http://127.0.0.1:$ours_port/index.html")")
  h2_nghttpd+=("$(h2_rps "http://127.0.0.1:$nghttpd_port/index.html")")
done
H1_OURS=$(best "${h1_ours[@]}"); H1_NGINX=$(best "${h1_nginx[@]}")
H2_OURS=$(best "${h2_ours[@]}"); H2_NGHTTPD=$(best "${h2_nghttpd[@]}")

stop "$ours_pid"; stop "$nginx_pid"; stop "$nghttpd_pid"
pids=()
fi   # throughput

# --- instructions per request (callgrind) ---------------------------------------------------
objcopy --strip-debug "$BIN" "$tmp/http-bench-server.stripped"
N1=2000
N2=12000
callgrind_total() {  # label n proto(h1|h2) cmd...
  local label=$1 n=$2 proto=$3; shift 3
  local out="$tmp/cg.$label.$n"
  local port
  port=$(free_port)
  local cmd=("$@")
  cmd=("${cmd[@]//@PORT@/$port}")
  if [ "$label" = nginx ]; then
    sed "s/listen 127.0.0.1:[0-9]*;/listen 127.0.0.1:$port;/" "$tmp/nginx/nginx.conf" > "$tmp/nginx/cg.conf"
  fi
  valgrind --tool=callgrind --callgrind-out-file="$out" "${cmd[@]}" > /dev/null 2> "$out.log" &
  local pid=$!; pids+=("$pid")
  wait_port "$port"
  if [ "$proto" = h1 ]; then
    h2load --h1 -n "$n" -c 4 "http://127.0.0.1:$port/" > "$out.h2load" 2>&1
  else
    h2load -n "$n" -c 4 -m 10 "http://127.0.0.1:$port/index.html" > "$out.h2load" 2>&1
  fi
  grep -q "$n succeeded" "$out.h2load" || { echo "bench-http: callgrind load run failed ($label $n)" >&2; cat "$out.h2load" >&2; }
  stop "$pid"
  pids=()
  awk '/^(summary|totals):/{print $2; exit}' "$out"
}
ours1=$(callgrind_total ours $N1 h1 "$tmp/http-bench-server.stripped" --port @PORT@)
ours2=$(callgrind_total ours $N2 h1 "$tmp/http-bench-server.stripped" --port @PORT@)
IPR_OURS=$(( (ours2 - ours1) / (N2 - N1) ))
if [ -n "$CG_ONLY" ]; then
  ours_h2_1=$(callgrind_total ours $N1 h2 "$tmp/http-bench-server.stripped" --port @PORT@)
  ours_h2_2=$(callgrind_total ours $N2 h2 "$tmp/http-bench-server.stripped" --port @PORT@)
  echo "h1 $IPR_OURS instructions per request, HTTP/1.1: ($ours2 - $ours1) / ($N2 - $N1)"
  echo "h2 $(( (ours_h2_2 - ours_h2_1) / (N2 - N1) )) instructions per request, HTTP/2: ($ours_h2_2 - $ours_h2_1) / ($N2 - $N1)"
  exit 0
fi
ngx1=$(callgrind_total nginx $N1 h1 nginx -c "$tmp/nginx/cg.conf" -p "$tmp/nginx" -e "$tmp/nginx/error.log")
ngx2=$(callgrind_total nginx $N2 h1 nginx -c "$tmp/nginx/cg.conf" -p "$tmp/nginx" -e "$tmp/nginx/error.log")
IPR_NGINX=$(( (ngx2 - ngx1) / (N2 - N1) ))
ours_h2_1=$(callgrind_total ours $N1 h2 "$tmp/http-bench-server.stripped" --port @PORT@)
ours_h2_2=$(callgrind_total ours $N2 h2 "$tmp/http-bench-server.stripped" --port @PORT@)
nghttpd1=$(callgrind_total nghttpd $N1 h2 nghttpd --no-tls -d "$tmp/www" @PORT@)
nghttpd2=$(callgrind_total nghttpd $N2 h2 nghttpd --no-tls -d "$tmp/www" @PORT@)
IPR_H2_OURS=$(( (ours_h2_2 - ours_h2_1) / (N2 - N1) ))
IPR_NGHTTPD=$(( (nghttpd2 - nghttpd1) / (N2 - N1) ))

ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }

cat <<EOF
## HTTP server (HTTPServer vs nginx / nghttpd)

One event-loop thread (ours) vs one nginx worker / one nghttpd thread, loopback, tiny
13-byte response, best of $ROUNDS rounds of ${DURATION} s each, all in this run.

| benchmark | command | ours | anchor | ratio (target) |
|---|---|---:|---:|---:|
| HTTP/1.1 keep-alive req/s | \`wrk -t1 -c64 -d${DURATION}s\` | $H1_OURS | nginx $H1_NGINX | $(ratio "$H1_OURS" "$H1_NGINX")x (>= 1.0) |
| HTTP/2 h2c req/s | \`h2load -t1 -c16 -m16 -D $DURATION\` | $H2_OURS | nghttpd $H2_NGHTTPD | $(ratio "$H2_OURS" "$H2_NGHTTPD")x (>= 1.0) |
| instructions / request, HTTP/1.1 | callgrind, \`h2load --h1 -c4\`, ($N2 - $N1 requests) | $IPR_OURS | nginx $IPR_NGINX | $(ratio "$IPR_OURS" "$IPR_NGINX")x (<= 2.0) |
| instructions / request, HTTP/2 | callgrind, \`h2load -c4 -m10\`, ($N2 - $N1 requests) | $IPR_H2_OURS | nghttpd $IPR_NGHTTPD | $(ratio "$IPR_H2_OURS" "$IPR_NGHTTPD")x (info) |

All rounds (req/s): ours h1 ${h1_ours[*]}; nginx ${h1_nginx[*]}; ours h2 ${h2_ours[*]}; nghttpd ${h2_nghttpd[*]}.
Load average when the run ended: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (load generators share
the machine with the servers; throughput ratios are only meaningful on an otherwise idle machine,
instruction counts are repeatable).
Instructions are counted over the whole process (kernel excluded) by callgrind on copies
stripped with \`objcopy --strip-debug\` (valgrind 3.19 cannot read Swift 6.3's DWARF 5).
EOF
