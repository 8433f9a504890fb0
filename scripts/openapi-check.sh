#!/usr/bin/env bash
# `make test`'s contract check of docs/openapi.yaml: validates the document with
# openapi-spec-validator, then runs schemathesis from it against a live relay-server (and
# mock-apns) on loopback: examples, coverage, fuzzing and stateful (link-following) phases,
# every check, bounded by OPENAPI_MAX_EXAMPLES (default 40) per operation and OPENAPI_MAX_TIME
# seconds (default 60 for the ingest listener, a third of it for the admin one). Every response must conform (status, headers, content type,
# body schema), no 5xx, and the relay must still be running at the end.
# Skipped with a message when the packages cannot be installed (offline), like kex-crosscheck.
#
#   scripts/openapi-check.sh                     # debug binaries from `swift build`
#   OPENAPI_MAX_EXAMPLES=500 OPENAPI_MAX_TIME=600 scripts/openapi-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
VALIDATOR_VERSION=0.9.0
VENV=${OPENAPI_VENV:-.build/openapi-venv}
BIN=${OPENAPI_BIN:-$(swift build ${SWIFT_FLAGS:-} --show-bin-path)}
MAX_EXAMPLES=${OPENAPI_MAX_EXAMPLES:-40}
MAX_TIME=${OPENAPI_MAX_TIME:-60}

command -v python3 >/dev/null || { echo "openapi-check: skipped (no python3)"; exit 0; }
if ! "$VENV/bin/python" -c "import schemathesis, openapi_spec_validator" 2>/dev/null \
   || [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))')" != "$SCHEMATHESIS_VERSION" ]; then
  rm -rf "$VENV"
  if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION" "openapi-spec-validator==$VALIDATOR_VERSION"; } >/dev/null 2>&1; then
    rm -rf "$VENV"
    echo "openapi-check: skipped (schemathesis==$SCHEMATHESIS_VERSION could not be installed: offline?)"
    exit 0
  fi
fi

"$VENV/bin/openapi-spec-validator" docs/openapi.yaml

for b in relay-server mock-apns relayctl; do
  [ -x "$BIN/$b" ] || { echo "openapi-check: $BIN/$b missing (swift build first)" >&2; exit 1; }
done

DIR=$(mktemp -d /tmp/openapi-check.XXXXXX)
RELAY_PID="" MOCK_PID=""
cleanup() {
  [ -n "$RELAY_PID" ] && kill -TERM "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null || true
  [ -n "$MOCK_PID" ] && kill -TERM "$MOCK_PID" 2>/dev/null && wait "$MOCK_PID" 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
RELAY_PORT=$(free_port) ADMIN_PORT=$(free_port) APNS_PORT=$(free_port) CONTROL_PORT=$(free_port)
BUNDLE=com.example.openapi
openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$DIR/key.p8"

wait_http() {  # url, what, pid
  for _ in $(seq 1 400); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "openapi-check: $2 exited during start-up" >&2; cat "$DIR"/*.log >&2; exit 1; }
    sleep 0.05
  done
  echo "openapi-check: $2 not ready at $1" >&2
  exit 1
}

"$BIN/mock-apns" --listen "127.0.0.1:$APNS_PORT" --control "127.0.0.1:$CONTROL_PORT" --generate-tls --ca-out "$DIR/ca.pem" \
  --token-key "KEYID00001:TEAMID0001:$DIR/key.p8" --bundle-id "$BUNDLE" 2> "$DIR/mock.log" &
MOCK_PID=$!
wait_http "http://127.0.0.1:$CONTROL_PORT/stats" mock-apns "$MOCK_PID"

cat > "$DIR/relay.json" <<EOF
{
  "listen": {"host": "127.0.0.1", "port": $RELAY_PORT},
  "admin": {"host": "127.0.0.1", "port": $ADMIN_PORT},
  "store": {"path": "relay.db"},
  "ingest": {"rateLimits": {"perCredential": {"perSecond": 100000, "burst": 100000},
                            "perPushToken": {"perSecond": 100000, "burst": 100000}}},
  "apps": [{"bundleID": "$BUNDLE", "environment": "custom", "url": "https://127.0.0.1:$APNS_PORT", "caFile": "ca.pem",
            "token": {"p8Path": "key.p8", "keyID": "KEYID00001", "teamID": "TEAMID0001"}}],
  "log": {"format": "text", "level": "warning"}
}
EOF
"$BIN/relay-server" --config "$DIR/relay.json" 2> "$DIR/relay.log" &
RELAY_PID=$!
wait_http "http://127.0.0.1:$ADMIN_PORT/readyz" relay-server "$RELAY_PID"
CRED=$("$BIN/relayctl" credentials create --config "$DIR/relay.json" --name openapi --apps "$BUNDLE" --json \
  | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["secret"])')

run() {  # listener url, tag, phases, seconds
  "$VENV/bin/schemathesis" --config-file scripts/schemathesis.toml run docs/openapi.yaml --url "$1" --include-tag "$2" \
    --checks all --phases "$3" \
    --max-examples "$MAX_EXAMPLES" --max-time "$4" --workers 1 \
    -H "Authorization: Bearer $CRED" --suppress-health-check all --no-color
}
status=0
run "http://127.0.0.1:$RELAY_PORT" ingest examples,coverage,fuzzing,stateful "$MAX_TIME" || status=1
# The admin paths have no links to follow.
run "http://127.0.0.1:$ADMIN_PORT" admin examples,coverage,fuzzing $((MAX_TIME / 3 + 1)) || status=1
if ! kill -0 "$RELAY_PID" 2>/dev/null; then
  echo "openapi-check: relay-server is no longer running" >&2
  tail -20 "$DIR/relay.log" >&2
  status=1
fi
[ "$status" = 0 ] && echo "openapi-check: docs/openapi.yaml valid; schemathesis found nothing against the live relay"
exit "$status"
