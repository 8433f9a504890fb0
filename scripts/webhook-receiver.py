#!/usr/bin/env python3
"""A small receiver for the relay's delivery events (docs/events.md, "Webhooks").

It verifies every request with `standardwebhooks`, the Standard Webhooks reference library
(independent of the relay's own signing code), answers 204 when the signature is good and 400
otherwise, and drops repeats by `webhook-id` (delivery is at least once). Used by the webhook
cross-check test and as a starting point for a real receiver:

    source scripts/lib-webhooks-venv.sh && PY=$(webhooks_venv_python)
    $PY scripts/webhook-receiver.py --secret-file /etc/accessory-relay/webhook-secret --port 9300

--secret-file holds the same one or two `whsec_` lines as the relay's `secretFile`; each line is
checked on its own and the request is accepted if one verifies. --record FILE appends one JSON
line per request (id, type, per secret whether it verified, the status answered and the body as
received; written when the request arrives). --fail-first N answers 500 to the first N requests,
to watch the relay retry; --delay-ms D answers each request D ms late (a slow receiver).
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def summary(body):
    """The event's gist for the log: the response's id, state, status and reason, or the push token."""
    try:
        data = json.loads(body).get("data", {})
    except ValueError:
        return ""
    if "id" in data:
        return " ".join(f"{k}={data.get(k)}" for k in ("id", "state", "status", "reason") if data.get(k) is not None)
    return f"pushToken={data.get('pushToken')}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9300, help="0: any free port (printed)")
    parser.add_argument("--record", help="append one JSON line per request to this file")
    parser.add_argument("--fail-first", type=int, default=0, help="answer 500 to the first N requests")
    parser.add_argument("--delay-ms", type=int, default=0, help="answer each request this many ms late")
    args = parser.parse_args()

    with open(args.secret_file) as f:
        verifiers = [Webhook(line.strip()) for line in f if line.strip()]
    lock = threading.Lock()
    state = {"requests": 0, "seen": set()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the relay reuses its connection

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            verified = []
            for w in verifiers:
                try:
                    w.verify(body, headers)
                    verified.append(True)
                except WebhookVerificationError:
                    verified.append(False)
            event_id = headers.get("webhook-id", "")
            with lock:
                number = state["requests"]
                state["requests"] += 1
                duplicate = event_id in state["seen"]
            try:
                event_type = json.loads(body).get("type")
            except ValueError:
                event_type = None
            if number < args.fail_first:
                status = 500
            elif not any(verified):
                status = 400
            else:
                status = 204
                if not duplicate:
                    with lock:
                        state["seen"].add(event_id)
                    # A real receiver acts on the event here (exactly once per webhook-id).
                    print(f"{event_type} {event_id} {summary(body)}", flush=True)
            if args.record:
                record = {"id": event_id, "type": event_type, "verified": verified, "status": status,
                          "body": body.decode("utf-8", "replace")}
                with lock, open(args.record, "a") as out:
                    out.write(json.dumps(record) + "\n")
            if args.delay_ms:
                time.sleep(args.delay_ms / 1000)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on {args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
