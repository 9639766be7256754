"""``zerotune recommend --measure``: the answer's shortlist measured by the batch job itself, against a real service.

The job is the real CLI as a subprocess with the variables a one-node Slurm batch job has (``SLURM_JOB_ID``,
``SLURM_JOB_NUM_NODES``), on ``local:2`` (two CPU ranks, gloo) with ``gpt-tiny``: every candidate is a real run of
the trainer under torchrun, seconds long. Checked: the shortlist measured, the winner written, the run.json files
stored as trials of the request, the cluster's calibration refitted, the next job of the same request served the
measurements (and measuring nothing), another request on the cluster predicting with the refit; and with the
service down, or a budget too small for any run, the job still gets a config and exit 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import Launcher, free_port, rows
from tests.api.test_recommend import read, recommend

BODY = {"model": "gpt-tiny", "cluster": "local:2x1", "executor": "model", "budget": {"trials": 8}}
ARGS = ["--model", "gpt-tiny", "--cluster", "local:2", "--trials", "8"]


def job_env(job: int, nodes: int = 1) -> dict[str, str]:
    """What an ``sbatch -N nodes`` job sets (the part ``zerotune recommend`` reads)."""
    return {"SLURM_JOB_ID": str(job), "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
            "SLURM_JOB_NODELIST": f"node[1-{nodes}]" if nodes > 1 else "node1"}


@dataclass
class Service:
    url: str
    db: str
    predicted: dict[str, Any]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A real ``zerotune serve`` (one embedded worker) holding the predicted answer of BODY."""
    tmp = tmp_path_factory.mktemp("measure-service")
    launcher = Launcher(tmp)
    db = f"sqlite:///{tmp / 'zerotune.sqlite'}"
    try:
        server = launcher.serve(db, workers=1)
        r = httpx.post(f"{server.url}/v1/recommendations", json=BODY, params={"wait": 120}, timeout=150)
        assert r.status_code == 200, r.text
        assert r.json()["evidence"] == "predicted"
        yield Service(server.url, db, r.json())
    finally:
        launcher.close()


def test_a_job_measures_its_shortlist_and_the_next_job_is_served_the_measurements(service, tmp_path):
    shortlist = httpx.get(f"{service.url}/v1/recommendations/{service.predicted['id']}/shortlist", timeout=30).json()
    assert len(shortlist["candidates"]) >= 2 and "unknown" in shortlist["why"]  # no calibration: the leaders

    out = tmp_path / "job101"
    r = recommend(*ARGS, "--server", service.url, "--measure", "150", "-o", str(out), cache=tmp_path / "cache",
                  timeout=240, **job_env(101))
    assert r.returncode == 0, r.stderr
    assert r.exports["ZEROTUNE_SOURCE"] == "service" and r.exports["ZEROTUNE_EVIDENCE"] == "measured", r.stderr
    rec_id = int(r.exports["ZEROTUNE_RECOMMENDATION_ID"])
    rec = httpx.get(f"{service.url}/v1/recommendations/{rec_id}", timeout=30).json()
    on_job = rec["metrics"]["measured_on_job"]
    assert on_job["job"] == "101" and on_job["cluster"] == "local:2x1"
    assert len(on_job["runs"]) + len(on_job["cut_off"]) == len(shortlist["candidates"])
    notes = (out / "notes.txt").read_text()
    assert "measured on this allocation, job 101" in notes
    assert "zerotune: warning: measured on this allocation, job 101" in r.stderr

    # the run.json files are trials of the request, each with its job; the winner is the fastest complete one
    trials = rows(service.db, "SELECT t.id, t.status, t.value, t.strategy, t.metrics, t.executor FROM zt_trials t "
                              "WHERE t.study_id = :s ORDER BY t.id", s=rec["study_id"])
    assert len(trials) == len(on_job["runs"]) and all(t[5] == "external" for t in trials)
    metrics = [json.loads(t[4]) if isinstance(t[4], str) else t[4] for t in trials]
    assert all(m["job"]["id"] == "101" and m["cluster"]["name"] == "local:2x1" for m in metrics)
    complete = [t for t in trials if t[1] == "complete"]
    best = max(complete, key=lambda t: t[2])
    assert rec["trial_id"] == best[0]
    winner = json.loads(best[3]) if isinstance(best[3], str) else best[3]
    assert read(out / "strategy.json") == winner == rec["strategy"]
    assert rec["metrics"]["measured_shortlist"]["predicted_recommendation_id"] == service.predicted["id"]

    # the cluster's calibration refitted from those runs, its error on them before and after
    refit = httpx.get(f"{service.url}/v1/calibrations/{on_job['refit']}", timeout=30).json()
    assert refit["cluster"] == "local:2x1" and refit["study_id"] == rec["study_id"]
    report = refit["report"]
    assert set(report["trial_ids"]) >= {t[0] for t in complete}
    assert report["after"]["rows"]["median"] < report["before"]["rows"]["median"]
    print(f"refit {refit['name']} from {len(report['trial_ids'])} runs: median error "
          f"{report['before']['rows']['median']:.1%} before, {report['after']['rows']['median']:.1%} after, "
          f"cross-validated {report['cross_validated'] and report['cross_validated']['rows']['median']}")

    # the next request (it now resolves to the refit calibration: another key) is served the measurements
    again = httpx.post(f"{service.url}/v1/recommendations", json=BODY, timeout=30)
    assert again.status_code == 200 and again.json()["id"] == rec_id, again.text
    # ... and the next job reuses them instead of measuring again
    r2 = recommend(*ARGS, "--server", service.url, "--measure", "150", "-o", str(tmp_path / "job102"),
                   cache=tmp_path / "cache2", **job_env(102))
    assert r2.returncode == 0 and r2.exports["ZEROTUNE_EVIDENCE"] == "measured", r2.stderr
    assert "reusing the measurement of job 101" in r2.stderr and r2.elapsed < 30
    assert not (tmp_path / "job102" / "measure").exists()
    assert "measured on an allocation of the same shape (local:2x1), job 101" in (
        tmp_path / "job102" / "notes.txt").read_text()
    # the same job's runs sent again: the answer they made, nothing stored twice
    body = {"job": "101", "budget_s": 150.0, "runs": [{**m, "logs": ""} for m in metrics]}
    for run, t in zip(body["runs"], trials, strict=True):
        run.pop("job")
        if t[1] != "complete":
            run["status"] = "failed"
    resent = httpx.post(f"{service.url}/v1/recommendations/{service.predicted['id']}/measurements", json=body,
                        timeout=60)
    assert resent.status_code == 200 and resent.json()["id"] == rec_id, resent.text

    # the dashboard says which job measured what
    page = httpx.get(f"{service.url}/dashboard", timeout=30).text
    section = page[page.index('id="measured-by-jobs"'):page.index("</section>", page.index('id="measured-by-jobs"'))]
    assert 'data-measured-job="101"' in section and refit["name"] in section
    assert all(f"/dashboard/trials/{t[0]}" in section for t in trials)

    # another request on the cluster predicts with the refit calibration
    other = httpx.post(f"{service.url}/v1/recommendations", json={**BODY, "global_batch": 16}, params={"wait": 120},
                       timeout=150)
    assert other.status_code == 200, other.text
    assert other.json()["metrics"]["calibration"] == refit["name"]


def test_a_run_of_another_shape_is_refused(service):
    run = {"status": "ok", "model": "gpt-tiny", "cluster": "local:2x2", "strategy": "zero1", "tflops_per_rank": 0.01}
    r = httpx.post(f"{service.url}/v1/recommendations/{service.predicted['id']}/measurements",
                   json={"job": "7", "budget_s": 60.0, "runs": [run]}, timeout=30)
    assert r.status_code == 422 and "runs on another shape measure nothing of this allocation" in r.text
    r = httpx.post(f"{service.url}/v1/recommendations/{service.predicted['id']}/measurements",
                   json={"job": "7", "budget_s": 60.0, "runs": [{**run, "cluster": "local:2x1", "strategy": "zero9"}]},
                   timeout=30)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.runs[0].strategy", r.text


def test_a_budget_too_small_keeps_the_predicted_answer(service, tmp_path):
    # two nodes (local:2x2): a request of its own, which no refit of local:2x1 has settled
    args = [*ARGS, "--server", service.url, "--wait", "120"]
    r = recommend(*args, "--measure", "3", "-o", str(tmp_path / "out"), cache=tmp_path / "cache", timeout=200,
                  **job_env(103, nodes=2))
    assert r.returncode == 0, r.stderr
    assert r.exports["ZEROTUNE_SOURCE"] == "service" and r.exports["ZEROTUNE_EVIDENCE"] == "predicted"
    warnings = [line for line in r.stderr.splitlines() if "--measure" in line]
    assert len(warnings) == 1 and "no candidate completed within --measure 3 s" in warnings[0], r.stderr
    assert "cut off by the budget (not started)" in r.stderr
    assert (tmp_path / "out" / "ds_config.json").is_file() and (tmp_path / "out" / "strategy.json").is_file()


def test_the_service_down_still_gives_the_job_a_config(tmp_path: Path):
    r = recommend(*ARGS, "--server", f"http://127.0.0.1:{free_port()}", "--measure", "60", "--timeout", "2",
                  "--quiet", "-o", str(tmp_path / "out"), cache=tmp_path / "cache", **job_env(104))
    assert r.returncode == 0, r.stderr
    assert r.exports["ZEROTUNE_SOURCE"] == "default"
    assert read(tmp_path / "out" / "strategy.json")["name"] == "zero3"
    (warning,) = r.stderr.strip().splitlines()  # one warning: the fallback's; nothing measured, nothing else said
    assert warning.startswith("zerotune: warning:") and "built-in default" in warning


def test_a_gpu_allocation_without_a_step_runner_keeps_the_predicted_answer(service, tmp_path):
    # frontier:2 has a shortlist (the service's own), but this node cannot run it as is, and no step runner exists
    args = ["--model", "gpt-tiny", "--cluster", "frontier", "--trials", "8", "--server", service.url, "--wait", "120"]
    r = recommend(*args, "--measure", "60", "-o", str(tmp_path / "out"), cache=tmp_path / "cache", timeout=200,
                  **job_env(105, nodes=2))
    assert r.returncode == 0, r.stderr
    assert r.exports["ZEROTUNE_TRAIN_CLUSTER"] == "frontier:2" and r.exports["ZEROTUNE_EVIDENCE"] == "predicted"
    shortlist = httpx.get(f"{service.url}/v1/recommendations/{r.exports['ZEROTUNE_RECOMMENDATION_ID']}/shortlist",
                          timeout=30).json()
    assert len(shortlist["candidates"]) >= 2, shortlist
    (warning,) = [line for line in r.stderr.splitlines() if "--measure" in line]
    assert "does not run on this node alone, and no Slurm step runner" in warning
    assert not (tmp_path / "out" / "measure").exists()
