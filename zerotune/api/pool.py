"""The embedded workers of ``zerotune serve``: child processes running ``zerotune worker``.

The worker itself (claiming jobs, running studies, heartbeats) lives in ``zerotune/tuner/worker.py``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from zerotune.api.settings import Settings

log = logging.getLogger("zerotune.worker")


class WorkerPool:
    """The embedded workers of ``zerotune serve``: child processes running ``zerotune worker``.

    Processes, not threads: a study is CPU work (sampling, the cost model) that must not take the
    GIL from the request path, and the service process never imports the tuner's heavy parts. A
    child that dies is restarted; :meth:`stop` lets each finish its trial and hand its job back.
    """

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings, self.url = settings, url
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = threading.Event()
        self.monitor = threading.Thread(target=self._monitor, daemon=True, name="zerotune-worker-pool")

    def _spawn(self) -> subprocess.Popen[bytes]:
        # the database URL (it may hold a password) goes through the environment, never argv: any user
        # of the host can read a process's argv (ps), only its owner its environment
        args = [sys.executable, "-m", "zerotune.api.cli", "worker", "--parent-pid", str(os.getpid())]
        return subprocess.Popen(args, env={**os.environ, "ZEROTUNE_DB": self.url, "PYTHONUNBUFFERED": "1"})

    def start(self) -> None:
        self.procs = [self._spawn() for _ in range(self.settings.workers)]
        self.monitor.start()

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def _monitor(self) -> None:
        while not self.stopping.wait(2.0):
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None and not self.stopping.is_set():
                    log.warning("embedded worker %d exited with status %s; restarting it", proc.pid, proc.returncode)
                    self.procs[i] = self._spawn()

    def stop(self) -> None:
        self.stopping.set()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("embedded worker %d did not stop in %.0f s; killing it", proc.pid,
                            self.settings.shutdown_grace_s)
                proc.kill()
                proc.wait()
