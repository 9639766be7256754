"""The service and the prologue on the session's real one-node Slurm (the ``slurm`` fixture, tests/slurm/cluster.py).

- ``examples/slurm/train-measured.sbatch`` submitted with ``sbatch --wait`` against a real ``zerotune serve``: inside
  the job, ``zerotune recommend --measure`` measures the answer's shortlist as steps of that very job (``srun
  --jobid``, no job of their own), writes the measured winner, uploads the runs (stored as trials of the request,
  stamped with the job's id), and the script then trains on the winner with ``srun torchrun``.
- A measured request (``executor: slurm``) through the service, whose worker runs outside any allocation: the
  worker holds one allocation for the study (one queue wait), runs every trial as a step of it and releases it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import Launcher, rows
from tests.api.test_recommend import ZEROTUNE
from tests.slurm.cluster import PARTITION, LocalSlurm
from tests.slurm.queue import QueueWatch, login_env
from tests.support import ROOT

BODY = {"model": "gpt-tiny", "cluster": "local:2x1"}  # what `zerotune recommend` asks for local:2 by default


def slurm_env(slurm: LocalSlurm, **extra: str) -> dict[str, str]:
    """A login node's environment (``login_env``) with no ``ZEROTUNE_*`` of this process and zerotune on the PATH
    (what a job inherits from ``sbatch``)."""
    env = {k: v for k, v in login_env(slurm).items() if not k.startswith("ZEROTUNE_")}
    env["PATH"] = f"{Path(ZEROTUNE[0]).parent}:{env.get('PATH', '')}" if len(ZEROTUNE) == 1 else env.get("PATH", "")
    return env | extra


@pytest.fixture
def service(tmp_path: Path, slurm: LocalSlurm) -> Iterator[tuple[str, str, Launcher]]:
    """A real ``zerotune serve`` (one embedded worker) on a login node of the Slurm cluster: (url, db, launcher)."""
    launcher = Launcher(tmp_path / "service")
    (tmp_path / "service").mkdir()
    launcher.base_env = {k: v for k, v in launcher.base_env.items() if not k.startswith("SLURM_")}
    db = f"sqlite:///{tmp_path / 'service' / 'zerotune.sqlite'}"
    try:
        env = {**slurm.env, "ZEROTUNE_SLURM_PARTITION": PARTITION, "ZEROTUNE_STEPS": "3",
               "ZEROTUNE_TRIAL_TIMEOUT_S": "240"}
        server = launcher.serve(db, 1, None, True, None, **env)
        yield server.url, db, launcher
    finally:
        launcher.close()


@pytest.mark.timeout(600)
def test_the_example_batch_script_measures_its_shortlist_as_steps_and_trains_on_the_winner(slurm, service,
                                                                                        tmp_path):
    url, db, _ = service
    predicted = httpx.post(f"{url}/v1/recommendations", json=BODY, params={"wait": 120}, timeout=150)
    assert predicted.status_code == 200 and predicted.json()["evidence"] == "predicted", predicted.text
    shortlist = httpx.get(f"{url}/v1/recommendations/{predicted.json()['id']}/shortlist", timeout=30).json()
    assert len(shortlist["candidates"]) >= 2, shortlist

    work = tmp_path / "job"
    work.mkdir()
    env = slurm_env(slurm, ZEROTUNE_MODEL="gpt-tiny", ZEROTUNE_CLUSTER="local:2", ZEROTUNE_URL=url,
                    ZEROTUNE_MEASURE_S="200", ZEROTUNE_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    script = ROOT / "examples" / "slurm" / "train-measured.sbatch"
    with QueueWatch(slurm) as seen:
        sub = subprocess.run(["sbatch", "--wait", "--parsable", "-N", "1", f"--partition={PARTITION}",
                              f"--chdir={work}", f"--output={work}/out.txt", f"--error={work}/err.txt", str(script)],
                             env=env, capture_output=True, text=True, timeout=560)
    err = (work / "err.txt").read_text() if (work / "err.txt").exists() else ""
    assert sub.returncode == 0, f"{sub.stdout}{sub.stderr}\n{err[-4000:]}\n{slurm.logs()}"
    job = sub.stdout.strip().split(";")[0]
    assert seen.jobs == {job}, f"a job of their own: {seen.jobs}"  # the candidates ran inside the job
    assert seen.steps and all(s.startswith(f"{job}.") for s in seen.steps), seen.steps
    said = [line for line in err.splitlines()
            if line.startswith("zerotune: measured config (service), recommendation ")]
    assert len(said) == 1, err[-4000:]
    rec_id = int(said[0].split("recommendation ", 1)[1].split(";", 1)[0])

    # the candidates were steps of this job, on its node: their srun lines name it
    config_dir = work / ".zerotune" / f"job-{job}"
    sruns = sorted(config_dir.glob("measure/*/step.srun"))
    assert sruns and all(f"--jobid={job} " in p.read_text() for p in sruns), sruns

    # the runs are trials of the request, stamped with this job; the winner is the one the job trained on
    rec = httpx.get(f"{url}/v1/recommendations/{rec_id}", timeout=30).json()
    assert rec["evidence"] == "measured" and rec["metrics"]["measured_on_job"]["job"] == job
    trials = rows(db, "SELECT status, metrics FROM zt_trials WHERE study_id = :s", s=rec["study_id"])
    metrics = [json.loads(m) if isinstance(m, str) else m for _, m in trials]
    assert len(trials) == len(sruns) and all(m["job"]["id"] == job for m in metrics)
    trained = json.loads((config_dir / "run.json").read_text())
    assert trained["status"] == "ok" and trained["strategy"] == rec["strategy"], trained
    assert "measured on this allocation, job " + job in (config_dir / "notes.txt").read_text()


@pytest.mark.timeout(600)
def test_a_measured_request_holds_one_allocation_for_its_study(slurm, service):
    url, db, launcher = service
    body = {"model": "gpt-tiny", "cluster": "local:2", "executor": "slurm", "budget": {"trials": 2}}
    with QueueWatch(slurm) as seen:
        r = httpx.post(f"{url}/v1/recommendations", json=body, params={"wait": 500}, timeout=540)
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["evidence"] == "measured", rec
    (held,) = seen.jobs  # one allocation for the study: one queue wait, not one per trial
    assert seen.steps and all(s.startswith(f"{held}.") for s in seen.steps), seen.steps
    trials = rows(db, "SELECT executor, logs FROM zt_trials WHERE study_id = :s AND status = 'complete'",
                  s=rec["study_id"])
    assert len(trials) >= 2 and all(ex == "slurm" and f"zerotune: step of Slurm job {held} on " in logs
                                    for ex, logs in trials), trials
    assert len(list((launcher.tmp_path / "data" / "work").rglob("hold.sbatch"))) == 1
    end = time.monotonic() + 60  # released when the study ends
    while slurm.command("squeue", "-h", "-j", held, "-o", "%T").stdout.strip() and time.monotonic() < end:
        time.sleep(1)
    assert slurm.command("squeue", "-h", "-j", held, "-o", "%T").stdout.strip() == ""
