"""The ``slurm`` executor: command lines and batch script against a fake Slurm, then real jobs on a local Slurm.

The real-Slurm tests use the session's one-node cluster on this machine (the ``slurm`` fixture of tests/conftest.py,
tests/slurm/cluster.py: munged, slurmctld, slurmd, all test-owned) and skip with the reason when Slurm is not installed
(``.ci/install-slurm.sh``) or we are not root; under CI=true they fail instead (``tests.support.unavailable``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.slurm.cluster import PARTITION, LocalSlurm
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.trainer.faults import first_rank_error
from zerotune.tuner.executors import make_executor
from zerotune.tuner.executors.base import Executor, TrialSpec
from zerotune.tuner.executors.slurm import REPO_ROOT, SlurmExecutor
from zerotune.tuner.executors.slurm_commands import SlurmCommands

SQUEUE = ["squeue", "-h", "-j", "12", "-o", "%T"]
SACCT = ["sacct", "-n", "-P", "-j", "12", "-o", "JobID,State,ExitCode,Reason"]
HEALTHY = {"status": "ok", "world_size": 4, "step_time_s": 0.1, "health": {"verdict": "ok", "evidence": "loss 6 -> 5"}}


def make_spec(workdir: Path, cluster: str = "local:2x2", strategy: str = "zero3", **kw) -> TrialSpec:
    c = parse_cluster(cluster)
    return TrialSpec(model=parse_model("gpt-tiny"), cluster=c, strategy=build_strategy(strategy, c), workdir=workdir,
                     **kw)


class FakeSlurm:
    """A runner that answers like Slurm's clients and records every command line.

    Each tool's answers are a list (taken in order, the last one repeats) of (rc, stdout, stderr)
    or of callables that get the argv and return one.
    """

    def __init__(self, **answers: list) -> None:
        self.answers = {"sbatch": [(0, "12\n", "")], "squeue": [(0, "", "")], "scancel": [(0, "", "")],
                        "sacct": [(0, "12|COMPLETED|0:0|None\n12.batch|COMPLETED|0:0|\n", "")],
                        "scontrol": [(1, "", "slurm_load_jobs error: Invalid job id specified")], **answers}
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        tool = Path(argv[0]).name if argv[0] != "ssh" else argv[2]
        queue = self.answers[tool]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        rc, out, err = answer(argv) if callable(answer) else answer
        return subprocess.CompletedProcess(argv, rc, out, err)

    def tools(self) -> list[str]:
        return [c[0] for c in self.calls]


def fake_executor(fake: FakeSlurm, **kw) -> SlurmExecutor:
    """The batch-job path (mode ``jobs``: one sbatch per trial) against a fake Slurm."""
    return SlurmExecutor(commands=SlurmCommands(runner=fake), poll_interval_s=0.001, **{"mode": "jobs", **kw})


def job_writes(files: dict[str, str | dict], rc_out: tuple[int, str, str] = (0, "12\n", "")) -> Callable:
    """An sbatch answer that also 'runs' the job: writes ``files`` into the job's workdir."""
    def submit(argv: list[str]) -> tuple[int, str, str]:
        wd = Path(argv[-1]).parent
        for name, content in files.items():
            (wd / name).write_text(content if isinstance(content, str) else json.dumps(content))
        return rc_out
    return submit


# -- the batch script ----------------------------------------------------------------------------------------


def test_is_an_executor_named_slurm(tmp_path):
    """What a request naming ``slurm`` gets (``make_executor``, as the worker and ``zerotune tune`` call it): an
    executor that measures (its trials are runs, not predictions), sends its jobs to the partition it was given,
    and labels each result ``slurm``, a failed one too (the executor a trial row stores)."""
    ex = make_executor("slurm", partition="gpu")
    assert isinstance(ex, Executor) and ex.measures
    assert "#SBATCH --partition=gpu" in ex.sbatch_script(make_spec(tmp_path / "script"))
    ok = fake_executor(FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY})]), partition="gpu").run(
        make_spec(tmp_path / "ok", timeout_s=60), stop=threading.Event())
    refused = fake_executor(FakeSlurm(sbatch=[(1, "", "sbatch: error: invalid partition specified: gpu")]),
                            partition="gpu").run(make_spec(tmp_path / "refused", timeout_s=60), stop=threading.Event())
    assert (ok.status, ok.executor, ok.metrics) == ("complete", "slurm", HEALTHY)
    assert (refused.status, refused.executor) == ("failed", "slurm") and "invalid partition" in refused.reason


def test_sbatch_script_for_a_two_node_cluster(tmp_path):
    spec = make_spec(tmp_path / "t1", "local:2x2", timeout_s=600,
                     env=(("ZEROTUNE_FAULT", "crash@1:1"), ("NOTE", "it's a test")))
    ex = SlurmExecutor(partition="gpu", account="proj42", sbatch_options=["--qos=short", "--exclusive"],
                       python="/opt/venv/bin/python")
    text = ex.sbatch_script(spec)
    lines = text.splitlines()
    wd = spec.workdir.resolve()
    assert lines[0] == "#!/bin/bash"
    assert [ln for ln in lines if ln.startswith("#SBATCH")] == [
        f"#SBATCH --job-name={SlurmExecutor.job_name(spec)}", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
        "#SBATCH --time=11", f"#SBATCH --output={wd}/slurm-%j.out", f"#SBATCH --error={wd}/slurm-%j.err",
        f"#SBATCH --chdir={wd}", "#SBATCH --partition=gpu", "#SBATCH --account=proj42", "#SBATCH --qos=short",
        "#SBATCH --exclusive"]
    assert SlurmExecutor.job_name(spec).startswith("zerotune-") and len(SlurmExecutor.job_name(spec)) == 17
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in lines
    assert "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))" in lines
    assert f"export PYTHONPATH={REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" in lines
    assert "export ZEROTUNE_FAULT=crash@1:1" in lines and "export NOTE='it'\"'\"'s a test'" in lines
    srun = shlex.split(lines[-1])
    assert srun[:5] == ["srun", "--kill-on-bad-exit=1", "/opt/venv/bin/python", "-m", "zerotune.trainer.train"]
    assert srun[5:] == spec.train_args(wd / "run.json")
    # the script is valid bash
    check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_relative_workdir_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = SlurmExecutor().sbatch_script(make_spec(Path("rel")))
    args = shlex.split(text.splitlines()[-1])
    assert args[args.index("--model") + 1] == str(tmp_path.resolve() / "rel" / "model.json")
    assert args[args.index("--out") + 1] == str(tmp_path.resolve() / "rel" / "run.json")


def test_layout_comes_from_the_outermost_level(tmp_path):
    ex = SlurmExecutor()
    assert ex.layout(make_spec(tmp_path, "local:2x2x2")) == (2, 4)
    assert ex.layout(make_spec(tmp_path, "local:4x3")) == (3, 4)
    assert ex.layout(make_spec(tmp_path, "local:4")) == (1, 4)  # one level: one node
    frontier = make_spec(tmp_path, "frontier:16")
    assert ex.layout(frontier) == (16, 8)


def test_physical_nodes_packs_emulated_nodes(tmp_path):
    spec = make_spec(tmp_path, "local:2x2")
    text = SlurmExecutor(physical_nodes=1).sbatch_script(spec)
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n" in text
    odd = SlurmExecutor(physical_nodes=2).sbatch_script(make_spec(tmp_path, "local:3x3"))
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=9\n" in odd
    # never more nodes than the cluster asks for
    assert "--nodes=2\n" in SlurmExecutor(physical_nodes=8).sbatch_script(spec)


def test_time_limit_is_the_timeout_in_minutes_plus_one():
    assert [SlurmExecutor.time_limit_min(t) for t in (1, 60, 61, 600, 3600)] == [2, 2, 3, 11, 61]


def test_gpus_and_srun_options(tmp_path):
    text = SlurmExecutor(gpus_per_node=8, srun_options=["--cpu-bind=cores"]).sbatch_script(make_spec(tmp_path))
    assert "#SBATCH --gpus-per-node=8" in text
    assert shlex.split(text.splitlines()[-1])[:3] == ["srun", "--kill-on-bad-exit=1", "--cpu-bind=cores"]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="must be one option"):
        SlurmExecutor(sbatch_options=["qos=short"])
    with pytest.raises(ValueError, match="must be one option"):
        SlurmExecutor(sbatch_options=["--qos=a\n#SBATCH --x"])
    with pytest.raises(ValueError, match="physical_nodes"):
        SlurmExecutor(physical_nodes=0)


# -- the run, against a fake Slurm ---------------------------------------------------------------------------


def test_completed_job_reads_run_json(tmp_path):
    fake = FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY, "slurm-12.err": "step 1/3\nstep 3/3\n"})],
                     squeue=[(0, "PENDING\n", ""), (0, "RUNNING\n", ""), (0, "COMPLETING\n", ""), (0, "", "")])
    spec = make_spec(tmp_path / "trial", timeout_s=120)
    r = fake_executor(fake).run(spec, stop=threading.Event())
    assert r.status == "complete", r.reason
    assert r.metrics == HEALTHY and r.executor == "slurm" and r.reason is None
    assert r.extra["slurm_job_id"] == "12" and r.extra["slurm_state"] == "COMPLETED"
    assert "step 3/3" in r.logs
    script = spec.workdir.resolve() / "job.sbatch"
    assert fake.calls[0] == ["sbatch", "--parsable", str(script)]
    assert fake.calls[1:5] == [SQUEUE] * 4 and fake.calls[5] == SACCT
    assert fake.tools() == ["sbatch", "squeue", "squeue", "squeue", "squeue", "sacct"]
    for name in ("model.json", "cluster.json", "strategy.json", "job.sbatch"):
        assert (spec.workdir / name).is_file()


def test_stale_results_are_removed_before_submitting(tmp_path):
    spec = make_spec(tmp_path / "trial")
    spec.workdir.mkdir()
    (spec.workdir / "run.json").write_text(json.dumps(HEALTHY))
    (spec.workdir / "run.json.rank3.err").write_text("{}")
    fake = FakeSlurm(sacct=[(0, "12|FAILED|2:0|NonZeroExitCode\n", "")])
    r = fake_executor(fake).run(spec, stop=threading.Event())
    assert r.status == "failed" and r.reason == "Slurm job 12 FAILED (exit 2:0)"
    assert not (spec.workdir / "run.json.rank3.err").exists()


def test_failed_job_names_the_first_rank_error_via_scontrol(tmp_path):
    scontrol = ("JobId=12 JobName=zerotune-abc\n   UserId=me(1) GroupId=me(1) MCS_label=N/A\n"
                "   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)\n"
                "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0\n")
    errs = {"run.json.rank0.err": {"rank": 0, "time": 20.0, "error": "RuntimeError: Connection closed by peer"},
            "run.json.rank1.err": {"rank": 1, "time": 10.0, "error": "RuntimeError: injected crash"}}
    fake = FakeSlurm(sbatch=[job_writes(errs)], squeue=[(0, "RUNNING\n", ""), (0, "", "")],
                     sacct=[(1, "", "Slurm accounting storage is disabled\n")], scontrol=[(0, scontrol, "")])
    ex = fake_executor(fake)
    r = ex.run(make_spec(tmp_path / "t"), stop=threading.Event())
    assert r.status == "failed"
    assert r.reason == "Slurm job 12 FAILED (exit 1:0): rank 1 failed: RuntimeError: injected crash"
    assert r.extra == {"slurm_job_id": "12", "slurm_state": "FAILED", "slurm_exit_code": "1:0",
                       "slurm_reason": "NonZeroExitCode", "slurm_script": str((tmp_path / "t/job.sbatch").resolve())}
    assert fake.calls[-1] == ["scontrol", "show", "job", "12"]
    # without slurmdbd, sacct is not asked again
    fake.calls.clear()
    ex.run(make_spec(tmp_path / "t2"), stop=threading.Event())
    assert "sacct" not in fake.tools()


@pytest.mark.parametrize(("state", "reason", "expect"), [
    ("CANCELLED by 1000", "None", "Slurm job 12 CANCELLED (exit 0:15)"),
    ("TIMEOUT", "TimeLimit", "Slurm job 12 TIMEOUT (exit 0:15, TimeLimit)"),
    ("NODE_FAIL", "NodeDown", "Slurm job 12 NODE_FAIL (exit 0:15, NodeDown)"),
    ("OUT_OF_MEMORY", "OutOfMemory", "Slurm job 12 OUT_OF_MEMORY (exit 0:15, OutOfMemory)"),
    ("PREEMPTED", "", "Slurm job 12 PREEMPTED (exit 0:15)"),
])
def test_other_final_states_fail_with_slurms_words(tmp_path, state, reason, expect):
    fake = FakeSlurm(sbatch=[job_writes({"slurm-12.err": "step 1/3\nslurmstepd: error: *** JOB 12 ON n1 ***\n"})],
                     sacct=[(0, f"12|{state}|0:15|{reason}\n12.batch|CANCELLED|0:15|\n", "")])
    r = fake_executor(fake).run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "failed" and r.reason == f"{expect}: slurmstepd: error: *** JOB 12 ON n1 ***"
    assert r.extra["slurm_state"] == state.split()[0] and "slurm-12.err" in r.logs


def test_accounting_lag_waits_for_a_final_state(tmp_path):
    fake = FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY})],
                     sacct=[(0, "12|RUNNING|0:0|None\n", ""), (0, "12|COMPLETED|0:0|None\n", "")])
    r = fake_executor(fake).run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "complete" and fake.tools().count("sacct") == 2


def test_unhealthy_run_fails_with_the_evidence(tmp_path):
    flat = {**HEALTHY, "health": {"verdict": "flat", "evidence": "loss 6.0000 -> 5.9990: less than 1% lower"}}
    fake = FakeSlurm(sbatch=[job_writes({"run.json": flat})])
    r = fake_executor(fake).run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "failed" and r.reason == "unhealthy run (flat): loss 6.0000 -> 5.9990: less than 1% lower"
    assert r.metrics == flat


def test_completed_without_run_json(tmp_path):
    r = fake_executor(FakeSlurm()).run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "failed" and "COMPLETED but rank 0 wrote no readable run.json" in r.reason


def test_sbatch_error_is_the_reason(tmp_path):
    fake = FakeSlurm(sbatch=[(1, "", "sbatch: error: invalid partition specified: nope\n"
                                     "sbatch: error: Batch job submission failed: Invalid partition name specified\n")])
    r = fake_executor(fake, partition="nope").run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "failed" and r.reason.startswith("sbatch failed (exit 1): sbatch: error: invalid partition")
    assert "Invalid partition name specified" in r.reason and fake.tools() == ["sbatch"]


def test_missing_sbatch_command_is_a_failed_trial(tmp_path):
    ex = SlurmExecutor(commands=SlurmCommands(sbatch="/nonexistent/sbatch"), mode="jobs")
    r = ex.run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "failed" and r.reason == "sbatch failed (exit 127): /nonexistent/sbatch: command not found"


def test_timeout_cancels_the_job(tmp_path):
    fake = FakeSlurm(squeue=[(0, "RUNNING\n", "")], sacct=[(0, "12|CANCELLED by 0|0:15|None\n", "")])

    def scancel(argv: list[str]) -> tuple[int, str, str]:
        fake.answers["squeue"] = [(0, "", "")]
        return 0, "", ""
    fake.answers["scancel"] = [scancel]
    t0 = time.monotonic()
    r = fake_executor(fake).run(make_spec(tmp_path, timeout_s=0.2), stop=threading.Event())
    assert 0.2 <= time.monotonic() - t0 < 10
    assert r.status == "failed" and r.reason == "timed out after 0.2 s; Slurm job 12 cancelled"
    assert ["scancel", "12"] in fake.calls and r.extra["timed_out"] is True
    assert r.extra["slurm_state"] == "CANCELLED"


def test_timeout_counts_from_the_start_not_from_the_queue(tmp_path):
    fake = FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY})],
                     squeue=[*[(0, "PENDING\n", "")] * 30, (0, "RUNNING\n", ""), (0, "", "")])
    ex = SlurmExecutor(commands=SlurmCommands(runner=fake), poll_interval_s=0.01, mode="jobs")
    r = ex.run(make_spec(tmp_path, timeout_s=0.1), stop=threading.Event())
    assert r.status == "complete", r.reason


def test_queue_timeout(tmp_path):
    fake = FakeSlurm(squeue=[(0, "PENDING\n", "")], sacct=[(0, "12|CANCELLED|0:0|None\n", "")])
    r = fake_executor(fake, queue_timeout_s=0.05, cancel_wait_s=0.05).run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "failed" and r.reason == "still PENDING after 0.05 s in the queue; Slurm job 12 cancelled"


def test_squeue_hiccups_do_not_end_the_trial(tmp_path):
    fake = FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY})],
                     squeue=[(1, "", "slurm_load_jobs error: Socket timed out on send/recv operation"),
                             (0, "RUNNING\n", ""), (0, "", "")])
    r = fake_executor(fake).run(make_spec(tmp_path), stop=threading.Event())
    assert r.status == "complete" and fake.tools().count("squeue") == 3


def test_squeue_invalid_job_id_means_gone(tmp_path):
    fake = FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY})],
                     squeue=[(1, "", "slurm_load_jobs error: Invalid job id specified\n")])
    assert fake_executor(fake).run(make_spec(tmp_path), stop=threading.Event()).status == "complete"


def test_stop_cancels_the_job_and_interrupts_the_trial(tmp_path):
    fake = FakeSlurm(squeue=[(0, "RUNNING\n", "")])
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()
    r = fake_executor(fake).run(make_spec(tmp_path), stop=stop)
    timer.join()
    assert r.status == "failed" and r.extra["interrupted"] and r.extra["slurm_job_id"] == "12"
    assert r.reason == "interrupted: the runner is stopping; Slurm job 12 cancelled"
    assert ["scancel", "12"] in fake.calls


def test_an_error_while_following_cancels_the_job(tmp_path):
    """Ctrl-C or a bug while the job is followed: scancel before the error goes on."""
    fake = FakeSlurm(squeue=[(0, "RUNNING\n", ""), (0, "RUNNING\n", ""), lambda argv: 1 / 0])
    with pytest.raises(ZeroDivisionError):
        fake_executor(fake).run(make_spec(tmp_path), stop=threading.Event())
    assert fake.calls[-1] == ["scancel", "12"]


def test_commands_can_be_argv_prefixes_and_workdir_root(tmp_path):
    fake = FakeSlurm(sbatch=[job_writes({"run.json": HEALTHY}, (0, "12;cluster2\n", ""))])
    cmds = SlurmCommands(sbatch=("ssh", "login1", "sbatch"), squeue=("ssh", "login1", "squeue"), runner=fake)
    ex = SlurmExecutor(commands=cmds, poll_interval_s=0.001, workdir_root=tmp_path / "shared", mode="jobs")
    r = ex.run(make_spec(tmp_path / "local" / "trial-7"), stop=threading.Event())
    assert r.status == "complete"
    script = (tmp_path / "shared" / "trial-7" / "job.sbatch").resolve()
    assert fake.calls[0] == ["ssh", "login1", "sbatch", "--parsable", str(script)]
    assert fake.calls[1] == ["ssh", "login1", *SQUEUE]
    assert not (tmp_path / "local").exists()


def test_first_rank_error(tmp_path):
    out = tmp_path / "run.json"
    assert first_rank_error(out) == ""
    (tmp_path / "run.json.rank2.err").write_text(json.dumps({"rank": 2, "time": 5.0, "error": "ValueError: x"}))
    (tmp_path / "run.json.rank3.err").write_text("not json")
    (tmp_path / "run.json.rank0.err").write_text(json.dumps({"rank": 0, "time": 7.0, "error": "RuntimeError: y"}))
    assert first_rank_error(out) == "rank 2 failed: ValueError: x"
    peer = "RuntimeError: Connection reset by peer. This is typically caused by a remote worker hanging"
    (tmp_path / "run.json.rank1.err").write_text(json.dumps({"rank": 1, "time": 1.0, "error": peer}))
    assert first_rank_error(out) == "rank 2 failed: ValueError: x"  # an earlier peer's symptom is not the cause


def test_default_runner_passes_env_and_reports_timeouts(tmp_path):
    cmds = SlurmCommands(squeue=("sh", "-c", 'echo "$ZT_VAR"; sleep 5'), env={"ZT_VAR": "hello"}, timeout_s=0.5)
    r = cmds("squeue")
    assert r.returncode == 124 and "no answer in 0.5 s" in r.stderr
    r = SlurmCommands(squeue=("sh", "-c", 'echo "$ZT_VAR"'), env={"ZT_VAR": "hello"})("squeue")
    assert r.returncode == 0 and r.stdout == "hello\n"


# -- real jobs on a local Slurm ------------------------------------------------------------------------------


def real_executor(slurm: LocalSlurm, **kw) -> SlurmExecutor:
    return SlurmExecutor(partition=PARTITION, physical_nodes=1, poll_interval_s=0.5,
                         commands=SlurmCommands(env=slurm.env), **{"mode": "jobs", **kw})


def assert_nothing_left(slurm: LocalSlurm, spec: TrialSpec) -> None:
    assert slurm.command("squeue", "-h", "-n", SlurmExecutor.job_name(spec), "-o", "%i").stdout.strip() == ""
    left = subprocess.run(["pgrep", "-f", f"--out {spec.workdir.resolve()}/run.json"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "ranks left behind"


@pytest.mark.timeout(240)
def test_slurm_healthy_trial(slurm, tmp_path):
    spec = make_spec(tmp_path / "healthy", "local:2x2", "zeropp", steps=3, warmup=1, timeout_s=200)
    r = real_executor(slurm).run(spec, stop=threading.Event())
    assert r.status == "complete", f"{r.reason}\n{r.logs}"
    assert r.metrics["status"] == "ok" and r.metrics["health"]["verdict"] == "ok"
    assert r.metrics["world_size"] == 4 and len(r.metrics["loss"]) == 3
    assert r.extra["slurm_state"] == "COMPLETED" and r.extra["slurm_job_id"].isdigit()
    assert "step 3/3" in r.logs and "master " in r.logs
    script = (spec.workdir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n" in script
    assert_nothing_left(slurm, spec)


@pytest.mark.timeout(240)
def test_slurm_crashing_rank(slurm, tmp_path):
    spec = make_spec(tmp_path / "crash", "local:2", steps=3, warmup=1, timeout_s=200,
                     env=(("ZEROTUNE_FAULT", "crash@1:1"),))
    r = real_executor(slurm).run(spec, stop=threading.Event())
    assert r.status == "failed", r.logs
    assert r.reason.startswith(f"Slurm job {r.extra['slurm_job_id']} FAILED (exit ")
    assert "rank 1 failed: RuntimeError: injected crash on rank 1 at step 1" in r.reason
    assert r.extra["slurm_state"] == "FAILED" and r.metrics is None
    assert_nothing_left(slurm, spec)


def _running_job(slurm: LocalSlurm, name: str, timeout_s: float = 120) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        out = slurm.command("squeue", "-h", "-n", name, "-t", "RUNNING", "-o", "%i").stdout.split()
        if out:
            return out[0]
        time.sleep(0.3)
    raise AssertionError(f"job {name} never ran:\n{slurm.logs()}")


@pytest.mark.timeout(240)
def test_slurm_cancelled_job(slurm, tmp_path):
    spec = make_spec(tmp_path / "cancel", "local:2", steps=3, warmup=1, timeout_s=200,
                     env=(("ZEROTUNE_FAULT", "hang@0:1"),))
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(real_executor(slurm).run, spec, stop=threading.Event())
        job_id = _running_job(slurm, SlurmExecutor.job_name(spec))
        time.sleep(1)
        assert slurm.command("scancel", job_id).returncode == 0
        r = future.result(timeout=120)
    assert r.status == "failed" and r.reason.startswith(f"Slurm job {job_id} CANCELLED (exit "), r.reason
    assert r.extra["slurm_state"] == "CANCELLED" and "timed_out" not in r.extra
    assert "CANCELLED" in r.logs
    assert_nothing_left(slurm, spec)


@pytest.mark.timeout(240)
def test_slurm_stop_cancels_a_running_job(slurm, tmp_path):
    """The runner stopping (service shutdown, lost lease) ends the batch job, not just the wait for it."""
    spec = make_spec(tmp_path / "stop", "local:2", steps=3, warmup=1, timeout_s=200,
                     env=(("ZEROTUNE_FAULT", "hang@0:1"),))
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(real_executor(slurm).run, spec, stop=stop)
        job_id = _running_job(slurm, SlurmExecutor.job_name(spec))
        time.sleep(1)
        stop.set()
        r = future.result(timeout=60)
    assert r.status == "failed" and r.extra["interrupted"], r.reason
    assert r.reason == f"interrupted: the runner is stopping; Slurm job {job_id} cancelled"
    end = time.monotonic() + 60
    while slurm.command("squeue", "-h", "-j", job_id, "-o", "%i").stdout.strip() and time.monotonic() < end:
        time.sleep(0.3)
    assert_nothing_left(slurm, spec)


@pytest.mark.timeout(240)
def test_slurm_executor_timeout_cancels(slurm, tmp_path):
    spec = make_spec(tmp_path / "timeout", "local:2", steps=3, warmup=1, timeout_s=3,
                     env=(("ZEROTUNE_FAULT", "hang@0:1"),))
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # the job was really running before it was cancelled
        while not stop.is_set():
            seen.extend(slurm.command("squeue", "-h", "-n", SlurmExecutor.job_name(spec), "-o", "%T").stdout.split())
            time.sleep(0.3)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        r = real_executor(slurm).run(spec, stop=threading.Event())
    finally:
        stop.set()
        t.join(5)
    assert r.status == "failed"
    assert r.reason == f"timed out after 3 s; Slurm job {r.extra['slurm_job_id']} cancelled"
    assert r.extra["timed_out"] is True and r.extra["slurm_state"] == "CANCELLED"
    assert "RUNNING" in seen and time.monotonic() - t0 < 120
    assert_nothing_left(slurm, spec)
