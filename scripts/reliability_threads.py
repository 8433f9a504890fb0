"""Worker threads for the reliability harnesses (scripts/reliability.py and reliability_pg.py):
start `nthreads` daemon threads running `self._worker(k)`, stop them by setting `stop_flag` and
joining each for at most `join_seconds`. Python 3 standard library only."""

import threading


class WorkerThreads:
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
