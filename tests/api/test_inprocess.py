"""The fast tier: the API's logic in-process (FastAPI's TestClient, an in-memory SQLite, no worker), where a
test takes milliseconds. The real-server tier (uvicorn in a subprocess, PostgreSQL, torchrun, Chromium)
is in the other files of this folder; both run under ``make test``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import StaticPool

from zerotune.api.app import create_app
from zerotune.api.deps import get_db
from zerotune.api.settings import Settings
from zerotune.core.fields import OPTIONS, Described, to_body
from zerotune.db import repository as repo
from zerotune.db.session import make_session_factory, session_scope
from zerotune.tuner.request import TuneRequest

NEOX = {"model": "gpt-neox-20b", "cluster": "frontier:48"}


@pytest.fixture
def app_and_engine() -> Iterator[tuple]:
    # one connection shared by every thread: the in-memory database lives as long as the engine
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    app = create_app(Settings(workers=0, db="sqlite://"), engine=engine)
    yield app, engine
    engine.dispose()


@pytest.fixture
def client(app_and_engine: tuple) -> Iterator[TestClient]:
    with TestClient(app_and_engine[0], base_url="http://127.0.0.1") as c:  # the lifespan migrates the database
        yield c


def test_a_new_request_queues_one_job_and_equal_requests_share_it(client: TestClient, app_and_engine: tuple) -> None:
    first = client.post("/v1/recommendations", json=NEOX)
    assert first.status_code == 202, first.text
    job = first.json()
    assert job["state"] == "queued" and job["trials_total"] == 40 and job["recommendation_id"] is None
    again = client.post("/v1/recommendations", json={**NEOX, "executor": "model", "budget": {"trials": 40}})
    assert again.status_code == 202 and again.json()["id"] == job["id"]  # normalized equal: one search
    other = client.post("/v1/recommendations", json={**NEOX, "budget": {"trials": 7}})
    assert other.json()["id"] != job["id"]
    ours = client.post("/v1/recommendations", json={**NEOX, "runner": "zerotune"})
    assert ours.json()["id"] == job["id"]  # zerotune's engine is the default runner
    deepspeed = client.post("/v1/recommendations", json={**NEOX, "runner": "deepspeed"}).json()
    assert deepspeed["id"] not in (job["id"], other.json()["id"])  # another question: another search
    fp32 = client.post("/v1/recommendations", json={**NEOX, "grad_reduce_in_fp32": True}).json()
    assert fp32["id"] not in (job["id"], other.json()["id"], deepspeed["id"])  # fp32 reductions: another search
    assert client.post("/v1/recommendations", json={**NEOX, "grad_reduce_in_fp32": False}).json()["id"] == job["id"]
    with session_scope(make_session_factory(app_and_engine[1])) as s:
        assert repo.get_request(session=s, request_id=deepspeed["request_id"]).spec["runner"] == "deepspeed"
        assert repo.get_request(session=s, request_id=fp32["request_id"]).spec["grad_reduce_in_fp32"] is True
    assert client.get(f"/v1/jobs/{job['id']}").json()["request_key"] == job["request_key"]
    with session_scope(make_session_factory(app_and_engine[1])) as s:  # what the route stored, through db/
        assert repo.job_counts(session=s) == {"queued": 4}


def test_a_request_may_set_the_memory_reserve(client: TestClient, app_and_engine: tuple) -> None:
    """``memory_reserve_gib``: kept with the request the worker gets back, another question than the computed
    reserve; the schema describes it."""
    default = client.post("/v1/recommendations", json=NEOX).json()
    kept = client.post("/v1/recommendations", json={**NEOX, "memory_reserve_gib": 4.5})
    assert kept.status_code == 202, kept.text
    assert kept.json()["id"] != default["id"]
    assert client.post("/v1/recommendations", json={**NEOX, "memory_reserve_gib": None}).json()["id"] == default["id"]
    with session_scope(make_session_factory(app_and_engine[1])) as s:
        spec = repo.get_request(session=s, request_id=kept.json()["request_id"]).spec
    assert spec["memory_reserve_gib"] == 4.5 and TuneRequest.from_dict(spec).memory_reserve_gib == 4.5
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert "fragmentation" in schemas["RecommendationCreate"]["properties"]["memory_reserve_gib"]["description"]
    assert "memory" in schemas["RecommendationPublic"]["properties"]


def test_a_cancelled_job_is_cancelled_once(client: TestClient) -> None:
    job = client.post("/v1/recommendations", json=NEOX).json()
    gone = client.delete(f"/v1/jobs/{job['id']}")
    assert gone.status_code == 200 and gone.json()["state"] == "cancelled"
    again = client.delete(f"/v1/jobs/{job['id']}")
    assert again.status_code == 409 and "already ended (cancelled)" in again.json()["detail"]


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({**NEOX, "model": "gpt-99b"}, "body.model", "unknown model preset"),
    ({**NEOX, "cluster": "/etc/hosts.json"}, "body.cluster", "unknown cluster preset"),  # never read as a file
    ({**NEOX, "cluster": "frontier:0"}, "body.cluster", "whole number"),
    ({**NEOX, "budget": {"trials": 0}}, "body.budget.trials", "greater than or equal to 1"),
    ({**NEOX, "budget": {"trials": "5"}}, "body.budget.trials", "valid integer"),
    ({**NEOX, "global_batch": 3}, "body.global_batch", "multiple"),
    ({**NEOX, "emulate": True}, "body.emulate", "only the local executor's runs can be emulated"),
    ({**NEOX, "emulate": "yes"}, "body.emulate", "valid boolean"),
    ({**NEOX, "runner": "megatron"}, "body.runner", "'zerotune', 'deepspeed' or 'fsdp'"),
    ({**NEOX, "runner": "deepspeed", "measure_shortlist": "slurm"}, "body.runner",
     "short runs train with zerotune's own engine"),
    ({**NEOX, "memory_reserve_gib": -1}, "body.memory_reserve_gib", "greater than or equal to 0"),
    ({**NEOX, "memory_reserve_gib": "2"}, "body.memory_reserve_gib", "valid number"),
    ({**NEOX, "memory_reserve_gib": 64}, "body.memory_reserve_gib", "under the device's memory (64 GiB)"),
])
def test_bad_input_is_a_422_naming_field_value_and_rule(client: TestClient, body: dict, field: str,
                                                        rule: str) -> None:
    r = client.post("/v1/recommendations", json=body)
    assert r.status_code == 422, r.text
    problem = r.json()["detail"][0]
    assert problem["field"] == field and rule in problem["rule"], problem
    assert client.get("/metrics").status_code == 200  # and the service is still there


def _breaking(d: Described) -> object:
    """A value that breaks field ``d``'s rule as the API holds it (its type, choices, bounds or length)."""
    rule = d.about
    if rule.choices:
        return "nope" if isinstance(rule.choices[0], str) else 999
    if d.kind is bool:
        return "yes"
    if d.kind is str:
        return "x" * (rule.max_length + 1) if rule.max_length else 5
    return (rule.api_max or 0) * 2 or -1


def test_each_field_of_a_request_body_is_the_request_s_own(client: TestClient) -> None:
    """The POST body's fields are the request's (``core.fields.Options``): each at its place, with its default and
    its description in the schema, and a value that breaks its rule a 422 naming it; the others are not in it."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for d in OPTIONS:
        *path, name = d.label.split(".")
        properties = schemas[path[0].capitalize() if path else "RecommendationCreate"]["properties"]
        if d.about.body is None:
            assert name not in properties
            continue
        assert properties[name]["description"] == d.about.doc and properties[name].get("default") == d.default
        r = client.post("/v1/recommendations", json={**NEOX, **to_body({d.name: _breaking(d)})})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == f"body.{d.label}", (d.name, r.text)
    assert client.get("/metrics").status_code == 200


def test_an_uploaded_run_is_kept_under_the_request_it_always_was(client: TestClient, app_and_engine: tuple) -> None:
    run = {"model": "gpt-tiny", "cluster": "local:2x2", "strategy": "zero3", "tflops_per_rank": 0.01}
    trial = client.post("/v1/trials", json=run)
    assert trial.status_code == 201, trial.text
    study = client.get(f"/v1/studies/{trial.json()['study_id']}").json()
    assert study["request"]["key"] == "f6365f03e6380ead0a9b462bf849f4a12f032f411993577e7d0c6b46eeb752d6"
    assert (study["request"]["executor"], study["request"]["budget"]) == ("external", {"trials": 1, "time_s": None})


@pytest.mark.parametrize("path", ["/v1/jobs/99", "/v1/studies/99", "/v1/trials/99", "/v1/recommendations/99",
                                  "/v1/calibrations/nope"])
def test_missing_rows_are_404s_from_the_one_error_mapping(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and path.rsplit("/", 1)[1] in r.json()["detail"], r.text


def test_a_database_outage_is_a_503_with_retry_after(app_and_engine: tuple) -> None:
    app, _ = app_and_engine

    def down() -> Iterator[None]:
        raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))
        yield  # a generator dependency, as get_db is

    app.dependency_overrides[get_db] = down
    try:
        with TestClient(app, base_url="http://127.0.0.1") as c:
            r = c.get("/v1/studies/1")
    finally:
        app.dependency_overrides.clear()
    assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
    assert "database unavailable" in r.json()["detail"]


def test_the_catalog_and_health_answer_without_a_worker(client: TestClient) -> None:
    catalog = client.get("/v1/catalog").json()
    assert "frontier" in catalog["clusters"] and "zeropp" in catalog["strategies"]
    assert client.get("/healthz").json()["status"] == "ok"


def test_a_trial_page_shows_seconds_per_level_and_the_emulation_only_when_the_run_recorded_them(
        client: TestClient, app_and_engine: tuple) -> None:
    """A measured trial with rank 0's seconds per level and an emulation summary shows both (bytes, seconds and
    their rate per level and collective; the emulated links); one without them, and a predicted one, show neither."""
    from zerotune.costmodel import predict
    from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
    from zerotune.tuner.request import strategy_key

    model, cluster = parse_model("gpt-tiny"), parse_cluster("frontier:2")
    emulation = {"scale": 0.0125, "namespaces": 2, "notes": ["latency is not emulated: the kernel has no sch_netem"],
                 "levels": {"node": {"links": 4, "mb_per_s": 250.0, "delay_us": 0.0},
                            "inter-node": {"links": 2, "mb_per_s": 40.0, "delay_us": 12.5}}}
    volume = {"gcd-pair": {"all_gather": 3 * 2**20}, "node": {"all_gather": 50_000_000, "reduce_scatter": 25_000_000},
              "inter-node": {"all_gather": 3_000_000_000, "reduce_scatter": 0}}
    seconds = {"gcd-pair": {"all_gather": 0.0021}, "node": {"all_gather": 0.125, "reduce_scatter": 0.05},
               "inter-node": {"all_gather": 1.5, "reduce_scatter": 0.0375}}
    run = {"status": "ok", "step_time_s": 2.5, "tflops_per_rank": 0.01, "bytes_per_level": volume,
           "seconds_per_level": seconds, "emulation": emulation, "memory_bytes": {"peak": 2**30},
           "health": {"verdict": "ok", "evidence": "loss 10.9 -> 7.1"}, "loss": [10.9, 7.1], "grad_norm": [2.0, 1.0]}
    plain = {k: v for k, v in run.items() if k not in ("seconds_per_level", "emulation")}  # a run.json of before
    ids = {}
    with session_scope(make_session_factory(app_and_engine[1])) as s:
        request, _ = repo.get_or_create_request(
            session=s, key="a" * 64, spec={"model": model.to_dict(), "cluster": cluster.to_dict(), "trials": 3,
                                           "executor": "local"})
        study = repo.create_study(session=s, request_id=request.id, optuna_study_name="seconds-per-level",
                                  sampler="tpe", executor="local", n_trials=3)
        for number, (name, metrics, executor) in enumerate((("timed", run, "local"), ("plain", plain, "local"),
                                                            ("predicted", None, "model"))):
            strategy = build_strategy(("zero3", "zeropp", "mics")[number], cluster)
            prediction = predict(model, cluster, strategy)
            trial = repo.add_trial(session=s, study_id=study.id, strategy=strategy.to_dict(),
                                   strategy_key=strategy_key(strategy), executor=executor, number=number)
            repo.claim_trial(session=s, trial_id=trial.id, owner="test-worker", lease_s=3600)
            repo.finish_trial(session=s, trial_id=trial.id, status="complete", value=0.01,
                              metrics=metrics or prediction, prediction=prediction)
            ids[name] = trial.id

    page = client.get(f"/dashboard/trials/{ids['timed']}")
    assert page.status_code == 200, page.text
    html = page.text
    table = html[html.index('<table class="grid" id="collectives">'):]
    table = table[:table.index("</table>")]
    cells = [[cell.split(">", 1)[1] for cell in row.split("</td>")[:-1]] for row in table.split("<tr>")[2:]]
    assert cells == [  # innermost level first, as the cluster lists them; a rate where bytes and seconds are both > 0
        ["gcd-pair", "all_gather", "3 MiB", "0.0021", "1.5 GB/s"],
        ["node", "all_gather", "47.7 MiB", "0.125", "400 MB/s"],
        ["node", "reduce_scatter", "23.8 MiB", "0.05", "500 MB/s"],
        ["inter-node", "all_gather", "2.79 GiB", "1.5", "2 GB/s"],
        ["inter-node", "reduce_scatter", "0 MiB", "0.0375", "—"],
    ], cells
    assert ('<dd id="emulation">emulated network (links slowed by scale 0.0125, 2 namespaces): node 250 MB/s per link '
            'each way (4 links); inter-node 40 MB/s per link each way (2 links, 12.5 µs latency); latency is not '
            'emulated: the kernel has no sch_netem</dd>') in html

    for name in ("plain", "predicted"):
        html = client.get(f"/dashboard/trials/{ids[name]}").text
        assert "Trial" in html and 'id="chart-bytes"' in html  # the page as it was: the bytes chart, no table
        assert "collectives" not in html and "Collectives per level" not in html and "emulat" not in html, name


def test_a_study_page_says_who_trains_with_its_answer(client: TestClient, app_and_engine: tuple) -> None:
    """A DeepSpeed request's study page says it searched what DeepSpeed runs, with DeepSpeed's collectives."""
    from zerotune.costmodel.catalog import parse_cluster, parse_model

    ids = {}
    with session_scope(make_session_factory(app_and_engine[1])) as s:
        for runner in ("zerotune", "deepspeed"):
            request, _ = repo.get_or_create_request(
                session=s, key=runner[0] * 64, spec={"model": parse_model("gpt-tiny").to_dict(),
                                                     "cluster": parse_cluster("frontier:2").to_dict(), "trials": 3,
                                                     "executor": "model", "runner": runner})
            ids[runner] = repo.create_study(session=s, request_id=request.id, optuna_study_name=f"runner-{runner}",
                                            sampler="tpe", executor="model", n_trials=3).id
    pages = {runner: client.get(f"/dashboard/studies/{i}") for runner, i in ids.items()}
    assert all(p.status_code == 200 for p in pages.values())
    assert ('<dd id="runner">deepspeed: only what it runs exactly, one ring over the whole group, gradients reduced '
            'in backward</dd>') in pages["deepspeed"].text
    assert "<dd id=\"runner\">zerotune's engine: every partition, one ring per level</dd>" in pages["zerotune"].text


def test_an_answer_stored_before_the_tool_formats_still_serves_them(client: TestClient, app_and_engine: tuple) -> None:
    """``?format=torchtitan|accelerate|hf-trainer`` of an answer whose stored exports predate those formats: built
    from the answer's own model, cluster, strategy and batch, as a new answer would carry them."""
    from zerotune.api.prologue import default_recommendation
    from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
    from zerotune.tuner.exports import all_exports

    rec = default_recommendation({"model": "gpt-125m", "cluster": "frontier:2"})
    old = {k: rec["exports"][k] for k in ("zerotune", "deepspeed", "deepspeed_notes", "fsdp")}
    with session_scope(make_session_factory(app_and_engine[1])) as s:
        req, _ = repo.get_or_create_request(session=s, key="k" * 64, spec={})
        study = repo.create_study(session=s, request_id=req.id, optuna_study_name="old", sampler="tpe",
                                  executor="model", n_trials=1)
        row = repo.save_recommendation(session=s, study_id=study.id, request_key="k" * 64, strategy=rec["strategy"],
                                       metrics={}, evidence="predicted", exports=old)
        rid = row.id
    zt = old["zerotune"]
    new = all_exports(ModelSpec.from_dict(zt["model"]), ClusterSpec.from_dict(zt["cluster"]),
                      Strategy.from_dict(zt["strategy"]), zt["global_batch"])
    r = client.get(f"/v1/recommendations/{rid}", params={"format": "torchtitan"})
    assert r.status_code == 200 and r.text == new["torchtitan"]["toml"]
    assert r.headers["content-type"].startswith("application/toml")
    r = client.get(f"/v1/recommendations/{rid}", params={"format": "accelerate", "plugin": "deepspeed"})
    assert r.status_code == 200 and r.text == new["accelerate"]["deepspeed_yaml"]
    r = client.get(f"/v1/recommendations/{rid}", params={"format": "hf-trainer"})
    assert r.status_code == 200 and r.json() == new["hf-trainer"]["config"]
    assert client.get(f"/v1/recommendations/{rid}", params={"format": "yaml"}).status_code == 422
    content = client.get("/openapi.json").json()["paths"]["/v1/recommendations/{recommendation_id}"]["get"][
        "responses"]["200"]["content"]
    assert {"application/json", "application/toml", "application/yaml"} <= set(content)


def test_a_hugging_face_config_is_a_model_and_an_unsupported_one_a_422_naming_its_key(
        client: TestClient, app_and_engine: tuple) -> None:
    import json
    from pathlib import Path
    cfg = json.loads((Path(__file__).parent.parent / "data" / "hf" / "Llama-3.1-8B" / "config.json").read_text())
    ok = client.post("/v1/recommendations", json={"model": {**cfg, "seq_len": 8192}, "cluster": "dgx-h100:4"})
    assert ok.status_code == 202, ok.text
    preset = client.post("/v1/recommendations", json={"model": "llama3-8b", "cluster": "dgx-h100:4"})
    assert preset.status_code == 202
    with session_scope(make_session_factory(app_and_engine[1])) as s:  # the same blocks as the preset, its name aside
        rows = [repo.get_request(session=s, request_id=r.json()["request_id"]) for r in (ok, preset)]
        stored, known = (row.spec["model"] for row in rows if row is not None)
    assert {**stored, "name": "x"} == {**known, "name": "x"}
    moe = client.post("/v1/recommendations", json={"model": {**cfg, "num_local_experts": 8}, "cluster": "dgx-h100:4"})
    assert moe.status_code == 422
    problem = moe.json()["detail"][0]
    assert problem["field"] == "body.model.num_local_experts" and problem["value"] == 8, problem
    unknown = client.post("/v1/recommendations", json={"model": {"model_type": "falcon"}, "cluster": "dgx-h100:4"})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["field"] == "body.model.model_type"


def test_a_baseline_is_part_of_the_request_and_an_inexpressible_key_a_422_naming_it(
        client: TestClient, app_and_engine: tuple) -> None:
    ds = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    body = {"model": "llama3-8b", "cluster": "dgx-h100:4", "global_batch": 256}
    plain = client.post("/v1/recommendations", json=body)
    ok = client.post("/v1/recommendations", json={**body, "baseline": ds})
    assert ok.status_code == 202, ok.text
    assert ok.json()["id"] != plain.json()["id"]  # another question: its answer states a gain over this baseline
    with session_scope(make_session_factory(app_and_engine[1])) as s:
        row = repo.get_request(session=s, request_id=ok.json()["request_id"])
        assert row is not None and row.spec["baseline"] == ds
    bad = client.post("/v1/recommendations", json={**body, "baseline": {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}})
    assert bad.status_code == 422
    problem = bad.json()["detail"][0]
    assert problem["field"].endswith("baseline.zero_optimization.offload_optimizer"), problem
    assert "offloading" in problem["rule"]
    odd = client.post("/v1/recommendations", json={**body, "baseline": "ds_config.json"})
    assert odd.status_code == 422 and odd.json()["detail"][0]["field"] == "body.baseline"
