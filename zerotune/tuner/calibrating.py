"""The calibration a study predicts with, and the refit a measured study leaves for the next one.

A study on a cluster predicts with, in order: the calibration its request names (stored in the
database, or a ``zerotune calibrate`` file), else the newest one stored for that cluster (see
``db.repository.calibration_for_cluster``), else the cluster's own profile (``costmodel.calibration_for``).

A study whose trials were measured (``local`` or ``slurm``) refits the calibration of the cluster
the runs ran on from every measured run there, and stores it with its error on those runs before
and after (``costmodel.calibration.refit``): the next study on that cluster starts from it. An
emulated run (a preset cluster run on this machine at a smaller size) calibrates the machine it ran
on, never the cluster it stood in for, so its refit is stored under the machine's ``local:`` name.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy.orm import Session

from zerotune.core.records import RunMetrics
from zerotune.core.spec import ClusterSpec
from zerotune.costmodel import Calibration, calibration_for
from zerotune.costmodel.calibration import load_calibration, refit
from zerotune.costmodel.measured import Measurement
from zerotune.costmodel.rates import run_by
from zerotune.db import repository as repo
from zerotune.db.models import Trial
from zerotune.errors import SpecError

if TYPE_CHECKING:
    from zerotune.tuner.request import TuneRequest

log = logging.getLogger("zerotune.calibrations")
MAX_RUNS = 60
"""A refit uses the newest measured runs on the cluster, at most this many (a fit costs ~0.1 s per run)."""


def resolve_name(session: Session, cluster: ClusterSpec, name: str | None) -> str | None:
    """The calibration name a request on ``cluster`` uses: ``name`` when it exists, else the newest stored
    for the cluster, else None (the cluster's profile). An unknown ``name`` is a ``SpecError``."""
    if name is not None:
        load(session, name)
        return name
    row = repo.calibration_for_cluster(session=session, cluster=cluster.name, num_levels=cluster.num_levels)
    return row.name if row is not None else None


def load(session: Session, name: str | None) -> Calibration | None:
    """The calibration called ``name``: from the database, else from the calibration files; None for None."""
    if name is None:
        return None
    row = repo.get_calibration(session=session, name=name)
    if row is not None:
        return Calibration.from_dict(row.calibration)
    try:
        return load_calibration(name)
    except SpecError:
        stored = [c.name for c in repo.list_calibrations(session=session, limit=20)[0]]
        raise SpecError("calibration", name, f"no such calibration; stored: {stored or 'none'}") from None


def for_request(session: Session, request: TuneRequest) -> Calibration | None:
    """What a study of ``request`` predicts with: the calibration it names (None: the cluster's profile),
    charged the collectives of the request's runner (DeepSpeed and FSDP2 issue flat rings and reduce in
    backward: ``costmodel.rates.run_by``)."""
    calib = load(session, request.calibration)
    if request.runner == "zerotune":
        return calib
    return run_by(calib or calibration_for(request.cluster), request.runner)


MEASURED_STATUSES = ("complete", "failed")
MEASURING_EXECUTORS = ("local", "slurm", "external")
"""The executors whose trials ran: short runs here or through Slurm, and uploaded runs."""
TIMED_VERDICTS = ("ok", "flat", "diverged")
"""A failed trial counts when its run wrote run.json and the health gate failed it as flat or diverged: its
steps ran as a healthy run's do. A NaN run does not count (its later steps computed on NaN)."""


def _timed(t: Trial) -> bool:
    metrics = t.metrics or {}
    return metrics.get("status") == "ok" and (metrics.get("health") or {}).get("verdict", "ok") in TIMED_VERDICTS


def measured_runs(session: Session, cluster_run: str, limit: int = MAX_RUNS) -> list[tuple[int, Measurement]]:
    """The newest measured trials (local, slurm, uploaded) whose runs ran on ``cluster_run``, as (trial id,
    measurement). A run the health gate failed (flat, diverged, NaN loss) still ran to its end: its
    step times, bytes and memory are a measurement of the strategy and count here."""
    rows = repo.measured_trials(session=session, statuses=MEASURED_STATUSES, executors=MEASURING_EXECUTORS)
    out = []
    for t in rows:
        metrics = t.metrics or {}
        if not _timed(t) or (metrics.get("cluster") or {}).get("name") != cluster_run:
            continue
        try:
            out.append((t.id, Measurement.from_run(cast(RunMetrics, metrics), source=f"trial {t.id}")))
        except (KeyError, TypeError, ValueError, SpecError) as exc:
            log.warning("trial %d: its run.json cannot calibrate: %s", t.id, exc)
            continue
        if len(out) >= limit:
            break
    return out[::-1]


def refit_study(session: Session, study_id: int) -> dict[str, Any] | None:
    """Refit and store the calibration of the cluster the study's measured runs ran on.

    Returns the stored report (with ``name``), or None when the study measured nothing."""
    mine = list(repo.measured_trials(session=session, statuses=MEASURED_STATUSES, study_id=study_id))[::-1]
    clusters = [(t.metrics or {}).get("cluster") for t in mine if _timed(t)]
    if not clusters or not all(clusters):
        return None
    ran_on = ClusterSpec.from_dict(clusters[-1])
    name = f"{ran_on.name}-study{study_id}"
    existing = repo.get_calibration(session=session, name=name)
    if existing is not None:  # a resumed study that refitted already: nothing to read or fit again
        return {**existing.report, "name": name}
    runs = measured_runs(session, ran_on.name)
    if not runs:
        return None
    previous = repo.calibration_for_cluster(session=session, cluster=ran_on.name, num_levels=ran_on.num_levels)
    start = Calibration.from_dict(previous.calibration) if previous is not None else calibration_for(ran_on)
    calib, report = refit([m for _, m in runs], name=name, start=start)
    own = {t.id for t in mine}
    report.update(trial_ids=[i for i, _ in runs], study_trials=sum(i in own for i, _ in runs))
    repo.save_calibration(session=session, name=name, cluster=ran_on.name, num_levels=ran_on.num_levels,
                          calibration=calib.to_dict(), report=report, study_id=study_id)
    log.info("study %s: refitted %s from %d measured runs on %s: median error %.1f%% before, %.1f%% after "
             "(cross-validated %s)", study_id, name, len(runs), ran_on.name, 100 * report["before"]["rows"]["median"],
             100 * report["after"]["rows"]["median"],
             f"{100 * report['cross_validated']['rows']['median']:.1f}%" if report["cross_validated"] else "n/a")
    return {**report, "name": name}
