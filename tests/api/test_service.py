"""End to end through real HTTP: post, wait, read the recommendation, its exports and its study."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy

from tests.api.conftest import ROOT, rows, wait_job

NEOX = {"model": "gpt-neox-20b", "cluster": "frontier:48", "executor": "model", "budget": {"trials": 10}}


def check_recommendation(url: str, rec: dict, shortlist_of: bool = False) -> None:
    """The recommendation, each export download, its study, trials (paged, filtered) and one trial.

    ``shortlist_of``: the answer measured a predicted request's shortlist: its study is a measured
    request of its own, and the answer is stored under the predicted request's key."""
    assert set(rec["exports"]) >= {"zerotune", "deepspeed", "fsdp"}
    assert rec["evidence"] in ("predicted", "proxy-verified", "measured") and rec["value"] > 0
    again = httpx.get(f"{url}/v1/recommendations/{rec['id']}").json()
    assert again == rec
    for fmt, filename in (("zerotune", "zerotune.json"), ("deepspeed", "ds_config.json"), ("fsdp", "fsdp.json")):
        r = httpx.get(f"{url}/v1/recommendations/{rec['id']}", params={"format": fmt})
        assert r.status_code == 200 and r.json() == rec["exports"][fmt]
        assert f'filename="{filename}"' in r.headers["content-disposition"]
    ex = rec["exports"]  # the formats for other tools: each file as its tool reads it
    for params, filename, body in (
            ({"format": "torchtitan"}, "torchtitan.toml", ex["torchtitan"]["toml"]),
            ({"format": "accelerate"}, "accelerate_fsdp.yaml", ex["accelerate"]["fsdp_yaml"]),
            ({"format": "accelerate", "plugin": "deepspeed"}, "accelerate_deepspeed.yaml",
             ex["accelerate"]["deepspeed_yaml"])):
        r = httpx.get(f"{url}/v1/recommendations/{rec['id']}", params=params)
        assert r.status_code == 200 and r.text == body, (params, r.text)
        assert f'filename="{filename}"' in r.headers["content-disposition"]
    r = httpx.get(f"{url}/v1/recommendations/{rec['id']}", params={"format": "hf-trainer"})
    assert r.status_code == 200 and r.json() == ex["hf-trainer"]["config"]
    assert r.json()["train_micro_batch_size_per_gpu"] == "auto"
    assert 'filename="hf_ds_config.json"' in r.headers["content-disposition"]
    assert rec["exports"]["deepspeed"]["zero_optimization"]["stage"] in (1, 2, 3)
    study = httpx.get(f"{url}/v1/studies/{rec['study_id']}").json()
    assert study["state"] == "done" and study["recommendation_id"] == rec["id"]
    lossy = rec["metrics"]["decision"]["lossy"]  # the fastest trial, unless a lossy leader was passed over
    fastest = lossy["quantized_trial_id"] if lossy and lossy["kept"] == "unquantized" else rec["trial_id"]
    assert study["best_trial_id"] == fastest
    if shortlist_of:
        assert study["request"]["key"] != rec["request_key"] and study["request"]["executor"] == "local"
    else:
        assert study["request"]["key"] == rec["request_key"]
    page = httpx.get(f"{url}/v1/studies/{rec['study_id']}/trials", params={"limit": 2}).json()
    assert len(page["data"]) == 2 and page["count"] == sum(study["trial_counts"].values())
    complete = httpx.get(f"{url}/v1/studies/{rec['study_id']}/trials", params={"status": "complete"}).json()
    assert complete["count"] == study["trial_counts"]["complete"]
    assert all(t["status"] == "complete" for t in complete["data"])
    trial = httpx.get(f"{url}/v1/trials/{rec['trial_id']}").json()
    assert trial["status"] == "complete" and trial["value"] == rec["value"] and trial["metrics"]
    listed = httpx.get(f"{url}/v1/studies").json()
    assert rec["study_id"] in [s["id"] for s in listed["data"]]


def torch_loaded(pid: int) -> bool:
    """Whether process ``pid`` (and not one of its children) has torch's library mapped."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.timeout(240)
def test_model_executor_end_to_end(db_url, launcher):
    server = launcher.serve(db_url)
    url = server.url
    first = httpx.post(f"{url}/v1/recommendations", json=NEOX)
    assert first.status_code == 202 and first.headers["location"] == f"/v1/jobs/{first.json()['id']}"
    job = wait_job(url, first.json()["id"])
    assert job["state"] == "done" and job["trials_done"] == 10 and job["progress"] == 1.0 and job["best_value"] > 0
    # equivalent (presets expanded, defaults filled): the same stored answer at once
    explicit_model = httpx.get(f"{url}/v1/catalog").json()["models"]["gpt-neox-20b"]
    explicit_model.pop("num_params")
    again = httpx.post(f"{url}/v1/recommendations", json={**NEOX, "model": explicit_model, "objective": "throughput"})
    assert again.status_code == 200
    rec = again.json()
    assert rec["id"] == job["recommendation_id"] and rec["request_key"] == job["request_key"]
    check_recommendation(url, rec)
    repeat = httpx.post(f"{url}/v1/recommendations", json=NEOX)  # the cached bytes
    assert repeat.status_code == 200 and repeat.content == again.content
    assert rows(db_url, "SELECT count(*) FROM zt_jobs")[0][0] == 1
    metrics = httpx.get(f"{url}/metrics").text
    assert 'zerotune_jobs{state="done"} 1' in metrics and "zerotune_cache_hits_total" in metrics
    assert 'zerotune_http_requests_total{method="POST",route="/v1/recommendations",status="200"}' in metrics
    ready = httpx.get(f"{url}/readyz").json()
    assert ready["status"] == "ok" and ready["checks"]["workers"]["embedded_alive"] == 1
    assert ready["checks"]["workers"]["live"] == 1 and "zerotune_workers_live 1" in metrics
    deadline = time.monotonic() + 10  # the worker says idle right after finishing its job
    while (worker := httpx.get(f"{url}/v1/workers").json()["data"][0])["state"] != "idle":
        assert time.monotonic() < deadline, worker
        time.sleep(0.1)
    assert worker["jobs_run"] == 1 and worker["job_id"] is None
    assert not torch_loaded(server.proc.pid), "the API process imported torch"


@pytest.mark.timeout(420)
def test_local_executor_end_to_end_and_upload(sqlite_url, launcher, tmp_path):
    server = launcher.serve(sqlite_url)
    url = server.url
    body = {"model": "gpt-tiny", "cluster": "local:2x2", "executor": "local", "budget": {"trials": 2}}
    r = httpx.post(f"{url}/v1/recommendations", json=body, params={"wait": 300}, timeout=330)
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["evidence"] == "measured" and rec["metrics"]["health"]["verdict"] == "ok"
    check_recommendation(url, rec)
    trial = httpx.get(f"{url}/v1/trials/{rec['trial_id']}").json()
    assert trial["executor"] == "local" and "step" in trial["logs"]
    assert trial["metrics"]["bytes_per_level"] == trial["prediction"]["bytes_per_level"]
    assert not torch_loaded(server.proc.pid), "the API process imported torch"

    # the measured run.json goes back in as an external trial: zerotune upload
    run = tmp_path / "run.json"
    run.write_text(json.dumps(trial["metrics"]))
    upload = [sys.executable, "-m", "zerotune.api.cli", "upload", str(run), "--url", url]
    first = subprocess.run(upload, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and "stored trial" in first.stderr, first.stderr
    second = subprocess.run(upload, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "already stored" in second.stderr, second.stderr
    (stored,) = rows(sqlite_url, "SELECT id, status, value, executor FROM zt_trials WHERE executor = 'external'")
    assert stored[1] == "complete" and stored[2] == trial["metrics"]["tflops_per_rank"]
    uploaded = httpx.get(f"{url}/v1/trials/{stored[0]}").json()
    assert uploaded["metrics"]["tokens_per_s"] == trial["metrics"]["tokens_per_s"] and uploaded["prediction"]

    # the same CPU run labelled as a Frontier run is refused, naming both devices; nothing is stored
    run.write_text(json.dumps({**trial["metrics"], "cluster": "frontier:2"}))
    refused = subprocess.run(upload, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "body.device" in refused.stderr and "cpu (" in refused.stderr and "AMD MI250X GCD" in refused.stderr
    assert len(rows(sqlite_url, "SELECT id FROM zt_trials WHERE executor = 'external'")) == 1


@pytest.mark.timeout(420)
def test_measured_study_through_the_service(sqlite_url, launcher):
    """gpt-7b on dgx-h100:2 through its proxy, with the local executor through the service: no trial fails (a
    slower one may be pruned), the polled job names its phase while it runs, and the answer states the leaders'
    intervals. (A measured study of a preset that runs as itself, gpt-mini, is tests/tuner/test_tune_cli.py's:
    the service and the CLI run the same Tuner.)"""
    model, cluster, trials, evidence = "gpt-7b", "dgx-h100:2", 3, "proxy-verified"
    server = launcher.serve(sqlite_url)
    body = {"model": model, "cluster": cluster, "executor": "local", "budget": {"trials": trials}}
    r = httpx.post(f"{server.url}/v1/recommendations", json=body, timeout=30)
    assert r.status_code == 202, r.text
    job_id, phases, running_progress = r.json()["id"], set(), []
    deadline = time.monotonic() + 360
    while time.monotonic() < deadline:
        job = httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=10).json()
        if job["state"] != "running" and job["state"] != "queued":
            break
        phases.add(job["phase"])
        running_progress.append(job["progress"])
        time.sleep(0.3)
    assert job["state"] == "done" and job["progress"] == 1.0, job
    assert running_progress and max(running_progress) < 1.0  # 1.0 only once done: never while re-measuring
    assert "measuring" in phases and job["phase"] is None, (phases, job)  # a done job is in no phase
    rec = httpx.get(f"{server.url}/v1/recommendations/{job['recommendation_id']}").json()
    assert rec["evidence"] == evidence and rec["metrics"]["health"]["verdict"] == "ok"
    statuses = rows(sqlite_url, "SELECT status, reason FROM zt_trials")
    # every trial trains to its end or is stopped early because its step times already lose to the best
    # trial's (the pruner's verdict on a slower strategy, or on a noisy machine): none fails
    assert len(statuses) >= trials and statuses.count(("complete", None)) >= 1, statuses
    assert all(st == "complete" or (st == "pruned" and "worse than the study's best" in (why or ""))
               for st, why in statuses), statuses
    lead = next(lead for lead in rec["metrics"]["leaders"] if lead["trial_id"] == rec["trial_id"])
    assert lead["interval"][0] <= lead["value"] <= lead["interval"][1]


@pytest.mark.timeout(420)
def test_a_measured_shortlist_answers_and_refits_the_calibration_the_next_request_uses(sqlite_url, launcher):
    """A model study asked to measure its shortlist: with no calibration on local:2x2 the model's error there is
    unknown, so its three fastest partitions are measured with the local executor; the measured fastest is the
    answer served for the request, and the measured runs refit the cluster's calibration, which the next request
    on that cluster predicts with (a new question: a new key)."""
    server = launcher.serve(sqlite_url)
    url = server.url
    body = {"model": "gpt-tiny", "cluster": "local:2x2", "budget": {"trials": 6}, "measure_shortlist": "local"}
    r = httpx.post(f"{url}/v1/recommendations", json=body, params={"wait": 360}, timeout=400)
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["evidence"] == "measured" and rec["metrics"]["health"]["verdict"] == "ok"
    check_recommendation(url, rec, shortlist_of=True)
    note = rec["metrics"]["measured_shortlist"]
    assert note["candidates"] == 3 and note["executor"] == "local" and "error on local:2x2 is unknown" in note["why"]
    assert isinstance(note["agrees"], bool)
    predicted = httpx.get(f"{url}/v1/recommendations/{note['predicted_recommendation_id']}").json()
    assert predicted["evidence"] == "predicted" and predicted["request_key"] == rec["request_key"]
    measured = httpx.get(f"{url}/v1/studies/{rec['study_id']}/trials").json()["data"]
    assert len(measured) == 3 and {t["executor"] for t in measured} == {"local"}
    assert {json.dumps(t["strategy"], sort_keys=True) for t in measured} == {  # exactly the three leaders
        json.dumps(s, sort_keys=True) for s in [predicted["strategy"], *[
            t["strategy"] for t in httpx.get(f"{url}/v1/studies/{predicted['study_id']}/trials",
                                             params={"status": "complete"}).json()["data"]]]
        if json.dumps(s, sort_keys=True) in {json.dumps(t["strategy"], sort_keys=True) for t in measured}}
    (job,) = rows(sqlite_url, "SELECT state, study_id FROM zt_jobs")
    assert job == ("done", rec["study_id"])
    again = httpx.post(f"{url}/v1/recommendations", json=body, timeout=30)  # the same request: the served answer
    assert again.status_code == 200 and again.json()["id"] == rec["id"]

    # the refit, stored and listed with its error before and after
    refit = rec["metrics"]["refit"]  # every complete measured run (a shortlist is never pruned; one may still fail)
    assert refit["name"] == f"local:2x2-study{rec['study_id']}"
    assert refit["runs"] == sum(t["status"] == "complete" for t in measured) >= 2
    assert refit["after"]["rows"]["median"] < refit["before"]["rows"]["median"]
    listed = httpx.get(f"{url}/v1/calibrations").json()
    assert listed["count"] == 1 and listed["data"][0]["name"] == refit["name"]
    one = httpx.get(f"{url}/v1/calibrations/{refit['name']}").json()
    assert one["cluster"] == "local:2x2" and one["report"]["before"] == refit["before"]
    assert one["calibration"]["measured_error"]["runs"] == refit["runs"]
    assert httpx.get(f"{url}/v1/calibrations/nope").status_code == 404
    page = httpx.get(f"{url}/dashboard/recommendations/{rec['id']}").text  # the page says what was measured, and why
    assert 'id="measured-shortlist"' in page and "3 candidates measured with the local executor" in page
    assert f"predicted answer {predicted['id']}" in page and refit["name"] in page and 'class="err-after"' in page

    # the next request on the cluster predicts with it
    plain = {"model": "gpt-tiny", "cluster": "local:2x2", "budget": {"trials": 4}}
    nxt = httpx.post(f"{url}/v1/recommendations", json=plain, params={"wait": 120}, timeout=150)
    assert nxt.status_code == 200, nxt.text
    answer = nxt.json()
    assert answer["metrics"]["calibration"] == refit["name"]
    assert answer["metrics"]["error_band"]["source"].startswith(f"{refit['runs']} measured runs on local:2x2")
    assert rows(sqlite_url, "SELECT json_extract(spec, '$.calibration') FROM zt_requests WHERE key = :k",
                k=answer["request_key"]) == [(refit["name"],)]


@pytest.mark.timeout(180)
def test_wait_cancel_and_errors(sqlite_url, launcher):
    url = launcher.serve(sqlite_url, workers=0).url  # nobody runs the job: it stays queued
    body = {**NEOX, "cluster": "frontier:2"}
    held = httpx.post(f"{url}/v1/recommendations", json=body, params={"wait": 1.0}, timeout=10)
    assert held.status_code == 202 and held.json()["state"] == "queued"
    job_id = held.json()["id"]
    cancelled = httpx.delete(f"{url}/v1/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert "cancelled by a client" in cancelled.json()["error"]
    assert httpx.get(f"{url}/v1/jobs/{job_id}").json()["error"] == cancelled.json()["error"]
    assert httpx.delete(f"{url}/v1/jobs/{job_id}").status_code == 409
    requeued = httpx.post(f"{url}/v1/recommendations", json=body)  # a cancelled job does not block a new one
    assert requeued.status_code == 202 and requeued.json()["id"] != job_id
    for path in ("/v1/jobs/999", "/v1/studies/999", "/v1/studies/999/trials", "/v1/trials/999",
                 "/v1/recommendations/999"):
        r = httpx.get(url + path)
        assert r.status_code == 404 and "999" in r.json()["detail"], path


@pytest.mark.parametrize("body, field, rule", [
    ({"model": "gpt-99b", "cluster": "frontier:4"}, "body.model", "unknown model preset"),
    ({"model": "/etc/passwd", "cluster": "frontier:4"}, "body.model", "unknown model preset"),
    ({"model": "gpt-tiny", "cluster": "/etc/hosts.json"}, "body.cluster", "unknown cluster preset"),
    ({"model": "gpt-tiny", "cluster": "frontier:0"}, "body.cluster", ">= 1"),
    ({"model": "gpt-tiny", "cluster": "mars:4"}, "body.cluster", "unknown cluster preset"),
    ({"model": "gpt-tiny", "cluster": "local:2", "budget": {"trials": 0}}, "body.budget.trials", "greater than"),
    ({"model": "gpt-tiny", "cluster": "local:2", "executor": "gpu"}, "body.executor", "'model', 'local'"),
    ({"model": "gpt-tiny", "cluster": "local:2", "objective": "speed"}, "body.objective", "throughput"),
    ({"model": "gpt-tiny", "cluster": "local:2", "colour": "red"}, "body.colour", "Extra inputs"),
    ({"model": {"name": "m", "layers": 2, "hidden": 100, "heads": 3, "vocab": 10, "seq_len": 8},
      "cluster": "local:2"}, "body.model.heads", "must divide hidden=100"),
    ({"model": {"name": "m", "layers": 2, "hidden": 64, "heads": 8, "vocab": 10, "seq_len": 8, "kv_heads": 3},
      "cluster": "local:2"}, "body.model.kv_heads", "must divide heads=8"),
    ({"model": {"name": "m", "layers": 2, "hidden": 64, "heads": 8, "vocab": 10, "seq_len": 8, "arch": "mamba"},
      "cluster": "local:2"}, "body.model.arch", "'gpt' or 'llama'"),
    ({"model": "gpt-tiny", "cluster": {"name": "c", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 0}]}},
     "body.cluster.levels[0].bandwidth_gbps", "greater than 0"),
    ({"model": "gpt-tiny", "cluster": {"name": "c", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 5},
      {"name": "b", "size": 2, "bandwidth_gbps": 5, "busbw_gbps": 0}]}}, "body.cluster.levels[1].busbw_gbps",
     "greater than 0"),
    ({"model": "gpt-tiny", "cluster": {"name": "c", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 5},
      {"name": "b", "size": 2, "bandwidth_gbps": 5, "busbw_gbps": 12}]}}, "body.cluster.level[b].busbw_gbps",
     "at most what the level's links carry: 2 rank(s) under it x bandwidth_gbps 5 = 10 GB/s"),
    ({"model": "gpt-tiny", "cluster": {"name": "c", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 5},
      {"name": "b", "size": 2, "bandwidth_gbps": 5, "all_gather_busbw_gbps": 11}]}},
     "body.cluster.level[b].all_gather_busbw_gbps", "at most what the level's links carry"),
    ({"model": "gpt-tiny", "cluster": {"name": "c", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 5},
      {"name": "b", "size": 2, "bandwidth_gbps": 5, "reduce_scatter_busbw_gbps": -3}]}},
     "body.cluster.levels[1].reduce_scatter_busbw_gbps", "greater than 0"),
    ({"model": "gpt-tiny", "cluster": "frontier:9999999"}, "body.cluster.level[inter-node].size", "must be <= 65536"),
    ({"model": "gpt-tiny", "cluster": "local:4096x4096x4"}, "body.cluster", "ranks; at most 16777216"),
    ({"cluster": "local:2"}, "body.model", "Field required"),
    ({"model": "gpt-7b", "cluster": "dgx-h100:8", "global_batch": 100}, "body.global_batch",
     "no micro-batch in [1, 2, 4] runs it on dgx-h100:8"),
    ({"model": "gpt-tiny", "cluster": "local:2x2", "executor": "local", "global_batch": 3}, "body.global_batch",
     "runs it on local:2x2"),
    ({"model": "gpt-7b", "cluster": "dgx-h100:8", "tokens_per_step": 1000}, "body.tokens_per_step",
     "whole number of sequences of 2048 tokens"),
    ({"model": "gpt-tiny", "cluster": "local:2", "calibration": "nope"}, "body.calibration", "no such calibration"),
    ({"model": "gpt-7b", "cluster": "frontier:2", "measure_shortlist": "local"}, "body.measure_shortlist",
     "this machine can only emulate frontier:2"),
    ({"model": "gpt-tiny", "cluster": "local:2", "executor": "local", "measure_shortlist": "local"},
     "body.measure_shortlist", "only a model study has a shortlist"),
    ({"model": "gpt-tiny", "cluster": "local:2", "measure_shortlist": "gpu"}, "body.measure_shortlist", "'local'"),
])
def test_bad_input_is_a_422_naming_field_value_and_rule(body, field, rule, api_server):
    engine = sqlalchemy.create_engine(api_server.args[api_server.args.index("--db") + 1])

    def stored() -> tuple[int, int]:
        with engine.connect() as c:
            return tuple(c.execute(sqlalchemy.text(f"select count(*) from {t}")).scalar() for t in ("zt_requests",
                                                                                                   "zt_jobs"))
    before = stored()
    r = httpx.post(f"{api_server.url}/v1/recommendations", json=body, headers=api_server.extra)
    assert r.status_code == 422, r.text
    problems = r.json()["detail"]
    assert any(p["field"] == field and rule in p["rule"] and "value" in p for p in problems), problems
    assert stored() == before  # refused before anything is stored: no request, no job queued
    engine.dispose()


@pytest.mark.parametrize("path", ["/v1/jobs/0", "/v1/jobs/x", "/v1/jobs/99999999999999999999",
                                  "/v1/studies?limit=0", "/v1/studies/1/trials?status=done",
                                  "/v1/recommendations/1?format=yaml", "/v1/recommendations?wait=-1"])
def test_bad_ids_and_queries_are_422(path, api_server):
    method = "POST" if "wait" in path else "GET"
    r = httpx.request(method, api_server.url + path, json=NEOX if method == "POST" else None, headers=api_server.extra)
    where = "query" if "?" in path else "path"
    assert r.status_code == 422 and r.json()["detail"][0]["field"].split(".")[0] == where, r.text


def test_catalog_and_health(api_server):
    catalog = httpx.get(f"{api_server.url}/v1/catalog").json()
    assert "gpt-neox-20b" in catalog["models"] and "frontier" in catalog["clusters"]
    llama = catalog["models"]["llama3-8b"]  # a Llama's blocks, counted as Meta counts them
    assert llama["arch"] == "llama" and llama["num_params"] == 8_030_261_248
    assert "arch" not in catalog["models"]["gpt-7b"]
    assert "zeropp" in catalog["strategies"] and catalog["executors"] == ["model", "local", "slurm"]
    assert httpx.get(f"{api_server.url}/healthz").json()["status"] == "ok"
    schema = httpx.get(f"{api_server.url}/openapi.json").json()
    post = schema["paths"]["/v1/recommendations"]["post"]
    assert {"200", "202", "401", "422"} <= set(post["responses"])
    body = schema["components"]["schemas"]["RecommendationCreate"]
    assert body["examples"][0]["cluster"] == "frontier:48"
