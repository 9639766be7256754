"""What the tests' Slurm queue showed while a block of a test ran, and the environment of a login node."""

from __future__ import annotations

import os
import threading
import time

from tests.slurm.cluster import LocalSlurm
from tests.support import ROOT


def queued(slurm: LocalSlurm) -> set[str]:
    """The id of every job the queue lists now."""
    return set(slurm.command("squeue", "-h", "-o", "%i").stdout.split())


class QueueWatch:
    """``with QueueWatch(slurm) as seen:`` every job (``seen.jobs``) and ``JOB.STEP`` (``seen.steps``, batch and
    extern steps aside) the queue showed while the block ran; a job listed before it (an earlier test's, still
    completing) is not counted."""

    def __init__(self, slurm: LocalSlurm) -> None:
        self.slurm, self.jobs, self.steps = slurm, set[str](), set[str]()
        self._done = threading.Event()
        self._before: set[str] = set()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            self.jobs.update(queued(self.slurm) - self._before)
            for line in self.slurm.command("squeue", "--steps", "-h", "-o", "%i|%j").stdout.split():
                sid, _, name = line.partition("|")
                if name not in ("batch", "extern") and sid.split(".")[0] not in self._before:
                    self.steps.add(sid)
            time.sleep(0.3)

    def __enter__(self) -> QueueWatch:
        self._before = queued(self.slurm)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(10)


def login_env(slurm: LocalSlurm, **extra: str) -> dict[str, str]:
    """This process's environment as a login node of ``slurm`` has it: no job's ``SLURM_*`` variables, the
    cluster's Slurm config, zerotune importable; then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return env | slurm.env | {"PYTHONPATH": str(ROOT)} | extra
