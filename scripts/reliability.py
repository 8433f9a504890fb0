#!/usr/bin/env python3
"""Reliability harness for relay-server + mock-apns (issue 7). Python 3 standard library only.

Drives the real release (or debug) binaries on loopback, on ports it picks itself, with a
concurrent ingest load whose every 202 is booked, and checks the promise: every response the
relay acknowledged with 202 reaches mock-apns at least once, whatever is killed or broken.

Sections (each can be selected with --sections):
  crash     ROUNDS rounds of kill -9 of relay-server at a random moment during ingest and
            dispatch (restart each time), kill -9 of mock-apns mid-stream every 4th round;
            then: every 202 id delivered (mock-apns' deliveries log), duplicates counted and
            compared with what was inflight at the kills, nothing left queued/inflight/retry.
  faults    the fault matrix: each mock-apns fault under steady load, then cleared; table of
            recovered, time to recover, lost, duplicates, retries (relay /metrics).
  storage   disk full (tmpfs), DB locked by another process (sqlite3 BEGIN EXCLUSIVE),
            read-only DB: no 202 that is not durable, 503 while broken, recovery after.
  badinput  slowloris, idle connections, header floods, huge bodies, invalid UTF-8, deep JSON,
            unauthenticated and revoked credentials under load: zero accepted.

With --backend postgres it runs the PostgreSQL scenarios instead (scripts/reliability_pg.py):
three relay-server nodes on one throwaway cluster; kill -9 of a node per round, pg_ctl restart
-m fast and -m immediate, the database stopped for 30 s, and stalled (SIGSTOP) for 20 s;
content audits after each.

Usage: scripts/reliability.py --bin .build/release [--rounds 20] [--sections crash,faults]
       [--rows 5xx,goaway] [--json-out FILE] [--md-out FILE] [--quick]
       scripts/reliability.py --bin .build/release --backend postgres
       [--scenarios kill,fast,immediate,outage,stall] [--pg-rounds 6] [--outage 30] [--plant-loss]
Exit status 0 when every check passed, 1 when one failed, 64 on usage errors.
Every process it starts is killed by pid on exit (also on SIGINT/SIGTERM).
"""
import argparse
import base64
import collections
import datetime
import http.client
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from reliability_common import DeliveryLog, WorkerThreads

BUNDLE = "com.example.reliability"
KEY_ID = "RELKEY0001"
TEAM_ID = "RELTEAM001"
RATCHET_KEY_ID = "AQIDBA=="
SEALED = base64.b64encode(bytes(range(48))).decode()

STARTED = []  # every Popen we started, killed by pid at exit


def log(msg):
    print(f"[reliability {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def req(port, method, path, body=None, headers=None, timeout=5.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body, headers or {})
        r = c.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        c.close()


def kill_all():
    for p in STARTED:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in STARTED:
        try:
            p.wait(timeout=5)
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# Processes


class Env:
    """Work directory, key material, mock-apns and relay-server processes with fixed ports."""

    def __init__(self, bindir, work, overrides=None):
        self.bin = bindir
        self.work = work
        os.makedirs(work, exist_ok=True)
        self.mock = None
        self.relay = None
        self.mock_port, self.control_port = free_port(), free_port()
        self.relay_port, self.admin_port = free_port(), free_port()
        self.log_path = os.path.join(work, "deliveries.jsonl")
        self.db_path = os.path.join(work, "relay.db")
        self.overrides = overrides or {}
        self.relay_log = open(os.path.join(work, "relay.log"), "ab")
        self.mock_log = open(os.path.join(work, "mock.log"), "ab")
        self._keys()
        self.write_config()

    def _keys(self):
        w = self.work
        self.p8 = os.path.join(w, "apns.p8")
        run(["sh", "-c", f"openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out {self.p8}"])
        # Our own CA and server certificate, so a restarted mock-apns keeps the certificate the
        # relay trusts (a --generate-tls mock would mint a new CA on every start).
        self.ca, self.ca_key = os.path.join(w, "ca.pem"), os.path.join(w, "ca.key")
        self.cert, self.key = os.path.join(w, "server.pem"), os.path.join(w, "server.key")
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", self.ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=reliability CA"])
        run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", self.key, "-out", os.path.join(w, "server.csr"), "-subj", "/CN=127.0.0.1"])
        ext = os.path.join(w, "ext.cnf")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        run(["openssl", "x509", "-req", "-in", os.path.join(w, "server.csr"), "-CA", self.ca, "-CAkey", self.ca_key,
             "-CAcreateserial", "-out", self.cert, "-days", "2", "-extfile", ext])

    def write_config(self, db_path=None, min_free_bytes=None):
        if db_path:
            self.db_path = db_path
        cfg = {
            "listen": {"host": "127.0.0.1", "port": self.relay_port},
            "admin": {"host": "127.0.0.1", "port": self.admin_port},
            "store": {"path": self.db_path, "synchronous": "FULL", "busyTimeoutMs": 1000, "maxPending": 5000000},
            # Rate limits off, the per-address 401 budget too: every client here is 127.0.0.1,
            # so after the bad-credential floods the budget would answer the good load and the
            # revocation check 429 instead of exercising the 401 path (the worst case: an
            # attacker spread over many addresses). The budget has its own tests.
            "ingest": {"rateLimits": {"perCredential": {"perSecond": 0, "burst": 1},
                                      "perPushToken": {"perSecond": 0, "burst": 1},
                                      "authFailuresPerAddress": {"perSecond": 0, "burst": 1}}},
            # Short timeouts and a low back-off cap so a recovery is measured in seconds, not in
            # the production cap of 5 minutes (the same code paths, smaller constants). A push
            # never answered (stall row) fails at maxAnswerWaitMs, not the production 120 s.
            "dispatch": {"maxInflight": 256, "backoffBaseMs": 200, "backoffCapMs": 2000,
                         "tooManyRequestsDelayMs": 2000, "requestTimeoutMs": 10000, "maxAnswerWaitMs": 20000,
                         "shutdownGraceMs": 1000},
            "apps": [{"bundleID": BUNDLE, "environment": "custom", "url": f"https://127.0.0.1:{self.mock_port}",
                      "caFile": self.ca, "token": {"p8Path": self.p8, "keyID": KEY_ID, "teamID": TEAM_ID}}],
            "log": {"format": "json", "level": "warning"},
        }
        for k, v in self.overrides.items():
            cfg[k].update(v)
        self.config = os.path.join(self.work, "relay.json")
        # 0600: relay-server warns about a config other users can read, and that warning would
        # stand in for the real last log line in the read-only case's note.
        if min_free_bytes is not None:
            cfg["store"]["minFreeBytes"] = min_free_bytes
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)

    # mock-apns ---------------------------------------------------------------------------
    def start_mock(self, tls_fault=None, faults=()):
        args = [os.path.join(self.bin, "mock-apns"), "--listen", f"127.0.0.1:{self.mock_port}",
                "--control", f"127.0.0.1:{self.control_port}",
                "--token-key", f"{KEY_ID}:{TEAM_ID}:{self.p8}", "--bundle-id", BUNDLE,
                "--deliveries-log", self.log_path]
        if tls_fault:
            args += ["--generate-tls", "--ca-out", os.path.join(self.work, "unused-ca.pem"), "--tls-fault", tls_fault]
        else:
            args += ["--tls-cert", self.cert, "--tls-key", self.key]
        for f in faults:
            args += ["--fault", f]
        self.mock = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.mock_log)
        STARTED.append(self.mock)
        self._wait(lambda: req(self.control_port, "GET", "/stats", timeout=1)[0] == 200, self.mock, "mock-apns")

    def stop_mock(self, sig=signal.SIGTERM):
        if self.mock and self.mock.poll() is None:
            self.mock.send_signal(sig)
            self.mock.wait(timeout=20)
        self.mock = None

    def faults(self, rules):
        body = json.dumps({"rules": rules})
        st, data, _ = req(self.control_port, "POST", "/faults", body, {"Content-Type": "application/json"})
        if st != 200:
            raise RuntimeError(f"POST /faults {st}: {data!r}")

    def clear_faults(self):
        req(self.control_port, "DELETE", "/faults")

    def mock_stats(self):
        return json.loads(req(self.control_port, "GET", "/stats")[1])

    # relay-server --------------------------------------------------------------------------
    def start_relay(self, wait=True):
        self.relay = subprocess.Popen([os.path.join(self.bin, "relay-server"), "--config", self.config],
                                      stdout=subprocess.DEVNULL, stderr=self.relay_log)
        STARTED.append(self.relay)
        self.relay_started = time.monotonic()
        if wait:
            self._wait(lambda: req(self.admin_port, "GET", "/readyz", timeout=1)[0] == 200, self.relay, "relay-server")
        return self.relay

    def kill_relay(self, sig=signal.SIGKILL):
        if self.relay and self.relay.poll() is None:
            self.relay.send_signal(sig)
            self.relay.wait(timeout=30)
        self.relay = None

    def _wait(self, ok, proc, name, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} during start-up (logs in {self.work})")
            try:
                if ok():
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{name} not ready after {seconds}s")

    def metrics(self):
        try:
            text = req(self.admin_port, "GET", "/metrics", timeout=3)[1].decode()
        except (OSError, http.client.HTTPException):
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
        return out

    def credential(self, name="load"):
        r = run([os.path.join(self.bin, "relayctl"), "credentials", "create", "--config", self.config,
                 "--name", name, "--apps", BUNDLE, "--json"])
        j = json.loads(r.stdout)
        return j["secret"], j["credential"]["id"]

    def revoke(self, cred_id):
        run([os.path.join(self.bin, "relayctl"), "credentials", "revoke", cred_id, "--config", self.config])

    def status(self):
        r = run([os.path.join(self.bin, "relayctl"), "status", "--config", self.config, "--json"])
        return json.loads(r.stdout)

    def db(self, sql, args=()):
        c = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)
        try:
            return c.execute(sql, args).fetchall()
        finally:
            c.close()

    def integrity(self):
        """PRAGMA integrity_check on a read-only connection (the relay may be down after a kill:
        a read-only connection recovers the WAL in memory and leaves the files as they are)."""
        try:
            rows = self.db("PRAGMA integrity_check")
            return "ok" if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:5])
        except sqlite3.Error as e:
            return f"error: {e}"

    def pending(self):
        return self.db("SELECT count(*) FROM responses WHERE state IN ('queued','inflight','retry')")[0][0]


def metric_sum(m, name, pred=lambda k: True):
    return sum(v for k, v in m.items() if (k == name or k.startswith(name + "{")) and pred(k))


class Deliveries(DeliveryLog):
    """mock-apns' deliveries log (reliability_common.DeliveryLog), plus per push token counts and
    when each apns-id was first seen (this process's monotonic clock, and mock-apns' receivedAt)."""

    def __init__(self, path):
        super().__init__(path)
        self.first_at = {}
        self.by_token = collections.Counter()
        self.received_wall = {}  # apns-id -> mock-apns' receivedAt of the first delivery (UNIX s)

    def poll(self):
        self._now = time.monotonic()   # one reading per poll: the lines of one poll arrived together
        super().poll()

    def _seen(self, a, d, received_at):
        self.by_token[d.get("deviceToken", "")] += 1
        self.first_at.setdefault(a, self._now)
        if received_at is not None:
            self.received_wall.setdefault(a, received_at)


# --------------------------------------------------------------------------------------------
# Load


class Load(WorkerThreads):
    """Concurrent ingest on keep-alive HTTP/1.1 connections, one push token per thread, a fresh
    message index per request (so every request is a new response). Books every answer."""

    def __init__(self, port, secret, threads=8, rate=0.0, tokens=None, auth=None):
        self.port, self.secret, self.nthreads, self.rate = port, secret, threads, rate
        self.tokens = tokens or [os.urandom(32).hex() for _ in range(threads)]
        self.auth = auth
        self.acked = {}          # id -> (token, monotonic sent, monotonic acked)
        self.status = collections.Counter()
        self.errors = 0          # requests with no answer (connection refused/reset): not acknowledged
        self.refused = set()     # (token, session, messageIndex) answered 503: must never be stored
        self.lock = threading.Lock()
        self._init_threads(threads)

    def _worker(self, k):
        token = self.tokens[k % len(self.tokens)]
        session = str(uuid.uuid4()).upper()
        index = 0
        conn = None
        per = self.rate / self.nthreads if self.rate else 0
        start = time.monotonic()
        headers = {"Content-Type": "application/json"}
        if self.auth is not None:
            if self.auth:
                headers["Authorization"] = self.auth
        else:
            headers["Authorization"] = "Bearer " + self.secret
        while not self.stop_flag.is_set():
            if per:
                due = start + index / per
                now = time.monotonic()
                if due > now:
                    time.sleep(min(due - now, 0.2))
                    continue
            body = json.dumps({"pushToken": token, "sessionIdentifier": session, "keyID": RATCHET_KEY_ID,
                               "messageIndex": index, "encryptedData": SEALED})
            sent_index = index
            index += 1
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/v1/responses", body, headers)
                r = conn.getresponse()
                data = r.read()
                st = r.status
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                if conn:
                    conn.close()
                conn = None
                with self.lock:
                    self.errors += 1
                time.sleep(0.02)
                continue
            with self.lock:
                self.status[st] += 1
                if st in (200, 202):
                    self.acked[json.loads(data)["id"].lower()] = (token, t0, time.monotonic())
                elif st == 503:
                    self.refused.add((token.lower(), session.lower(), sent_index))
        if conn:
            conn.close()

    def snapshot(self):
        with self.lock:
            return dict(self.acked), collections.Counter(self.status), self.errors


def wait_delivered(env, dl, ids, seconds):
    """Waits until every id is in the mock's log; returns (seconds taken or None, missing ids)."""
    t0 = time.monotonic()
    while True:
        dl.poll()
        missing = [i for i in ids if dl.count[i] == 0]
        if not missing:
            return time.monotonic() - t0, []
        if time.monotonic() - t0 > seconds:
            return None, missing
        time.sleep(0.2)


def wait_pending_zero(env, seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if env.pending() == 0:
                return True
        except sqlite3.Error:
            pass
        time.sleep(0.25)
    return False


def classify_missing(env, missing):
    """Missing from the mock's log: answered 200 to the relay (a killed mock lost its log line)
    or truly lost."""
    answered, lost = [], []
    for i in missing:
        rows = env.db("SELECT count(*) FROM attempts WHERE response_id = ? AND status = 200", (i,))
        (answered if rows and rows[0][0] > 0 else lost).append(i)
    return answered, lost


# --------------------------------------------------------------------------------------------
# Sections


def event_mismatches(env):
    """Rows whose delivery events disagree with their state (docs/events.md): a terminal response
    without exactly one event of its type, or an event of a response that is not terminal. An
    event is written in the outcome's transaction, so a kill -9 anywhere leaves none of these."""
    return env.db("""
        SELECT count(*) FROM responses r
        LEFT JOIN (SELECT response_id, count(*) AS n, min(type) AS t FROM events WHERE response_id IS NOT NULL GROUP BY response_id) e
          ON e.response_id = r.id
        WHERE CASE WHEN r.state IN ('delivered', 'failed') THEN coalesce(e.n, 0) != 1 OR e.t != 'response.' || r.state
                   ELSE e.n IS NOT NULL END""")[0][0] + env.db("""
        SELECT count(*) FROM events e WHERE e.response_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM responses r WHERE r.id = e.response_id)""")[0][0]


def section_crash(env, args, results):
    log(f"crash: {args.rounds} rounds of kill -9")
    env.start_mock()
    env.start_relay()
    secret, _ = env.credential()
    load = Load(env.relay_port, secret, threads=args.threads).start()
    rng = random.Random(args.seed)
    rounds = []
    inflight_at_kills = 0
    mock_kills = 0
    try:
        for r in range(1, args.rounds + 1):
            if env.relay is None:
                env.start_relay()
            up = rng.uniform(0.4, 2.5 if not args.quick else 1.2)
            kill_mock = (r % 4 == 2)
            if kill_mock:
                time.sleep(up / 2)
                env.stop_mock(signal.SIGKILL)
                mock_kills += 1
                time.sleep(rng.uniform(0.2, 1.0))
                env.start_mock()
                time.sleep(up / 2)
            else:
                time.sleep(up)
            acked_before = len(load.snapshot()[0])
            env.kill_relay(signal.SIGKILL)
            inflight = env.db("SELECT count(*) FROM responses WHERE state = 'inflight'")[0][0]
            queued = env.db("SELECT count(*) FROM responses WHERE state IN ('queued','retry')")[0][0]
            integrity = env.integrity()
            events_off = event_mismatches(env)
            inflight_at_kills += inflight
            rounds.append({"round": r, "upSeconds": round(up, 2), "mockKilled": kill_mock,
                           "ackedSoFar": acked_before, "inflightAtKill": inflight, "queuedAtKill": queued,
                           "integrity": integrity, "eventMismatches": events_off})
            log(f"  round {r}: killed after {up:.2f}s, acked so far {acked_before}, inflight {inflight}, queued {queued}, "
                f"integrity_check {integrity}" + (" (mock-apns killed too)" if kill_mock else ""))
            time.sleep(rng.uniform(0.0, 0.3))
        env.start_relay()
        time.sleep(1.0)
    finally:
        load.stop()
    acked, status, errors = load.snapshot()
    drained = wait_pending_zero(env, 120)
    dl = Deliveries(env.log_path)
    took, missing = wait_delivered(env, dl, list(acked), 30 if drained else 5)
    answered, lost = classify_missing(env, missing)
    dups = sum(1 for i in acked if dl.count[i] > 1)
    extra = sum(dl.count[i] - 1 for i in acked if dl.count[i] > 1)
    st = env.status()
    counts = {}
    for s in ("queued", "inflight", "retry", "delivered", "failed"):
        counts[s] = env.db("SELECT count(*) FROM responses WHERE state = ?", (s,))[0][0]
    # A push can be delivered twice only if it was inflight (sent, answer not recorded) when
    # the relay died, or on the wire when mock-apns died (at most dispatch.maxInflight).
    bound = inflight_at_kills + mock_kills * 256
    integrity_ok = sum(1 for r in rounds if r["integrity"] == "ok")
    final_integrity = env.integrity()
    events_off = sum(r["eventMismatches"] for r in rounds) + event_mismatches(env)
    events = env.db("SELECT count(*) FROM events WHERE type = 'response.delivered'")[0][0]
    ok = (integrity_ok == len(rounds) and final_integrity == "ok" and not lost and drained and counts["queued"] == counts["inflight"] == counts["retry"] == 0
          and counts["failed"] == 0 and extra <= bound and len(acked) > 0 and events_off == 0 and events == counts["delivered"])
    res = {"rounds": len(rounds), "mockKills": mock_kills, "acked": len(acked), "statusCounts": dict(status),
           "unanswered": errors, "delivered": len(acked) - len(missing), "answered200NotLogged": len(answered),
           "lost": len(lost), "lostIds": lost[:20], "duplicateIds": dups, "extraDeliveries": extra,
           "duplicateBound": bound, "inflightAtKills": inflight_at_kills, "drained": drained,
           "finalStates": counts, "relayctlStatus": st, "integrityOkRounds": integrity_ok,
           "finalIntegrity": final_integrity, "eventMismatches": events_off, "deliveredEvents": events,
           "roundLog": rounds, "pass": ok}
    results["crash"] = res
    log(f"crash: acked {len(acked)}, lost {len(lost)}, duplicates {extra} (bound {bound}), final {counts}, "
        f"integrity_check ok after {integrity_ok}/{len(rounds)} kills and at the end: {final_integrity}: "
        + ("PASS" if ok else "FAIL"))
    env.kill_relay(signal.SIGTERM)
    env.stop_mock()


FAULT_ROWS = {
    # name: (description, how to inject, seconds)
    "5xx": "500 InternalServerError for every push, 3 s",
    "503": "503 ServiceUnavailable for half of the pushes, 3 s",
    "429": "429 TooManyRequests storm on one push token, 4 s (others keep flowing)",
    "goaway": "GOAWAY after every 20 streams per connection, 4 s",
    "close": "abrupt TCP close after every 25 streams per connection, 4 s",
    "abort": "connection dropped without an answer for 5% of pushes, 3 s",
    "stall": "10% of pushes never answered, 4 s (maxAnswerWaitMs 20000 fires, retried)",
    "tls": "TLS handshake failure (mock restarted with --tls-fault untrusted), 4 s",
    "refused": "connection refused (mock-apns stopped), 4 s",
    "expired": "403 ExpiredProviderToken for every token issued before now, 4 s",
}


def section_faults(env, args, results):
    rows = args.rows.split(",") if args.rows else list(FAULT_ROWS)
    log(f"faults: {', '.join(rows)}")
    env.start_mock()
    env.start_relay()
    secret, _ = env.credential()
    table = []
    dl = Deliveries(env.log_path)
    for name in rows:
        if name not in FAULT_ROWS:
            raise SystemExit(f"unknown fault row {name} (known: {', '.join(FAULT_ROWS)})")
    for name in rows:
        try:
            table.append(_fault_row(env, args, secret, dl, name))
        except (OSError, RuntimeError, http.client.HTTPException) as e:
            died = env.mock.poll() if env.mock else None
            relay_died = env.relay.poll() if env.relay else None
            note = f"harness error: {e!r}; mock-apns exit {died}; relay-server exit {relay_died}"
            log(f"  {name}: {note}  <-- FAIL")
            table.append({"row": name, "fault": FAULT_ROWS[name], "pass": False, "note": note, "acked": 0,
                          "ackedDuringFault": 0, "recovered": False, "secondsToRecover": None, "lost": None,
                          "answered200NotLogged": 0, "duplicates": None, "retries": None, "nonSuccessAnswers": None})
            kill_all_but_none = [p for p in (env.mock, env.relay) if p and p.poll() is None]
            for p in kill_all_but_none:
                p.kill()
                p.wait()
            env.mock = env.relay = None
            env.start_mock()
            env.start_relay()
    results["faults"] = table
    env.kill_relay(signal.SIGTERM)
    env.stop_mock()


def _fault_row(env, args, secret, dl, name):
    if True:
        dl.poll()
        m0 = env.metrics()
        closed0 = env.mock_stats().get("connectionsClosedByFault", 0) if name == "close" else 0
        expired0 = env.mock_stats().get("byStatusReason", {}).get("403 ExpiredProviderToken", 0) if name == "expired" else 0
        load = Load(env.relay_port, secret, threads=args.threads, rate=args.rate).start()
        time.sleep(1.0)
        storm_token = load.tokens[0]
        t_fault = time.monotonic()
        hold = 3.0 if name in ("5xx", "503", "abort") else 4.0
        if name == "5xx":
            env.faults([{"status": 500}])
        elif name == "503":
            env.faults([{"status": 503, "fraction": 0.5}])
        elif name == "429":
            env.faults([{"status": 429, "deviceToken": storm_token}])
        elif name == "goaway":
            env.faults([{"goAwayAfter": 20}])
        elif name == "close":
            env.faults([{"closeAfter": 25}])
        elif name == "abort":
            env.faults([{"abort": True, "fraction": 0.05}])
        elif name == "stall":
            env.faults([{"stall": True, "fraction": 0.1}])
        elif name == "tls":
            env.stop_mock()
            env.start_mock(tls_fault="untrusted")
        elif name == "refused":
            env.stop_mock()
        elif name == "expired":
            # +1: a token minted in this very second (after a reconnect) is expired too.
            env.faults([{"expireTokensIssuedBefore": int(time.time()) + 1}])
        time.sleep(hold)
        if name in ("tls", "refused"):
            env.stop_mock()
            env.start_mock()
        else:
            env.clear_faults()
        t_clear = time.monotonic()
        t_clear_wall = time.time()
        acked_at_clear = dict(load.snapshot()[0])
        during = {i: v for i, v in acked_at_clear.items() if v[1] >= t_fault}
        time.sleep(1.0)
        load.stop()
        acked, status, errors = load.snapshot()
        took, missing = wait_delivered(env, dl, list(acked_at_clear), 60)
        # wait for the rest (acked after the clear) without timing it
        _, missing_all = wait_delivered(env, dl, list(acked), 30)
        # mock-apns is never killed here (stopped with SIGTERM at most, which flushes its log):
        # anything missing from its log is lost, whatever the relay recorded.
        answered, _ = classify_missing(env, missing_all)
        lost = missing_all
        m1 = env.metrics()
        retries = metric_sum(m1, "relay_push_retries_total") - metric_sum(m0, "relay_push_retries_total")
        non200 = (metric_sum(m1, "relay_pushes_total", lambda k: 'status="200"' not in k)
                  - metric_sum(m0, "relay_pushes_total", lambda k: 'status="200"' not in k))
        extra = sum(dl.count[i] - 1 for i in acked if dl.count[i] > 1)
        row = {"row": name, "fault": FAULT_ROWS[name], "acked": len(acked), "ackedDuringFault": len(during),
               "recovered": took is not None and not lost, "secondsToRecover": round(took, 2) if took is not None else None,
               "lost": len(lost), "answered200NotLogged": len(answered), "duplicates": extra,
               "retries": int(retries), "nonSuccessAnswers": int(non200), "ingestStatus": dict(status),
               "unanswered": errors}
        if name == "429":
            # Other tokens keep flowing: their pushes acknowledged during the storm (up to 0.5 s
            # before it was cleared) reached mock-apns before the storm ended (its receivedAt).
            others = [i for i, v in during.items() if v[0] != storm_token and v[2] <= t_clear - 0.5]
            flowed = sum(1 for i in others if dl.received_wall.get(i, float("inf")) <= t_clear_wall)
            row["othersDeliveredDuringStorm"] = f"{flowed}/{len(others)}"
            row["othersFlowing"] = len(others) > 0 and flowed >= 0.9 * len(others)
            row["recovered"] = row["recovered"] and row["othersFlowing"]
        # Every row but GOAWAY and close must have made the relay retry (GOAWAY'd streams were
        # never processed: PushClient resends them on a new connection without a failed attempt).
        # A close fails only the streams still open on that connection, and with few in flight
        # there may be none: the row then shows the mock closed connections (the fault acted).
        row["integrity"] = env.integrity()
        if name == "close":
            row["connectionsClosed"] = env.mock_stats().get("connectionsClosedByFault", 0) - closed0
            acted = row["connectionsClosed"] > 0
        else:
            # refused: mock-apns is down for the whole fault, so it acted; PushClient's pushes
            # wait for its next paced connection attempt instead of failing, which may land
            # after the restart (no retry at all).
            acted = name in ("goaway", "refused") or row["retries"] > 0
        if name == "expired":
            # PushClient retries an ExpiredProviderToken once itself, on a fresh connection that
            # waits for its pacer: that retry may land after the fault, and the relay then sees
            # no failure at all. The mock's own count of 403s says whether the fault acted.
            row["expiredAnswers"] = env.mock_stats().get("byStatusReason", {}).get("403 ExpiredProviderToken", 0) - expired0
            acted = row["expiredAnswers"] > 0
        row["pass"] = row["recovered"] and row["lost"] == 0 and acted and row["integrity"] == "ok"
        if env.mock is None or env.mock.poll() is not None:
            row["pass"] = False
            row["note"] = f"mock-apns exited ({env.mock.poll() if env.mock else 'gone'})"
        log(f"  {name}: recovered {row['recovered']} in {row['secondsToRecover']} s, lost {row['lost']}, "
            f"duplicates {extra}, retries {row['retries']}, integrity_check {row['integrity']}"
            + ("" if row["pass"] else "  <-- FAIL"))
        wait_pending_zero(env, 30)
        return row


def last_log_line(env):
    try:
        with open(os.path.join(env.work, "relay.log"), "rb") as f:
            lines = [l for l in f.read().decode(errors="replace").splitlines() if l.strip()]
        return lines[-1][:300] if lines else ""
    except OSError:
        return ""


def _tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


def _umount(path):
    subprocess.run(["umount", "-l", path], capture_output=True)


def section_storage(env, args, results):
    out = []
    results["storage"] = out
    mnt = os.path.join(env.work, "tmpfs")
    ok, err = _tmpfs(mnt, "48m")
    if not ok:
        out.append({"case": "all", "pass": None, "note": f"tmpfs mount not possible here ({err}); skipped"})
        return
    try:
        # minFreeBytes 0: the default 1 GiB floor would refuse every ingest on this 48 MiB tmpfs
        # (/readyz 503 from the start); here the disk must really fill so failed COMMITs are
        # exercised. The floor itself has its own tests (BoundedDiskTests).
        env.write_config(os.path.join(mnt, "relay.db"), min_free_bytes=0)
        env.start_mock()
        env.start_relay()
        secret, _ = env.credential()
        dl = Deliveries(env.log_path)

        # 1. disk full: a filler file takes the rest of the tmpfs.
        load = Load(env.relay_port, secret, threads=4, rate=300).start()
        time.sleep(1.0)
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        full_at = time.monotonic()
        base = load.snapshot()
        saw503 = None
        while time.monotonic() - full_at < 30:
            s = load.snapshot()[1]
            if s[503] > base[1][503]:
                saw503 = time.monotonic() - full_at
                break
            time.sleep(0.1)
        time.sleep(1.0)
        # An operator's write during the episode, as the disk-full runbook suggests: relayctl
        # purge (its own connection, stock SQLite) while the relay keeps failing commits. It may
        # fail (exit 1, a message), never crash, and must leave the database intact.
        pr = subprocess.run([os.path.join(env.bin, "relayctl"), "purge", "--delivered", "--older-than", "1s",
                             "--config", env.config], capture_output=True, text=True, timeout=60)
        purge_note = f"exit {pr.returncode}: " + (pr.stdout.strip() or pr.stderr.strip()).splitlines()[-1][:160] \
            if (pr.stdout.strip() or pr.stderr.strip()) else f"exit {pr.returncode}"
        time.sleep(1.0)
        during_full = load.snapshot()
        acked_while_full = {i for i, v in during_full[0].items() if v[1] >= full_at + (saw503 or 0) + 0.5}
        integrity_full = env.integrity()
        # kill -9 while the disk is still full: what a COMMIT that failed (503) left behind must
        # not come back when the relay recovers the WAL.
        env.kill_relay(signal.SIGKILL)
        integrity_killed = env.integrity()
        os.remove(filler)
        env.start_relay()
        freed_at = time.monotonic()
        recovered = None
        n0 = len(load.snapshot()[0])
        while time.monotonic() - freed_at < 30:
            if len(load.snapshot()[0]) > n0 + 20:
                recovered = time.monotonic() - freed_at
                break
            time.sleep(0.1)
        load.stop()
        acked, status, _ = load.snapshot()
        _, missing = wait_delivered(env, dl, list(acked), 60)
        lost = missing
        s_full = {k: during_full[1][k] - base[1][k] for k in during_full[1]}
        integrity_after = env.integrity()
        # The content audit: every acknowledged id still has its row, unless relayctl purge
        # removed it after delivery (then it is in mock-apns' log).
        present = {r[0] for r in env.db("SELECT id FROM responses")}
        absent_undelivered = [i for i in acked if i not in present and dl.count[i] == 0]
        with load.lock:
            refused = set(load.refused)
        stored = {(t.lower(), s.lower(), m) for t, s, m in
                  env.db("SELECT push_token, session_id, message_index FROM responses")}
        refused_but_stored = len(refused & stored)
        out.append({"case": "disk full (tmpfs 48 MiB, filler file), relayctl purge during it, kill -9 while full",
                    "secondsTo503": saw503 and round(saw503, 2),
                    "answersWhileFull": s_full, "acked202WhileFull": len(acked_while_full),
                    "relayctlPurgeWhileFull": purge_note,
                    "secondsToRecover (restart included)": recovered and round(recovered, 2), "lost": len(lost), "acked": len(acked),
                    "ackedRowsMissing": len(absent_undelivered), "refused503": len(refused),
                    "refused503Stored": refused_but_stored,
                    "integrityWhileFull": integrity_full, "integrityAfterKill": integrity_killed,
                    "integrityAfter": integrity_after,
                    "pass": (saw503 is not None and recovered is not None and not lost and status.get(500, 0) == 0
                             and pr.returncode in (0, 1) and integrity_full == "ok" and integrity_killed == "ok"
                             and integrity_after == "ok" and not absent_undelivered and refused_but_stored == 0
                             and len(refused) > 0)})

        # 2. DB locked by another process: sqlite3 CLI holds BEGIN EXCLUSIVE for 3 s (> busyTimeoutMs 1000).
        load = Load(env.relay_port, secret, threads=4, rate=300).start()
        time.sleep(1.0)
        cli = subprocess.Popen(["sqlite3", env.db_path], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        STARTED.append(cli)
        cli.stdin.write(".timeout 10000\nBEGIN EXCLUSIVE;\nSELECT 1;\n")
        cli.stdin.flush()
        locked_at = time.monotonic()
        base = load.snapshot()
        time.sleep(3.0)
        during = load.snapshot()
        acked_locked = {i for i, v in during[0].items() if locked_at + 1.2 <= v[1] and v[2] <= locked_at + 3.0}
        cli.stdin.write("COMMIT;\n.quit\n")
        cli.stdin.flush()
        cli.wait(timeout=10)
        freed_at = time.monotonic()
        recovered = None
        n0 = len(load.snapshot()[0])
        while time.monotonic() - freed_at < 30:
            if len(load.snapshot()[0]) > n0 + 20:
                recovered = time.monotonic() - freed_at
                break
            time.sleep(0.1)
        load.stop()
        acked, status, _ = load.snapshot()
        _, missing = wait_delivered(env, dl, list(acked), 60)
        lost = missing
        s_locked = {k: during[1][k] - base[1][k] for k in during[1]}
        integrity = env.integrity()
        out.append({"case": "DB locked (sqlite3 BEGIN EXCLUSIVE, 3 s; busyTimeoutMs 1000)",
                    "answersWhileLocked": s_locked, "acked202WhileLocked": len(acked_locked),
                    "secondsToRecover": recovered and round(recovered, 2), "lost": len(lost), "acked": len(acked),
                    "integrity": integrity,
                    "pass": s_locked.get(503, 0) > 0 and not acked_locked and recovered is not None and not lost
                            and integrity == "ok"})

        # 3. read-only DB: the file system holding it is remounted read-only (relay stopped
        # first: Linux refuses an ro remount while a file is open for writing).
        env.kill_relay(signal.SIGTERM)
        r = subprocess.run(["mount", "-o", "remount,ro", mnt], capture_output=True, text=True)
        if r.returncode != 0:
            out.append({"case": "read-only DB", "pass": None, "note": f"remount ro failed: {r.stderr.strip()}"})
        else:
            proc = env.start_relay(wait=False)
            time.sleep(2.0)
            alive = proc.poll() is None
            answers = collections.Counter()
            readyz = None
            if alive:
                try:
                    readyz = req(env.admin_port, "GET", "/readyz", timeout=2)[0]
                except OSError:
                    pass
                load = Load(env.relay_port, secret, threads=2, rate=100).start()
                time.sleep(2.0)
                load.stop()
                answers = load.snapshot()[1]
            subprocess.run(["mount", "-o", "remount,rw", mnt], check=True)
            recovered = None
            t0 = time.monotonic()
            restarted = False
            if alive:
                load = Load(env.relay_port, secret, threads=2, rate=100).start()
                while time.monotonic() - t0 < 15:
                    if load.snapshot()[1][202] > 10:
                        recovered = time.monotonic() - t0
                        break
                    time.sleep(0.1)
                load.stop()
            if recovered is None:
                env.kill_relay(signal.SIGTERM)
                env.start_relay()
                restarted = True
                load = Load(env.relay_port, secret, threads=2, rate=100).start()
                time.sleep(1.5)
                load.stop()
                recovered = (time.monotonic() - t0) if load.snapshot()[1][202] > 0 else None
            exit_note = "" if alive else f"relay-server refused to start (exit {proc.returncode}): {last_log_line(env)}"
            integrity = env.integrity()
            out.append({"case": "read-only DB (tmpfs remounted ro, relay started on it)",
                        "relayRunning": alive, "readyz": readyz, "answersWhileReadOnly": dict(answers),
                        "note": exit_note, "recoveredWithoutRestart": not restarted,
                        "secondsToRecover": round(recovered, 2) if recovered else None, "integrity": integrity,
                        "pass": answers.get(202, 0) == 0 and recovered is not None and (alive is False or answers.get(503, 0) > 0)
                                and integrity == "ok"})
        env.kill_relay(signal.SIGTERM)
        env.stop_mock()
    finally:
        if env.relay:
            env.kill_relay()
        _umount(mnt)
        env.write_config(os.path.join(env.work, "relay.db"))


def _raw(port, data, read_timeout=5.0):
    """Sends raw bytes, returns (status or None, seconds until the server closed or answered)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        buf = b""
        t0 = time.monotonic()
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, OSError):
                break
            if not chunk:
                break
            buf += chunk
            if b"\r\n\r\n" in buf:
                break
        m = re.match(rb"HTTP/1\.[01] (\d{3})", buf)
        return (int(m.group(1)) if m else None), time.monotonic() - t0, buf
    finally:
        s.close()


def section_badinput(env, args, results):
    out = []
    results["badinput"] = out
    env.start_mock()
    env.start_relay()
    secret, cred_id = env.credential()
    revoked_secret, revoked_id = env.credential("revoked")
    env.revoke(revoked_id)
    port = env.relay_port
    good = Load(port, secret, threads=2, rate=100).start()

    def post(body, headers=None):
        h = {"Content-Type": "application/json", "Authorization": "Bearer " + secret}
        h.update(headers or {})
        st, data, _ = req(port, "POST", "/v1/responses", body, h)
        return st, data

    def case(name, expect, got, detail=""):
        ok = got in expect if isinstance(expect, (set, tuple, list)) else got == expect
        out.append({"case": name, "expected": str(expect), "got": str(got), "detail": detail, "pass": ok})
        log(f"  {name}: {got} {'ok' if ok else 'FAIL'} {detail}")

    tok = os.urandom(32).hex()
    sess = str(uuid.uuid4())
    valid = {"pushToken": tok, "sessionIdentifier": sess, "keyID": RATCHET_KEY_ID, "messageIndex": 1, "encryptedData": SEALED}
    # invalid UTF-8 inside a string, deep nesting, huge bodies
    b = json.dumps(valid).encode().replace(b'"pushToken"', b'"push\xff\xfeToken"')
    st, data = post(b)
    case("invalid UTF-8 in a member name", 400, st, data.decode("latin-1")[:80])
    b = json.dumps(valid).encode()[:-1] + b',"app":"com.example.\xc3\x28"}'
    st, data = post(b)
    case("invalid UTF-8 in a value", 400, st, data.decode("latin-1")[:80])
    deep = b'{"pushToken":' + b"[" * 100000 + b"]" * 100000 + b"}"
    st, data = post(deep)
    case("100,000-deep nested JSON (within body limit? no: 200 KB)", {400, 413}, st, data.decode()[:80])
    deep = b'{"app":' + b"[" * 5000 + b"]" * 5000 + b"}"
    st, data = post(deep)
    case("5,000-deep nested JSON (10 KB)", 400, st, data.decode()[:80])
    st, data = post(b"{" + b'"a":1,' * 4000 + b'"b":1}')
    case("20 KB body (> maxBodyBytes 16384)", 413, st, data.decode()[:80])
    st, _, _ = _raw(port, b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
                    + secret.encode() + b"\r\nContent-Length: 1073741824\r\n\r\n" + b"{" * 65536)
    case("declared 1 GiB body", 413, st)
    st, _, _ = _raw(port, b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + (b"4000\r\n" + b"x" * 0x4000 + b"\r\n") * 8)
    case("chunked body past the limit", 413, st)
    # header floods
    st, _, _ = _raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-F%d: y\r\n" % i for i in range(500)) + b"\r\n")
    case("500 header fields", 431, st)
    st, _, _ = _raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    case("one 70 KB header", 431, st)
    # unauthenticated / revoked under load
    bad_auths = {"none": "", "garbage": "Bearer nope", "unknown": "Bearer rk_" + base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("="),
                 "revoked": "Bearer " + revoked_secret, "basic": "Basic dXNlcjpwYXNz"}
    loads = {k: Load(port, None, threads=2, auth=v).start() for k, v in bad_auths.items()}
    time.sleep(3.0)
    for ld in loads.values():
        ld.stop()
    for k, ld in loads.items():
        acked, status, _ = ld.snapshot()
        accepted = sum(v for s, v in status.items() if 200 <= s < 300)
        case(f"credential {k} under load ({sum(status.values())} requests)", 0, accepted, f"statuses {dict(status)}")
    # revocation takes effect immediately for a credential in use
    live_secret, live_id = env.credential("to-revoke")
    ld = Load(port, live_secret, threads=2).start()
    time.sleep(1.0)
    env.revoke(live_id)
    t_rev = time.monotonic()
    time.sleep(1.5)
    ld.stop()
    acked, status, _ = ld.snapshot()
    late = sum(1 for v in acked.values() if v[1] > t_rev + 0.05)
    case("credential revoked while in use: 202s for requests sent after the revoke", 0, late,
         f"before: {len(acked) - late} accepted, then {status.get(401, 0)} x 401")
    # slowloris: one byte a second; the server closes at its header deadline (10 s default)
    if not args.quick:
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/responses HTTP/1.1\r\n")
            socks.append(s)
        t0 = time.monotonic()
        closed = 0
        while time.monotonic() - t0 < 25 and closed < len(socks):
            for s in socks:
                if s.fileno() < 0:
                    continue
                try:
                    s.sendall(b"X")
                except OSError:
                    s.close()
                    closed += 1
            time.sleep(1.0)
        took = time.monotonic() - t0
        for s in socks:
            s.close()
        case("slowloris: 200 connections sending a byte a second, closed by the header timeout", 200, closed, f"all closed after {took:.1f} s")
        # idle connections
        n = args.idle
        idle = []
        t0 = time.monotonic()
        failed = 0
        for _ in range(n):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                failed += 1
        time.sleep(1.0)
        before = good.snapshot()[1][202]
        time.sleep(2.0)
        after = good.snapshot()[1][202]
        m = env.metrics()
        open_now = metric_sum(m, "relay_http_connections_open", lambda k: "ingest" in k)
        for s in idle:
            s.close()
        case(f"{n} idle connections: ingest keeps answering 202 meanwhile", True, after - before > 50,
             f"{after - before} x 202 in 2 s while {int(open_now)} connections open ({failed} connects failed)")
    good.stop()
    acked, status, _ = good.snapshot()
    dl = Deliveries(env.log_path)
    _, missing = wait_delivered(env, dl, list(acked), 30)
    case("background good load during all of the above: every 202 delivered", 0, len(missing), f"{len(acked)} acked; statuses {dict(status)}")
    alive = env.relay.poll() is None
    case("relay-server still running", True, alive)
    env.kill_relay(signal.SIGTERM)
    env.stop_mock()


# --------------------------------------------------------------------------------------------
# Report


def markdown(results, args, elapsed):
    L = []
    try:
        commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"
    L.append(f"Run {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} at commit {commit}, {elapsed:.0f} s, "
             f"binaries `{args.bin}`, command `{' '.join(sys.argv)}`, load average at the end "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a shared machine is noisy: timings vary run to run).")
    L.append("")
    c = results.get("crash")
    if c:
        L.append("### Crash (kill -9)")
        L.append("")
        L.append("| rounds | mock-apns kills | 202 acked | delivered (mock log) | answered 200, log line lost with the killed mock | lost | ids delivered twice | extra deliveries | bound (inflight at kills + 256 per mock kill) | left queued/inflight/retry | failed | integrity_check ok (after each kill, at the end) | result |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        f = c["finalStates"]
        L.append(f"| {c['rounds']} | {c['mockKills']} | {c['acked']} | {c['delivered']} | {c['answered200NotLogged']} | **{c['lost']}** | "
                 f"{c['duplicateIds']} | {c['extraDeliveries']} | {c['duplicateBound']} | {f['queued'] + f['inflight'] + f['retry']} | {f['failed']} | "
                 f"{c['integrityOkRounds']}/{c['rounds']}, {c['finalIntegrity']} | {'pass' if c['pass'] else '**FAIL**'} |")
        L.append("")
        L.append(f"Ingest answers during the rounds: {c['statusCounts']}; requests that got no answer (relay killed under them, not acknowledged): {c['unanswered']}.")
        L.append("")
    fr = results.get("faults")
    if fr:
        L.append("### Fault matrix (mock-apns faults under steady load)")
        L.append("")
        L.append("| fault | recovered | time to recover (s) | 202 acked (during fault) | lost | duplicates | retries | non-200 APNs answers | integrity_check | note | result |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in fr:
            note = f"other tokens delivered during the storm: {r['othersDeliveredDuringStorm']}" if "othersDeliveredDuringStorm" in r else ""
            if "connectionsClosed" in r:
                note += f"connections closed by the fault: {r['connectionsClosed']}"
            if r["answered200NotLogged"]:
                note += f" {r['answered200NotLogged']} answered 200 but not in the mock log"
            L.append(f"| {r['fault']} | {'yes' if r['recovered'] else '**no**'} | {r['secondsToRecover']} | {r['acked']} ({r['ackedDuringFault']}) | "
                     f"**{r['lost']}** | {r['duplicates']} | {r['retries']} | {r['nonSuccessAnswers']} | {r.get('integrity', '')} | {note} | {'pass' if r['pass'] else '**FAIL**'} |")
        L.append("")
        L.append("Time to recover: from clearing the fault until every response acknowledged up to then was in mock-apns' log.")
        L.append("")
    st = results.get("storage")
    if st:
        L.append("### Storage faults")
        L.append("")
        L.append("| case | observed | result |")
        L.append("|---|---|---|")
        for r in st:
            obs = "; ".join(f"{k}: {v}" for k, v in r.items() if k not in ("case", "pass"))
            L.append(f"| {r['case']} | {obs} | {'pass' if r['pass'] else ('skipped' if r['pass'] is None else '**FAIL**')} |")
        L.append("")
    pg = results.get("postgres")
    if pg:
        import reliability_pg
        L.append("### PostgreSQL: three nodes, kill -9 and database restarts")
        L.append("")
        L.append(reliability_pg.markdown(pg))
    bi = results.get("badinput")
    if bi:
        L.append("### Bad input")
        L.append("")
        L.append("| case | expected | got | detail | result |")
        L.append("|---|---|---|---|---|")
        for r in bi:
            d = r["detail"].replace("|", "/")
            L.append(f"| {r['case']} | {r['expected']} | {r['got']} | {d} | {'pass' if r['pass'] else '**FAIL**'} |")
        L.append("")
    return "\n".join(L)


def all_pass(results):
    ok = True
    if "postgres" in results:
        ok &= results["postgres"].get("pass", False) or "skipped" in results["postgres"]
    if "crash" in results:
        ok &= results["crash"]["pass"]
    for r in results.get("faults", []):
        ok &= r["pass"]
    for r in results.get("storage", []):
        ok &= r["pass"] is not False
    for r in results.get("badinput", []):
        ok &= r["pass"]
    return bool(ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="directory holding relay-server, mock-apns, relayctl")
    ap.add_argument("--sections", default="crash,faults,storage,badinput")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rows", default="", help=f"fault rows (default all: {','.join(FAULT_ROWS)})")
    ap.add_argument("--threads", type=int, default=8, help="ingest client threads")
    ap.add_argument("--rate", type=float, default=300.0, help="offered load during the fault matrix (responses/s)")
    ap.add_argument("--idle", type=int, default=10000, help="idle connections in the bad-input section")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="CI size: shorter rounds, no slowloris/idle cases")
    ap.add_argument("--work", default=None, help="work directory (default: a temp dir, removed on success)")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    ap.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--scenarios", default="kill,fast,immediate,outage,stall", help="postgres scenarios")
    ap.add_argument("--pg-rounds", type=int, default=6, help="postgres: kill -9 rounds (one node each)")
    ap.add_argument("--pg-rate", type=float, default=300.0, help="postgres: offered load (responses/s, all nodes)")
    ap.add_argument("--lease", type=int, default=12, help="postgres: store.leaseSeconds (requestTimeoutMs is 2 s less, at most 10 s)")
    ap.add_argument("--mock-latency", type=int, default=150, help="postgres: mock-apns answers every push after this many ms")
    ap.add_argument("--stall", type=float, default=20.0, help="postgres: seconds the stall scenario keeps the server SIGSTOPped")
    ap.add_argument("--outage", type=float, default=30.0, help="postgres: seconds the database stays stopped")
    ap.add_argument("--plant-loss", action="store_true",
                    help="postgres: delete one acknowledged, unsent row mid-run (the run must then fail)")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    for exe in ("relay-server", "mock-apns", "relayctl"):
        if not os.access(os.path.join(args.bin, exe), os.X_OK):
            print(f"reliability: {args.bin}/{exe} not found (build first)", file=sys.stderr)
            return 64
    work = args.work or tempfile.mkdtemp(prefix="reliability.")
    os.makedirs(work, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = max(soft, args.idle * 2 + 1024)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, max(hard, want)), max(hard, want)))
    except (ValueError, OSError):
        pass
    results = {"seed": args.seed}
    t0 = time.monotonic()
    code = 1
    try:
        sections = [] if args.backend == "postgres" else args.sections.split(",")
        if args.backend == "postgres":
            import reliability_pg
            reliability_pg.run(sys.modules[__name__], args, work, results)
        for name in sections:
            env = Env(args.bin, os.path.join(work, name))
            {"crash": section_crash, "faults": section_faults, "storage": section_storage,
             "badinput": section_badinput}[name](env, args, results)
            kill_all()
        code = 0 if all_pass(results) else 1
    except KeyboardInterrupt:
        code = 130
    except Exception:
        # The results name what broke the run, so a caller holding only the JSON can say why.
        results["error"] = traceback.format_exc()
        raise
    finally:
        kill_all()
        results["pass"] = code == 0
        md = markdown(results, args, time.monotonic() - t0)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(results, f, indent=1, default=str)
        if args.md_out:
            with open(args.md_out, "w") as f:
                f.write(md + "\n")
        print(md)
        if code == 0 and not args.work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")
    return code


if __name__ == "__main__":
    sys.exit(main())
