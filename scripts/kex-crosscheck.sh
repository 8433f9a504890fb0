#!/usr/bin/env bash
# Runs scripts/kex-crosscheck.py (KeyExchange against Python `cryptography`) for `make test`.
# The venv is throwaway and lives in .build/kex-venv (KEX_VENV); cryptography is pinned to a
# version with ML-KEM and HPKE (its wheels bring their own OpenSSL). Without python3, or when
# the package cannot be installed (offline), the check is skipped with a message, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."
CRYPTOGRAPHY_VERSION=50.0.2
VENV=${KEX_VENV:-.build/kex-venv}
TOOL=${KEX_TOOL:-$(swift build ${SWIFT_FLAGS:-} --show-bin-path)/kex-tool}
if ! command -v python3 >/dev/null; then
  echo "kex-crosscheck: skipped (no python3)"; exit 0
fi
[ -x "$TOOL" ] || { echo "kex-crosscheck: $TOOL missing (swift build first)" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import cryptography, sys; sys.exit(cryptography.__version__ != '$CRYPTOGRAPHY_VERSION')" 2>/dev/null; then
  rm -rf "$VENV"
  if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "cryptography==$CRYPTOGRAPHY_VERSION"; } >/dev/null 2>&1; then
    echo "kex-crosscheck: skipped (could not make a venv with cryptography==$CRYPTOGRAPHY_VERSION: offline?)"
    rm -rf "$VENV"; exit 0
  fi
fi
exec "$VENV/bin/python" scripts/kex-crosscheck.py "$TOOL"
