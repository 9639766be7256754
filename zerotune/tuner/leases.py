"""A study's trial leases: a heartbeat holds one while its trial runs; a resumed study recovers dead runners' trials.

zerotune owns the trial lifecycle (Optuna's heartbeat does not cover ask/tell): a trial row is inserted already
leased to its runner (``repo.claim_trial``), a heartbeat thread extends the lease every third of ``lease_s`` while
the executor runs, and a study that is resumed records the trials left unfinished (their lease ran out, or the
runner holds the study alone) as interrupted and runs each again.
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
"""How an older version ended the reason of a dead runner's trial that a retry replaced (the retry is what counts)."""
INTERRUPTED = "interrupted: "
"""How the reason of a trial begins that was cut short from outside (a stop, a restart, a dead runner, a fault of the
database): it is run again, whatever number of times, and never counts against the budget or as a failure."""
UNSPENT = (f"{INTERRUPTED}%", f"%{RETRIED}")
"""The reasons (SQL ``LIKE`` patterns) of trials that do not count against a study's budget: each was run again."""
RUNNER_DEATHS = 3
"""A point found in flight this many times by runners that resumed its study after its runner died (SIGKILL, a lost
machine, a lease that ran out) is failed instead of run again: a run that keeps killing its runner is the work's own
fault. A stop (SIGTERM, a cancel) or a fault of the database is recorded when it happens and is never counted."""
DIED = f"{INTERRUPTED}its runner died"


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


def enqueue_again(study: Any, space: Space, strategy: dict[str, Any], trial_id: int) -> None:
    """Put the point of trial ``trial_id`` (cut short from outside) back at the head of ``study``'s queue."""
    attrs: dict[str, Any] = {"rerun_of": trial_id}
    if strategy.get("name"):
        attrs["preset"] = strategy["name"]
    study.enqueue_trial(space.strategy_params(Strategy.from_dict(strategy)), user_attrs=attrs)


def recover_dead_trials(sessions: sessionmaker[Session], study: Any, study_id: int, space: Space, *,
                        exclusive: bool, owner: str | None = None) -> None:
    """Record the trials of ``study_id`` left unfinished as interrupted and run each again (in the Optuna ``study``).

    Unfinished: a ``running`` trial whose lease expired, a ``queued`` row (never claimed: left by an older version
    that inserted before leasing), and — when ``exclusive`` (no other runner can hold one) — every running trial.
    One that ``owner`` (this runner) holds was cut short by a fault of the database it recovered from; any other's
    runner died, and a point whose runner died :data:`RUNNER_DEATHS` times is failed instead. The point is enqueued
    again before its row is ended, so a fault between the two can repeat a point but never lose one; an Optuna
    trial asked for a point of the queue and never stored (a fault came between) is enqueued again too.
    """
    import optuna

    now = datetime.now(UTC)
    with session_scope(sessions) as s:
        dead = [(t.id, t.number, t.strategy, t.strategy_key, t.status, t.lease_owner, t.lease_expires_at)
                for t in repo.dead_trials(session=s, study_id=study_id, now=now, all_running=exclusive)]
        stored = {t.number for t in repo.trials_of(session=s, study_id=study_id)}
        deaths = {key: n for key, n in repo.count_reasons(session=s, study_id=study_id, like=f"{DIED}%").items()}
    for trial_id, number, strategy, key, status, holder, expires in dead:
        if status == "queued":
            why = f"{INTERRUPTED}its runner stopped before starting it; run again"
        elif owner is not None and holder == owner:
            why = f"{INTERRUPTED}cut short by a fault of the database this runner recovered from; run again"
        else:
            died = deaths.get(key, 0) + 1
            deaths[key] = died
            how = ("the study was resumed by another runner" if exclusive and (expires is None or expires >= now)
                   else "its lease expired without a heartbeat")
            why = (f"{DIED} ({how}); run again" if died < RUNNER_DEATHS else
                   f"its runner died {died} times while running it ({how}): a run that kills its runner; "
                   "not run again")
        if why.startswith(INTERRUPTED):
            enqueue_again(study, space, strategy, trial_id)
        if number is not None:
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        with session_scope(sessions) as s:
            repo.finish_trial(session=s, trial_id=trial_id, status="failed", reason=why)
        log.warning("trial %d: %s", trial_id, why)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        fixed = t.system_attrs.get("fixed_params")
        if t.number not in stored and fixed:  # a point of the queue, asked for and lost before it was stored
            attrs = {k: v for k, v in t.user_attrs.items() if k != "zt_trial_id"}
            study.enqueue_trial(fixed, user_attrs=attrs)
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)  # asked, never stored
