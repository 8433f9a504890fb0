#!/usr/bin/env bash
# PushClient vs its anchors, measured in this one run against the same mock-apns (TLS, token auth,
# one event-loop thread), printed as a markdown section:
#   push-bench (PushClient, release) over 1 and 4 connections
#   h2load with the same request (same headers, body and JWT) over 1 and 4 connections: the
#     mock's own ceiling
#   aioapns (PyPI, in a venv made here under a temp dir) over 1 and 4 connections
# Every process started here is stopped on exit. Environment: COUNT (pushes per run, default
# 20000), AIO_COUNT (default 5000), INFLIGHT (concurrent pushes, default 200), ROUNDS (best of,
# default 3).
# BENCH_BIN=DIR: run the release binaries in DIR instead of building (A/B runs of two builds).
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-20000}
AIO_COUNT=${AIO_COUNT:-5000}
INFLIGHT=${INFLIGHT:-200}
ROUNDS=${ROUNDS:-3}
for tool in h2load openssl python3; do
  command -v "$tool" >/dev/null || { echo "bench-push: $tool missing (make deps)" >&2; exit 1; }
done

if [ -n "${BENCH_BIN:-}" ]; then
  BIN=$BENCH_BIN   # prebuilt binaries: A/B runs of two builds in one session
else
  swift build -c release --product push-bench >&2
  swift build -c release --product mock-apns >&2
  BIN="$(swift build -c release --show-bin-path)"
fi

tmp=$(mktemp -d)
mock_pid=""
cleanup() {
  if [ -n "$mock_pid" ]; then kill "$mock_pid" 2>/dev/null || true; wait "$mock_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

KEY_ID=ABC123DEFG
TEAM_ID=DEF123GHIJ
BUNDLE=com.example.app
DEVICE=a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/key.p8" 2>/dev/null

# --- the mock ------------------------------------------------------------------------------------
# h2load and aioapns open streams before reading SETTINGS: let the mock grant 1000 streams at once
# (APNs grants 1 until a valid token succeeds; PushClient copes with either).
"$BIN/mock-apns" --listen 127.0.0.1:0 --control off --generate-tls --ca-out "$tmp/ca.pem" \
  --token-key "$KEY_ID:$TEAM_ID:$tmp/key.p8" --bundle-id "$BUNDLE" \
  --initial-max-concurrent-streams 1000 --ready-file "$tmp/ready.json" 2> "$tmp/mock.log" &
mock_pid=$!
for _ in $(seq 1 200); do [ -s "$tmp/ready.json" ] && break; sleep 0.05; done
[ -s "$tmp/ready.json" ] || { echo "bench-push: mock-apns did not start" >&2; cat "$tmp/mock.log" >&2; exit 1; }
PORT=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['port'])" "$tmp/ready.json")
URL="https://127.0.0.1:$PORT"

# --- the same request for everyone ------------------------------------------------------------------
"$BIN/push-bench" --print-body > "$tmp/body.json"
JWT=$("$BIN/push-bench" --print-jwt --p8 "$tmp/key.p8" --key-id "$KEY_ID" --team-id "$TEAM_ID")

ours() {  # connections
  "$BIN/push-bench" --url "$URL" --ca "$tmp/ca.pem" --p8 "$tmp/key.p8" --key-id "$KEY_ID" \
    --team-id "$TEAM_ID" --bundle "$BUNDLE" --device-token "$DEVICE" --connections "$1" \
    --count "$COUNT" --inflight "$INFLIGHT" | sed -n 's/^pushes_per_sec=\([0-9]*\).*/\1/p'
}
h2l() {  # connections
  local out
  out=$(h2load -n "$COUNT" -c "$1" -m $((INFLIGHT / $1)) -t 1 -d "$tmp/body.json" \
    -H "apns-push-type: accessory" -H "apns-topic: $BUNDLE.push-type.accessory" \
    -H "authorization: bearer $JWT" -H "content-type: application/json" \
    "$URL/3/device/$DEVICE" 2>&1)
  echo "$out" | grep -q "$COUNT succeeded" || { echo "bench-push: h2load run failed" >&2; echo "$out" >&2; echo 0; return; }
  echo "$out" | awk '/^finished in/{gsub(",","",$4); print int($4)}'
}

# --- aioapns in its own venv ------------------------------------------------------------------------
AIO=""
if python3 -m venv "$tmp/venv" >&2 && "$tmp/venv/bin/pip" install -q aioapns >&2; then
  AIO_VERSION=$("$tmp/venv/bin/pip" show aioapns | awk '/^Version:/{print $2}')
  cat > "$tmp/aio.py" <<'PY'
# aioapns has no custom-host option: its protocol classes carry the host and port as class
# attributes, which we point at the mock; the mock's CA and ALPN h2 come in through ssl_context
# (aioapns sets no ALPN itself, and the mock refuses connections without h2). aioapns has no
# "accessory" PushType: any object with .value works, it only reads push_type.value.
import asyncio, enum, json, ssl, sys, time
from aioapns import APNs, NotificationRequest, connection

host, port, ca, p8, kid, team, bundle, device, body, count, inflight, conns = sys.argv[1:13]
connection.APNsTLSClientProtocol.APNS_PORT = int(port)
connection.APNsProductionClientProtocol.APNS_SERVER = host

class PushType(enum.Enum):
    ACCESSORY = "accessory"

async def main():
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    client = APNs(key=open(p8).read(), key_id=kid, team_id=team, topic=bundle + ".push-type.accessory",
                  max_connections=int(conns), ssl_context=ctx)
    message = json.load(open(body))
    sem = asyncio.Semaphore(int(inflight))
    failed = 0
    async def one():
        nonlocal failed
        async with sem:
            r = await client.send_notification(NotificationRequest(device_token=device, message=message,
                                                                   push_type=PushType.ACCESSORY))
            if not r.is_successful:
                failed += 1
    await asyncio.gather(*(one() for _ in range(200)))   # warm-up: connections and tokens
    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(int(count))))
    elapsed = time.perf_counter() - start
    print(int(int(count) / elapsed) if failed == 0 else 0)
    if failed:
        print(f"aioapns: {failed} failed", file=sys.stderr)

asyncio.run(main())
PY
  AIO=yes
else
  echo "bench-push: could not install aioapns from PyPI; skipping it" >&2
fi
aio() {  # connections
  "$tmp/venv/bin/python" "$tmp/aio.py" 127.0.0.1 "$PORT" "$tmp/ca.pem" "$tmp/key.p8" "$KEY_ID" "$TEAM_ID" \
    "$BUNDLE" "$DEVICE" "$tmp/body.json" "$AIO_COUNT" "$INFLIGHT" "$1" 2>>"$tmp/aio.log" || echo 0
}

best() { printf '%s\n' "$@" | sort -n | tail -1; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else 'n/a')" "$1" "$2"; }

o1=(); o4=(); h1=(); h4=(); a1=(); a4=()
for _ in $(seq 1 "$ROUNDS"); do
  o1+=("$(ours 1)"); h1+=("$(h2l 1)"); o4+=("$(ours 4)"); h4+=("$(h2l 4)")
  if [ -n "$AIO" ]; then a1+=("$(aio 1)"); a4+=("$(aio 4)"); fi
done
O1=$(best "${o1[@]}"); O4=$(best "${o4[@]}"); H1=$(best "${h1[@]}"); H4=$(best "${h4[@]}")
A1=0; A4=0
if [ -n "$AIO" ]; then A1=$(best "${a1[@]}"); A4=$(best "${a4[@]}"); fi

cat <<MD
## PushClient (scripts/bench-push.sh)

Pushes per second to one mock-apns (TLS 1.3, ES256 token auth, one loop thread) on loopback,
$INFLIGHT pushes in flight, the same 214-byte accessory body and headers for every client.
Best of $ROUNDS rounds; PushClient and h2load send $COUNT pushes per run, aioapns $AIO_COUNT.
All clients share the machine's cores with the mock, so the mock's ceiling (h2load) is the anchor.

| client | 1 connection | 4 connections |
|---|---|---|
| PushClient (nghttp2 $(pkg-config --modversion libnghttp2 2>/dev/null || echo '?') client, push-bench) | $O1 | $O4 |
| h2load (same request) | $H1 | $H4 |
| aioapns ${AIO_VERSION:-(not installed)} | $A1 | $A4 |
| **PushClient / h2load** | $(ratio "$O1" "$H1") | $(ratio "$O4" "$H4") |
| **PushClient / aioapns** | $(ratio "$O1" "$A1") | $(ratio "$O4" "$A4") |

Targets (issue 4): >= 0.8x h2load, >= 10x aioapns. Reproduce: \`make bench\` or
\`scripts/bench-push.sh\` (COUNT, AIO_COUNT, INFLIGHT, ROUNDS). Every round's figures:
PushClient 1: ${o1[*]}; 4: ${o4[*]}; h2load 1: ${h1[*]}; 4: ${h4[*]}; aioapns 1: ${a1[*]:-}; 4: ${a4[*]:-}.
See docs/pushclient.md for the engine and the analysis.
MD
