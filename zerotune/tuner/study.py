"""One study: an Optuna ask/tell loop over the strategy space, every trial stored in the database.

Optuna's RDB storage lives on the same database URL as our ``zt_`` tables (so ``optuna-dashboard``
can read the study), but zerotune owns the trial lifecycle: each dispatched trial gets a lease
that a heartbeat thread extends while its executor runs (Optuna's heartbeat does not cover
ask/tell). A trial cut short from outside — a stop (``stop`` set: a cancel or a shutdown), a runner
that died, a fault of the database — is recorded as ``interrupted:`` and its point run again, whatever
number of times; it never counts against the budget (``leases.UNSPENT``) nor as a failure. A stop is
recorded when it happens; when a study is resumed, trials whose lease expired — their runner died — are
recorded then. A trial row is inserted already leased (one transaction), so a runner that dies at any
moment leaves a lease to expire, never an unowned row; a caller that holds the study alone (a worker
holding its job: ``exclusive=True``) recovers every unfinished trial at once on resume instead of
waiting for the leases. A fault of the infrastructure (``tuner.infrastructure``) leaves the study as it
stood, for the caller to resume. A stopped tuner stores no recommendation: a partial study's answer is
never served as final.

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
from pathlib import Path
from typing import Any, cast

from sqlalchemy.orm import Session, sessionmaker

from zerotune.core.records import Prediction, RunMetrics
from zerotune.core.spec import Strategy
from zerotune.costmodel import Calibration, predict
from zerotune.db import repository as repo
from zerotune.db.session import session_scope, url_of
from zerotune.errors import SpecError, StudyFailed
from zerotune.tuner import calibrating, failures, infrastructure, leases, optuna_study, remeasure, seeding
from zerotune.tuner.choice import Chooser, choose, partition
from zerotune.tuner.executors.base import Executor, StepHook, TrialResult, TrialSpec
from zerotune.tuner.leases import UNSPENT
from zerotune.tuner.request import TuneRequest, strategy_key
from zerotune.tuner.space import Space, params_key
from zerotune.tuner.study_options import Progress, TunerOptions, prunes

log = logging.getLogger("zerotune.tuner")


class Tuner:
    """Runs (or resumes) the study of one request against one database.

    The constructor only keeps what it is given: the database is first read by :meth:`open` or :meth:`run`."""

    def __init__(self, request: TuneRequest, *, sessions: sessionmaker[Session], executor: Executor, workdir: Path,
                 options: TunerOptions | None = None, calibration: Calibration | None = None,
                 progress: Callable[[Progress], None] | None = None, stop: threading.Event | None = None) -> None:
        """``sessions``: the database the study lives in (Optuna's storage opens the same URL). ``executor``:
        runs each trial, configured where it was made (a model executor predicts with the calibration it was
        given). ``calibration``: what the study screens and seeds with (None: ``tuner.calibrating.for_request``
        at :meth:`run`, the one ``request.calibration`` names, else the cluster's profile, with the request
        runner's collectives). ``progress``: told after each trial and at each new phase. ``stop``: set to stop
        the study (a cancel or a shutdown) after the trial in progress."""
        self.request, self.sessions, self.executor, self.workdir = request, sessions, executor, Path(workdir)
        self.options = options or TunerOptions()
        self.worker_id = self.options.worker_id or f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
        self.calibration = calibration
        self.progress_cb, self.stop = progress, stop or threading.Event()
        self.space = Space(request.cluster, global_batch=request.global_batch, runner=request.runner,
                           grad_widths=(32,) if request.grad_reduce_in_fp32 else None)
        self.remeasured: list[int] = []
        """Trials this study ran a second time because their intervals overlapped the leader's."""
        self.progress: Progress | None = None
        self.refit: dict[str, Any] | None = None
        """The calibration this study's measured runs refitted (``tuner.calibrating.refit_study``)."""

    @property
    def refines(self) -> bool:
        """Whether the study refines around its best trials before TPE samples (``seeding.refine``): a study of the
        default sampler for throughput; not random search or NSGA-II (asked for as they are)."""
        return self.request.sampler == "tpe" and self.request.objective != "pareto"

    # -- setup -------------------------------------------------------------------------------------
    def open(self) -> int:
        """Find or create the request and its study rows; return the study id."""
        r = self.request
        with session_scope(self.sessions) as s:
            req, _ = repo.get_or_create_request(session=s, key=r.key(), spec=r.to_dict())
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
        if self.calibration is None:  # read here, not when the Tuner is made: a constructor reads nothing
            with session_scope(self.sessions) as s:
                self.calibration = calibrating.for_request(s, self.request)
        study_id = study_id or self.open()
        self.study_id = study_id
        with session_scope(self.sessions) as s:
            row = repo.get_study(session=s, study_id=study_id)
            if row is None:
                raise StudyFailed(f"study {study_id} does not exist")
            name, fresh = row.optuna_study_name, row.state == "pending"
            repo.set_study_state(session=s, study_id=study_id, state="running")
        study = optuna_study.create(self.request, url_of(self.sessions), name)
        leases.recover_dead_trials(self.sessions, study, study_id, self.space, exclusive=self.options.exclusive,
                                   owner=self.worker_id)
        if fresh:
            self._enqueue_first_picks(study)
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
            if recommendation:  # what optuna-dashboard shows as best may be a trial the answer passed over
                optuna_study.mark_choice(study, recommendation)
        except BaseException as exc:
            if isinstance(exc, Exception) and infrastructure.fault(exc) is not None:
                raise  # not the study's failure: it stays as it stood, to be resumed
            with session_scope(self.sessions) as s:
                repo.set_study_state(session=s, study_id=study_id, state="failed", error=str(exc)[:2000])
            raise
        finally:
            self.executor.close()  # e.g. the Slurm allocation held for the study's trials
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
                         workdir=self.workdir / workdir, steps=self.options.steps,
                         warmup=min(2, self.options.steps - 1), global_batch=self.request.global_batch,
                         timeout_s=self.options.trial_timeout_s, memory_reserve_gib=self.request.memory_reserve_gib)

    def _remeasure(self, study_id: int) -> list[int]:
        """Run the measured leaders whose intervals overlap again and pool their timed steps
        (``tuner.remeasure``); returns the trial ids re-measured. A second run that fails is logged and
        leaves the first measurement as it was."""
        with session_scope(self.sessions) as s:
            rows = repo.ranked_trials(session=s, study_id=study_id)
            ranked = [(t.id, float(t.value), cast(RunMetrics, dict(t.metrics))) for t in rows
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
            value, metrics = remeasure.pooled(known[trial_id][1], known[trial_id][0], cast(RunMetrics, result.metrics))
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
            # a trial cut short from outside is run again: only the run that ends counts against the budget
            return repo.count_spent_trials(session=s, study_id=study_id, unspent=UNSPENT)

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
                             calibration=self.calibration, memory_reserve_gib=self.request.memory_reserve_gib)
        with session_scope(self.sessions) as s:
            row = repo.add_trial(session=s, study_id=study_id, strategy=strategy.to_dict(), strategy_key=key,
                                 executor=self.executor.name, number=trial.number, optuna_trial_id=trial._trial_id)
            trial_id = row.id
            # leased in the same transaction: a runner dying after this leaves a lease to expire
            repo.claim_trial(session=s, trial_id=trial_id, owner=self.worker_id, lease_s=self.options.lease_s)
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
        if result.extra.get("interrupted"):  # cut short from outside: its point is run again
            log.info("trial %d %s", trial_id, result.reason)
            if self.stop.is_set():  # a stop, said now (a lost lease: the trial is another runner's)
                self._interrupted(study, trial, trial_id, strategy, result.reason or "interrupted")
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

    def _interrupted(self, study: Any, trial: Any, trial_id: int, strategy: Strategy, reason: str) -> None:
        """Record a trial the stop cut short as interrupted, and enqueue its point again (first: a fault between the
        two can repeat the point, never lose it)."""
        import optuna

        leases.enqueue_again(study, self.space, strategy.to_dict(), trial_id)
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        why = reason if reason.startswith(leases.INTERRUPTED) else f"{leases.INTERRUPTED}{reason}"
        with session_scope(self.sessions) as s:
            repo.finish_trial(session=s, trial_id=trial_id, status="failed", reason=f"{why}; run again",
                              owner=self.worker_id)

    def _dispatch(self, trial_id: int, strategy: Strategy, prediction: Prediction) -> TrialResult:
        """Run one trial (leased when it was added) while a heartbeat keeps its lease alive.

        The run is stopped when the runner stops or when a heartbeat finds the lease gone (the trial
        expired and was claimed again, or was finished elsewhere); either way it is ``interrupted`` and
        its result is not stored by this runner."""
        spec, on_step = self._trial_spec(strategy, f"trial-{trial_id}"), self._pruner()
        with leases.held(self.sessions, trial_id, owner=self.worker_id, lease_s=self.options.lease_s,
                         stop=self.stop) as halt:
            try:
                return self.executor.run(spec, stop=halt, on_step=on_step)
            except Exception as exc:  # an executor bug must fail the trial, not the study
                return TrialResult(status="failed", reason=f"executor error: {type(exc).__name__}: {exc}",
                                   executor=self.executor.name)

    def _pruner(self) -> StepHook | None:
        """What stops a run early (None: each runs in full): a run whose post-warm-up step time is 3x the best
        completed trial's."""
        best = self._best_step_time()

        def prune(step: int, seconds: float) -> bool:
            return prunes(step, seconds, best)
        return prune

    def _best_step_time(self) -> float | None:
        with session_scope(self.sessions) as s:
            rows = repo.ranked_trials(session=s, study_id=self.study_id)
            times = [t.metrics["step_time_s"] for t in rows if t.metrics and t.metrics.get("step_time_s")]
            return min(times) if times else None

    def _finish(self, trial_id: int, result: TrialResult, prediction: Prediction, value: float | None) -> None:
        with session_scope(self.sessions) as s:
            repo.finish_trial(session=s, trial_id=trial_id, status=result.status, value=value,
                              metrics=result.metrics, prediction=prediction, reason=result.reason,
                              logs=result.logs, proxy_model=result.proxy_model)

    # -- seeding ------------------------------------------------------------------------------------
    def _first_picks(self) -> list[tuple[Strategy, dict[str, Any]]]:
        """What a fresh study tries first, with the user attributes that say why: the known-good strategies
        that fit, then the best of the most similar earlier request."""
        with session_scope(self.sessions) as session:
            similar = seeding.warm_start(session, self.request)
        return (self._baseline_pick() + seeding.known_good(self.request, self.calibration)
                + [(s, {"warm_start": "true"}) for s in similar])

    def _baseline_pick(self) -> list[tuple[Strategy, dict[str, Any]]]:
        """The user's baseline as the study's first trial, where the search space holds it (its buckets snapped to
        the space's choices): a measuring study then measures it, and the answer states the measured gain."""
        searched = self.baseline_as_searched()
        return [] if searched is None else [(searched, {"baseline": "true"})]

    def baseline_as_searched(self) -> Strategy | None:
        """The baseline's strategy as this study's space runs it (None without a baseline, or where the space does
        not hold it: another runner's rule, a span or hpZ group it does not search)."""
        if self.request.baseline is None:
            return None
        from zerotune.tuner.baseline import parse_baseline

        base = self.request.fit(parse_baseline(self.request.baseline, self.request.model, self.request.cluster,
                                               self.request.global_batch).strategy)
        try:
            searched = self.space.strategy_of(self.space.strategy_params(base))
        except (ValueError, KeyError, SpecError):
            return None
        return searched if partition(searched) == partition(base) else None

    def _enqueue_first_picks(self, study: Any) -> None:
        seen: set[str] = set()
        for strategy, attrs in self._first_picks():
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
        return choose(self._chooser(), study_id, verify_quantized=self.options.verify_quantized)

    def _chooser(self) -> Chooser:
        """What choosing this study's answer needs of it (the answer is stored under the request's key)."""
        return Chooser(request=self.request, sessions=self.sessions, workdir=self.workdir,
                       trial_timeout_s=self.options.trial_timeout_s, stop=self.stop, phase=self.phase,
                       refit=self.refit, remeasured=self.remeasured, baseline=self.baseline_as_searched())

