"""The short-run entry through the real CLI: run.json, health verdicts, failures that name the rank."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

import pytest

from tests.support import ROOT
from zerotune.costmodel import predict, state_memory, step_volume
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.measured import Measurement, measured_quant_rate
from zerotune.trainer.faults import failure_reason
from zerotune.trainer.health import health

RUN_FIELDS = {"status", "world_size", "steps", "step_time_s", "tokens_per_s", "tflops_per_rank", "bytes_per_level",
              "memory_bytes", "loss", "grad_norm", "health"}
MEMORY_FIELDS = {"params", "secondary_params", "grads", "optim_states", "comm_buffers", "activations", "peak"}


def zerotune(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerotune.api.cli", *args], capture_output=True, text=True, cwd=ROOT,
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
    assert run["host"] == {"name": platform.node(), "cpus": len(os.sched_getaffinity(0)), "local_ranks": 4}
    assert run["device"].startswith("cpu") and run["emulated"] is False
    cluster, model = parse_cluster("local:2x2"), parse_model("gpt-tiny")
    s = build_strategy("zeropp", cluster, allgather_bucket_mb=0.1)
    assert run["global_batch"] == 16 and run["grad_accum_steps"] == 4  # 4 sequences per rank by default
    assert run["bytes_per_level"] == step_volume(model, cluster, s, elem_bytes=4, accum=4)
    # every (level, kind) that moved bytes took time, and less than the step
    assert {lv: set(k) for lv, k in run["seconds_per_level"].items()} == {lv: set(k) for lv, k in
                                                                         run["bytes_per_level"].items()}
    assert all(0 < t < run["step_time_s"] for kinds in run["seconds_per_level"].values() for t in kinds.values())
    mem = state_memory(model, cluster, s, elem_bytes=4)
    assert {k: run["memory_bytes"][k] for k in mem} == mem
    # ZeRO++ quantizes: the elements are the model's count, their seconds a part of the step
    quant = run["quantization"]
    assert quant["elements"] == predict(model, cluster, s, elem_bytes=4, global_batch=16)["quantization"]["elements"]
    assert quant["elements"] > 0 and 0 < quant["seconds"] < run["step_time_s"]
    rate = measured_quant_rate([Measurement.from_run(run)])
    assert rate == pytest.approx(quant["elements"] / quant["seconds"])


def test_profile_adds_one_untimed_step_and_leaves_the_timed_ones_alone(tmp_path):
    """--profile runs one more step under torch.profiler after the timed ones: run.json gains what it
    dispatched (on CPU: ATen operators, the matrix products among them), while the steps, losses and norms
    are those of the same run without it, to the bit (the loop draws each next batch during the step)."""
    runs = {}
    for flags in ((), ("--profile", "--trace-dir", str(tmp_path / "traces"))):
        out = tmp_path / f"run{len(flags)}.json"
        r = zerotune("train", "--model", "gpt-tiny", "--cluster", "local:2", "--strategy", "zero3", "--steps", "3",
                     "--warmup", "1", "--global-batch", "4", *flags, "--out", str(out), "--quiet")
        assert r.returncode == 0, r.stderr[-3000:]
        runs[bool(flags)] = json.loads(out.read_text())
    plain, profiled = runs[False], runs[True]
    assert "profile" not in plain and len(profiled["step_times_s"]) == 3
    assert profiled["loss"] == plain["loss"] and profiled["grad_norm"] == plain["grad_norm"]
    prof = profiled["profile"]
    assert prof["unit"] == "aten operators" and prof["launches"] > 0 and prof["busy_ms"] > 0
    names = {row["name"] for row in prof["top"]}
    assert names & {"aten::mm", "aten::addmm", "aten::bmm"}, names
    assert not (tmp_path / "traces").exists()  # a trace of host and device is a GPU's


def test_diverging_run_is_reported_diverged(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "local:2", "--strategy", "zero3", "--steps", "8", "--lr", "1.0",
                 "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    verdict = json.loads(out.read_text())["health"]
    assert verdict["verdict"] == "diverged" and "over twice the first" in verdict["evidence"]


def test_crashing_rank_is_named(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "local:2x2", "--steps", "4", "--out", str(out), "--quiet",
                 env={"ZEROTUNE_FAULT": "crash@2:1"})
    assert r.returncode == 1
    assert "rank 2 failed: RuntimeError: injected crash on rank 2 at step 1" in r.stderr
    run = json.loads(out.read_text())
    assert run["status"] == "failed" and "rank 2" in run["error"]


GLOO_PEER = ("RuntimeError: [third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
             "[127.0.0.1]:438. This is typically caused by a remote worker crashing.")


def _torchrun_root_cause(rank: int, exitcode: int) -> str:
    return ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-26_10:00:00\n  host      : node\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {exitcode} (pid: 4242)\n")


@pytest.mark.parametrize("exitcode, expect", [
    (-6, "rank 2 failed: RuntimeError: injected crash"),  # a peer that aborted first is a symptom
    (-9, "rank 3 killed by SIGKILL — out of memory? (resident memory 0.50 GiB when last recorded, at step 1/4)"),
])
def test_the_cause_is_named_before_its_symptoms(tmp_path, exitcode, expect):
    """When rank 2 raises, its peers fail after it: one inside a collective (gloo's lost connection),
    one by SIGABRT when the collective's thread gets the error, and torchrun may observe that SIGABRT
    first. The raising rank is named; a SIGKILL (the out-of-memory killer's signal) still wins."""
    out = tmp_path / "run.json"
    (tmp_path / "run.json.rank0.err").write_text(json.dumps({"rank": 0, "time": 9.0, "error": GLOO_PEER}))
    (tmp_path / "run.json.rank1.err").write_text(json.dumps({"rank": 1, "time": 10.0, "error": GLOO_PEER}))
    (tmp_path / "run.json.rank2.err").write_text(
        json.dumps({"rank": 2, "time": 11.0, "error": "RuntimeError: injected crash"}))
    (tmp_path / "run.json.rank3.status").write_text(
        json.dumps({"rank": 3, "phase": "at step 1/4", "max_rss_bytes": 2**29}))
    assert failure_reason(out, _torchrun_root_cause(3, exitcode), False, 60) == expect


def test_without_a_cause_the_signal_then_the_symptom_is_named(tmp_path):
    out = tmp_path / "run.json"
    (tmp_path / "run.json.rank0.err").write_text(json.dumps({"rank": 0, "time": 9.0, "error": GLOO_PEER}))
    assert failure_reason(out, _torchrun_root_cause(3, -11), False, 60) == "rank 3 killed by SIGSEGV"
    assert failure_reason(out, "torchrun: something else\n", False, 60) == f"rank 0 failed: {GLOO_PEER}"
    assert failure_reason(tmp_path / "none.json", "a\nlast words\n", False, 60) == "last words"
    assert failure_reason(out, "", True, 60) == "timed out after 60 s; every rank was killed"


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


def test_killed_rank_is_named_with_its_signal_and_memory(tmp_path):
    """A rank the kernel kills (as the out-of-memory killer does) is named, not a peer's connection error."""
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "local:2x2", "--steps", "4", "--out", str(out), "--quiet",
                 env={"ZEROTUNE_FAULT": "kill@1:2"})
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert "rank 1 killed by SIGKILL — out of memory? (resident memory" in line and "GiB when last recorded" in line
    assert json.loads(out.read_text())["status"] == "failed"


def test_a_run_on_other_hardware_is_an_emulation(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "dgx-h100:1", "--steps", "2", "--warmup", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "it is an emulation on" in r.stderr and "NVIDIA H100 80GB" in r.stderr
    run = json.loads(out.read_text())
    assert run["emulated"] is True and run["device"].startswith("cpu") and run["host"]["name"] == platform.node()
    assert not list(tmp_path.glob("run.json.rank*"))  # per-rank status files are removed after a clean run


def test_early_refusals(tmp_path):
    """Memory (the cost model, before any process starts), an unwritable --out: exit 2, one line."""
    out = tmp_path / "run.json"
    t0 = time.monotonic()
    r = zerotune("train", "--model", "gpt-7b", "--cluster", "local:2x2", "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "gpt-7b does not fit cpu memory" in r.stderr and "largest: optim_states" in r.stderr
    assert "--force runs it anyway" in r.stderr
    r = zerotune("train", "--out", "/nonexistent/dir/run.json")
    assert r.returncode == 2 and "out='/nonexistent/dir/run.json': its directory '/nonexistent/dir' does not exist" \
        in r.stderr
    r = zerotune("train", "--out", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr
    assert time.monotonic() - t0 < 30 and not out.exists()


def test_host_memory_check_counts_every_rank_on_the_host():
    from zerotune.errors import SpecError
    from zerotune.trainer.train import check_memory

    model, cluster = parse_model("gpt-mini"), parse_cluster("local:2x2")
    s = build_strategy("zero3", cluster)
    per_rank = check_memory(model, cluster, s, 4, 4)["peak"]
    check_memory(model, cluster, s, 4, 4, ranks_here=4, available_bytes=4 * per_rank)
    with pytest.raises(SpecError, match=r"its 4 ranks on this host need .* GiB .* is available"):
        check_memory(model, cluster, s, 4, 4, ranks_here=4, available_bytes=4 * per_rank - 1)


def test_invalid_input_is_refused_before_any_process_starts(tmp_path):
    out = tmp_path / "run.json"
    t0 = time.monotonic()
    r = zerotune("train", "--cluster", "local:4", "--strategy", "zeropp", "--out", str(out))
    assert r.returncode == 2 and "needs a cluster with an hpZ level" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = zerotune("train", "--cluster", "local:2x2", "--global-batch", "6", "--out", str(out))
    assert r.returncode == 2 and "global_batch=6: must be a multiple of world x micro_batch_size = 4" in r.stderr
    r = zerotune("train", "--out", str(out), env={"ZEROTUNE_FAULT": "explode@1:2"})
    assert r.returncode == 2 and "ZEROTUNE_FAULT='explode@1:2': must be KIND@RANK:STEP" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30


# Loss curves recorded from real runs (10 steps, the first 2 untimed) and shaped ones around them.
NOISY_DECREASING = [8.34, 8.23, 8.15, 8.12, 8.07, 7.91, 8.14, 7.81, 7.76, 7.73]  # gpt-mini, 1 rank: a spike at 7
SMOOTH_DECREASING = [6.25, 6.24, 6.2, 6.17, 6.13, 6.09, 6.06, 6.01, 5.98, 5.96]  # gpt-tiny, 8 ranks
FLAT = [8.3715, 8.40, 8.31, 8.45, 8.36, 8.33, 8.44, 8.38, 8.35, 8.5772]  # noise around a level: the old gate's case
RISING_SLOWLY = [6.2, 6.22, 6.21, 6.25, 6.24, 6.28, 6.27, 6.31, 6.30, 6.34]
BLOW_UP = [6.26, 6.1, 6.0, 7.5, 9.8, 14.2, 30.1, 55.0, 80.2, 87.7]  # --lr 1.0


@pytest.mark.parametrize("losses, norms, verdict", [
    (NOISY_DECREASING, [1] * 10, "ok"),
    (SMOOTH_DECREASING, [1] * 10, "ok"),
    (FLAT, [1] * 10, "flat"),
    (RISING_SLOWLY, [1] * 10, "diverged"),
    (BLOW_UP, [1] * 10, "diverged"),
    ([6.0, 5.5, float("nan"), 4.5], [1, 1, 1, 1], "nan"),
    ([6.0, 5.5, 5.0, 4.5], [1, 1, float("inf"), 1], "nan"),
    ([6.0, 5.5, 5.0, 4.5, 4.0, 3.5], [1] * 6, "ok"),  # an exact line: t is finite and says falling
    ([6.0, 6.0, 6.0, 6.0, 6.0, 6.0], [1] * 6, "flat"),
    ([6.0, 5.99, 5.98], [1] * 3, "ok"),  # too short to read a trend: only NaN is checked
])
def test_health_verdicts(losses, norms, verdict):
    result = health(losses, norms, warmup=2)
    assert result["verdict"] == verdict, result
    json.dumps(result, allow_nan=False)  # the verdict's figures are valid JSON


def test_health_evidence_names_its_figures():
    result = health(FLAT, [1] * 10, warmup=2)
    assert result["steps_fitted"] == 8 and result["critical_t"] == pytest.approx(3.143, abs=1e-3)
    assert "over steps 3-10" in result["evidence"] and "6 df" in result["evidence"]
    assert f"t = {result['t']:.2f}" in result["evidence"] and "not falling beyond noise" in result["evidence"]
    rising = health(RISING_SLOWLY, [1] * 10, warmup=2)
    assert rising["slope"] > 0 and "rising beyond noise" in rising["evidence"]


def test_srun_layout_and_host_facts(monkeypatch):
    """Under srun without torchrun, rank, world and ranks per host come from Slurm's variables."""
    from zerotune.trainer.train import _env_from_slurm, host_facts

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(var, "")  # recorded, so what _env_from_slurm sets is undone after the test
        monkeypatch.delenv(var)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x3),4")
    _env_from_slurm()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("5", "16", "1")
    assert host_facts(16) == {"name": platform.node(), "cpus": len(os.sched_getaffinity(0)), "local_ranks": 4}
