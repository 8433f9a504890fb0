#!/usr/bin/env bash
# `make run`: the newcomer's first command. Builds release binaries, prepares .run/ (kept and
# reused on the next run), starts mock-apns (TLS 127.0.0.1:2197, control 127.0.0.1:2198) and
# relay-server (127.0.0.1:8080, admin 127.0.0.1:9090) on SQLite .run/relay.db and a webhook
# receiver for the delivery events (scripts/webhook-receiver.py on 127.0.0.1:9300, verifying each
# signature with Python standardwebhooks in .build/webhooks-venv; WEBHOOK_URL=... points the relay at
# your own receiver instead; without either, e.g. offline, the relay runs without a webhook and
# says how to add one), prints commands that prove the path, and stops them all cleanly on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN=.run
BUNDLE=com.example.relay-demo
APNS_KEY_ID=DEMOKEY001
TEAM_ID=DEMOTEAM01
RELAY_PORT=${RELAY_PORT:-8080}
ADMIN_PORT=${ADMIN_PORT:-9090}
APNS_PORT=${APNS_PORT:-2197}
CONTROL_PORT=${CONTROL_PORT:-2198}
WEBHOOK_PORT=${WEBHOOK_PORT:-9300}
WEBHOOK_URL=${WEBHOOK_URL:-}   # your own receiver (loopback http, or https); none started here then

for tool in openssl sqlite3 curl; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing (make deps installs it)" >&2; exit 1; }
done
PORTS=("$RELAY_PORT" "$ADMIN_PORT" "$APNS_PORT" "$CONTROL_PORT")
[ -n "$WEBHOOK_URL" ] || PORTS+=("$WEBHOOK_PORT")
for port in "${PORTS[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "run.sh: 127.0.0.1:$port is already in use (another make run?)" >&2
    exit 1
  fi
done

echo "==> building release binaries (swift build -c release)"
swift build -c release --product relay-server >&2
swift build -c release --product mock-apns >&2
swift build -c release --product relayctl >&2 || echo "run.sh: relayctl did not build; continuing without it" >&2
BIN=$(swift build -c release --show-bin-path)

mkdir -p "$RUN"
chmod 700 "$RUN"
umask 077

# Demo APNs token key (ES256 / P-256, PKCS#8 like Apple's .p8 downloads).
if [ ! -s "$RUN/demo-apns-key.p8" ]; then
  openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out "$RUN/demo-apns-key.p8"
fi
# Demo accessory root secret (accessory-to-host, 32 bytes hex) and its ratchet keyID.
if [ ! -s "$RUN/demo-root-key" ]; then
  openssl rand -hex 32 > "$RUN/demo-root-key"
fi
if [ ! -s "$RUN/demo-key-id" ]; then
  openssl rand -base64 4 > "$RUN/demo-key-id"
fi
# A second one for the printed curl command, so its message index 0 never collides with the
# ratchet state relayctl send-test keeps for the demo key.
[ -s "$RUN/demo-curl-root-key" ] || openssl rand -hex 32 > "$RUN/demo-curl-root-key"
[ -s "$RUN/demo-curl-key-id" ] || openssl rand -base64 4 > "$RUN/demo-curl-key-id"
# A simulated accessory paired by key exchange (X-Wing HPKE, docs/key-exchange.md): mock-apns
# derives its receiving root from the key material, relayctl accessory send seals with it.
if [ ! -s "$RUN/demo-accessory.json" ] && [ -x "$BIN/relayctl" ]; then
  "$BIN/relayctl" accessory pair --ciphersuite xwing --out "$RUN/demo-accessory.json" > "$RUN/demo-accessory-pairing.txt" \
    || echo "run.sh: relayctl accessory pair failed; continuing without the paired accessory" >&2
fi
ACCESSORY_ARGS=()
[ -s "$RUN/demo-accessory.json" ] && ACCESSORY_ARGS=(--accessory "$RUN/demo-accessory.json")
ROOT_KEY=$(cat "$RUN/demo-root-key")
KEY_ID=$(cat "$RUN/demo-key-id")
CURL_ROOT_KEY=$(cat "$RUN/demo-curl-root-key")
CURL_KEY_ID=$(cat "$RUN/demo-curl-key-id")

# The webhook receiver's venv (Python standardwebhooks; made once, needs the package index) and
# the webhook secret the relay signs with and the receiver verifies with.
[ -s "$RUN/webhook-secret" ] || echo "whsec_$(openssl rand -base64 32)" > "$RUN/webhook-secret"
WEBHOOK_PY=""
if [ -z "$WEBHOOK_URL" ]; then
  echo "==> preparing the webhook receiver (Python standardwebhooks in .build/webhooks-venv)"
  . scripts/lib-webhooks-venv.sh
  WEBHOOK_PY=$(webhooks_venv_python) || WEBHOOK_PY=""
  [ -n "$WEBHOOK_PY" ] && WEBHOOK_URL="http://127.0.0.1:$WEBHOOK_PORT/relay"
fi
EVENTS=""
if [ -n "$WEBHOOK_URL" ]; then
  EVENTS='"events": { "webhooks": [ { "name": "demo", "url": "'$WEBHOOK_URL'", "secretFile": "webhook-secret" } ] },'
fi

cat > "$RUN/relay.json" <<EOF
{
  "_comment": "Written by scripts/run.sh for the local demo; see config/relay.example.json for every key.",
  "listen": { "host": "127.0.0.1", "port": $RELAY_PORT },
  "admin": { "host": "127.0.0.1", "port": $ADMIN_PORT },
  "store": { "path": "relay.db", "synchronous": "FULL" },
  "apps": [
    {
      "bundleID": "$BUNDLE",
      "environment": "custom",
      "url": "https://127.0.0.1:$APNS_PORT",
      "caFile": "ca.pem",
      "token": { "p8Path": "demo-apns-key.p8", "keyID": "$APNS_KEY_ID", "teamID": "$TEAM_ID" }
    }
  ],
  $EVENTS
  "log": { "format": "text", "level": "info" }
}
EOF

MOCK_PID=""
RELAY_PID=""
WEBHOOK_PID=""
stop() {
  trap - INT TERM EXIT
  echo
  echo "==> stopping"
  [ -n "$RELAY_PID" ] && kill -TERM "$RELAY_PID" 2>/dev/null || true
  [ -n "$RELAY_PID" ] && wait "$RELAY_PID" 2>/dev/null || true
  [ -n "$MOCK_PID" ] && kill -TERM "$MOCK_PID" 2>/dev/null || true
  [ -n "$MOCK_PID" ] && wait "$MOCK_PID" 2>/dev/null || true
  [ -n "$WEBHOOK_PID" ] && kill -TERM "$WEBHOOK_PID" 2>/dev/null || true
  [ -n "$WEBHOOK_PID" ] && wait "$WEBHOOK_PID" 2>/dev/null || true
  echo "==> stopped (state kept in $RUN/; delete it for a fresh start)"
}
trap stop INT TERM EXIT

wait_http() {  # url, what, pid
  for _ in $(seq 1 200); do
    if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    kill -0 "$3" 2>/dev/null || { echo "run.sh: $2 exited during start-up" >&2; exit 1; }
    sleep 0.05
  done
  echo "run.sh: $2 did not become ready at $1" >&2
  exit 1
}

echo "==> starting mock-apns on 127.0.0.1:$APNS_PORT (control 127.0.0.1:$CONTROL_PORT)"
rm -f "$RUN/ca.pem"
"$BIN/mock-apns" --listen "127.0.0.1:$APNS_PORT" --control "127.0.0.1:$CONTROL_PORT" \
  --generate-tls --ca-out "$RUN/ca.pem" \
  --token-key "$APNS_KEY_ID:$TEAM_ID:$RUN/demo-apns-key.p8" --bundle-id "$BUNDLE" \
  --root-secret "$KEY_ID:$ROOT_KEY" --root-secret "$CURL_KEY_ID:$CURL_ROOT_KEY" ${ACCESSORY_ARGS[@]+"${ACCESSORY_ARGS[@]}"} --deliveries-log "$RUN/deliveries.jsonl" 2> >(sed -u 's/^/[mock-apns] /' >&2) &
MOCK_PID=$!
wait_http "http://127.0.0.1:$CONTROL_PORT/stats" mock-apns "$MOCK_PID"

if [ -n "$WEBHOOK_PY" ]; then
  echo "==> starting the webhook receiver on 127.0.0.1:$WEBHOOK_PORT (scripts/webhook-receiver.py)"
  "$WEBHOOK_PY" -u scripts/webhook-receiver.py --secret-file "$RUN/webhook-secret" --port "$WEBHOOK_PORT" \
    > >(sed -u 's/^/[webhook] /') 2>&1 &
  WEBHOOK_PID=$!
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$WEBHOOK_PORT") 2>/dev/null && break
    kill -0 "$WEBHOOK_PID" 2>/dev/null || { echo "run.sh: the webhook receiver exited during start-up" >&2; exit 1; }
    sleep 0.05
  done
fi

echo "==> starting relay-server on 127.0.0.1:$RELAY_PORT (admin 127.0.0.1:$ADMIN_PORT)"
"$BIN/relay-server" --config "$RUN/relay.json" 2> >(sed -u 's/^/[relay] /' >&2) &
RELAY_PID=$!
wait_http "http://127.0.0.1:$ADMIN_PORT/readyz" relay-server "$RELAY_PID"

# Demo credential: created once, reused while .run/relay.db keeps it.
CRED=""
if [ -s "$RUN/demo-credential" ]; then
  CRED=$(cat "$RUN/demo-credential")
  HASH=$(printf %s "$CRED" | openssl dgst -sha256 -binary | od -An -tx1 | tr -d ' \n')
  FOUND=$(sqlite3 "$RUN/relay.db" "SELECT count(*) FROM credentials WHERE hash = X'$HASH' AND revoked_at IS NULL")
  [ "$FOUND" = 1 ] || CRED=""
fi
if [ -z "$CRED" ]; then
  if "$BIN/relayctl" credentials create --help >/dev/null 2>&1; then
    CRED=$("$BIN/relayctl" credentials create --config "$RUN/relay.json" --name demo --apps "$BUNDLE" --json \
      | sed -n 's/.*"secret" *: *"\([^"]*\)".*/\1/p')
  fi
  if [ -z "$CRED" ]; then
    # Fallback until relayctl has `credentials create`: the same format and hash the relay uses
    # (rk_ + base64url of 32 random bytes, stored as SHA-256), inserted beside the running server.
    CRED="rk_$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')"
    HASH=$(printf %s "$CRED" | openssl dgst -sha256 -binary | od -An -tx1 | tr -d ' \n')
    ID="cred_$(openssl rand -hex 6)"
    NOW=$(($(date +%s) * 1000))
    sqlite3 "$RUN/relay.db" ".timeout 5000" \
      "INSERT INTO credentials (id, name, hash, apps, created_at) VALUES ('$ID', 'demo', X'$HASH', '$BUNDLE', $NOW)"
  fi
  printf %s "$CRED" > "$RUN/demo-credential"
fi

TOKEN=$(openssl rand -hex 32)
SESSION=$(cat /proc/sys/kernel/random/uuid | tr a-z A-Z)
# A real response sealed with the curl demo root secret at message index 0 (chain key 0 = root
# secret), so mock-apns can decrypt and verify it. Run the curl twice: the second answer is 200
# with the same id (dedupe).
INDEX=0
DATA=""
if MK=$("$BIN/relayctl" ratchet step --chain-key "$CURL_ROOT_KEY" --index 0 --json 2>/dev/null | sed -n 's/.*"messageKey":"\([0-9a-f]*\)".*/\1/p') && [ -n "$MK" ]; then
  BODY=$("$BIN/relayctl" ratchet body encode --notification-id demo-1 --source-id "$BUNDLE" --action-id accept \
    --user-text "Hello from make run" --json 2>/dev/null | sed -n 's/.*"body":"\([0-9a-f]*\)".*/\1/p')
  [ -n "$BODY" ] && DATA=$("$BIN/relayctl" ratchet seal --key "$MK" --plaintext "$BODY" --json 2>/dev/null | sed -n 's/.*"sealed":"\([^"]*\)".*/\1/p')
fi
NOTE="(sealed at message index 0 with .run/demo-curl-root-key: mock-apns decrypts and verifies it; run it twice for a 200 duplicate)"
if [ -z "$DATA" ]; then
  DATA=$(openssl rand -base64 48 | tr -d '\n')
  INDEX='$RANDOM'
  NOTE="(random ciphertext: mock-apns accepts the push and records it as not decryptable)"
fi
cat <<EOF

relay-server is accepting responses. Try it:

  curl -sS -i http://127.0.0.1:$RELAY_PORT/v1/responses \\
    -H "Authorization: Bearer \$(cat $RUN/demo-credential)" -H 'Content-Type: application/json' \\
    -d '{"pushToken":"$TOKEN","sessionIdentifier":"$SESSION","keyID":"$CURL_KEY_ID","messageIndex":$INDEX,"encryptedData":"$DATA"}'

  $NOTE
  then:  curl -sS http://127.0.0.1:$RELAY_PORT/v1/responses/<id> -H "Authorization: Bearer \$(cat $RUN/demo-credential)"
         curl -sS http://127.0.0.1:$CONTROL_PORT/deliveries

An accessory's real, ratchet-encrypted response, verified by mock-apns:

  $BIN/relayctl send-test --url http://127.0.0.1:$RELAY_PORT --credential @$RUN/demo-credential \\
    --root-key \$(cat $RUN/demo-root-key) --key-id \$(cat $RUN/demo-key-id) --state-file $RUN/send-test-state.json --count 3 --wait 10s

A simulated accessory paired by X-Wing key exchange ($RUN/demo-accessory.json, pairing values in
$RUN/demo-accessory-pairing.txt; docs/key-exchange.md): its responses are sealed with the root it
derived, sent over libcurl, and verified by mock-apns with the root it derived from the same key material:

  $BIN/relayctl accessory send --state $RUN/demo-accessory.json --url http://127.0.0.1:$RELAY_PORT \\
    --credential @$RUN/demo-credential --app $BUNDLE --count 3
  then:  curl -sS http://127.0.0.1:$CONTROL_PORT/deliveries      ("verified":true)
         $BIN/relayctl accessory derive --state $RUN/demo-accessory.json   (every intermediate value)

Delivery events (docs/events.md): what became of each response, signed and pushed to a webhook,
and in the feed.
EOF
if [ -n "$WEBHOOK_PY" ]; then
  cat <<EOF
  The [webhook] lines come from scripts/webhook-receiver.py on 127.0.0.1:$WEBHOOK_PORT: it verifies
  each request's Standard Webhooks signature with the secret in $RUN/webhook-secret (the relay's
  webhook "demo") and prints each event once: type, webhook-id, the response's id, state, reason.
EOF
elif [ -n "$WEBHOOK_URL" ]; then
  cat <<EOF
  Events are sent to your receiver at $WEBHOOK_URL (webhook "demo"), signed with the secret in
  $RUN/webhook-secret: verify them with it (docs/events.md "Verifying").
EOF
else
  cat <<EOF
  No webhook: Python standardwebhooks could not be installed (offline?), so no receiver was
  started. To see events pushed, run a receiver (docs/events.md "Verifying") with the secret in
  $RUN/webhook-secret and start again with its URL:  WEBHOOK_URL=http://127.0.0.1:$WEBHOOK_PORT/relay make run
EOF
fi
cat <<EOF
  The feed, the same events pulled with the credential:
    curl -sS "http://127.0.0.1:$RELAY_PORT/v1/events?wait=10" -H "Authorization: Bearer \$(cat $RUN/demo-credential)"
    $BIN/relayctl events list --config $RUN/relay.json

Metrics: curl -sS http://127.0.0.1:$ADMIN_PORT/metrics     Ctrl-C stops them all.

EOF
wait "$RELAY_PID" || true
