# Sourced by scripts/kex-crosscheck.sh and scripts/bench-kex.sh: the throwaway venv with Python
# `cryptography` (ML-KEM, X25519, P-256, HPKE; its wheels bring their own OpenSSL) in
# .build/kex-venv (KEX_VENV). kex_venv_python prints its python, or returns 1 when python3 is
# missing or the pinned version cannot be installed (offline).
source "$(dirname "${BASH_SOURCE[0]}")/lib-venv.sh"
KEX_CRYPTOGRAPHY_VERSION=50.0.2
KEX_VENV=${KEX_VENV:-.build/kex-venv}

kex_venv_python() { pinned_venv_python "$KEX_VENV" cryptography "$KEX_CRYPTOGRAPHY_VERSION"; }
