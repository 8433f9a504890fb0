# Sourced by the webhook cross-check test (Tests/RelayCoreTests/WebhookTests.swift) and by anyone
# who wants scripts/webhook-receiver.py: a throwaway venv with Python `standardwebhooks` (the
# Standard Webhooks reference library) in .build/webhooks-venv (WEBHOOKS_VENV).
# webhooks_venv_python prints its python, or returns 1 when python3 is missing or the pinned
# version cannot be installed (offline).
WEBHOOKS_STANDARDWEBHOOKS_VERSION=1.0.0
WEBHOOKS_VENV=${WEBHOOKS_VENV:-.build/webhooks-venv}

webhooks_venv_python() {
  command -v python3 >/dev/null || return 1
  mkdir -p "$(dirname "$WEBHOOKS_VENV")"
  # One maker at a time: WebhookCrossCheckTests and EventsEndToEndTests run in parallel in
  # `make test`, and one must not delete the venv the other is making or using.
  (
    flock 9 || exit 1
    if ! "$WEBHOOKS_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('standardwebhooks') != '$WEBHOOKS_STANDARDWEBHOOKS_VERSION')" 2>/dev/null; then
      rm -rf "$WEBHOOKS_VENV"
      if ! { python3 -m venv "$WEBHOOKS_VENV" && "$WEBHOOKS_VENV/bin/pip" install -q "standardwebhooks==$WEBHOOKS_STANDARDWEBHOOKS_VERSION"; } >/dev/null 2>&1; then
        rm -rf "$WEBHOOKS_VENV"
        exit 1
      fi
    fi
  ) 9>"$WEBHOOKS_VENV.lock" || return 1
  echo "$WEBHOOKS_VENV/bin/python"
}
