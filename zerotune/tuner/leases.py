"""A study's trial leases: a heartbeat holds one while its trial runs; a resumed study recovers dead runners' trials.

zerotune owns the trial lifecycle (Optuna's heartbeat does not cover ask/tell): a trial row is inserted already
leased to its runner (``repo.claim_trial``), a heartbeat thread extends the lease every third of ``lease_s`` while
the executor runs, and a study that is resumed fails the trials whose lease ran out and retries each once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from zerotune.core.spec import Strategy
from zerotune.db import repository as repo
from zerotune.db.session import session_scope
from zerotune.tuner.space import Space

log = logging.getLogger("zerotune.tuner")

RETRIED = "retried once"
"""How a dead runner's trial ends its reason when a retry replaces it (the retry is what counts)."""


@contextmanager
def held(sessions: sessionmaker[Session], trial_id: int, *, owner: str, lease_s: float,
         stop: threading.Event) -> Iterator[threading.Event]:
    """Keep ``owner``'s lease on ``trial_id`` alive while the block runs; yields the event that stops its run.

    The event is set when ``stop`` is (the runner stops) or when a heartbeat finds the lease gone (the trial
    expired and was claimed again, or was finished elsewhere)."""
    halt, done = threading.Event(), threading.Event()

    def beat() -> None:
        interval, last = lease_s / 3, time.monotonic()
        while not done.wait(min(0.5, interval)):
            if stop.is_set():
                halt.set()
            if time.monotonic() - last < interval:
                continue
            last = time.monotonic()
            try:
                with session_scope(sessions) as s:
                    kept = repo.heartbeat_trial(session=s, trial_id=trial_id, owner=owner, lease_s=lease_s)
            except Exception as exc:  # the database is away for a moment: the lease has time left
                log.warning("trial %d: heartbeat failed: %s: %s", trial_id, type(exc).__name__, exc)
                continue
            if not kept:
                log.warning("trial %d: the lease was lost (another runner holds the trial); stopping its run",
                            trial_id)
                halt.set()
    thread = threading.Thread(target=beat, daemon=True, name=f"zerotune-heartbeat-{trial_id}")
    thread.start()
    try:
        yield halt
    finally:
        done.set()
        thread.join(timeout=5)


def recover_dead_trials(sessions: sessionmaker[Session], study: Any, study_id: int, space: Space, *,
                        exclusive: bool) -> None:
    """Fail the trials of ``study_id`` whose runner died and retry each once (in the Optuna ``study``).

    Dead: a ``running`` trial whose lease expired, a ``queued`` row (never claimed: left by an
    older version that inserted before leasing), and — when ``exclusive`` (no other runner can hold
    one) — every running trial.
    """
    import optuna

    now = datetime.now(UTC)
    retries = {t.number for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs}
    with session_scope(sessions) as s:
        dead = []
        for t in repo.dead_trials(session=s, study_id=study_id, now=now, all_running=exclusive):
            why = ("runner died before starting it" if t.status == "queued" else
                   "runner died: the study was resumed by another runner" if exclusive
                   and (t.lease_expires_at is None or t.lease_expires_at >= now)
                   else "runner died: its lease expired without a heartbeat")
            retry = t.number not in retries  # a trial that killed its runner twice is not tried again
            repo.finish_trial(session=s, trial_id=t.id, status="failed",
                              reason=f"{why}; {RETRIED if retry else 'not retried (it was a retry)'}")
            dead.append((t.id, t.number, t.strategy, retry))
    for trial_id, number, strategy, retry in dead:
        if number is not None:
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        if retry:
            attrs: dict[str, Any] = {"retry_of": trial_id}
            if strategy.get("name"):
                attrs["preset"] = strategy["name"]
            study.enqueue_trial(space.strategy_params(Strategy.from_dict(strategy)), user_attrs=attrs)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)  # asked, never stored
