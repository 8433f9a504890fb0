#!/usr/bin/env python3
"""Load and measurement helpers for scripts/bench-pipeline.sh (Python 3 standard library only).

  latency PORT CRED LOG RATE SECONDS OUT.csv
      Offers RATE responses/s for SECONDS on keep-alive HTTP/1.1 connections (unique bodies),
      books each 202's send time, then matches mock-apns' deliveries log (receivedAt, ms) and
      prints "offered achieved matched p50 p99 p999 max" (ms); writes every latency to OUT.csv.
  drain ADMIN_PORT DB ROWS TIMEOUT OUT.csv
      Polls the relay's delivered count (SQLite, read-only) until ROWS are delivered; prints
      "rows seconds rate"; writes (seconds, delivered, rss_kb) samples to OUT.csv.
  prefill DB ROWS DUE_IN_SECONDS
      Inserts ROWS queued responses directly (one transaction), due DUE_IN_SECONDS from now.
"""
import datetime
import http.client
import json
import os
import sqlite3
import sys
import threading
import time
import uuid

SEALED = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIj"


def latency(port, cred, log_path, rate, seconds, out_csv):
    rate, seconds = float(rate), float(seconds)
    nthreads = max(4, min(32, int(rate // 60) + 1))
    sent = {}
    lock = threading.Lock()
    start_at = time.time() + 0.2
    log_offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0

    def worker(k):
        c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
        token = os.urandom(32).hex()
        session = str(uuid.uuid4()).upper()
        per = rate / nthreads
        i = 0
        hdrs = {"Content-Type": "application/json", "Authorization": "Bearer " + cred}
        while True:
            due = start_at + (i + k / nthreads) / per
            if due - start_at >= seconds:
                break
            now = time.time()
            if due > now:
                time.sleep(due - now)
            body = json.dumps({"pushToken": token, "sessionIdentifier": session, "keyID": "AQIDBA==",
                               "messageIndex": i, "encryptedData": SEALED})
            t0 = time.time()
            try:
                c.request("POST", "/v1/responses", body, hdrs)
                r = c.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException):
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
                i += 1
                continue
            if r.status == 202:
                with lock:
                    sent[json.loads(data)["id"]] = t0
            i += 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.time() - start_at
    lat = []
    deadline = time.time() + 15
    while time.time() < deadline:
        lat = []
        with open(log_path, "rb") as f:
            f.seek(log_offset)
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                t0 = sent.get(d.get("apnsId"))
                if t0 is None:
                    continue
                ra = datetime.datetime.fromisoformat(d["receivedAt"].replace("Z", "+00:00")).timestamp()
                lat.append(max(0.0, (ra - t0) * 1000))
        if len(lat) >= len(sent):
            break
        time.sleep(0.5)
    lat.sort()

    def pct(p):
        return lat[min(len(lat) - 1, int(len(lat) * p))] if lat else float("nan")

    with open(out_csv, "w") as f:
        f.write("latency_ms\n")
        for v in lat:
            f.write(f"{v:.3f}\n")
    print(f"{rate:.0f} {len(sent) / elapsed:.0f} {len(lat)} {pct(0.5):.2f} {pct(0.99):.2f} {pct(0.999):.2f} "
          f"{(lat[-1] if lat else float('nan')):.2f}")


def drain(admin_port, db, rows, timeout, out_csv, pid=None):
    rows, timeout = int(rows), float(timeout)
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    t0 = time.time()
    samples = []
    done = 0
    while time.time() - t0 < timeout:
        done = c.execute("SELECT count(*) FROM responses WHERE state = 'delivered'").fetchone()[0]
        rss = 0
        if pid:
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS"):
                            rss = int(line.split()[1])
            except OSError:
                pass
        samples.append((time.time() - t0, done, rss))
        if done >= rows:
            break
        time.sleep(0.5)
    took = time.time() - t0
    with open(out_csv, "w") as f:
        f.write("seconds,delivered,rss_kb\n")
        for s in samples:
            f.write(f"{s[0]:.2f},{s[1]},{s[2]}\n")
    print(f"{done} {took:.1f} {done / took if took else 0:.0f}")


def prefill(db, rows, due_in):
    rows, due_in = int(rows), float(due_in)
    now = int(time.time() * 1000)
    due = now + int(due_in * 1000)
    c = sqlite3.connect(db, timeout=30)
    c.execute("PRAGMA synchronous=OFF")
    c.execute(f"""
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})
-- id_high is the id's first 64 bits (schema v5): v4-shaped ids whose first 64 bits are (i << 16) | 0x4000
INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                       attempts, next_attempt_at, created_at, expires_at, updated_at)
SELECT (i << 16) | 16384, printf('%08x-%04x-4000-8%03x-%012x', i >> 16, i & 65535, random() & 4095, random() & 281474976710655),
       'com.example.bench', printf('%064x', i), 'B1D0C8A4-1111-4222-8333-444455556666', X'01020304', i,
       randomblob(36), 'cred_bench', 'queued', 0, {due}, {now}, {now} + 86400000 * 7, {now} FROM n""")
    c.commit()
    c.close()


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"latency": latency, "drain": drain, "prefill": prefill}[cmd](*args)
