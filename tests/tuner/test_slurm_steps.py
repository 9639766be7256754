"""The ``slurm`` executor's step mode: trials as job steps of an allocation, and a study in one allocation.

The allocation's description (Slurm's variables), the packing of a trial's nodes onto it and the lending of disjoint
nodes are checked as functions; everything that runs, runs on the session's one-node Slurm (the ``slurm`` fixture,
tests/slurm/cluster.py): an allocation made with ``salloc --no-shell``, a study inside ``sbatch``, and a study started
outside any allocation. The steps are seen in ``squeue --steps`` while they run, in each trial's result
(``slurm_step_id``) and, for the studies, afterwards in ``sacct`` (the cluster's test-owned slurmdbd): the study's
one job and its trials as steps ``JOB.N`` of it, and no other job. Where the cluster keeps no accounting (no slurmdbd
or no MariaDB here) the studies' ``sacct`` checks are ``unavailable``: skipped on a developer's machine, failed
under ``CI=true``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.slurm.cluster import PARTITION, LocalSlurm, short_hostname
from tests.slurm.queue import QueueWatch, login_env
from tests.support import ROOT, unavailable
from tests.tuner.test_slurm import make_spec
from zerotune.tuner.executors.base import TrialSpec
from zerotune.tuner.executors.slurm import SlurmExecutor, run_in_allocation
from zerotune.tuner.executors.slurm_allocation import Allocation, NodePool, gpus_on_node
from zerotune.tuner.executors.slurm_commands import SlurmCommands
from zerotune.tuner.executors.slurm_steps import StepRun, step_layout

# -- the allocation, as functions ----------------------------------------------------------------------------------


def test_no_job_id_is_no_allocation():
    assert Allocation.from_env({"SLURM_JOB_NODELIST": "n1"}) is None
    assert Allocation.from_env({"SLURM_JOB_ID": ""}) is None


def test_allocation_from_expanded_variables():
    missing = SlurmCommands(scontrol="/nonexistent/scontrol")  # a plain list needs no scontrol
    a = Allocation.from_env({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1,n2", "SLURM_JOB_NUM_NODES": "2",
                             "SLURM_GPUS_ON_NODE": "8"}, missing)
    assert a == Allocation("77", ("n1", "n2"), 8) and a.describe() == "Slurm job 77: 2 nodes x 8 GPUs"
    with pytest.raises(ValueError, match="cannot tell its nodes"):
        Allocation.from_env({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]"}, missing)
    with pytest.raises(ValueError, match="SLURM_JOB_NUM_NODES=3 but its node list names 2"):
        Allocation.from_env({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1,n2", "SLURM_JOB_NUM_NODES": "3"}, missing)
    inside = Allocation.from_env({"SLURM_JOB_ID": "5", "SLURM_NODELIST": "n1", "SLURM_STEP_ID": "0"}, missing)
    assert inside is not None and inside.in_step and inside.gpus_per_node == 0


def test_gpus_per_node_from_each_variable_slurm_sets():
    assert gpus_on_node({"SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1"}) == 4
    assert gpus_on_node({"SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}) == 8
    assert gpus_on_node({"SLURM_STEP_GPUS": "2,3"}) == 2
    assert gpus_on_node({"SLURM_GPUS_PER_NODE": "a100:4"}) == 4
    assert gpus_on_node({"SLURM_GPUS_PER_NODE": "2"}) == 2
    assert gpus_on_node({}) == 0


def test_step_layout_packs_the_clusters_nodes_onto_the_allocations(tmp_path):
    one_cpu_node = Allocation("1", ("n1",))
    assert step_layout(make_spec(tmp_path, "local:2x2"), one_cpu_node) == (1, 4, "")
    four = Allocation("1", ("n1", "n2", "n3", "n4"))
    assert step_layout(make_spec(tmp_path, "local:2x2"), four) == (2, 2, "")
    assert step_layout(make_spec(tmp_path, "local:2x2"), four, physical_nodes=1) == (1, 4, "")
    assert step_layout(make_spec(tmp_path, "local:3x3"), Allocation("1", ("n1", "n2")))[:2] == (1, 9)  # 9 ranks: 1
    gpus = Allocation("9", ("g1", "g2"), 8)
    assert step_layout(make_spec(tmp_path, "frontier:2"), gpus) == (2, 8, "")
    nodes, per_node, why = step_layout(make_spec(tmp_path, "frontier:4"), gpus)
    assert (nodes, per_node) == (2, 16)
    assert why == "frontier:4 needs 32 ranks on at most 2 nodes (16 per node), but Slurm job 9: 2 nodes x 8 GPUs"


def test_node_pool_lends_disjoint_nodes():
    pool = NodePool(["n1", "n2", "n3", "n4"])
    stop = threading.Event()
    a, b = pool.acquire(2, stop), pool.acquire(2, stop)
    assert a == ["n1", "n2"] and b == ["n3", "n4"] and pool.free == 0
    with ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(pool.acquire, 3, stop)
        time.sleep(0.3)
        assert not waiting.done()  # no 3 nodes free while both steps run
        pool.release(a)
        time.sleep(0.3)
        assert not waiting.done()
        pool.release(b)
        assert waiting.result(timeout=5) == ["n1", "n2", "n3"]
    stop.set()
    assert pool.acquire(2, stop) is None  # stopping: no step starts
    with pytest.raises(ValueError, match="1 to 4 nodes"):
        pool.acquire(5, threading.Event())


def test_srun_command_line_of_a_step(tmp_path):
    spec = make_spec(tmp_path / "t", "local:2x2", timeout_s=600, env=(("ZEROTUNE_FAULT", "crash@1:1"),))
    ex = SlurmExecutor(python="/opt/venv/bin/python", srun_options=["--cpu-bind=cores"])
    alloc = Allocation("42", ("n1", "n2", "n3"), 4, in_step=True)
    step = StepRun(ex, alloc, spec, ["n2", "n3"], 2, 20123)
    argv = step.argv()
    wd = spec.workdir.resolve()
    assert argv[:argv.index("/opt/venv/bin/python")] == [
        "srun", "--jobid=42", f"--job-name={SlurmExecutor.job_name(spec)}", "--nodes=2", "--nodelist=n2,n3",
        "--ntasks=4", "--ntasks-per-node=2", "--time=11", f"--chdir={wd}", "--kill-on-bad-exit=1", "--wait=0",
        "--gpus-per-node=2", "--overlap", "--cpu-bind=cores"]
    assert argv[argv.index("/opt/venv/bin/python"):] == ["/opt/venv/bin/python", "-m", "zerotune.trainer.train",
                                                         *spec.train_args(wd / "run.json")]
    env = step.env()
    assert env["MASTER_ADDR"] == "n2" and env["MASTER_PORT"] == "20123" and env["ZEROTUNE_FAULT"] == "crash@1:1"
    assert "SLURM_NTASKS" not in env and "RANK" not in env


def test_mode_jobs_never_runs_steps_and_modes_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    assert SlurmExecutor(mode="jobs").allocation() is None
    assert SlurmExecutor(mode="steps").allocation() == Allocation("5", ("n1",))
    with pytest.raises(ValueError, match="mode='batch'"):
        SlurmExecutor(mode="batch")
    with pytest.raises(ValueError, match="not inside a Slurm allocation"):
        monkeypatch.delenv("SLURM_JOB_ID")
        run_in_allocation([make_spec(tmp_path)])


# -- on a real Slurm -----------------------------------------------------------------------------------------------


@pytest.fixture
def allocation(slurm: LocalSlurm) -> Iterator[Allocation]:
    """A one-node allocation (``salloc --no-shell``, the node's CPUs), cancelled after the test."""
    r = slurm.command("salloc", "--no-shell", "--nodes=1", "--exclusive", f"--partition={PARTITION}",
                      "--job-name=zt-test-alloc", "--time=20", timeout=120)
    m = re.search(r"Granted job allocation (\d+)", r.stderr + r.stdout)
    assert m, f"salloc failed: {r.stderr}\n{slurm.logs()}"
    job_id = m.group(1)
    try:
        yield Allocation(job_id, (short_hostname(),))
    finally:
        slurm.command("scancel", job_id)


def step_executor(slurm: LocalSlurm, allocation: Allocation, **kw) -> SlurmExecutor:
    return SlurmExecutor(poll_interval_s=0.5, commands=SlurmCommands(env=slurm.env), allocation=allocation,
                         cancel_wait_s=30, **kw)


def steps_of(slurm: LocalSlurm, job_id: str) -> list[str]:
    r = slurm.command("squeue", "--steps", "-h", "-j", job_id, "-o", "%i|%j")
    return [line for line in r.stdout.split() if not line.endswith("|batch") and "|extern" not in line]


def assert_no_ranks_left(spec: TrialSpec) -> None:
    left = subprocess.run(["pgrep", "-f", f"--out {spec.workdir.resolve()}/run.json"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "ranks left behind"
    srun = subprocess.run(["pgrep", "-f", f"--chdir={spec.workdir.resolve()}"], capture_output=True, text=True)
    assert srun.stdout.strip() == "", "srun left behind"


def wait_for_step(slurm: LocalSlurm, job_id: str, name: str, timeout_s: float = 120) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for line in steps_of(slurm, job_id):
            sid, _, step_name = line.partition("|")
            if step_name == name:
                return sid
        time.sleep(0.3)
    raise AssertionError(f"no step {name} of job {job_id}:\n{slurm.logs()}")


@pytest.mark.timeout(400)
def test_a_hung_step_is_killed_at_its_timeout_and_the_next_trial_runs_packed(slurm, allocation, tmp_path):
    """A hung rank: the step is cancelled at the trial's timeout and nothing of it is left; the next trial (a 2-node
    emulated cluster, packed as 4 ranks onto the allocation's one node) runs as the next step of the same job."""
    ex = step_executor(slurm, allocation)
    hung = make_spec(tmp_path / "hung", "local:2", steps=3, warmup=1, timeout_s=3,
                     env=(("ZEROTUNE_FAULT", "hang@0:1"),))
    t0 = time.monotonic()
    r = ex.run(hung, stop=threading.Event())
    assert r.status == "failed" and r.extra["timed_out"] is True, r.reason
    step = r.extra["slurm_step_id"]
    assert re.fullmatch(rf"{allocation.job_id}\.\d+", step)
    assert r.reason == f"timed out after 3 s; Slurm step {step} cancelled"
    assert time.monotonic() - t0 < 200
    assert_no_ranks_left(hung)
    assert steps_of(slurm, allocation.job_id) == []
    packed = make_spec(tmp_path / "packed", "local:2x2", "zeropp", steps=3, warmup=1, timeout_s=240)
    r2 = ex.run(packed, stop=threading.Event())
    assert r2.status == "complete", f"{r2.reason}\n{r2.logs}"
    assert r2.metrics["world_size"] == 4 and r2.metrics["health"]["verdict"] == "ok"
    assert r2.extra["slurm_job_id"] == allocation.job_id and r2.extra["slurm_state"] == "COMPLETED"
    assert int(r2.extra["slurm_step_id"].split(".")[1]) > int(step.split(".")[1])  # the next step, same job
    assert "--nodes=1 " in (packed.workdir / "step.srun").read_text()
    assert "--ntasks-per-node=4 " in (packed.workdir / "step.srun").read_text()
    assert "step 3/3" in r2.logs
    assert slurm.command("squeue", "-h", "-j", allocation.job_id, "-o", "%T").stdout.strip() == "RUNNING"
    assert_no_ranks_left(packed)


@pytest.mark.timeout(300)
def test_stop_cancels_the_step_and_leaves_nothing(slurm, allocation, tmp_path):
    spec = make_spec(tmp_path / "stop", "local:2", steps=3, warmup=1, timeout_s=200,
                     env=(("ZEROTUNE_FAULT", "hang@0:1"),))
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(step_executor(slurm, allocation).run, spec, stop=stop)
        step = wait_for_step(slurm, allocation.job_id, SlurmExecutor.job_name(spec))
        time.sleep(1)
        stop.set()
        r = future.result(timeout=120)
    assert r.status == "failed" and r.extra["interrupted"], r.reason
    assert r.reason == f"interrupted: the runner is stopping; Slurm step {step} cancelled"
    assert_no_ranks_left(spec)
    assert steps_of(slurm, allocation.job_id) == []
    # the allocation itself goes on: only its step was cancelled
    assert slurm.command("squeue", "-h", "-j", allocation.job_id, "-o", "%T").stdout.strip() == "RUNNING"


@pytest.mark.timeout(300)
def test_a_crashing_rank_is_the_reason_and_run_in_allocation_goes_on(slurm, allocation, tmp_path):
    """``run_in_allocation`` (a shortlist measured inside the job): one step at a time on a one-node allocation, a
    rank's error as the failed trial's reason, the others measured."""
    crash = make_spec(tmp_path / "crash", "local:2", steps=3, warmup=1, timeout_s=200,
                      env=(("ZEROTUNE_FAULT", "crash@1:1"),))
    ok = make_spec(tmp_path / "ok", "local:2", "zero2", steps=3, warmup=1, timeout_s=200)
    seen: list[int] = []
    results = run_in_allocation([crash, ok], executor=step_executor(slurm, allocation),
                                on_result=lambda i, _: seen.append(i))
    r, r2 = results
    assert r.status == "failed", r.logs
    step = r.extra["slurm_step_id"]
    # srun's --kill-on-bad-exit ends the other rank and accounting records the step CANCELLED (exit 0:15): nobody
    # cancelled it, and srun's own exit status says FAILED
    assert r.reason.startswith(f"Slurm step {step} FAILED (exit "), r.reason
    assert ": rank 1 failed: RuntimeError: injected crash on rank 1 at step 1" in r.reason, r.reason
    assert r2.status == "complete", f"{r2.reason}\n{r2.logs}"
    assert r2.extra["slurm_step_id"] != step and sorted(seen) == [0, 1]
    assert {r.extra["slurm_job_id"], r2.extra["slurm_job_id"]} == {allocation.job_id}
    assert_no_ranks_left(crash)


def sacct_jobs(slurm: LocalSlurm) -> set[str]:
    """The id of every job (allocations and batch jobs, not their steps) the cluster's accounting has seen."""
    r = slurm.command("sacct", "-a", "-X", "-n", "-P", "--format=JobID", "--starttime=2000-01-01")
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def sacct_rows(slurm: LocalSlurm, job_id: str, steps: set[str], timeout_s: float = 30) -> dict[str, tuple[str, str]]:
    """{JobID: (JobName, State)} that ``sacct`` shows of job ``job_id`` and its steps, once it shows the job and
    every step in ``steps`` ended (slurmctld sends its records to slurmdbd a little after they happen)."""
    end = time.monotonic() + timeout_s
    while True:
        r = slurm.command("sacct", "-j", job_id, "--format=JobID,JobName,State", "-P", "-n")
        rows = {i: (name, state) for i, name, state in (line.split("|", 2) for line in r.stdout.splitlines()
                                                         if line.count("|") == 2)}
        live = any(state.split(" ")[0] in ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED") for _, state in rows.values())
        if (job_id in rows and not live and steps <= rows.keys()) or time.monotonic() > end:
            return rows
        time.sleep(1)


def assert_trials_are_steps_in_sacct(slurm: LocalSlurm, job_id: str, steps: set[str], trials: int,
                                     before: set[str]) -> None:
    """``sacct`` shows ``job_id`` with each trial a step ``JOB.N`` of it (``steps``: those ``squeue`` saw; at least
    ``trials`` of them completed), and no job but ``job_id`` since ``before`` (the jobs it showed before the study)."""
    if not slurm.accounting:
        unavailable(f"the test Slurm keeps no accounting, so sacct cannot show the steps: {slurm.accounting_off}")
    rows = sacct_rows(slurm, job_id, steps)
    print(f"sacct -j {job_id}:\n" + "\n".join(f"{i}|{name}|{state}" for i, (name, state) in rows.items()))
    trial_steps = {i: v for i, v in rows.items() if re.fullmatch(rf"{job_id}\.\d+", i)}
    assert job_id in rows and set(rows) - set(trial_steps) <= {job_id, f"{job_id}.batch", f"{job_id}.extern"}, rows
    assert all(name.startswith("zerotune-") for name, _ in trial_steps.values()), rows
    assert steps <= trial_steps.keys(), f"steps squeue saw but sacct does not: {steps - trial_steps.keys()}"
    assert sum(state == "COMPLETED" for _, state in trial_steps.values()) >= trials, rows
    assert sacct_jobs(slurm) - before == {job_id}, f"sacct shows other jobs: {sacct_jobs(slurm) - before - {job_id}}"


def _study_argv(tmp_path: Path, trials: int = 2) -> list[str]:
    return ["tune", "--model", "gpt-tiny", "--cluster", "local:2", "--executor", "slurm", "--partition", PARTITION,
            "--trials", str(trials), "--steps", "3", "--trial-timeout", "240", "--seed", "0", "--quiet",
            "--db", f"sqlite:///{tmp_path / 'zt.sqlite'}", "--workdir", str(tmp_path / "work")]


def _measured_trials(tmp_path: Path) -> list[tuple[str, str]]:
    """(executor, logs) of each complete trial the study stored."""
    import sqlite3

    with sqlite3.connect(tmp_path / "zt.sqlite") as db:
        return list(db.execute("SELECT executor, logs FROM zt_trials WHERE status = 'complete'"))


@pytest.mark.timeout(600)
def test_a_study_inside_sbatch_runs_its_trials_as_steps(slurm, tmp_path):
    """``zerotune tune --executor slurm`` in a batch script: every trial is a step of that one job (``squeue`` while
    it runs, ``sacct`` after)."""
    script = tmp_path / "study.sbatch"
    argv = " ".join(_study_argv(tmp_path))
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n#SBATCH --time=15\n"
                      f"#SBATCH --output={tmp_path}/out.txt\n#SBATCH --error={tmp_path}/err.txt\n"
                      f"export PYTHONPATH={ROOT}\n{sys.executable} -m zerotune.api.cli {argv}\n")
    before = sacct_jobs(slurm) if slurm.accounting else set()
    with QueueWatch(slurm) as seen:
        job_id = slurm.command("sbatch", "--parsable", f"--partition={PARTITION}", str(script)).stdout.strip()
        assert job_id.isdigit(), slurm.logs()
        end = time.monotonic() + 540
        while slurm.command("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip() and time.monotonic() < end:
            time.sleep(1)
    jobs, steps = seen.jobs, seen.steps
    err = (tmp_path / "err.txt").read_text()
    rec = json.loads((tmp_path / "out.txt").read_text())
    assert rec["evidence"] == "measured", err[-3000:]
    assert jobs == {job_id}, f"a job per trial: {jobs}"  # no new job id per trial
    trials = _measured_trials(tmp_path)
    assert len(trials) >= 2, err[-3000:]
    assert all(ex == "slurm" and f"zerotune: step of Slurm job {job_id} on " in logs for ex, logs in trials)
    assert steps and all(s.startswith(f"{job_id}.") for s in steps), steps
    assert_trials_are_steps_in_sacct(slurm, job_id, steps, len(trials), before)


@pytest.mark.timeout(600)
def test_a_study_outside_an_allocation_holds_one_for_all_its_trials(slurm, tmp_path):
    """``zerotune tune --executor slurm`` on a login node: one allocation for the whole study (one queue wait), every
    trial a step of it, the allocation cancelled when the study ends."""
    before = sacct_jobs(slurm) if slurm.accounting else set()
    with QueueWatch(slurm) as seen:
        r = subprocess.run([sys.executable, "-m", "zerotune.api.cli", *_study_argv(tmp_path)], capture_output=True,
                           text=True, cwd=ROOT, env=login_env(slurm), timeout=540)
    jobs, steps = seen.jobs, seen.steps
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["evidence"] == "measured"
    assert len(jobs) == 1, f"one allocation for the study, not {jobs}"
    (held,) = jobs
    assert steps and all(s.startswith(f"{held}.") for s in steps), steps
    assert len(list((tmp_path / "work").glob("*/hold.sbatch"))) == 1
    assert slurm.command("squeue", "-h", "-j", held, "-o", "%T").stdout.strip() == ""  # released at the end
    trials = _measured_trials(tmp_path)
    assert len(trials) >= 2 and all(f"zerotune: step of Slurm job {held} on " in logs for _, logs in trials)
    assert_trials_are_steps_in_sacct(slurm, held, steps, len(trials), before)
