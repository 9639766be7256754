"""The short-run entry through the real CLI: run.json, health verdicts, failures that name the rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strategies.catalog import build_strategy, parse_cluster, parse_model
from strategies.costmodel import state_memory, step_volume
from strategies.train import health

ROOT = Path(__file__).resolve().parents[2]
RUN_FIELDS = {"status", "world_size", "steps", "step_time_s", "tokens_per_s", "tflops_per_rank", "bytes_per_level",
              "memory_bytes", "loss", "grad_norm", "health"}
MEMORY_FIELDS = {"params", "secondary_params", "grads", "optim_states", "comm_buffers", "activations", "peak"}


def zerotune(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_train_writes_run_json(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--model", "gpt-tiny", "--cluster", "local:2x2", "--strategy", "zeropp", "--steps", "6",
                 "--set", "allgather_bucket_mb=0.1", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 6/6" in r.stderr  # progress was shown
    run = json.loads(out.read_text())
    assert RUN_FIELDS <= set(run) and MEMORY_FIELDS <= set(run["memory_bytes"])
    assert run["status"] == "ok" and run["world_size"] == 4 and len(run["loss"]) == len(run["grad_norm"]) == 6
    assert run["health"]["verdict"] == "ok", run["health"]
    assert run["step_time_s"] > 0 and run["tokens_per_s"] > 0 and run["tflops_per_rank"] > 0
    assert run["host"] == {"cpus": len(os.sched_getaffinity(0)), "local_ranks": 4}  # torchrun's 4 ranks here
    cluster, model = parse_cluster("local:2x2"), parse_model("gpt-tiny")
    s = build_strategy("zeropp", cluster, allgather_bucket_mb=0.1)
    assert run["bytes_per_level"] == step_volume(model, cluster, s, elem_bytes=4)
    mem = state_memory(model, cluster, s, elem_bytes=4)
    assert {k: run["memory_bytes"][k] for k in mem} == mem


def test_diverging_run_is_reported_diverged(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "local:2", "--strategy", "zero3", "--steps", "8", "--lr", "1.0",
                 "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    verdict = json.loads(out.read_text())["health"]
    assert verdict["verdict"] == "diverged" and "loss went from" in verdict["evidence"]


def test_crashing_rank_is_named(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "local:2x2", "--steps", "4", "--out", str(out), "--quiet",
                 env={"ZEROTUNE_FAULT": "crash@2:1"})
    assert r.returncode == 1
    assert "rank 2 failed: RuntimeError: injected crash on rank 2 at step 1" in r.stderr
    run = json.loads(out.read_text())
    assert run["status"] == "failed" and "rank 2" in run["error"]


def test_hung_run_times_out_and_is_killed(tmp_path):
    out = tmp_path / "run.json"
    t0 = time.monotonic()
    r = zerotune("train", "--cluster", "local:2", "--steps", "4", "--out", str(out), "--quiet",
                 "--run-timeout", "20", env={"ZEROTUNE_FAULT": "hang@1:1"})
    assert r.returncode == 1 and "timed out after 20 s" in r.stderr
    assert time.monotonic() - t0 < 60
    assert json.loads(out.read_text())["status"] == "failed"
    leftover = subprocess.run(["pgrep", "-f", f"--out {out}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "ranks left behind"


def test_invalid_input_is_refused_before_any_process_starts(tmp_path):
    out = tmp_path / "run.json"
    t0 = time.monotonic()
    r = zerotune("train", "--cluster", "local:4", "--strategy", "zeropp", "--out", str(out))
    assert r.returncode == 2 and "needs a cluster with an hpZ level" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = zerotune("train", "--cluster", "local:2x2", "--global-batch", "6", "--out", str(out))
    assert r.returncode == 2 and "global_batch=6: must be a multiple of world x micro_batch_size = 4" in r.stderr
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("losses, norms, verdict", [
    ([6.0, 5.5, 5.0, 4.5], [1, 1, 1, 1], "ok"),
    ([6.0, 5.5, float("nan"), 4.5], [1, 1, 1, 1], "nan"),
    ([6.0, 5.5, 5.0, 4.5], [1, 1, float("inf"), 1], "nan"),
    ([6.0, 7.0, 8.0, 9.0], [1, 1, 1, 1], "diverged"),
    ([6.0, 13.0, 5.0, 4.0], [1, 1, 1, 1], "diverged"),
    ([6.0, 6.0, 5.99, 5.98] * 2, [1] * 8, "flat"),
    ([6.0, 6.0, 5.99, 5.98], [1] * 4, "ok"),  # too short to call flat
])
def test_health_verdicts(losses, norms, verdict):
    assert health(losses, norms)["verdict"] == verdict


def test_srun_layout_and_host_facts(monkeypatch):
    """Under srun without torchrun, rank, world and ranks per host come from Slurm's variables."""
    from strategies.train import _env_from_slurm, host_facts

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(var, "")  # recorded, so what _env_from_slurm sets is undone after the test
        monkeypatch.delenv(var)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x3),4")
    _env_from_slurm()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("5", "16", "1")
    assert host_facts(16) == {"cpus": len(os.sched_getaffinity(0)), "local_ranks": 4}
