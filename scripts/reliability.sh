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
# BACKEND=postgres (`make reliability BACKEND=postgres`): the PostgreSQL scenarios instead
# (three relay-server nodes on a throwaway cluster: kill -9 of a node per round, pg_ctl restart
# -m fast and -m immediate, the database stopped for 30 s and stalled for 20 s); results in
# .build/reliability/results-postgres.{json,md} and between the "pg-results" markers.
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
BACKEND=${BACKEND:-sqlite}
case "$BACKEND" in
  sqlite) NAME=results; MARK=results; EXTRA=(--rounds "$ROUNDS") ;;
  postgres)
    NAME=results-postgres; MARK=pg-results; EXTRA=(--backend postgres)
    [ -n "${RELIABILITY_PG_ROUNDS:-}" ] && EXTRA+=(--pg-rounds "$RELIABILITY_PG_ROUNDS")
    ;;
  *) echo "reliability: BACKEND must be sqlite or postgres, not $BACKEND" >&2; exit 64 ;;
esac
set +e
python3 scripts/reliability.py --bin "$RELIABILITY_BIN" "${EXTRA[@]}" \
  --json-out "$OUT/$NAME.json" --md-out "$OUT/$NAME.md" "$@" &
HARNESS=$!
trap 'kill -INT "$HARNESS" 2>/dev/null; wait "$HARNESS"; exit 130' INT TERM
wait "$HARNESS"
rc=$?
trap - INT TERM
set -e
if [ -s "$OUT/$NAME.md" ] && grep -q "<!-- $MARK:begin -->" docs/reliability.md; then
  python3 - "$OUT/$NAME.md" docs/reliability.md "$MARK" <<'PY'
import sys
results, doc, mark = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
head, rest = doc.split(f"<!-- {mark}:begin -->", 1)
_, tail = rest.split(f"<!-- {mark}:end -->", 1)
open(sys.argv[2], "w").write(head + f"<!-- {mark}:begin -->\n" + results + f"<!-- {mark}:end -->" + tail)
PY
  echo "reliability: results in $OUT/$NAME.md and docs/reliability.md" >&2
fi
[ $rc -eq 0 ] && echo "reliability: every check passed" >&2 || echo "reliability: FAILED (exit $rc); see above" >&2
exit $rc
