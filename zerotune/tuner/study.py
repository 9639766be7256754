"""One study: an Optuna ask/tell loop over the strategy space, every trial stored in the database.

Optuna's RDB storage lives on the same database URL as our ``zt_`` tables (so ``optuna-dashboard``
can read the study), but zerotune owns the trial lifecycle: each dispatched trial gets a lease
that a heartbeat thread extends while its executor runs (Optuna's heartbeat does not cover
ask/tell). When a study is resumed, trials whose lease expired — their runner died — are failed
with that reason and retried once. A trial row is inserted already leased (one transaction), so a
runner that dies at any moment leaves a lease to expire, never an unowned row; a caller that holds
the study alone (a worker holding its job: ``exclusive=True``) fails every unfinished trial at once
on resume instead of waiting for the leases. A stopped tuner (``stop`` set: a cancel or a shutdown)
stores no recommendation: a partial study's answer is never served as final.

The cost model screens every point first: infeasible points are told with a positive constraint
(``trial.set_constraint``, read by TPE and NSGA-II) and never run, and every measured trial stores
the prediction for the same point, so model error stays visible.

Known-good strategies (zero3, zeropp, 3level-b, 3level-a, mics, and zero2, zero1, ddp where they
fit) are enqueued first, then the best strategies of the most similar earlier request (same cluster
family, nearest model size).

Every trial trains the same global batch (``TuneRequest.global_batch``, resolved by
``space.resolve_global_batch``): only micro-batch and accumulation vary, never their product with
the data-parallel world.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zerotune.core.spec import Strategy
from zerotune.costmodel import Calibration, predict
from zerotune.db import repository as repo
from zerotune.db.session import make_engine, make_session_factory, session_scope
from zerotune.errors import StudyFailed
from zerotune.tuner import calibrating, failures, optuna_study, remeasure, seeding
from zerotune.tuner.choice import Chooser, choose
from zerotune.tuner.executors.base import Executor, TrialResult, TrialSpec
from zerotune.tuner.executors.predicted import ModelExecutor
from zerotune.tuner.request import TuneRequest, strategy_key
from zerotune.tuner.space import Space, params_key

log = logging.getLogger("zerotune.tuner")

RETRIED = "retried once"
"""How a dead runner's trial ends its reason when a retry replaces it (the retry is what counts)."""


def prunes(step: int, seconds: float, best_s: float | None) -> bool:
    """The study's pruning rule: stop a run whose step ``step`` took ``seconds``, over 3x ``best_s``, the best
    completed trial's step time. Steps 1 and 2 never stop a run (the warm-up: compilation, allocator growth,
    first collectives), and without a completed trial there is nothing to compare with."""
    return best_s is not None and step > 2 and seconds > 3 * best_s


@dataclass
class Progress:
    done: int = 0
    total: int = 0
    phase: str = ""
    """screening (model executor), measuring, re-measuring k/n, verifying."""
    best_value: float | None = None
    last: dict[str, Any] = field(default_factory=dict)


class Tuner:
    """Runs (or resumes) the study of one request against one database."""

    def __init__(self, request: TuneRequest, *, db_url: str, executor: Executor, workdir: Path,
                 worker_id: str | None = None, lease_s: float = 60.0, trial_timeout_s: float = 600.0,
                 steps: int = 10, calibration: Calibration | None = None,
                 progress: Callable[[Progress], None] | None = None, stop: threading.Event | None = None,
                 verify_quantized: bool = True, exclusive: bool = False,
                 candidates: list[Strategy] | None = None, answer_key: str | None = None,
                 answer_note: dict[str, Any] | None = None) -> None:
        """``calibration``: what every prediction uses (None: ``tuner.calibrating.for_request``, the one
        ``request.calibration`` names, else the cluster's profile, with the request runner's collectives).
        ``verify_quantized``: proxy-verify a predicted quantized pick before recommending it
        (:func:`tuner.choice.choose`). ``exclusive``: the caller guarantees no other worker runs this study
        (a worker holding its job), so unfinished trials found at resume are dead whatever their lease says.
        ``candidates``: try exactly these strategies (a shortlist to measure) instead of the presets, the
        warm start and the sampler. ``answer_key``: store the recommendation under this request key (the
        request whose shortlist this measures), with ``answer_note`` in its metrics."""
        self.verify_quantized, self.exclusive = verify_quantized, exclusive
        self.request, self.executor, self.workdir = request, executor, Path(workdir)
        self.db_url = db_url
        self.worker_id = worker_id or f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
        self.lease_s, self.trial_timeout_s, self.steps = lease_s, trial_timeout_s, steps
        self.progress_cb, self.stop = progress, stop or threading.Event()
        self.candidates, self.answer_key, self.answer_note = candidates, answer_key, answer_note
        self.space = Space(request.cluster, global_batch=request.global_batch, runner=request.runner,
                           grad_widths=(32,) if request.grad_reduce_in_fp32 else None)
        self.refines = candidates is None and request.sampler == "tpe" and request.objective != "pareto"
        """Whether the study refines around its best trials before TPE samples (``seeding.refine``): a study of the
        default sampler for throughput; not a shortlist (exactly its strategies), not random search or NSGA-II
        (asked for as they are)."""
        self.sessions = make_session_factory(make_engine(db_url))
        if calibration is None and (request.calibration is not None or request.runner != "zerotune"):
            with session_scope(self.sessions) as s:
                calibration = calibrating.for_request(s, request)
        self.calibration = calibration
        if isinstance(executor, ModelExecutor) and executor.calibration is None:
            executor.calibration = calibration  # the model executor's values are what the study screened with
        self.remeasured: list[int] = []
        """Trials this study ran a second time because their intervals overlapped the leader's."""
        self.progress: Progress | None = None
        self.refit: dict[str, Any] | None = None
        """The calibration this study's measured runs refitted (``tuner.calibrating.refit_study``)."""

    # -- setup -------------------------------------------------------------------------------------
    def open(self) -> int:
        """Find or create the request and its study rows; return the study id."""
        r = self.request
        with session_scope(self.sessions) as s:
            req, _ = repo.get_or_create_request(session=s, key=r.key(), model=r.model.to_dict(),
                                             cluster=r.cluster.to_dict(), objective=r.objective,
                                             budget={"trials": r.trials, "time_s": r.time_budget_s},
                                             executor=r.executor, global_batch=r.global_batch,
                                             calibration=r.calibration, measure=r.measure, emulate=r.emulate,
                                             runner=r.runner, grad_reduce_in_fp32=r.grad_reduce_in_fp32)
            existing = next(reversed(repo.studies_of_request(session=s, request_id=req.id)), None)
            if existing is not None and existing.state != "failed":
                return existing.id
            study = repo.create_study(session=s, request_id=req.id, optuna_study_name=f"zerotune-{r.key()[:16]}-"
                                      f"{uuid.uuid4().hex[:6]}", sampler=r.sampler, executor=r.executor,
                                      n_trials=r.trials)
            return study.id

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, study_id: int | None = None) -> dict[str, Any]:
        """Run trials until the budget is spent; return the recommendation (``{}`` when stopped first:
        the study stays ``cancelled`` and resumable, and nothing partial is stored as an answer)."""
        study_id = study_id or self.open()
        self.study_id = study_id
        with session_scope(self.sessions) as s:
            row = repo.get_study(session=s, study_id=study_id)
            if row is None:
                raise StudyFailed(f"study {study_id} does not exist")
            name, fresh = row.optuna_study_name, row.state == "pending"
            repo.set_study_state(session=s, study_id=study_id, state="running")
        study = optuna_study.create(self.request, self.db_url, name)
        self._recover_dead_trials(study_id, study)
        if fresh:
            self._enqueue_known_good(study, study_id)
        progress = Progress(total=self.request.trials,
                            phase="measuring" if self.executor.measures else "screening")
        self.progress = progress
        deadline = time.monotonic() + self.request.time_budget_s if self.request.time_budget_s else math.inf
        asked = 0
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                progress.done = self._count_done(study_id)
                if progress.done >= self.request.trials or asked > 20 * self.request.trials:
                    break
                asked += 1
                if self.refines:
                    seeding.refine(study, self.space, self.request.trials - progress.done)
                if self._one_trial(study, study_id, progress) and self.progress_cb:
                    self.progress_cb(progress)
                if progress.best_value is None and self.executor.measures:  # only runs fail, until one completes
                    self._stop_on_repeated_failure(study_id)
            if self.executor.measures and not self.stop.is_set():
                self.remeasured = self._remeasure(study_id)
                self.refit = self._refit(study_id)
            recommendation = self.answer(study_id)
        except BaseException as exc:
            with session_scope(self.sessions) as s:
                repo.set_study_state(session=s, study_id=study_id, state="failed", error=str(exc)[:2000])
            raise
        with session_scope(self.sessions) as s:
            repo.set_study_state(session=s, study_id=study_id, state="cancelled" if self.stop.is_set() else "done")
        return recommendation

    def phase(self, name: str) -> None:
        """Tell the progress callback that the study entered phase ``name``."""
        progress = self.progress
        if progress is not None and self.progress_cb:
            progress.phase, progress.last = name, {}
            self.progress_cb(progress)

    def _trial_spec(self, strategy: Strategy, workdir: str) -> TrialSpec:
        """One short run of ``strategy`` for this request, in ``workdir`` under the study's."""
        return TrialSpec(model=self.request.model, cluster=self.request.cluster, strategy=strategy,
                         workdir=self.workdir / workdir, steps=self.steps, warmup=min(2, self.steps - 1),
                         global_batch=self.request.global_batch, timeout_s=self.trial_timeout_s)

    def _remeasure(self, study_id: int) -> list[int]:
        """Run the measured leaders whose intervals overlap again and pool their timed steps
        (``tuner.remeasure``); returns the trial ids re-measured. A second run that fails is logged and
        leaves the first measurement as it was."""
        with session_scope(self.sessions) as s:
            rows = repo.ranked_trials(session=s, study_id=study_id)
            ranked = [(t.id, float(t.value), dict(t.metrics)) for t in rows
                      if t.value is not None and t.metrics and t.metrics.get("step_times_s")]
            strategies = {t.id: Strategy.from_dict(t.strategy) for t in rows}
        known = {i: (v, m) for i, v, m in ranked}
        todo = [i for i in remeasure.overlapping(ranked) if not known[i][1].get("remeasured")]
        for k, trial_id in enumerate(todo):
            self.phase(f"re-measuring {k + 1}/{len(todo)}")
            try:
                result = self.executor.run(self._trial_spec(strategies[trial_id], f"trial-{trial_id}-again"),
                                            stop=self.stop)
            except Exception as exc:
                log.warning("trial %d: the second run could not start: %s: %s", trial_id, type(exc).__name__, exc)
                continue
            if not result.metrics or result.metrics.get("status") != "ok":
                log.warning("trial %d: the second run failed (%s); the first measurement stands", trial_id,
                            result.reason)
                continue
            value, metrics = remeasure.pooled(known[trial_id][1], known[trial_id][0], result.metrics)
            with session_scope(self.sessions) as s:
                repo.finish_trial(session=s, trial_id=trial_id, status="complete", value=value, metrics=metrics)
        return todo

    def _refit(self, study_id: int) -> dict[str, Any] | None:
        """Refit the calibration of the cluster the measured runs ran on; a refit that fails is logged and
        reported, never the study's failure (the measurements and the answer stand without it)."""
        try:
            with session_scope(self.sessions) as s:
                return calibrating.refit_study(s, study_id)
        except Exception as exc:
            calibrating.log.warning("study %d: refit failed: %s: %s", study_id, type(exc).__name__, exc)
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _stop_on_repeated_failure(self, study_id: int) -> None:
        """Fail fast: runs that keep failing for one cause before any completed (an unreachable Slurm
        controller, a broken environment) stop the study with that cause instead of spending the
        budget on it (``failures.FAIL_FAST``)."""
        with session_scope(self.sessions) as s:
            rows = repo.trial_outcomes(session=s, study_id=study_id)
        reason = failures.repeated_failure((status, why) for status, why in rows)
        if reason is not None:
            n = sum(failures.is_run_failure(status, why) for status, why in rows)
            raise StudyFailed(f"study {study_id} stopped after {n} failed runs and none completed, all with one "
                              f"cause (fix it and resubmit): {reason}")

    def _count_done(self, study_id: int) -> int:
        with session_scope(self.sessions) as s:
            # a trial whose runner died is replaced by its retry: only the retry counts against the budget
            return repo.count_spent_trials(session=s, study_id=study_id, replaced_suffix=RETRIED)

    def _one_trial(self, study: Any, study_id: int, progress: Progress) -> bool:
        """Ask, run and tell one trial; whether it ended with an outcome (``progress.last``): a point the rules
        exclude and a run stopped midway have none."""
        import optuna

        trial, strategy = self.space.ask(study)
        if strategy is None:  # a combination the rules exclude: cheap, not counted
            return False
        if trial.user_attrs.get("preset"):
            strategy = strategy.replace(name=trial.user_attrs["preset"])
        key = strategy_key(strategy)
        prediction = predict(self.request.model, self.request.cluster, strategy, global_batch=self.request.global_batch,
                             calibration=self.calibration)
        with session_scope(self.sessions) as s:
            row = repo.add_trial(session=s, study_id=study_id, strategy=strategy.to_dict(), strategy_key=key,
                                 executor=self.executor.name, number=trial.number, optuna_trial_id=trial._trial_id)
            trial_id = row.id
            # leased in the same transaction: a runner dying after this leaves a lease to expire
            repo.claim_trial(session=s, trial_id=trial_id, owner=self.worker_id, lease_s=self.lease_s)
        trial.set_user_attr("zt_trial_id", trial_id)
        optuna_study.constrain(trial, float(-prediction["headroom_bytes"]) / 2**30)
        if not prediction["feasible"]:
            infeasible = TrialResult(status="infeasible", reason=prediction["overflow"]["reason"], executor="model")
            self._finish(trial_id, infeasible, prediction, None)
            optuna_study.tell_infeasible(study, trial, prediction, self.request.objective)
            progress.last = {"number": trial.number, "status": infeasible.status, "reason": infeasible.reason,
                             "strategy": strategy.to_dict(), "value": None}
            return True
        result = self._dispatch(trial_id, strategy, prediction)
        if result.extra.get("interrupted"):  # stopped: the trial is left to be run again
            log.info("trial %d %s", trial_id, result.reason)
            return False
        value = optuna_study.values(result.metrics, self.request.objective) \
            if result.status == "complete" and result.metrics is not None else None
        self._finish(trial_id, result, prediction, value[0] if value else None)
        if value is None:  # a pruned run is Optuna's PRUNED too (its sampler treats the two differently)
            trial.set_user_attr("reason", result.reason or "failed")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED if result.status == "pruned"
                       else optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
            progress.best_value = max(progress.best_value or -math.inf, value[0])
        progress.last = {"number": trial.number, "status": result.status, "reason": result.reason,
                         "strategy": strategy.to_dict(), "value": value[0] if value else None}
        return True

    def _dispatch(self, trial_id: int, strategy: Strategy, prediction: dict[str, Any]) -> TrialResult:
        """Run one trial (leased when it was added) while a heartbeat keeps its lease alive.

        The run is stopped when the runner stops or when a heartbeat finds the lease gone (the trial
        expired and was claimed again, or was finished elsewhere); either way it is ``interrupted`` and
        its result is not stored by this runner."""
        halt, done = threading.Event(), threading.Event()

        def beat() -> None:
            interval, last = self.lease_s / 3, time.monotonic()
            while not done.wait(min(0.5, interval)):
                if self.stop.is_set():
                    halt.set()
                if time.monotonic() - last < interval:
                    continue
                last = time.monotonic()
                try:
                    with session_scope(self.sessions) as s:
                        held = repo.heartbeat_trial(session=s, trial_id=trial_id, owner=self.worker_id,
                                                    lease_s=self.lease_s)
                except Exception as exc:  # the database is away for a moment: the lease has time left
                    log.warning("trial %d: heartbeat failed: %s: %s", trial_id, type(exc).__name__, exc)
                    continue
                if not held:
                    log.warning("trial %d: the lease was lost (another runner holds the trial); stopping its run",
                                trial_id)
                    halt.set()
        thread = threading.Thread(target=beat, daemon=True, name=f"zerotune-heartbeat-{trial_id}")
        thread.start()
        spec = self._trial_spec(strategy, f"trial-{trial_id}")
        on_step = self._pruner() if self.candidates is None else None  # a shortlist is measured in full
        try:
            return self.executor.run(spec, stop=halt, on_step=on_step)
        except Exception as exc:  # an executor bug must fail the trial, not the study
            return TrialResult(status="failed", reason=f"executor error: {type(exc).__name__}: {exc}",
                               executor=self.executor.name)
        finally:
            done.set()
            thread.join(timeout=5)

    def _pruner(self) -> Callable[[int, float], bool]:
        """Stop a local run whose post-warm-up step time is 3x the best completed trial's."""
        best = self._best_step_time()

        def prune(step: int, seconds: float) -> bool:
            return prunes(step, seconds, best)
        return prune

    def _best_step_time(self) -> float | None:
        with session_scope(self.sessions) as s:
            rows = repo.ranked_trials(session=s, study_id=self.study_id)
            times = [t.metrics["step_time_s"] for t in rows if t.metrics and t.metrics.get("step_time_s")]
            return min(times) if times else None

    def _finish(self, trial_id: int, result: TrialResult, prediction: dict[str, Any], value: float | None) -> None:
        with session_scope(self.sessions) as s:
            repo.finish_trial(session=s, trial_id=trial_id, status=result.status, value=value,
                              metrics=result.metrics, prediction=prediction, reason=result.reason,
                              logs=result.logs, proxy_model=result.proxy_model)

    # -- recovery and seeding ------------------------------------------------------------------------
    def _recover_dead_trials(self, study_id: int, study: Any) -> None:
        """Fail trials whose runner died and retry each once.

        Dead: a ``running`` trial whose lease expired, a ``queued`` row (never claimed: left by an
        older version that inserted before leasing), and — when ``exclusive`` — every running trial,
        since no other runner can hold one.
        """
        import optuna

        now = datetime.now(UTC)
        retries = {t.number for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs}
        with session_scope(self.sessions) as s:
            dead = []
            for t in repo.dead_trials(session=s, study_id=study_id, now=now, all_running=self.exclusive):
                why = ("runner died before starting it" if t.status == "queued" else
                       "runner died: the study was resumed by another runner" if self.exclusive
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
                study.enqueue_trial(self.space.strategy_params(Strategy.from_dict(strategy)), user_attrs=attrs)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)  # asked, never stored

    def _enqueue_known_good(self, study: Any, study_id: int) -> None:
        seen: set[str] = set()
        strategies: list[tuple[Strategy, dict[str, Any]]]
        if self.candidates is not None:  # a shortlist: exactly these, nothing else
            strategies = [(s, {"preset": s.name} if s.name else {"shortlist": "true"}) for s in self.candidates]
        else:
            with session_scope(self.sessions) as session:
                similar = seeding.warm_start(session, self.request)
            strategies = seeding.known_good(self.request, self.calibration) + [
                (s, {"warm_start": "true"}) for s in similar]
        for strategy, attrs in strategies:
            params = self.space.strategy_params(strategy)
            key = params_key(params)
            # never more first picks than the budget: a retry enqueued later must still get its turn
            if key not in seen and len(seen) < self.request.trials:
                seen.add(key)
                study.enqueue_trial(params, user_attrs=attrs)

    def answer(self, study_id: int) -> dict[str, Any]:
        """The study's recommendation, stored; ``{}`` when the tuner was stopped (a partial study)."""
        if self.stop.is_set():
            return {}
        chooser = Chooser(request=self.request, sessions=self.sessions, workdir=self.workdir,
                          trial_timeout_s=self.trial_timeout_s, stop=self.stop, phase=self.phase,
                          answer_key=self.answer_key, refit=self.refit, remeasured=self.remeasured,
                          note=self.answer_note or {})
        return choose(chooser, study_id, verify_quantized=self.verify_quantized)

