#!/usr/bin/env bash
# `make reliability`: the whole reliability run against release binaries (docs/reliability.md).
#   - RELIABILITY_ROUNDS kill -9 rounds of relay-server under concurrent ingest (default 20),
#     mock-apns killed mid-stream every 4th round;
#   - the fault matrix (every mock-apns fault under steady load);
#   - storage faults (disk full on a tmpfs, DB locked by sqlite3, read-only DB);
#   - bad input (slowloris, 10,000 idle connections, floods, huge bodies, bad UTF-8, deep JSON,
#     unauthenticated and revoked credentials under load).
# Results: .build/reliability/results.{json,md}, and spliced into docs/reliability.md between
# the "results" markers. Extra arguments go to scripts/reliability.py (e.g. --sections crash).
# The harness kills every process it started, by pid, also on Ctrl-C; it stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in python3 openssl sqlite3 curl; do
  command -v "$tool" >/dev/null || { echo "reliability: $tool missing (make deps)" >&2; exit 1; }
done
ROUNDS=${RELIABILITY_ROUNDS:-20}
if [ -z "${RELIABILITY_BIN:-}" ]; then
  for product in relay-server mock-apns relayctl; do swift build -c release --product "$product" >&2; done
  RELIABILITY_BIN=$(swift build -c release --show-bin-path)
fi
# 10,000 idle client connections plus the relay's side of them: raise the descriptor limit
# (root may raise the hard limit; otherwise the soft limit goes as high as allowed).
ulimit -Hn 65536 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
OUT=.build/reliability
mkdir -p "$OUT"
set +e
python3 scripts/reliability.py --bin "$RELIABILITY_BIN" --rounds "$ROUNDS" \
  --json-out "$OUT/results.json" --md-out "$OUT/results.md" "$@" &
HARNESS=$!
trap 'kill -INT "$HARNESS" 2>/dev/null; wait "$HARNESS"; exit 130' INT TERM
wait "$HARNESS"
rc=$?
trap - INT TERM
set -e
if [ -s "$OUT/results.md" ] && grep -q '<!-- results:begin -->' docs/reliability.md; then
  python3 - "$OUT/results.md" docs/reliability.md <<'PY'
import sys
results, doc = open(sys.argv[1]).read(), open(sys.argv[2]).read()
head, rest = doc.split("<!-- results:begin -->", 1)
_, tail = rest.split("<!-- results:end -->", 1)
open(sys.argv[2], "w").write(head + "<!-- results:begin -->\n" + results + "<!-- results:end -->" + tail)
PY
  echo "reliability: results in $OUT/results.md and docs/reliability.md" >&2
fi
[ $rc -eq 0 ] && echo "reliability: every check passed" >&2 || echo "reliability: FAILED (exit $rc); see above" >&2
exit $rc
