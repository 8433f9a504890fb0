"""Pieces both reliability harnesses use (scripts/reliability.py and reliability_pg.py): worker
threads and the tail of a JSON-lines file another process appends to. Python 3 standard
library only."""

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
