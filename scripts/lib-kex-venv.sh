# Sourced by scripts/kex-crosscheck.sh and scripts/bench-kex.sh: the throwaway venv with Python
# `cryptography` (ML-KEM, X25519, P-256, HPKE; its wheels bring their own OpenSSL) in
# .build/kex-venv (KEX_VENV). kex_venv_python prints its python, or returns 1 when python3 is
# missing or the pinned version cannot be installed (offline).
KEX_CRYPTOGRAPHY_VERSION=50.0.2
KEX_VENV=${KEX_VENV:-.build/kex-venv}

kex_venv_python() {
  command -v python3 >/dev/null || return 1
  if ! "$KEX_VENV/bin/python" -c "import cryptography, sys; sys.exit(cryptography.__version__ != '$KEX_CRYPTOGRAPHY_VERSION')" 2>/dev/null; then
    rm -rf "$KEX_VENV"
    if ! { python3 -m venv "$KEX_VENV" && "$KEX_VENV/bin/pip" install -q "cryptography==$KEX_CRYPTOGRAPHY_VERSION"; } >/dev/null 2>&1; then
      rm -rf "$KEX_VENV"
      return 1
    fi
  fi
  echo "$KEX_VENV/bin/python"
}
