#!/usr/bin/env bash
# `make bench-kex`: X-Wing keygen/encaps/decaps and HPKE export per second, KeyExchange (release
# kex-tool) against Python `cryptography` (its ML-KEM and X25519 from OpenSSL, composed into
# X-Wing) in the same run, alternating A/B/A/B, as ratios. A markdown table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib-kex-venv.sh
SECONDS_PER_OP=${KEX_BENCH_SECONDS:-2}
ROUNDS=${KEX_BENCH_ROUNDS:-2}
swift build -c release --product kex-tool >&2
TOOL=$(swift build -c release --show-bin-path)/kex-tool
PY=$(kex_venv_python) || { echo "bench-kex: needs python3 and a venv with cryptography==$KEX_CRYPTOGRAPHY_VERSION" >&2; exit 1; }
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
SWIFT_RUNS=() PY_RUNS=()
for _ in $(seq "$ROUNDS"); do
  SWIFT_RUNS+=("$("$TOOL" bench "$SECONDS_PER_OP")")
  PY_RUNS+=("$("$PY" scripts/bench-kex.py "$SECONDS_PER_OP")")
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" - "$LOAD_BEFORE" "$LOAD_AFTER" "$("$PY" -c 'import cryptography; print(cryptography.__version__)')" \
  "$("$PY" -c 'from cryptography.hazmat.backends.openssl import backend; print(backend.openssl_version_text())')" \
  "$(printf '%s\n' "${SWIFT_RUNS[@]}")" "$(printf '%s\n' "${PY_RUNS[@]}")" <<'PYEOF'
import json, statistics, sys
before, after, version, openssl, swift_runs, py_runs = sys.argv[1:7]
s = [json.loads(l) for l in swift_runs.splitlines() if l.strip()]
p = [json.loads(l) for l in py_runs.splitlines() if l.strip()]
names = {"xwingKeygen": "X-Wing keygen (from seed)", "xwingEncaps": "X-Wing encaps", "xwingDecaps": "X-Wing decaps", "hpkeExport": "HPKE export (32 bytes)"}
print("## KeyExchange vs Python cryptography (scripts/bench-kex.sh, `make bench-kex`)")
print()
print(f"| operation | KeyExchange (Swift) /s | Python cryptography {version} /s | ratio Swift/Python |")
print("|---|---:|---:|---:|")
for key, label in names.items():
    a = statistics.median(r[key] for r in s)
    b = statistics.median(r[key] for r in p)
    print(f"| {label} | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")
print(f"\nMedians of {len(s)} alternating runs per side; {openssl} under Python; load average {before} before, {after} after.")
PYEOF
