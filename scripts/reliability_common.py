"""Pieces both reliability harnesses use (scripts/reliability.py and reliability_pg.py): worker
threads, the tail of a JSON-lines file another process appends to, and mock-apns' deliveries
log read through it. Python 3 standard library only."""

import collections
import datetime
import json
import os
import threading


class WorkerThreads:
    """Start `nthreads` daemon threads running `self._worker(k)`; stop them by setting
    `stop_flag` and joining each for at most `join_seconds`."""
    join_seconds = 15

    def _init_threads(self, nthreads):
        self.nthreads = nthreads
        self.stop_flag = threading.Event()
        self.threads = []

    def start(self):
        for k in range(self.nthreads):
            t = threading.Thread(target=self._worker, args=(k,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=self.join_seconds)


class JsonlTail:
    """The complete lines appended to `path` since the last call (a line still being written
    waits for the next call); none while the file does not exist."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def new_lines(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return lines


def received_at(delivery):
    """mock-apns' `receivedAt` of one deliveries-log record in UNIX seconds; None when absent or
    not an ISO 8601 time."""
    try:
        return datetime.datetime.fromisoformat(delivery["receivedAt"].replace("Z", "+00:00")).timestamp()
    except (KeyError, AttributeError, ValueError):
        return None


class DeliveryLog:
    """mock-apns' --deliveries-log read incrementally with `poll` (the file survives mock
    restarts): `count` of deliveries per apns-id (lowercase). A subclass keeps what else it needs
    of each delivery in `_seen(apns_id, record, received_at)`."""

    def __init__(self, path):
        self.tail = JsonlTail(path)
        self.count = collections.Counter()

    def poll(self):
        for line in self.tail.new_lines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue  # a torn last line of a killed mock
            a = d.get("apnsId", "").lower()
            self.count[a] += 1
            self._seen(a, d, received_at(d))

    def _seen(self, apns_id, record, received_at):
        pass
