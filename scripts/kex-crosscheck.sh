#!/usr/bin/env bash
# Runs scripts/kex-crosscheck.py (KeyExchange against Python `cryptography`) for `make test`.
# Without python3, or when cryptography cannot be installed (offline), the check is skipped with
# a message, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib-kex-venv.sh
TOOL=${KEX_TOOL:-$(swift build ${SWIFT_FLAGS:-} --show-bin-path)/kex-tool}
[ -x "$TOOL" ] || { echo "kex-crosscheck: $TOOL missing (swift build first)" >&2; exit 1; }
if ! PY=$(kex_venv_python); then
  echo "kex-crosscheck: skipped (no python3, or no venv with cryptography==$KEX_CRYPTOGRAPHY_VERSION: offline?)"
  exit 0
fi
exec "$PY" scripts/kex-crosscheck.py "$TOOL"
