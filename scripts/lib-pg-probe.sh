# Shared by scripts/pg-stall-probe.sh and scripts/pg-failover-probe.sh (sourced; W = repo root,
# B = bin dir, D = work dir). probe_relay URL NODE_ID starts relay-server on that PostgreSQL URL
# with an APNs app that is never reached, waits for /readyz and creates a credential: sets port,
# admin, relay (pid) and secret. post N sends one ingest (message index N, its own push token)
# and prints the status (POST_FORMAT: a curl -w format); post_body N is its JSON.
. "$W/scripts/lib-bench.sh"   # free_port

probe_relay() {
  openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out $D/apns.p8
  port=$(free_port); admin=$(free_port)
  cat > $D/relay.json <<J
{"listen":{"host":"127.0.0.1","port":$port},"admin":{"host":"127.0.0.1","port":$admin},
 "store":{"kind":"postgres","url":"$1","nodeId":"$2"},
 "apps":[{"bundleID":"com.example.app","environment":"custom","url":"https://127.0.0.1:9","token":{"p8Path":"$D/apns.p8","keyID":"PROBE00001","teamID":"PROBETEAM1"}}],
 "watchdog":false,"log":{"level":"warning"}}
J
  $B/relay-server --config $D/relay.json 2>$D/relay.log & relay=$!
  for i in $(seq 100); do curl -fs 127.0.0.1:$admin/readyz >/dev/null && break; sleep 0.1; done
  secret=$($B/relayctl credentials create --config $D/relay.json --name p --apps com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
}

post_body() {
  echo "{\"pushToken\":\"$(printf '%064x' $1)\",\"sessionIdentifier\":\"6F9619FF-8B86-D011-B42D-00C04FC964FF\",\"keyID\":\"AQIDBA==\",\"messageIndex\":$1,\"encryptedData\":\"$(head -c 40 /dev/zero | base64 -w0)\"}"
}

post() {
  curl -s -o /dev/null -w "${POST_FORMAT:-%{http_code\}}" -m 60 -X POST 127.0.0.1:$port/v1/responses -H "Authorization: Bearer $secret" \
    -H 'Content-Type: application/json' -d "$(post_body $1)"
}
