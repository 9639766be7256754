"""`zerotune tune` and `zerotune db upgrade` as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from tests.support import ROOT
from tests.support.postgres import fresh_database


def zerotune(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerotune.api.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_model_that_fits_only_with_checkpointing_is_answered_from_the_first_trials(tmp_path):
    """Llama 3 70B at 8,192 tokens on 64 H100s: no preset fits as it is (the activations alone are 178 GiB), so each
    is tried first as it fits (checkpointing, one sequence per micro-batch); a study of as many trials as presets
    answers, and every trial that does not fit says in its progress line what overflows."""
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    r = zerotune("tune", "--model", "llama3-70b", "--cluster", "dgx-h100:8", "--trials", "5", "--db", db,
                 "--workdir", str(tmp_path), "--seed", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("zerotune: screening trial")]
    assert len(lines) == 5 and "TFLOPS/rank" in lines[0]
    assert all("TFLOPS/rank;" in line or "infeasible: needs" in line for line in lines), lines
    rec = json.loads(r.stdout)
    assert rec["strategy"]["activation_checkpointing"] and rec["strategy"]["micro_batch_size"] == 1
    assert rec["strategy"]["param_span"] >= 1 and rec["value"] > 0


def test_tune_reads_the_database_the_service_reads(tmp_path):
    """No --db: ``zerotune tune`` stores its study where ZEROTUNE_DB_FILE (or ZEROTUNE_DB) says, as the service
    and its workers do, so a URL with a password never has to go on the command line."""
    import sqlite3

    url_file = tmp_path / "db-url"
    url_file.write_text(f"sqlite:///{tmp_path / 'shared.sqlite'}\n")
    r = subprocess.run([sys.executable, "-m", "zerotune.api.cli", "tune", "--model", "gpt-13b", "--cluster",
                        "dgx-h100:8", "--trials", "4", "--workdir", str(tmp_path), "--seed", "0", "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("ZEROTUNE_")},
                            "PYTHONPATH": str(ROOT), "ZEROTUNE_DB_FILE": str(url_file)})
    assert r.returncode == 0, r.stderr[-2000:]
    with sqlite3.connect(tmp_path / "shared.sqlite") as db:
        assert db.execute("SELECT count(*) FROM zt_trials").fetchone()[0] == 4


def test_tune_with_the_model_executor_prints_a_recommendation(tmp_path):
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    r = zerotune("db", "upgrade", "--db", db)
    assert r.returncode == 0 and "at revision" in r.stderr
    r = zerotune("tune", "--model", "gpt-13b", "--cluster", "dgx-h100:8", "--trials", "12", "--db", db,
                 "--workdir", str(tmp_path), "--seed", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "recommended P/G/OS spans" in r.stderr
    # progress in a log: one plain line per trial with its phase, no carriage-return frames, no Optuna warnings
    assert "zerotune: screening trial 1/12" in r.stderr and "\r" not in r.stderr
    assert "ExperimentalWarning" not in r.stderr
    assert "measured leaders" not in r.stderr  # nothing was measured: no empty list of measured runs
    rec = json.loads(r.stdout)
    assert rec["evidence"] in ("predicted", "proxy-verified")
    assert rec["exports"]["deepspeed"]["zero_optimization"]["stage"] in (1, 2, 3)
    assert rec["value"] > 0
    # the same question for a job that trains with FSDP2: only what fully_shard runs, nothing quantized
    r = zerotune("tune", "--model", "gpt-13b", "--cluster", "dgx-h100:8", "--trials", "12", "--db", db,
                 "--workdir", str(tmp_path), "--seed", "0", "--runner", "fsdp", "--full")
    assert r.returncode == 0, r.stderr[-2000:]
    fsdp = json.loads(r.stdout)
    s = fsdp["strategy"]
    assert fsdp["runner"] == "fsdp" and s["param_span"] == s["grad_span"] == s["optim_span"]
    assert s["weight_bits"] == s["grad_bits"] == 16
    assert "collectives" not in fsdp["decision"]  # NCCL on 64 GPUs held to the ring model
    # DeepSpeed on 48 Frontier nodes: its flat RCCL rings were measured far slower than the model's at that scale
    r = zerotune("tune", "--model", "gpt-13b", "--cluster", "frontier:48", "--trials", "6", "--db", db,
                 "--workdir", str(tmp_path), "--seed", "0", "--runner", "deepspeed", "--full")
    assert r.returncode == 0, r.stderr[-2000:]
    ds = json.loads(r.stdout)
    # charged by the law measured on those rings (costmodel/fabrics.py): no residual past 15% to add
    assert ds["evidence"] == "predicted" and "collectives" not in ds["decision"]
    assert "flat rings over" not in r.stderr


def test_tune_rejects_bad_input_with_one_line(tmp_path):
    r = zerotune("tune", "--model", "gpt-13b", "--cluster", "dgx-h100:0", "--db", f"sqlite:///{tmp_path}/x.sqlite")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "cluster='dgx-h100:0'" in r.stderr
    r = zerotune("tune", "--model", "gpt-7b", "--cluster", "dgx-h100:8", "--global-batch", "100", "--db",
                 f"sqlite:///{tmp_path}/x.sqlite")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "global_batch=100: no micro-batch in [1, 2, 4] runs it on dgx-h100:8" in r.stderr
    assert "nearest: 128" in r.stderr
    r = zerotune("tune", "--model", "gpt-tiny", "--cluster", "local:2", "--calibration", "nope", "--db",
                 f"sqlite:///{tmp_path}/x.sqlite")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "calibration='nope': no such calibration; stored: none" in r.stderr
    r = zerotune("tune", "--model", "gpt-7b", "--cluster", "frontier:2", "--measure-shortlist", "local", "--db",
                 f"sqlite:///{tmp_path}/x.sqlite")
    assert r.returncode == 2 and "this machine can only emulate frontier:2" in r.stderr, r.stderr
    r = zerotune("tune", "--model", "gpt-tiny", "--cluster", "local:2", "--executor", "local", "--runner",
                 "deepspeed", "--db", f"sqlite:///{tmp_path}/x.sqlite")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "runner='deepspeed': short runs train with zerotune's own engine" in r.stderr
    r = zerotune("tune", "--model", "gpt-tiny", "--cluster", "local:2", "--executor", "local", "--steps", "0", "--db",
                 f"sqlite:///{tmp_path}/steps.sqlite")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "steps=0: must be a whole number of optimizer steps >= 1" in r.stderr
    assert not (tmp_path / "steps.sqlite").exists()  # refused before any database is made


def test_a_database_path_that_is_no_url_is_refused_with_the_url_it_should_be(tmp_path):
    path = tmp_path / "zt.db"
    r = zerotune("tune", "--model", "gpt-13b", "--cluster", "dgx-h100:8", "--trials", "2", "--db", str(path))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"db='{path}': not a database URL" in r.stderr and f"sqlite:///{path}" in r.stderr
    assert not path.exists()  # nothing created under a name the user did not mean


def test_db_upgrade_opens_the_database_the_service_reads_and_never_prints_its_password(tmp_path, monkeypatch):
    """``zerotune db upgrade`` without ``--db`` migrates ZEROTUNE_DB, the database ``serve`` and ``worker`` open, not
    the default SQLite file; the URL it prints hides a password."""
    db = tmp_path / "service.sqlite"
    monkeypatch.setenv("ZEROTUNE_DB", f"sqlite:///{db}")
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path / "default"))
    r = zerotune("db", "upgrade")
    assert r.returncode == 0 and f"database sqlite:///{db} at revision" in r.stderr, r.stderr
    assert db.exists() and not (tmp_path / "default" / "zerotune.sqlite").exists()
    with fresh_database("zt_upgrade") as url:  # trust auth: the password is taken and not needed
        with_password = make_url(url).set(password="s3cret").render_as_string(hide_password=False)
        r = zerotune("db", "upgrade", "--db", with_password, timeout=120)
        assert r.returncode == 0 and "at revision" in r.stderr and "***" in r.stderr, r.stderr
        assert "s3cret" not in r.stderr + r.stdout


def test_tune_measures_its_shortlist_and_the_next_tune_starts_from_the_refit(tmp_path):
    """A model study on local:2 with --measure-shortlist local: three partitions measured (the model's error there
    is unknown), the measured fastest printed, the refit stored in --db and used by the next tune there."""
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    r = zerotune("tune", "--model", "gpt-tiny", "--cluster", "local:2", "--trials", "5", "--seed", "0", "--db", db,
                 "--workdir", str(tmp_path), "--measure-shortlist", "local", "--steps", "8", "--full", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(r.stdout)
    assert rec["evidence"] == "measured" and rec["measured_shortlist"]["candidates"] == 3
    assert "measuring the shortlist (the model's error on local:2 is unknown" in r.stderr
    name, runs = rec["refit"]["name"], rec["refit"]["runs"]  # a run can fail (pruned, unhealthy): the rest refit
    measured = sum(t["status"] == "complete" for t in _trials(db, rec["study_id"]))
    assert runs == measured >= 2 and f"refitted calibration {name}: median error" in r.stderr
    assert f"cross-validated ({runs} runs)" in r.stderr
    r = zerotune("tune", "--model", "gpt-tiny", "--cluster", "local:2", "--trials", "3", "--db", db, "--full",
                 "--quiet", "--workdir", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    nxt = json.loads(r.stdout)
    assert nxt["metrics"]["calibration"] == name
    assert nxt["metrics"]["error_band"]["source"].startswith(f"{runs} measured runs on local:2")


def _trials(db: str, study_id: int) -> list[dict]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(db)
    try:
        with engine.connect() as c:
            rows = c.execute(sqlalchemy.text("SELECT status FROM zt_trials WHERE study_id = :s"), {"s": study_id})
            return [{"status": status} for (status,) in rows]
    finally:
        engine.dispose()


@pytest.mark.timeout(600)
def test_measured_tuning_learns_and_answers(tmp_path):
    """A measured study of a model that is not gpt-tiny: every trial trains healthily, and the answer shows the
    leaders' intervals. (A preset larger than this machine, run through its proxy, is
    tests/api/test_service.py's measured study: the CLI and the service run the same Tuner.)"""
    model, cluster, trials = "gpt-mini", "local:2x2", 3
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    r = zerotune("tune", "--model", model, "--cluster", cluster, "--executor", "local", "--trials", str(trials),
                 "--db", db, "--workdir", str(tmp_path), "--full", timeout=580)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(r.stdout)
    assert rec["evidence"] == "measured"
    assert rec["metrics"]["health"]["verdict"] == "ok" and rec["metrics"]["health"]["t"] < 0
    assert f"measuring trial {trials}/{trials}" in r.stderr and "failed" not in r.stderr, r.stderr[-3000:]
    assert "measured leaders (TFLOPS/rank, median [interquartile])" in r.stderr
    lead = next(lead for lead in rec["leaders"] if lead["trial_id"] == rec["trial_id"])
    assert lead["interval"][0] <= rec["value"] <= lead["interval"][1]
    assert rec["leaders"][0]["value"] == max(lead["value"] for lead in rec["leaders"])


def test_tune_a_hugging_face_config_against_the_users_deepspeed_config(tmp_path):
    """The closing example: a Hugging Face config.json's folder as the model, a ds_config.json as the baseline; the
    answer states the gain over it with the model's comparison error."""
    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                              "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8,
                                                    "stage3_prefetch_bucket_size": 5e7}}))
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    r = zerotune("tune", "--model", str(ROOT / "tests" / "data" / "hf" / "Qwen2.5-7B"), "--cluster", "dgx-h100:4",
                 "--trials", "8", "--global-batch", "256", "--runner", "deepspeed", "--baseline", str(ds), "--db", db,
                 "--workdir", str(tmp_path), "--seed", "0", "--full")
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stderr.splitlines() if "vs your deepspeed baseline: predicted" in x)
    assert "p90" in line and ("beyond" in line or "within" in line)
    rec = json.loads(r.stdout)
    gain = rec["baseline"]["predicted"]
    assert rec["baseline"]["strategy"]["param_span"] == 2 and rec["baseline"]["runner"] == "deepspeed"
    assert gain["pick_tflops_per_rank"] == pytest.approx(rec["value"], rel=1e-6)
    assert gain["gain"] == pytest.approx(gain["pick_tflops_per_rank"] / gain["baseline_tflops_per_rank"] - 1)
    # the dashboard's page of the answer states it too
    from fastapi.testclient import TestClient

    from zerotune.api.app import create_app
    from zerotune.api.settings import Settings
    with TestClient(create_app(Settings(workers=0, db=db)), base_url="http://127.0.0.1") as client:
        page = client.get(f"/dashboard/recommendations/{rec['id']}")
    assert page.status_code == 200, page.text
    shown = page.text.split('id="baseline"', 1)[1].split("</div>", 1)[0]
    assert "gain over your deepspeed config" in shown and f"{100 * gain['gain']:+.1f}%" in shown
    assert gain["vs_band"] in shown and "p90" in shown
    bad = tmp_path / "train.toml"
    bad.write_text("[parallelism]\npipeline_parallel_degree = 4\n")
    r = zerotune("tune", "--model", "llama3-8b", "--cluster", "dgx-h100:4", "--baseline", str(bad), "--db", db)
    assert r.returncode == 2 and "baseline.parallelism.pipeline_parallel_degree" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_measuring_study_measures_the_baseline_first_and_states_the_measured_gain(tmp_path):
    """With the local executor the baseline is the study's first trial (its buckets on the search grid), so the
    answer states the measured gain beside the predicted one."""
    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "reduce_bucket_size": 12_500_000, "allgather_bucket_size": 12_500_000}}))
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    r = zerotune("tune", "--model", "gpt-tiny", "--cluster", "local:2", "--executor", "local", "--trials", "3",
                 "--steps", "3", "--baseline", str(ds), "--db", db, "--workdir", str(tmp_path), "--seed", "0",
                 "--full", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads(r.stdout)
    measured = rec["baseline"]["measured"]
    assert measured is not None and measured["pick_tflops_per_rank"] == pytest.approx(rec["value"])
    assert measured["gain"] == pytest.approx(measured["pick_tflops_per_rank"] / measured["baseline_tflops_per_rank"]
                                             - 1)
    assert "measured" in next(x for x in r.stderr.splitlines() if "baseline: predicted" in x)
