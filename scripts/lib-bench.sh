# Shared by the benchmark scripts that run relay-server beside mock-apns and an nginx anchor
# (bench-relay.sh, bench-ingest.sh, bench-pipeline.sh, bench-postgres.sh, bench-log.sh,
# bench-token-walk.sh, bench-webhook-load.sh, relay-callgrind.sh).
# Source it, then call bench_prologue, or set WORK (a temp dir the caller removes), BIN (release
# binaries) and PIDS=() (killed by the caller's EXIT trap) yourself.

# bench_prologue NAME TOOL...: every TOOL must be installed; BIN holds the release relay-server
# and mock-apns (built here, or BENCH_BIN=DIR's prebuilt ones: A/B runs of two builds); WORK is
# a fresh temp dir (/tmp/NAME.XXXXXX); at exit the pids in PIDS are stopped, a PostgreSQL
# cluster under $WORK/pg (if one was started) too, and WORK is removed; SECRET is a fresh ingest
# credential and HASH its stored hash (the format and hash of RelayCore's Credentials).
bench_prologue() {
  local name=$1 tool
  shift
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$name: $tool missing (make deps bench-deps)" >&2; exit 1; }
  done
  if [ -n "${BENCH_BIN:-}" ]; then
    BIN=$BENCH_BIN
  else
    swift build -c release --product relay-server >&2
    swift build -c release --product mock-apns >&2
    BIN=$(swift build -c release --show-bin-path)
  fi
  WORK=$(mktemp -d "/tmp/$name.XXXXXX")
  chmod 755 "$WORK"   # PostgreSQL (another user) reads its socket and data dir under it
  PIDS=()
  trap bench_cleanup EXIT
  SECRET="rk_$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')"
  HASH=$(printf %s "$SECRET" | openssl dgst -sha256 -binary | od -An -tx1 | tr -d ' \n')
}

bench_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -d "$WORK/pg" ] && { scripts/pg-test.sh stop "$WORK/pg" >/dev/null 2>&1 || true; }
  rm -rf "$WORK"
}

# An unused loopback port.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# Waits up to 60 s for a URL to answer 2xx; the benchmark cannot go on without it.
wait_url() {
  for _ in $(seq 1 2400); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.025; done
  echo "$(basename "$0"): $1 never came up" >&2
  exit 1
}

# The anchor: nginx answering a tiny JSON body with `return 200`, two workers (one per core),
# on a free port. Sets NGINX_PORT, NGINX_PID and NGINX_WORKERS (the worker pids, whose CPU is
# nginx's per request; the master's own pid when it has none, as a single-process stand-in).
start_nginx_anchor() {
  NGINX_PORT=$(free_port)
  mkdir -p "$WORK/nginx"
  cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 2;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx; proxy_temp_path $WORK/nginx; fastcgi_temp_path $WORK/nginx;
  uwsgi_temp_path $WORK/nginx; scgi_temp_path $WORK/nginx;
  server { listen 127.0.0.1:$NGINX_PORT; location / { default_type application/json; return 200 '{"ok":true}'; } }
}
CONF
  nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" 2>/dev/null &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  wait_url "http://127.0.0.1:$NGINX_PORT/"
  NGINX_WORKERS=$(pgrep -P "$NGINX_PID" | tr '\n' ' ' || true)
  [ -n "${NGINX_WORKERS// /}" ] || NGINX_WORKERS=$NGINX_PID
}

stop_nginx_anchor() { kill -TERM "$NGINX_PID" 2>/dev/null || true; wait "$NGINX_PID" 2>/dev/null || true; }

# mock-apns on free loopback ports with a fresh token key ($WORK/apns.p8, BENCHKEY01/BENCHTEAM1)
# for com.example.bench and its CA in $WORK/ca.pem; extra arguments go to mock-apns. Sets
# MOCK_PORT, CONTROL_PORT and MOCK_PID.
start_bench_mock() {
  openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$WORK/apns.p8"
  MOCK_PORT=$(free_port); CONTROL_PORT=$(free_port)
  "$BIN/mock-apns" --listen "127.0.0.1:$MOCK_PORT" --control "127.0.0.1:$CONTROL_PORT" --generate-tls --ca-out "$WORK/ca.pem" \
    --token-key "BENCHKEY01:BENCHTEAM1:$WORK/apns.p8" --bundle-id com.example.bench "$@" 2>"$WORK/mock.log" &
  MOCK_PID=$!
  PIDS+=("$MOCK_PID")
  wait_url "http://127.0.0.1:$CONTROL_PORT/stats"
}

# The "ingest" (rate limits off: the benchmark is one credential, one push token per wrk thread)
# and "apps" (com.example.bench on the mock above) members of a benchmark relay config.
bench_relay_members() {
  cat <<JSON
"ingest":{"rateLimits":{"perCredential":{"perSecond":0,"burst":1},"perPushToken":{"perSecond":0,"burst":1}}},
 "apps":[{"bundleID":"com.example.bench","environment":"custom","url":"https://127.0.0.1:$MOCK_PORT","caFile":"$WORK/ca.pem",
          "token":{"p8Path":"$WORK/apns.p8","keyID":"BENCHKEY01","teamID":"BENCHTEAM1"}}]
JSON
}

# The wrk script that POSTs unique responses (one push token and session per wrk thread, the
# message index counting up) with the credential in $RELAY_CRED. WRK_SEED (optional) separates
# concurrent wrk processes.
#   write_post_lua FILE        the cheap client: the request is formatted once at init around the
#                              message index (which counts up from 1,000,000, so every body has the
#                              same length) and request() only splices the digits in; no response()
#                              callback, which would make wrk hand every response's headers and body
#                              to Lua. Count the answers on the server (relay_ingest_requests_total).
#                              It costs wrk about what a plain GET does (~8 us against ~10.5 us for
#                              the counting variant, nginx runs 2026-11-30).
#   write_post_lua FILE count  the same requests, plus a response() that counts non-202 answers and
#                              prints "NON202 <n>" at the end (bench-postgres.sh, several wrk
#                              processes against several nodes).
write_post_lua() {
  cat > "$1" <<'LUA'
local threads = {}
function setup(thread) thread:set("tid", #threads) table.insert(threads, thread) end
function init(args)
  math.randomseed(os.time() * 1000 + tid * 7919 + tonumber(os.getenv("WRK_SEED") or "0"))
  local t = {}
  for i = 1, 32 do t[i] = string.format("%02x", math.random(0, 255)) end
  local token = table.concat(t)
  local session = string.format("%08X-%04X-4%03X-8%03X-%012X", math.random(0, 0x7fffffff), math.random(0, 0xffff),
                                math.random(0, 0xfff), math.random(0, 0xfff), math.random(0, 0x7fffffff))
  local data = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7"
  local hdrs = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. os.getenv("RELAY_CRED") }
  local body = '{"pushToken":"' .. token .. '","sessionIdentifier":"' .. session ..
    '","keyID":"AQIDBA==","messageIndex":1000000,"encryptedData":"' .. data .. '"}'
  local req = wrk.format("POST", "/v1/responses", hdrs, body)
  local at = req:find('"messageIndex":1000000', 1, true) + #'"messageIndex":'
  head, tail = req:sub(1, at - 1), req:sub(at + 7)
  n = 1000000
  bad = 0
end
function request()
  n = n + 1   -- 7 digits up to 9,999,999 requests per thread: the Content-Length stays right
  return head .. n .. tail
end
LUA
  if [ "${2:-}" = count ]; then
    cat >> "$1" <<'LUA'
function response(status, headers, body) if status ~= 202 then bad = bad + 1 end end
function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do b = b + t:get("bad") end
  io.write(string.format("NON202 %d\n", b))
end
LUA
  fi
}

# The wrk script for realistic traffic: many push tokens interleaved, 200-400-byte ciphertexts.
# At init each wrk thread draws its share of WRK_TOKENS push tokens (random 32 bytes, one random
# session each; WRK_THREADS is the wrk -t value) and 97 ciphertexts of 200-400 random bytes;
# request() cycles through its tokens (their random order scatters them over any index keyed by
# token) and through the ciphertexts, the messageIndex counting up from 1 per (token, session),
# so every body is unique and nothing dedupes. Content-Length is computed per request; no
# response() callback (count the 202s on the server). RELAY_CRED and WRK_SEED as above.
#   write_tokens_lua FILE
write_tokens_lua() {
  cat > "$1" <<'LUA'
local threads = {}
function setup(thread) thread:set("tid", #threads) table.insert(threads, thread) end
local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function b64char(v) return B64:sub(v + 1, v + 1) end
local function base64(bytes)
  local out = {}
  for i = 1, #bytes, 3 do
    local a, b, c = bytes[i], bytes[i + 1], bytes[i + 2]
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    out[#out + 1] = b64char(math.floor(v / 262144) % 64) .. b64char(math.floor(v / 4096) % 64) ..
      (b and b64char(math.floor(v / 64) % 64) or "=") .. (c and b64char(v % 64) or "=")
  end
  return table.concat(out)
end
function init(args)
  local nthreads = tonumber(os.getenv("WRK_THREADS") or "1")
  local total = tonumber(os.getenv("WRK_TOKENS") or "1000")
  math.randomseed(os.time() * 1000 + tid * 7919 + tonumber(os.getenv("WRK_SEED") or "0"))
  n = math.floor(total / nthreads) + ((tid < total % nthreads) and 1 or 0)
  if n < 1 then n = 1 end
  pre, idx = {}, {}
  for j = 1, n do
    local t = {}
    for i = 1, 32 do t[i] = string.format("%02x", math.random(0, 255)) end
    local session = string.format("%08X-%04X-4%03X-8%03X-%06X%06X", math.random(0, 0x7fffffff), math.random(0, 0xffff),
                                  math.random(0, 0xfff), math.random(0, 0xfff), math.random(0, 0xffffff), math.random(0, 0xffffff))
    pre[j] = '{"pushToken":"' .. table.concat(t) .. '","sessionIdentifier":"' .. session .. '","keyID":"AQIDBA==","messageIndex":'
    idx[j] = 0
  end
  blobs = {}
  for k = 1, 97 do
    local bytes = {}
    for i = 1, math.random(200, 400) do bytes[i] = math.random(0, 255) end
    blobs[k] = ',"encryptedData":"' .. base64(bytes) .. '"}'
  end
  local hdrs = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. os.getenv("RELAY_CRED") }
  local sample = (wrk.format("POST", "/v1/responses", hdrs, "X"):gsub("Content%-Length: 1\r\n", ""))
  base = sample:sub(1, -4) .. "Content-Length: "
  j, k = 0, 0
end
function request()
  j = j + 1; if j > n then j = 1 end
  k = k + 1; if k > 97 then k = 1 end
  local i = idx[j] + 1
  idx[j] = i
  local body = pre[j] .. i .. blobs[k]
  return base .. #body .. "\r\n\r\n" .. body
end
LUA
}

# One sample of the relay's admin /metrics (0 if absent), e.g.
# metric ADMIN_PORT 'relay_ingest_requests_total{status="202"}'.
metric() { curl -fsS -m 5 "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {v = $2} END {print v + 0}'; }

# What the relay answered ingest requests so far (relay_ingest_requests_total on the admin
# /metrics), one "STATUS:COUNT" word per status. Take one before and one after a wrk run and
# give both to ingest_result: wrk's Requests/sec counts every answer, 503s and 429s too.
ingest_counts() {
  curl -fsS -m 5 "http://127.0.0.1:$1/metrics" |
    sed -n 's/^relay_ingest_requests_total{status="\([0-9]*\)"} \([0-9]*\).*/\1:\2/p' | tr '\n' ' '
}

# wrk's measured run time in seconds, from its "N requests in 8.00s, ..." line (wrk prints the
# time with a unit: us, ms, s, m or h).
wrk_seconds() {
  awk '/ requests in /{t = $4; sub(/,$/, "", t); v = t + 0; u = t; sub(/^[0-9.]+/, "", u)
    print v * (u == "us" ? 1e-6 : u == "ms" ? 1e-3 : u == "m" ? 60 : u == "h" ? 3600 : 1)}' "$1"
}

# ingest_result BEFORE AFTER WRK_OUTPUT -> "ACCEPTED_PER_S OTHERS": BEFORE and AFTER are
# ingest_counts around one wrk run; ACCEPTED_PER_S is the 202s the relay counted in between
# divided by wrk's measured seconds; OTHERS is every other status in between
# ("503:12,429:3", or 0), then wrk's own view when it saw a status >= 400, a socket error or
# (write_post_lua FILE count) a non-202 ("wrk-non2xx:15", "wrk-timeout:2", "wrk-non202:15": a
# cross-check of the relay's count). The relay may answer up to one request per connection after
# wrk stopped counting: noise of -c in the 202s.
ingest_result() {
  awk -v a="$1" -v b="$2" -v secs="$(wrk_seconds "$3")" \
      -v wnon="$(awk '/Non-2xx or 3xx responses:/{print $NF}' "$3")" -v wnon202="$(awk '/^NON202 /{print $2}' "$3")" \
      -v werr="$(sed -n 's/^ *Socket errors: //p' "$3")" 'BEGIN {
    n = split(a, x, " "); for (i = 1; i <= n; i++) { split(x[i], kv, ":"); c0[kv[1]] = kv[2] }
    n = split(b, y, " ")
    for (i = 1; i <= n; i++) {
      split(y[i], kv, ":"); d = kv[2] - c0[kv[1]]
      if (kv[1] == "202") acc = d; else if (d > 0) other = other (other == "" ? "" : ",") kv[1] ":" d
    }
    if (wnon + 0 > 0) other = other (other == "" ? "" : ",") "wrk-non2xx:" wnon
    if (wnon202 + 0 > 0) other = other (other == "" ? "" : ",") "wrk-non202:" wnon202
    n = split(werr, e, ", ")   # "connect 0, read 0, write 0, timeout 12"
    for (i = 1; i <= n; i++) { split(e[i], kv, " "); if (kv[2] + 0 > 0) other = other (other == "" ? "" : ",") "wrk-" kv[1] ":" kv[2] }
    printf "%.0f %s\n", (secs > 0 ? acc / secs : 0), (other == "" ? "0" : other)
  }'
}

# CPU ticks (utime + stime, /proc/PID/stat after the command name) of the given pids, summed;
# all threads of each. Pids that are gone count 0.
proc_ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}'))); done; echo "$t"; }
# CPU ticks per thread name of one process ("name ticks" lines, threads of the same name summed;
# spaces in names become _): which thread a change moved work to.
thread_ticks() {
  local t
  for t in /proc/"$1"/task/*; do
    [ -r "$t/stat" ] && printf '%s %s\n' "$(tr ' ' _ < "$t/comm")" "$(sed 's/.*) //' "$t/stat" | awk '{print $12 + $13}')"
  done | awk '{s[$1] += $2} END {for (k in s) print k, s[k]}'
}
# CPU ticks of a process tree that forks short-lived children (PostgreSQL's backends): the
# parent's own time plus its reaped children's (cutime + cstime) plus every live child's. A
# child that exits between two readings moves from the live sum into the parent's cutime, so
# the difference of two readings is the tree's CPU in between.
tree_ticks() {
  local t c
  t=$(sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13 + $14 + $15}')
  for c in $(pgrep -P "$1"); do t=$((t + $(proc_ticks "$c"))); done
  echo "$t"
}
# ticks requests -> CPU microseconds per request
us_per_req() { awk -v t="$1" -v n="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", (n > 0 ? t / hz * 1e6 / n : 0)}'; }

# A loopback webhook receiver answering 204 to everything (python3 http.server): sets HOOK_PORT,
# writes a fresh secret to $WORK/webhook-secret, adds its pid to PIDS, waits until it answers.
# WEBHOOK_RECEIVER=fast: http-bench-server from $BIN (libuv, one thread, 200 to everything)
# instead of python3's http.server, whose CPU per request on the same cores is several times
# the relay's cost of sending it (docs/events.md, "Cost of a webhook").
start_webhook_receiver() {
  HOOK_PORT=$(free_port)
  echo "whsec_$(openssl rand -base64 32)" > "$WORK/webhook-secret"
  if [ "${WEBHOOK_RECEIVER:-}" = fast ]; then
    "${BIN:-$BENCH_BIN}/http-bench-server" --port "$HOOK_PORT" --threads 1 > /dev/null &
    PIDS+=($!)
    wait_url "http://127.0.0.1:$HOOK_PORT/"
    return
  fi
  python3 - "$HOOK_PORT" <<'EOF' &
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(204); self.send_header("content-length", "0"); self.end_headers()
    do_GET = do_POST
    def log_message(self, *_): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
  PIDS+=($!)
  wait_url "http://127.0.0.1:$HOOK_PORT/"
}

# Events of DB the webhook "bench" was sent with a 2xx: its delivered rows and, from schema v13
# (a cursor per webhook), the events its cursor passed without a row (each delivered at its
# first attempt). Falls back to the rows alone on an older schema.
webhook_delivered_count() {
  sqlite3 "file:$1?mode=ro" "SELECT (SELECT count(*) FROM webhook_deliveries WHERE webhook='bench' AND state='delivered')
    + (SELECT count(*) FROM events e, webhook_cursors c WHERE c.webhook='bench' AND e.seq > c.start_seq AND e.seq <= c.seq
       AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.seq = e.seq AND d.webhook = 'bench'))" 2>/dev/null \
  || sqlite3 "file:$1?mode=ro" "SELECT count(*) FROM webhook_deliveries WHERE state='delivered'" 2>/dev/null || echo 0
}
