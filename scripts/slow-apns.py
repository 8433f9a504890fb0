#!/usr/bin/env python3
"""A slow APNs through the whole relay (issue 31): connections opened and duplicates.

mock-apns answers every push after --latency-ms (default 60 s) and answers PING at once;
relay-server runs with the production dispatch settings (back-off 1 s to 300 s, request
timeout 10 s, 2 connections per app, maxInflight 256, answer wait 120 s and queue wait 30 s
unless given); --rate responses/s (default 20) are ingested for --seconds (default
120). Then the script waits --drain seconds for answers still on their way and prints one JSON
object: connections the mock saw in the first minute and in all, pushes it received, distinct
ones, repeats (pushes received more than once), delivered rows, relay retries.

Usage: scripts/slow-apns.py --bin .build/debug [--latency-ms 60000] [--rate 20] [--seconds 120]
       [--drain 75] [--answer-wait-ms N] [--queue-wait-ms N] [--work DIR]
--answer-wait-ms 10000 (= requestTimeoutMs) gives the behaviour before the answer wait: a push
unanswered at the request timeout fails and is retried. Not part of `make test` (minutes long).
Reuses scripts/reliability.py's process and load helpers; every process started is killed by
pid at exit.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reliability as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="directory holding relay-server, mock-apns, relayctl")
    ap.add_argument("--latency-ms", type=int, default=60_000)
    ap.add_argument("--rate", type=float, default=20.0, help="offered load (responses/s)")
    ap.add_argument("--seconds", type=float, default=120.0, help="how long the load runs")
    ap.add_argument("--drain", type=float, default=75.0, help="seconds to wait after the load for answers on their way")
    ap.add_argument("--answer-wait-ms", type=int, default=None, help="dispatch.maxAnswerWaitMs (default: the relay's)")
    ap.add_argument("--queue-wait-ms", type=int, default=None, help="dispatch.maxQueueWaitMs (default: the relay's)")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    for exe in ("relay-server", "mock-apns", "relayctl"):
        if not os.access(os.path.join(args.bin, exe), os.X_OK):
            print(f"slow-apns: {args.bin}/{exe} not found (build first)", file=sys.stderr)
            return 64
    work = args.work or tempfile.mkdtemp(prefix="slow-apns.")
    # Production dispatch settings (RelayConfig's defaults), written out so the run says what it used.
    dispatch = {"maxInflight": 256, "claimBatch": 256, "backoffBaseMs": 1000, "backoffCapMs": 300_000,
                "tooManyRequestsDelayMs": 60_000, "requestTimeoutMs": 10_000, "connectionsPerApp": 2,
                "maxNewConnectionsPerMinute": 10, "shutdownGraceMs": 1000,
                # Written out: reliability.py's own (scaled) dispatch section sets a shorter answer wait.
                "maxAnswerWaitMs": 120_000, "maxQueueWaitMs": 30_000}
    if args.answer_wait_ms is not None:
        dispatch["maxAnswerWaitMs"] = args.answer_wait_ms
    if args.queue_wait_ms is not None:
        dispatch["maxQueueWaitMs"] = args.queue_wait_ms
    result = {"latencyMs": args.latency_ms, "rate": args.rate, "seconds": args.seconds, "dispatch": dispatch}
    try:
        env = R.Env(args.bin, work, overrides={"dispatch": dispatch})
        env.start_mock(faults=[f"latency={args.latency_ms}"])
        env.start_relay()
        secret, _ = env.credential()
        dl = R.Deliveries(env.log_path)
        t0 = time.monotonic()
        load = R.Load(env.relay_port, secret, threads=4, rate=args.rate).start()
        first_minute = None
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1)
            if first_minute is None and time.monotonic() - t0 >= 60:
                first_minute = env.mock_stats()
                R.log(f"first minute: {first_minute.get('connectionsTotal')} connections, {first_minute.get('requests')} requests")
        load.stop()
        acked, status, errors = load.snapshot()
        R.log(f"load stopped: {len(acked)} accepted; waiting {args.drain:.0f} s for answers on their way")
        time.sleep(args.drain)
        stats = env.mock_stats()
        dl.poll()
        metrics = env.metrics()
        delivered = env.db("SELECT count(*) FROM responses WHERE state = 'delivered'")[0][0]
        # The relay's attempts by outcome: 200s, "not sent" (never written), timeouts, refusals.
        outcomes = env.db("SELECT coalesce(status, substr(reason, 1, instr(reason || ':', ':') - 1)), count(*) "
                          "FROM attempts GROUP BY 1 ORDER BY 2 DESC")
        result.update({
            "accepted": len(acked), "ingestStatus": dict(status), "ingestErrors": errors,
            "connectionsFirstMinute": (first_minute or {}).get("connectionsTotal"),
            "connectionsTotal": stats.get("connectionsTotal"),
            "mockRequests": stats.get("requests"),
            "pushesReceived": sum(dl.count.values()),
            "distinctPushesReceived": len(dl.count),
            "repeats": sum(n - 1 for n in dl.count.values() if n > 1),
            "pushesReceivedMoreThanOnce": sum(1 for n in dl.count.values() if n > 1),
            "rowsDelivered": delivered,
            "relayRetries": R.metric_sum(metrics, "relay_push_retries_total"),
            "attemptOutcomes": {str(k): n for k, n in outcomes},
        })
    finally:
        R.kill_all()
    print(json.dumps(result, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
