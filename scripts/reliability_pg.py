"""The PostgreSQL backend of the reliability harness (issue 25; `scripts/reliability.py --backend
postgres`, docs/reliability.md "PostgreSQL"). Python 3 standard library and the `psql` client.

Three relay-server nodes (nodeId relay-1..3, one config each) share one throwaway PostgreSQL
cluster (scripts/pg-test.sh start, in a temp dir, on a free loopback port) and deliver to one
mock-apns. A load generator posts through all three nodes as a load balancer would: each client
thread has its own node, push token and session; a request without an answer (its node killed)
is sent again, the same bytes, to the next node; a 503 is sent again after its Retry-After (at
most 1 s). Scenarios, each under that load, each followed by an audit:

  kill      ROUNDS rounds: kill -9 of one node (in turn), restarted 0.5-2 s later with the same
            nodeId (it takes its own leases back); in the full run the last round keeps the node
            down past leaseSeconds, so the other nodes must take its leases over.
  fast      `pg_ctl restart -m fast` mid-load.
  immediate `pg_ctl restart -m immediate` mid-load (PostgreSQL's crash recovery).
  outage    PostgreSQL stopped (`pg_ctl stop -m fast`) for OUTAGE seconds (30), then started.
  stall     PostgreSQL's processes SIGSTOPped for STALL seconds (20), then SIGCONTinued: open
            connections that answer nothing (a hung server or a partition), where ingest must
            still answer 503 within seconds.

Audit after each scenario (once the outbox has drained): every acknowledged id (202, or 200 for
a resent request) has its row with the bytes that were sent (push token, session, keyID, message
index, encryptedData), ends delivered (in mock-apns' deliveries log, whose payload carries the
same encryptedData) or failed with a reason; none lost; no row inflight once its lease is 5 s
past; duplicates (mock-apns' count per apns-id) attributed to the rows a killed node held leased
or to the rows inflight across a database outage, and within that bound. During (fast, immediate,
outage, stall) every ingest answer is booked: 202 only for rows that are there afterwards, 503
with Retry-After and `storage_unavailable`, no request left hanging (10 s) or answered later than
store.requestTimeoutMs (5 s) + 1 s; in outage and stall at least one 503 and /readyz of every node
polled (each node fails, none answers 200, while the database is down); time from the database's return to each node's first 202
and first /readyz 200.

`--plant-loss` deletes one acknowledged, not yet sent row mid-run (the harness must report it
lost and fail): a check that the audit can fail.
"""
import base64
import collections
import glob
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import uuid
from reliability_common import DeliveryLog, WorkerThreads

LEASE_SECONDS = 12          # --lease; must exceed maxQueueWaitMs + maxAnswerWaitMs + 1 s (set to 1 s and lease - 3 s)
GRACE_MS = 5000             # an inflight row whose lease is this far past counts as stuck
STORE_DEADLINE_MS = 5000    # store.requestTimeoutMs (the default, written to each node's config)
# docs/postgres.md: ingest answers (503 storage_unavailable at worst) within requestTimeoutMs of the
# request reaching the store; 1 s more for the HTTP layer and this Python client on a loaded box.
SLOW_ANSWER = STORE_DEADLINE_MS / 1000 + 1.0
CLIENT_TIMEOUT = 2 * STORE_DEADLINE_MS / 1000  # an ingest request without an answer for this long counts as hanging


def now_ms():
    return int(time.time() * 1000)


class DBError(Exception):
    pass


class Cluster:
    """A throwaway cluster through scripts/pg-test.sh; queries through psql."""

    def __init__(self, repo):
        self.script = os.path.join(repo, "scripts", "pg-test.sh")
        # /tmp directly: as root, pg-test.sh hands the directory to the postgres user, who must
        # be able to reach it (a directory under a 0700 parent would not do).
        self.dir = os.path.join("/tmp", "relay-pg-reliability-" + uuid.uuid4().hex[:8])
        out = subprocess.run(["bash", self.script, "start", self.dir], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"pg-test.sh start failed: {out.stderr.strip()}")
        self.url = out.stdout.strip().splitlines()[-1]
        self.psql = psql_path()

    def ctl(self, what):
        out = subprocess.run(["bash", self.script, what, self.dir], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"pg-test.sh {what} failed: {out.stderr.strip()}")

    def server_pids(self):
        """The postmaster (first line of postmaster.pid) and its children: the processes of the
        cluster this harness started, by pid."""
        with open(os.path.join(self.dir, "data", "postmaster.pid")) as f:
            master = int(f.readline())
        pids = [master]
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == master:
                    pids.append(int(d))
        return pids

    def destroy(self):
        subprocess.run(["bash", self.script, "stop", self.dir], capture_output=True, timeout=120)

    def q(self, sql, timeout=30):
        env = dict(os.environ, PGCONNECT_TIMEOUT="2")
        try:
            r = subprocess.run([self.psql, self.url, "-X", "-q", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                               capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise DBError("psql timed out")
        if r.returncode != 0:
            raise DBError(r.stderr.strip()[:300])
        return [line.split("\t") for line in r.stdout.splitlines() if line != ""]

    def reachable(self):
        try:
            return self.q("SELECT 1", timeout=5) == [["1"]]
        except DBError:
            return False


def psql_path():
    for d in [os.environ.get("PG_BINDIR", "")] + sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if d and os.access(os.path.join(d, "psql"), os.X_OK):
            return os.path.join(d, "psql")
    p = shutil.which("psql")
    if p:
        return p
    raise RuntimeError("no psql (apt-get install postgresql, or make deps)")


def available():
    """PostgreSQL's server binaries and psql are installed (what pg-test.sh needs)."""
    have = any(os.access(os.path.join(d, "pg_ctl"), os.X_OK)
               for d in [os.environ.get("PG_BINDIR", "")] + glob.glob("/usr/lib/postgresql/*/bin") if d)
    try:
        psql_path()
    except RuntimeError:
        return False
    return have or shutil.which("pg_ctl") is not None


class Node:
    def __init__(self, name, work):
        self.name = name
        self.port, self.admin_port = None, None
        self.config = os.path.join(work, f"{name}.json")
        self.log = open(os.path.join(work, f"{name}.log"), "ab")
        self.proc = None


class PGEnv:
    """mock-apns (with the SQLite harness' Env: key material, certificate, deliveries log) and
    three relay-server nodes on one cluster."""

    def __init__(self, R, args, work, cluster, nodes=3):
        self.R = R
        self.base = R.Env(args.bin, work)  # keys, CA, mock-apns ports and log
        self.bin = args.bin
        self.work = work
        self.cluster = cluster
        self.nodes = []
        for k in range(1, nodes + 1):
            n = Node(f"relay-{k}", work)
            n.port, n.admin_port = R.free_port(), R.free_port()
            self._write_config(n)
            self.nodes.append(n)

    def _write_config(self, n):
        b = self.base
        cfg = {
            "listen": {"host": "127.0.0.1", "port": n.port},
            "admin": {"host": "127.0.0.1", "port": n.admin_port},
            "store": {"kind": "postgres", "url": self.cluster.url, "nodeId": n.name, "leaseSeconds": LEASE_SECONDS,
                      "requestTimeoutMs": STORE_DEADLINE_MS, "maxPending": 5000000},
            "ingest": {"rateLimits": {"perCredential": {"perSecond": 0, "burst": 1},
                                      "perPushToken": {"perSecond": 0, "burst": 1},
                                      "authFailuresPerAddress": {"perSecond": 0, "burst": 1}}},
            "dispatch": {"maxInflight": 256, "backoffBaseMs": 200, "backoffCapMs": 2000, "tooManyRequestsDelayMs": 2000,
                         # leaseSeconds must exceed what the APNs client may hold a push:
                         # maxQueueWaitMs + maxAnswerWaitMs + 1 s (RelayConfig).
                         "requestTimeoutMs": min(10000, (LEASE_SECONDS - 3) * 1000),
                         "maxAnswerWaitMs": min(10000, (LEASE_SECONDS - 3) * 1000), "maxQueueWaitMs": 1000,
                         "shutdownGraceMs": 1000},
            "apps": [{"bundleID": self.R.BUNDLE, "environment": "custom", "url": f"https://127.0.0.1:{b.mock_port}",
                      "caFile": b.ca, "token": {"p8Path": b.p8, "keyID": self.R.KEY_ID, "teamID": self.R.TEAM_ID}}],
            "log": {"format": "json", "level": "warning"},
        }
        fd = os.open(n.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)

    def start_node(self, n, wait=True):
        n.proc = subprocess.Popen([os.path.join(self.bin, "relay-server"), "--config", n.config],
                                  stdout=subprocess.DEVNULL, stderr=n.log)
        self.R.STARTED.append(n.proc)
        if wait:
            self.base._wait(lambda: self.readyz(n, 1) == 200, n.proc, n.name)

    def kill_node(self, n, sig=signal.SIGKILL):
        if n.proc and n.proc.poll() is None:
            n.proc.send_signal(sig)
            n.proc.wait(timeout=30)
        n.proc = None

    def readyz(self, n, timeout=2):
        try:
            return self.R.req(n.admin_port, "GET", "/readyz", timeout=timeout)[0]
        except (OSError, http.client.HTTPException):
            return None

    def credential(self):
        r = self.R.run([os.path.join(self.bin, "relayctl"), "credentials", "create", "--config", self.nodes[0].config,
                        "--name", "load", "--apps", self.R.BUNDLE, "--json"])
        j = json.loads(r.stdout)
        return j["secret"]

    def pending(self):
        return int(self.cluster.q("SELECT count(*) FROM responses WHERE state IN ('queued','inflight','retry')")[0][0])


# --------------------------------------------------------------------------------------------
# Load through all nodes


class PGLoad(WorkerThreads):
    """Client threads, each with its own node, push token and session; a fresh messageIndex per
    response and random encryptedData bytes, so every row's content can be checked. A request
    without an answer goes again (same bytes) to the next node; a 503 goes again after its
    Retry-After (capped at 1 s). Every answer is booked with its time and node."""

    join_seconds = CLIENT_TIMEOUT + 10

    def __init__(self, env, secret, threads, rate):
        self.env, self.secret, self.nthreads, self.rate = env, secret, threads, rate
        self.acked = {}        # id -> dict(token, session, index, data, node, status, sent, answered)
        self.answers = []      # (monotonic answered, node, status or None, error code, retry-after, hung, seconds taken)
        self.unacked = []      # requests abandoned at stop without a 2xx: (token, session, index)
        self.mismatch200 = []  # a resent request answered 200 with another id than a 202 had given
        self.lock = threading.Lock()
        self._init_threads(threads)

    def _worker(self, k):
        nodes = self.env.nodes
        node = k % len(nodes)
        token = os.urandom(32).hex()
        session = str(uuid.uuid4()).upper()
        per = self.rate / self.nthreads if self.rate else 0
        start = time.monotonic()
        headers = {"Content-Type": "application/json", "Authorization": "Bearer " + self.secret}
        conn = None
        index = 0
        pending = None  # (index, data, body) being sent until it gets a 2xx
        while not self.stop_flag.is_set():
            if pending is None:
                if per:
                    due = start + index / per
                    now = time.monotonic()
                    if due > now:
                        time.sleep(min(due - now, 0.2))
                        continue
                data = base64.b64encode(os.urandom(48)).decode()
                body = json.dumps({"pushToken": token, "sessionIdentifier": session, "keyID": self.env.R.RATCHET_KEY_ID,
                                   "messageIndex": index, "encryptedData": data})
                pending = (index, data, body)
                index += 1
            n = nodes[node]
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", n.port, timeout=CLIENT_TIMEOUT)
                conn.request("POST", "/v1/responses", pending[2], headers)
                r = conn.getresponse()
                raw = r.read()
                st = r.status
                ra = r.getheader("retry-after")
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                hung = isinstance(e, TimeoutError) or "timed out" in str(e)
                if conn:
                    conn.close()
                conn = None
                with self.lock:
                    self.answers.append((time.monotonic(), n.name, None, "hung" if hung else "no answer", None, hung,
                                         time.monotonic() - t0))
                node = (node + 1) % len(nodes)  # the load balancer's next node
                time.sleep(0.05)
                continue
            code = None
            try:
                j = json.loads(raw) if raw else {}
                code = j.get("error") if isinstance(j, dict) else None
            except ValueError:
                j = {}
            t1 = time.monotonic()
            with self.lock:
                self.answers.append((t1, n.name, st, code, ra, False, t1 - t0))
                if st in (200, 202):
                    rid = j["id"].lower()
                    if rid in self.acked and self.acked[rid]["index"] != pending[0]:
                        self.mismatch200.append(rid)
                    self.acked[rid] = {"token": token, "session": session, "index": pending[0], "data": pending[1],
                                       "node": n.name, "status": st, "sent": t0, "answered": t1}
                    pending = None
            if st == 503:
                try:
                    wait = float(ra) if ra else 1.0
                except ValueError:
                    wait = 1.0
                time.sleep(min(wait, 1.0))
            elif st not in (200, 202):
                time.sleep(0.2)
        if pending is not None:
            with self.lock:
                self.unacked.append((token.lower(), session.lower(), pending[0]))
        if conn:
            conn.close()


class Monitor:
    """Polls every node's /readyz (4/s) and the count of inflight rows whose lease is GRACE_MS past
    (1/s) for the whole scenario."""

    def __init__(self, env):
        self.env = env
        self.readyz = []   # (monotonic, node, status or None)
        self.stuck = []    # (monotonic, count or None)
        self.stop_flag = threading.Event()
        # one poller per node: a node whose probe waits out its 2 s does not delay the others' polls
        self.threads = [threading.Thread(target=self._readyz, args=(n,), daemon=True) for n in env.nodes]
        self.threads.append(threading.Thread(target=self._stuck, daemon=True))

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=20)

    def _readyz(self, n):
        while not self.stop_flag.is_set():
            if n.proc is not None and n.proc.poll() is None:
                status = self.env.readyz(n, timeout=2)
                self.readyz.append((time.monotonic(), n.name, status))
            time.sleep(0.25)

    def _stuck(self):
        while not self.stop_flag.is_set():
            try:
                c = int(self.env.cluster.q(
                    f"SELECT count(*) FROM responses WHERE state = 'inflight' AND lease_expires_at < "
                    f"(extract(epoch FROM clock_timestamp()) * 1000)::bigint - {GRACE_MS}", timeout=5)[0][0])
            except DBError:
                c = None
            self.stuck.append((time.monotonic(), c))
            time.sleep(1.0)


# --------------------------------------------------------------------------------------------
# Scenarios


def scenario_kill(env, args, rng, ctx):
    rounds = []
    long_down = not args.quick
    for r in range(1, args.pg_rounds + 1):
        n = env.nodes[(r - 1) % len(env.nodes)]
        up = rng.uniform(1.0, 3.0 if not args.quick else 1.5)
        time.sleep(up)
        env.kill_node(n)
        t_kill = time.monotonic()
        leased = [row[0] for row in env.cluster.q(
            f"SELECT id FROM responses WHERE state = 'inflight' AND lease_owner = '{n.name}'")]
        ctx["killLeased"].update(leased)
        last = r == args.pg_rounds
        down = LEASE_SECONDS + 3 if (last and long_down) else rng.uniform(0.5, 2.0)
        time.sleep(down)
        taken_over = None
        if last and long_down and leased:
            ids = ",".join(f"'{i}'" for i in leased)
            taken_over = int(env.cluster.q(f"SELECT count(*) FROM responses WHERE id IN ({ids}) AND (state IN "
                                           f"('delivered','failed') OR lease_owner IS DISTINCT FROM '{n.name}')")[0][0])
        env.start_node(n)
        rounds.append({"round": r, "node": n.name, "upSeconds": round(up, 2), "downSeconds": round(down, 2),
                       "leasedAtKill": len(leased), "leasesTakenOverWhileDown": taken_over,
                       "restartSeconds": round(time.monotonic() - t_kill - down, 2)})
        ctx["log"](f"  kill round {r}: {n.name} kill -9 after {up:.1f}s, {len(leased)} rows leased, down {down:.1f}s"
                   + (f", {taken_over}/{len(leased)} leases taken over by the other nodes while down" if taken_over is not None else ""))
    return {"rounds": rounds}


def scenario_db(env, args, rng, ctx, how):
    """fast / immediate restart or a stop for args.outage seconds. Returns the times."""
    time.sleep(rng.uniform(1.0, 2.0))
    t_down = time.monotonic()
    ctx["downMs"] = now_ms()
    if how == "fast":
        env.cluster.ctl("restart")
    elif how == "stall":
        pids = env.cluster.server_pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        t_stopped = time.monotonic()
        try:
            time.sleep(args.stall)
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
    elif how == "immediate":
        env.cluster.ctl("crash")
    else:
        env.cluster.ctl("pause")
        t_stopped = time.monotonic()
        time.sleep(args.outage)
        env.cluster.ctl("resume")
    t_up = time.monotonic()  # pg_ctl -w returned: the server accepts connections
    snap = None
    for _ in range(50):
        try:
            snap = env.cluster.q("SELECT id, lease_expires_at, lease_owner FROM responses WHERE state = 'inflight'", timeout=5)
            break
        except DBError:
            time.sleep(0.1)
    for rid, lease, owner in snap or []:
        ctx["inflightAcrossOutage"][rid.lower()] = (int(lease) / 1000.0, t_up - t_down, owner)
    out = {"downAt": t_down, "upAt": t_up, "restartSeconds": round(t_up - t_down, 2),
           "inflightAfterReturn": len(snap or [])}
    if how in ("outage", "stall"):
        out["stoppedAt"] = t_stopped
    ctx["log"](f"  database {how}: down for {t_up - t_down:.1f}s, {len(snap or [])} rows inflight when it returned")
    return out


# --------------------------------------------------------------------------------------------
# Audit


def payload_fields(line):
    """What a delivered push carried: (push token, session, keyID, message index, encryptedData),
    from the APNs payload's `aps` (docs/pushclient.md) and the request's device token."""
    aps = (line.get("payload") or {}).get("aps") if isinstance(line.get("payload"), dict) else None
    if not isinstance(aps, dict):
        return None
    return (line.get("deviceToken", "").lower(), str(aps.get("sessionIdentifier", "")).lower(), aps.get("keyID"),
            str(aps.get("messageIndex")), aps.get("encryptedData"))


class MockLog(DeliveryLog):
    """mock-apns' deliveries log (reliability_common.DeliveryLog), plus what each delivery carried
    and every receivedAt per apns-id."""

    def __init__(self, path):
        super().__init__(path)
        self.data = {}
        self.data_mismatch = set()
        self.received = collections.defaultdict(list)  # apns-id -> mock-apns' receivedAt of each delivery (UNIX s)

    def _seen(self, a, d, received_at):
        if received_at is not None:
            self.received[a].append(received_at)
        pd = payload_fields(d)
        if a in self.data and pd != self.data[a]:
            self.data_mismatch.add(a)
        self.data.setdefault(a, pd)


def rows_by_id(cluster):
    rows = {}
    for r in cluster.q("SELECT id, state, push_token, session_id, encode(key_id, 'base64'), message_index, "
                       "encode(encrypted_data, 'base64'), coalesce(last_reason, ''), coalesce(lease_owner, ''), "
                       "coalesce(lease_expires_at, 0) FROM responses", timeout=120):
        rows[r[0].lower()] = r
    return rows


def attempts_of(cluster, ids):
    if not ids:
        return {}
    q = ",".join(f"'{i}'" for i in ids)
    out = collections.defaultdict(list)
    for r in cluster.q(f"SELECT response_id, coalesce(node, ''), coalesce(status::text, ''), coalesce(reason, ''), attempted_at "
                       f"FROM attempts WHERE response_id IN ({q}) ORDER BY id"):
        out[r[0].lower()].append({"node": r[1], "status": r[2], "reason": r[3], "at": int(r[4])})
    return dict(out)


def audit(env, ctx, acked, mock):
    """Waits for the outbox to drain, then checks every acknowledged id."""
    t0 = time.monotonic()
    drained = False
    while time.monotonic() - t0 < LEASE_SECONDS + 90:
        try:
            if env.pending() == 0:
                drained = True
                break
        except DBError:
            pass
        time.sleep(0.5)
    drain_s = round(time.monotonic() - t0, 1)
    # the mock's log may trail the relay's outcome write by a moment (the line is written before
    # the 200 is sent, so it cannot: but give the tail a poll)
    time.sleep(0.5)
    mock.poll()
    rows = rows_by_id(env.cluster)
    missing_row, content_bad, not_final, failed_no_reason, lost, undelivered_but_marked = [], [], [], [], [], []
    failed = []
    payload_bad = []
    for rid, a in acked.items():
        row = rows.get(rid)
        if row is None:
            missing_row.append(rid)
            lost.append(rid)
            continue
        _, state, tok, sess, keyid, idx, data, reason, _, _ = row
        if (tok.lower() != a["token"].lower() or sess.lower() != a["session"].lower() or keyid != env.R.RATCHET_KEY_ID
                or int(idx) != a["index"] or data != a["data"]):
            content_bad.append(rid)
        if state == "failed":
            failed.append(rid)
            if not reason:
                failed_no_reason.append(rid)
            continue
        if state != "delivered":
            not_final.append(rid)
        if mock.count[rid] == 0:
            lost.append(rid)
            if state == "delivered":
                undelivered_but_marked.append(rid)
        elif mock.data.get(rid) != (a["token"].lower(), a["session"].lower(), env.R.RATCHET_KEY_ID, str(a["index"]), a["data"]):
            payload_bad.append(rid)
    dup_ids = [i for i in acked if mock.count[i] > 1]
    extra = sum(mock.count[i] - 1 for i in dup_ids)
    # The documented bound (docs/postgres.md): a push reaches APNs twice only if its node died
    # (a killed node's leases) or stalled longer than leaseSeconds after sending it: a database
    # outage longer than the lease, during which no outcome could be written. A push re-sent
    # after a database restart shorter than the lease is beyond that bound.
    across = ctx["inflightAcrossOutage"]
    killed = [i for i in dup_ids if i in ctx["killLeased"]]
    outage_long = [i for i in dup_ids if i not in ctx["killLeased"] and i in across and across[i][1] > LEASE_SECONDS]
    outage_short = [i for i in dup_ids if i not in ctx["killLeased"] and i in across and across[i][1] <= LEASE_SECONDS]
    other = [i for i in dup_ids if i not in ctx["killLeased"] and i not in across]
    after_lease = sum(1 for i in outage_long + outage_short
                      if len(mock.received[i]) > 1 and sorted(mock.received[i])[1] >= across[i][0] - 0.05)
    inflight_now = sum(1 for r in rows.values() if r[1] == "inflight")
    bound_ids = [i for i in acked if i in ctx["killLeased"] or (i in across and across[i][1] > LEASE_SECONDS)]
    res = {"acked": len(acked), "drained": drained, "drainSeconds": drain_s, "rowsMissing": len(missing_row),
           "contentMismatch": len(content_bad), "deliveredPayloadMismatch": len(payload_bad) + len(mock.data_mismatch & set(acked)),
           "delivered": sum(1 for i in acked if mock.count[i] > 0), "failed": len(failed),
           "failedWithoutReason": len(failed_no_reason), "notFinal": len(not_final),
           "markedDeliveredNotAtMock": len(undelivered_but_marked), "lost": len(lost),
           "duplicateIds": len(dup_ids), "extraDeliveries": extra,
           "duplicatesFromKilledLeases": len(killed), "duplicatesFromOutageLongerThanLease": len(outage_long),
           "duplicatesFromRestartShorterThanLease": len(outage_short), "duplicatesUnattributed": len(other),
           "outageDuplicatesResentAfterLeaseExpiry": after_lease, "duplicateBound": len(bound_ids),
           "inflightAtEnd": inflight_now,
           "examples": {"lost": lost[:10], "rowsMissing": missing_row[:10], "contentMismatch": content_bad[:10],
                        "notFinal": not_final[:10], "failed": failed[:10], "duplicatesUnattributed": other[:10]}}
    if other:
        res["unattributedDuplicateAttempts"] = attempts_of(env.cluster, other[:10])
    if outage_short or outage_long:
        sample = (outage_short or outage_long)[:3]
        res["outageDuplicateSample"] = {i: {"attempts": attempts_of(env.cluster, [i]).get(i, []),
                                            "mockReceivedAt": mock.received[i], "leaseExpiresAt": across[i][0],
                                            "leaseOwnerWhenTheDatabaseReturned": across[i][2]}
                                        for i in sample}
    if failed:
        res["failedReasons"] = dict(collections.Counter(rows[i][7] for i in failed))
    res["pass"] = (drained and not missing_row and not content_bad and not res["deliveredPayloadMismatch"] and not not_final
                   and not failed_no_reason and not lost and not other and not outage_short
                   and len(dup_ids) <= len(bound_ids) and inflight_now == 0
                   and len(acked) > 0)
    return res


def outage_checks(load, mon, times, how, env):
    """Ingest answers and /readyz around a database restart or outage."""
    t_down, t_up = times["downAt"], times["upAt"]
    window = [a for a in load.answers if t_down <= a[0] <= t_up + 1.0]
    by = collections.Counter()
    for a in window:
        by[f"{a[2]}{' ' + a[3] if a[3] else ''}" if a[2] is not None else a[3]] += 1
    all503 = [a for a in load.answers if a[2] == 503]
    bad503 = [a for a in all503 if a[3] != "storage_unavailable" or not a[4]]
    other = [a for a in load.answers if a[2] is not None and a[2] not in (200, 202, 503)]
    hung = [a for a in load.answers if a[5]]
    slow = [a for a in load.answers if a[2] is not None and a[6] > SLOW_ANSWER]
    out = {"answersDuringOutage": dict(by), "answers503": len(all503), "answers503WithoutRetryAfterOrCode": len(bad503),
           "answersOtherStatus": dict(collections.Counter(a[2] for a in other)), "requestsHung": len(hung),
           "unansweredRequests": sum(1 for a in load.answers if a[2] is None),
           "slowestAnswerSeconds": round(max((a[6] for a in load.answers), default=0), 2),
           "answersSlowerThanDeadline": len(slow), "deadlineSeconds": SLOW_ANSWER}
    if how in ("outage", "stall"):
        # the database is certainly down from pg_ctl stop's return to pg_ctl start's call
        t_stopped = times["stoppedAt"]
        false202 = [a for a in load.answers if a[2] in (200, 202) and t_stopped + 0.5 <= a[0] <= t_up - 0.5]
        out["acceptedWhileStopped"] = len(false202)
        ready = [r for r in mon.readyz if t_stopped + 3.0 <= r[0] <= t_up - 0.5]
        out["readyz200WhileStopped"] = sum(1 for r in ready if r[2] == 200)
        out["readyzWhileStopped"] = {str(k): v for k, v in collections.Counter(r[2] for r in ready).items()}  # None: no answer in 2 s
        out["readyzPollsWhileStopped"] = len(ready)
        out["readyzFailedWhileStoppedPerNode"] = {n.name: sum(1 for r in ready if r[1] == n.name and r[2] != 200)
                                                  for n in env.nodes}
    fails = collections.Counter(r[1] for r in mon.readyz if t_down <= r[0] <= t_up + 1.0 and r[2] != 200)
    out["readyzFailedPerNode"] = {n.name: fails.get(n.name, 0) for n in env.nodes}
    resume = {}
    for n in env.nodes:
        first202 = next((a[0] for a in load.answers if a[1] == n.name and a[2] == 202 and a[0] > t_up), None)
        first_ready = next((r[0] for r in mon.readyz if r[1] == n.name and r[2] == 200 and r[0] > t_up), None)
        resume[n.name] = {"first202": round(first202 - t_up, 2) if first202 else None,
                          "readyz200": round(first_ready - t_up, 2) if first_ready else None}
    out["resumeSecondsAfterReturn"] = resume
    worst = [v["first202"] for v in resume.values()]
    out["worstResumeSeconds"] = None if None in worst else max(worst)
    ok = (not bad503 and not other and not hung and not slow and out["worstResumeSeconds"] is not None
          and out["worstResumeSeconds"] <= 10.0)
    if how in ("outage", "stall"):
        ok = ok and out["acceptedWhileStopped"] == 0 and out["readyz200WhileStopped"] == 0 and out["readyzPollsWhileStopped"] > 0
        ok = ok and all(v > 0 for v in out["readyzFailedWhileStoppedPerNode"].values())
        # down (or stalled) past the deadline: clients must have been told so (503), not kept waiting
        ok = ok and (out["answers503"] > 0 or t_up - t_stopped <= SLOW_ANSWER)
        ok = ok and all(v["readyz200"] is not None and v["readyz200"] <= 10.0 for v in resume.values())
    out["pass"] = ok
    return out


SCENARIOS = {
    "kill": "kill -9 of one relay node per round, restarted with the same nodeId",
    "fast": "PostgreSQL `pg_ctl restart -m fast` mid-load",
    "immediate": "PostgreSQL `pg_ctl restart -m immediate` (crash recovery) mid-load",
    "outage": "PostgreSQL stopped for {outage} s, then started",
    # Beyond issue 25's four: the server's processes SIGSTOPped, so connections stay open and
    # nothing answers (a hung server, a network partition that drops packets).
    "stall": "PostgreSQL stalled (its processes SIGSTOPped) for {stall} s, then continued",
}


def run(R, args, work, results):
    """Runs the selected scenarios; fills results['postgres']."""
    log = R.log
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not available():
        results["postgres"] = {"skipped": "PostgreSQL binaries (pg_ctl, psql) not found"}
        log("postgres: PostgreSQL binaries not found: skipped")
        return
    names = args.scenarios.split(",")
    for s in names:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s} (known: {', '.join(SCENARIOS)})")
    global LEASE_SECONDS
    LEASE_SECONDS = args.lease
    rng = random.Random(args.seed)
    cluster = Cluster(repo)
    res = {"cluster": cluster.url, "leaseSeconds": LEASE_SECONDS, "mockLatencyMs": args.mock_latency, "nodes": 3, "threads": args.threads,
           "rate": args.pg_rate, "scenarios": []}
    results["postgres"] = res
    try:
        env = PGEnv(R, args, os.path.join(work, "postgres"), cluster)
        # mock-apns answers each push after LATENCY ms, so pushes are on the wire (rows leased,
        # answers pending) when a node or the database goes away.
        env.base.start_mock(faults=(f"latency={args.mock_latency}",) if args.mock_latency else ())
        for n in env.nodes:
            env.start_node(n)
        secret = env.credential()
        mock = MockLog(env.base.log_path)
        all_acked = {}
        ctx = {"killLeased": set(), "inflightAcrossOutage": {}, "log": log}
        log(f"postgres: 3 nodes on {cluster.url}, lease {LEASE_SECONDS}s, scenarios {', '.join(names)}")
        for name in names:
            log(f"postgres: {name}")
            mon = Monitor(env).start()
            load = PGLoad(env, secret, args.threads, args.pg_rate).start()
            planted = None
            try:
                if name == "kill":
                    detail = scenario_kill(env, args, rng, ctx)
                else:
                    detail = scenario_db(env, args, rng, ctx, name)
                if args.plant_loss and not any(r.get("plantedLoss") for r in res["scenarios"]):
                    planted = plant_loss(env, load)
                    log(f"  planted loss: deleted acknowledged row {planted}")
                time.sleep(3.0)  # load goes on after the database (or node) came back: resume times
            finally:
                load.stop()
                mon.stop()
            for n in env.nodes:  # a node that died by itself is a finding, and is restarted
                if n.proc is None or n.proc.poll() is not None:
                    detail.setdefault("nodesDied", []).append(f"{n.name} exit {n.proc.poll() if n.proc else None}")
                    env.start_node(n)
            row = {"scenario": name, "what": SCENARIOS[name].format(outage=args.outage, stall=args.stall), "detail": detail,
                   "answers": dict(collections.Counter(a[2] if a[2] is not None else "no answer" for a in load.answers)),
                   "abandonedAtStop": len(load.unacked),
                   "resentAnswered200WithOtherId": len(load.mismatch200)}
            if planted:
                row["plantedLoss"] = planted
            if name != "kill":
                row["outage"] = outage_checks(load, mon, detail, name, env)
            # Rows inflight GRACE_MS past their lease while the database was up: none may stay. After
            # the database returns, leases that ran out during the outage are taken at the nodes'
            # next claims: the first GRACE_MS after its return are left out, and the time until
            # none is left is reported.
            if name == "kill":
                stuck = [c for _, c in mon.stuck if c]
            else:
                stuck = [c for t, c in mon.stuck if c and not (detail["downAt"] <= t <= detail["upAt"] + GRACE_MS / 1000)]
                after = [(t, c) for t, c in mon.stuck if t >= detail["upAt"] and c is not None]
                cleared = next((t for t, c in after if c == 0), None)
                detail["expiredLeasesClearedAfterReturnSeconds"] = round(cleared - detail["upAt"], 2) if cleared else None
                detail["expiredLeasesAfterReturn"] = max((c for t, c in after), default=0)
            row["maxInflightPastLeaseWhileRunning"] = max(stuck) if stuck else 0
            all_acked.update(load.acked)
            row["audit"] = audit(env, ctx, load.acked, mock)
            row["pass"] = (row["audit"]["pass"] and (row.get("outage", {}).get("pass", True))
                           and row["maxInflightPastLeaseWhileRunning"] == 0
                           and not detail.get("nodesDied") and not load.mismatch200)
            res["scenarios"].append(row)
            a = row["audit"]
            log(f"  {name}: acked {a['acked']}, lost {a['lost']}, rows missing {a['rowsMissing']}, content mismatches "
                f"{a['contentMismatch']}, failed {a['failed']}, duplicates {a['extraDeliveries']} (killed leases "
                f"{a['duplicatesFromKilledLeases']}, inflight across an outage longer than the lease "
                f"{a['duplicatesFromOutageLongerThanLease']}, across a restart shorter than the lease "
                f"{a['duplicatesFromRestartShorterThanLease']}, resent after lease expiry {a['outageDuplicatesResentAfterLeaseExpiry']}, unattributed "
                f"{a['duplicatesUnattributed']}), inflight left {a['inflightAtEnd']}, drained in {a['drainSeconds']}s"
                + (f"; outage {json.dumps({k: v for k, v in row['outage'].items() if k != 'pass'})}" if "outage" in row else "")
                + ("  PASS" if row["pass"] else "  <-- FAIL"))
        # Every acknowledged id of every scenario, once more at the end: a later scenario (a
        # crash recovery) must not have taken back what an earlier one acknowledged.
        res["final"] = audit(env, ctx, all_acked, mock)
        res["final"]["unackedStoredRows"] = stored_unacked(env, all_acked)
        log(f"postgres: final audit over {len(all_acked)} acknowledged ids: lost {res['final']['lost']}, rows missing "
            f"{res['final']['rowsMissing']}: " + ("PASS" if res["final"]["pass"] else "FAIL"))
        for n in env.nodes:
            env.kill_node(n, signal.SIGTERM)
        env.base.stop_mock()
    finally:
        res["pass"] = bool(res["scenarios"]) and all(r["pass"] for r in res["scenarios"]) and res.get("final", {}).get("pass", False)
        R.kill_all()
        cluster.destroy()


def stored_unacked(env, acked):
    """Rows stored although the client never got a 2xx for them (a COMMIT whose answer was lost,
    answered 503 or not at all): allowed (the client's retry would get 200), counted."""
    ids = {r[0].lower() for r in env.cluster.q("SELECT id FROM responses", timeout=120)}
    return len(ids - set(acked))


def plant_loss(env, load):
    """Deletes one acknowledged row that is not sent yet: a loss the audit must report."""
    for _ in range(200):
        with load.lock:
            recent = sorted(load.acked, key=lambda i: load.acked[i]["answered"])[-200:]
        if recent:
            ids = ",".join(f"'{i}'" for i in recent)
            try:
                r = env.cluster.q(f"DELETE FROM responses WHERE id = (SELECT id FROM responses WHERE id IN ({ids}) "
                                  f"AND state IN ('queued','retry') LIMIT 1) RETURNING id")
            except DBError:
                r = []
            if r:
                return r[0][0]
        time.sleep(0.05)
    return None


def markdown(res):
    L = []
    if res.get("skipped"):
        return f"PostgreSQL: skipped ({res['skipped']}).\n"
    L.append(f"Three relay-server nodes (nodeId relay-1..3, leaseSeconds {res['leaseSeconds']}) on one throwaway "
             f"PostgreSQL cluster, {res['threads']} client threads at {res['rate']:.0f} responses/s offered through all three, "
             f"mock-apns answering every push after {res['mockLatencyMs']} ms (so pushes are in flight at every kill and restart).")
    L.append("")
    L.append("| scenario | 202/200 acked | ingest answers | lost | acked rows missing / row content mismatch / delivered payload mismatch | delivered / failed (with reason) | "
             "extra deliveries (killed node's leases / inflight across an outage > lease / inflight across a restart < lease / unattributed) | "
             "documented bound (killed node's leases + inflight across an outage > lease) | inflight past lease (max while running, at end) | "
             "during the outage | resume after the database returned (s, first 202 per node) | result |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["scenarios"]:
        a = r["audit"]
        o = r.get("outage")
        if o:
            during = (f"answers {o['answersDuringOutage']}; 503 without Retry-After/code: {o['answers503WithoutRetryAfterOrCode']}; "
                      f"other status {o['answersOtherStatus']}; hung {o['requestsHung']}; /readyz non-200 polls {o['readyzFailedPerNode']}")
            during += f"; slowest answer {o['slowestAnswerSeconds']} s ({o['answersSlowerThanDeadline']} over {o['deadlineSeconds']:g} s)"
            if "acceptedWhileStopped" in o:
                during += (f"; 2xx while stopped: {o['acceptedWhileStopped']}; /readyz 200 while stopped: "
                           f"{o['readyz200WhileStopped']}/{o['readyzPollsWhileStopped']}")
            if r["detail"].get("expiredLeasesAfterReturn"):
                during += (f"; {r['detail']['expiredLeasesAfterReturn']} leases expired when it returned, all taken "
                           f"{r['detail']['expiredLeasesClearedAfterReturnSeconds']} s later")
            resume = ", ".join(f"{k} {v['first202']}" + (f" (readyz {v['readyz200']})" if v["readyz200"] is not None else "")
                               for k, v in o["resumeSecondsAfterReturn"].items())
        else:
            rounds = r["detail"]["rounds"]
            during = "; ".join(f"{x['node']} down {x['downSeconds']}s, {x['leasedAtKill']} leased"
                               + (f", {x['leasesTakenOverWhileDown']} taken over" if x["leasesTakenOverWhileDown"] is not None else "")
                               for x in rounds)
            resume = ""
        if r["detail"].get("nodesDied"):
            during += f"; nodes died: {r['detail']['nodesDied']}"
        if r.get("plantedLoss"):
            during += f"; PLANTED LOSS: row {r['plantedLoss']} deleted"
        L.append(f"| {r['what']} | {a['acked']} | {r['answers']} | **{a['lost']}** | {a['rowsMissing']} / {a['contentMismatch']} / {a['deliveredPayloadMismatch']} | "
                 f"{a['delivered']} / {a['failed']} ({a['failed'] - a['failedWithoutReason']}) | {a['extraDeliveries']} "
                 f"({a['duplicatesFromKilledLeases']} / {a['duplicatesFromOutageLongerThanLease']} / {a['duplicatesFromRestartShorterThanLease']} / "
                 f"{a['duplicatesUnattributed']}) | "
                 f"{a['duplicateBound']} | {r['maxInflightPastLeaseWhileRunning']}, {a['inflightAtEnd']} | {during} | {resume} | "
                 f"{'pass' if r['pass'] else '**FAIL**'} |")
    f = res.get("final")
    if f:
        L.append("")
        L.append(f"Final audit over every scenario's acknowledged ids: {f['acked']} acknowledged, {f['lost']} lost, "
                 f"{f['rowsMissing']} rows missing, {f['contentMismatch']} content mismatches, {f['delivered']} delivered, "
                 f"{f['failed']} failed, {f['unackedStoredRows']} rows stored without a 2xx to their client (COMMIT answer lost "
                 f"or the request abandoned at the end; allowed), result {'pass' if f['pass'] else '**FAIL**'}.")
    L.append("")
    return "\n".join(L)
