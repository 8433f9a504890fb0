# Sourced by the webhook cross-check test (Tests/RelayCoreTests/WebhookTests.swift) and by anyone
# who wants scripts/webhook-receiver.py: a throwaway venv with Python `standardwebhooks` (the
# Standard Webhooks reference library) in .build/webhooks-venv (WEBHOOKS_VENV).
# webhooks_venv_python prints its python, or returns 1 when python3 is missing or the pinned
# version cannot be installed (offline).
source "$(dirname "${BASH_SOURCE[0]}")/lib-venv.sh"
WEBHOOKS_STANDARDWEBHOOKS_VERSION=1.0.0
WEBHOOKS_VENV=${WEBHOOKS_VENV:-.build/webhooks-venv}

webhooks_venv_python() { pinned_venv_python "$WEBHOOKS_VENV" standardwebhooks "$WEBHOOKS_STANDARDWEBHOOKS_VERSION"; }
