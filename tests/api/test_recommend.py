"""``zerotune recommend``, the Slurm prologue client: the real CLI as a subprocess against a real service.

One ``zerotune serve`` for the module (a stored recommendation, a pending job, a refused request);
small stdlib HTTP stubs for a slow, failing or flaky service; a free port nobody listens on for a
service that is down. Every exit status of the recommend path is checked here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ROOT, Launcher, free_port
from zerotune.api.cli import ExitStatus
from zerotune.api.prologue import (
    default_recommendation,
    merge_deepspeed,
    request_key,
)
from zerotune.api.prologue.client import Client, Retry, ServiceError
from zerotune.errors import UsageError

STORED = {"model": "gpt-125m", "cluster": "frontier:2", "executor": "model", "budget": {"trials": 8}}
STORED_ARGS = ["--model", "gpt-125m", "--cluster", "frontier:2", "--trials", "8"]
_SCRIPT = Path(sys.executable).parent / "zerotune"
ZEROTUNE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "zerotune.api.cli"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    exports: dict[str, str] = field(default_factory=dict)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without SLURM_* / ZEROTUNE_* (the tests may run inside a Slurm job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ZEROTUNE_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def recommend(*args: str, cache: Path, cwd: Path | None = None, timeout: float = 90, **env: str) -> Result:
    start = time.monotonic()
    proc = subprocess.run([*ZEROTUNE, "recommend", *args], cwd=cwd or ROOT, capture_output=True, text=True,
                          env=clean_env(ZEROTUNE_CACHE_DIR=str(cache), **env), timeout=timeout)
    result = Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)
    for line in proc.stdout.splitlines():
        m = re.match(r"^export (ZEROTUNE_[A-Z_]+)=(.*)$", line)
        if m:
            result.exports[m[1]] = m[2]
    return result


def read(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# --------------------------------------------------------------------------------------------------
# the service and the stubs


@dataclass
class Service:
    url: str
    rec: dict[str, Any]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A real ``zerotune serve`` (one embedded worker) holding the recommendation of STORED."""
    tmp = tmp_path_factory.mktemp("recommend-service")
    launcher = Launcher(tmp)
    try:
        server = launcher.serve(f"sqlite:///{tmp / 'zerotune.sqlite'}", workers=1)
        r = httpx.post(f"{server.url}/v1/recommendations", json=STORED, params={"wait": 120}, timeout=150)
        assert r.status_code == 200, r.text
        yield Service(server.url, r.json())
    finally:
        launcher.close()


class Stub:
    """A stdlib HTTP service that answers from a script: ``(status, body, headers)`` per request (the last
    one repeats), or ``"hang"``: hold the request until the test ends."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.count = 0
        self.seen = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stub.handle(self)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            step = self.script[min(self.count, len(self.script) - 1)]
            self.count += 1
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        self.seen.set()
        if step == "hang":
            self.release.wait(60)
            return
        status, body, headers = step
        data = json.dumps(body).encode()
        try:
            h.send_response(status)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except OSError:
            pass

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs() -> Iterator[list[Stub]]:
    made: list[Stub] = []
    try:
        yield made
    finally:
        for s in made:
            s.close()


# --------------------------------------------------------------------------------------------------
# answers from the service


def test_stored_recommendation_writes_files_env_lines_and_cache(service, tmp_path):
    out = tmp_path / "cfg"
    r = recommend(*STORED_ARGS, "--server", service.url, "-o", str(out), cache=tmp_path / "cache")
    assert r.returncode == ExitStatus.SUCCESS, r.stderr
    e, rec = r.exports, service.rec
    # the configs' notes: in notes.txt beside them, and one warning line each on stderr
    notes = (out / "notes.txt").read_text().splitlines()
    assert e["ZEROTUNE_NOTES"] == str(out / "notes.txt")
    assert len(notes) == len(rec["exports"]["deepspeed_notes"]) + len(rec["exports"]["fsdp"]["notes"])
    assert r.stderr.splitlines() == [f"zerotune: warning: {' '.join(n.split())}" for n in notes]
    assert e["ZEROTUNE_SOURCE"] == "service" and e["ZEROTUNE_RECOMMENDATION_ID"] == str(rec["id"])
    assert e["ZEROTUNE_EVIDENCE"] == rec["evidence"] and e["ZEROTUNE_CONFIG_DIR"] == str(out)
    assert read(e["ZEROTUNE_CONFIG"]) == rec["exports"]["zerotune"]
    assert read(e["ZEROTUNE_DEEPSPEED_CONFIG"]) == rec["exports"]["deepspeed"]
    assert read(e["ZEROTUNE_FSDP_CONFIG"]) == rec["exports"]["fsdp"]
    assert read(e["ZEROTUNE_STRATEGY_FILE"]) == rec["exports"]["zerotune"]["strategy"]
    assert Path(e["ZEROTUNE_STRATEGY_FILE"]).parent == out
    assert (e["ZEROTUNE_TRAIN_MODEL"], e["ZEROTUNE_TRAIN_CLUSTER"]) == ("gpt-125m", "frontier:2")
    assert (e["ZEROTUNE_NNODES"], e["ZEROTUNE_NPROC_PER_NODE"]) == ("2", "8")
    assert e["ZEROTUNE_GLOBAL_BATCH"] == str(rec["exports"]["zerotune"]["global_batch"])
    assert not list(out.glob("*.tmp")), "a temporary file was left behind"
    (cached,) = (tmp_path / "cache" / "recommendations").iterdir()
    assert read(cached)["recommendation"]["id"] == rec["id"] and read(cached)["url"] == service.url

    # the same request from the Slurm environment: ZEROTUNE_* defaults, the node count from Slurm
    slurm = recommend("--trials", "8", cache=tmp_path / "cache2", cwd=tmp_path, ZEROTUNE_URL=service.url,
                      ZEROTUNE_MODEL="gpt-125m", SLURM_CLUSTER_NAME="frontier", SLURM_JOB_NUM_NODES="2",
                      SLURM_GPUS_ON_NODE="8", SLURM_JOB_ID="4242")
    assert slurm.returncode == 0, slurm.stderr
    assert slurm.exports["ZEROTUNE_RECOMMENDATION_ID"] == str(rec["id"])
    assert slurm.exports["ZEROTUNE_CONFIG_DIR"] == str(tmp_path / ".zerotune" / "job-4242")


def test_formats_and_the_deepspeed_base_merge(service, tmp_path):
    rec, cache = service.rec["exports"], tmp_path / "cache"
    base = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
            "fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
            "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
    (tmp_path / "mine.json").write_text(json.dumps(base))
    out = tmp_path / "ds.json"
    recommended = rec["deepspeed"]
    # a batch other than the one every trial measured is refused, naming the key and both values
    args = (*STORED_ARGS, "--server", service.url, "--format", "deepspeed", "--base", str(tmp_path / "mine.json"),
            "-o", str(out))
    r = recommend(*args, cache=cache)
    assert r.returncode == ExitStatus.USAGE_ERROR and not out.exists(), r.stderr
    assert one_line(r.stderr) == (
        f"zerotune: error: --base train_micro_batch_size_per_gpu=4: conflicts with the recommended "
        f"train_micro_batch_size_per_gpu={recommended['train_micro_batch_size_per_gpu']} (every trial trained "
        f"{recommended['train_batch_size']} sequences per step); remove it from the base, or pass --keep-base-batch "
        "to train another batch than was measured")
    r = recommend(*args, "--keep-base-batch", cache=cache)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    warnings = r.stderr.strip().splitlines()
    assert all(w.startswith("zerotune: warning: ") for w in warnings)
    assert any("zero_optimization.offload_optimizer (device cpu)" in w for w in warnings)
    assert any("--base keeps fp16: the recommendation is for bf16" in w for w in warnings)
    world = recommended["train_batch_size"] // (recommended["train_micro_batch_size_per_gpu"]
                                                * recommended["gradient_accumulation_steps"])
    assert any(f"--keep-base-batch: {4 * 2 * world} sequences per step" in w for w in warnings)
    merged = read(out)
    assert merged["train_batch_size"] == 4 * 2 * world  # DeepSpeed's rule, derived from the base's two keys
    assert {k: v for k, v in merged.items() if k not in ("zero_optimization", "train_batch_size")} == \
        {k: v for k, v in base.items() if k != "zero_optimization"}, "the user's other keys changed"
    assert merged["zero_optimization"] == {"offload_optimizer": {"device": "cpu"}, **recommended["zero_optimization"]}
    notes = (tmp_path / "ds.notes.txt").read_text().splitlines()
    assert [f"zerotune: warning: {n}" for n in notes] == [" ".join(w.split()) for w in warnings]
    assert read(tmp_path / "mine.json") == base, "the --base file itself changed"
    quiet = recommend(*args, "--keep-base-batch", "--quiet", cache=cache)
    assert quiet.returncode == 0 and quiet.stderr == "" and read(out) == merged

    # one name per format, as the API names it; "json" stays accepted as the zerotune config's older name
    for fmt, key in (("deepspeed", "deepspeed"), ("fsdp", "fsdp"), ("zerotune", "zerotune"), ("json", "zerotune")):
        r = recommend(*STORED_ARGS, "--server", service.url, "--format", fmt, cache=cache)
        assert r.returncode == 0 and json.loads(r.stdout) == rec[key], (fmt, r.stderr)
    r = recommend(*STORED_ARGS, "--server", service.url, "--format", "zerotune", "-o", str(tmp_path / "zt.json"),
                  cache=cache)
    written = read(tmp_path / "zt.json")  # its files named after it, and its command naming those
    assert r.returncode == 0 and written["files"] == {"zt.strategy.json": "strategy"}
    assert written["command"] == rec["zerotune"]["command"].replace(" strategy.json", " zt.strategy.json")
    assert {k: v for k, v in written.items() if k not in ("files", "command")} == \
        {k: v for k, v in rec["zerotune"].items() if k not in ("files", "command")}
    assert read(tmp_path / "zt.strategy.json") == rec["zerotune"]["strategy"]
    assert not (tmp_path / "strategy.json").exists()


def test_pending_job_falls_back_then_wait_gets_the_answer(service, tmp_path):
    args = ["--model", "gpt-125m", "--cluster", "frontier:4", "--trials", "40", "--server", service.url,
            "--format", "json"]
    first = recommend(*args, cache=tmp_path / "cache")
    assert first.returncode == ExitStatus.SUCCESS, first.stderr
    warning = one_line(first.stderr)
    assert warning.startswith("zerotune: warning: no stored recommendation yet: job ") and "--wait" in warning
    assert "built-in default" in warning
    job_id = int(re.search(r"job (\d+) is", warning)[1])
    fallback = json.loads(first.stdout)
    assert fallback["strategy"]["name"] == "zero3" and fallback["strategy"]["reduce_bucket_mb"] == 1000

    asked = datetime.now(UTC)
    waited = recommend(*args, "--wait", "90", cache=tmp_path / "cache")
    assert waited.returncode == ExitStatus.SUCCESS and waited.stderr == "", waited.stderr
    job = httpx.get(f"{service.url}/v1/jobs/{job_id}").json()
    assert job["state"] == "done", job
    assert datetime.fromisoformat(job["finished_at"].replace("Z", "+00:00")) > asked, "the job ended before --wait"
    rec = httpx.get(f"{service.url}/v1/recommendations/{job['recommendation_id']}").json()
    assert json.loads(waited.stdout) == rec["exports"]["zerotune"]


def test_a_refused_request_prints_the_services_message(service, tmp_path):
    r = recommend("--model", "gpt-99b", "--cluster", "frontier:2", "--server", service.url, "-o",
                  str(tmp_path / "out"), cache=tmp_path / "cache")
    assert r.returncode == ExitStatus.SERVER_REFUSED and r.stdout == ""
    line = one_line(r.stderr)
    assert line.startswith("zerotune: error: the service refused the request: body.model='gpt-99b': ")
    assert "unknown model preset" in line
    assert not (tmp_path / "out").exists(), "a refused request must not write a fallback"


def test_an_unwritable_output_is_an_error(service, tmp_path):
    (tmp_path / "a-file").write_text("")
    r = recommend(*STORED_ARGS, "--server", service.url, "--format", "deepspeed", "-o",
                  str(tmp_path / "a-file" / "ds.json"), cache=tmp_path / "cache")
    assert r.returncode == ExitStatus.ERROR
    assert one_line(r.stderr).startswith("zerotune: error: cannot write the deepspeed output: [Errno ")


# --------------------------------------------------------------------------------------------------
# no answer: fallbacks and their exit statuses


def test_service_down_falls_back_within_the_budget(service, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "default"
    r = recommend(*STORED_ARGS, "--server", down, "--timeout", "1", "-o", str(out), "--quiet", cache=tmp_path / "empty")
    assert r.returncode == ExitStatus.SUCCESS, r.stderr
    line = one_line(r.stderr)  # --quiet silences the configs' notes, never the fallback's warning
    assert line.startswith("zerotune: warning: service unreachable") and "built-in default" in line
    assert 0.8 <= r.elapsed < 3.5, r.elapsed  # retried until the budget (1 s) was spent
    assert r.exports["ZEROTUNE_SOURCE"] == "default"
    zero = read(out / "ds_config.json")["zero_optimization"]
    assert (zero["stage"], zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (3, 5e8, 5e7)
    assert read(out / "strategy.json")["name"] == "zero3"

    strict = recommend(*STORED_ARGS, "--server", down, "--timeout", "0.5", "-o", str(tmp_path / "strict"),
                       "--strict", cache=tmp_path / "empty")
    assert strict.returncode == ExitStatus.FALLBACK_USED and (tmp_path / "strict" / "ds_config.json").is_file()
    none = recommend(*STORED_ARGS, "--server", down, "--timeout", "0.5", "-o", str(tmp_path / "none"),
                     "--no-fallback", cache=tmp_path / "empty")
    assert none.returncode == ExitStatus.SERVER_ERROR and none.stdout == ""
    assert one_line(none.stderr).startswith("zerotune: error: service unreachable")
    assert not (tmp_path / "none").exists()

    # the last answer for the same request, cached on disk, wins over the built-in default
    cache = tmp_path / "cache"
    assert recommend(*STORED_ARGS, "--server", service.url, "--format", "json", cache=cache).returncode == 0
    cached = recommend(*STORED_ARGS, "--server", down, "--timeout", "0.5", "-o", str(tmp_path / "c"), "--quiet",
                       cache=cache)
    assert cached.returncode == 0 and cached.exports["ZEROTUNE_SOURCE"] == "cache"
    assert cached.exports["ZEROTUNE_RECOMMENDATION_ID"] == str(service.rec["id"])
    assert f"cached recommendation {service.rec['id']}" in one_line(cached.stderr)
    assert read(tmp_path / "c" / "ds_config.json") == service.rec["exports"]["deepspeed"]
    other = recommend(*STORED_ARGS, "--objective", "pareto", "--server", down, "--timeout", "0.3", "--format",
                      "json", cache=cache)  # another request: the cache does not answer it
    assert other.returncode == 0 and "built-in default" in other.stderr


def test_a_slow_service_times_out_within_the_budget(stubs, tmp_path):
    slow = Stub("hang")
    stubs.append(slow)
    r = recommend(*STORED_ARGS, "--server", slow.url, "--timeout", "2", "--format", "deepspeed",
                  cache=tmp_path / "cache")
    assert r.returncode == ExitStatus.SUCCESS and json.loads(r.stdout)["zero_optimization"]["stage"] == 3
    assert "no answer in time" in one_line(r.stderr)
    assert 2.0 <= r.elapsed < 4.5, r.elapsed
    r = recommend(*STORED_ARGS, "--server", slow.url, "--timeout", "1", "--no-fallback", cache=tmp_path / "cache")
    assert r.returncode == ExitStatus.TIMEOUT and "no answer in time" in one_line(r.stderr)
    assert 1.0 <= r.elapsed < 3.5, r.elapsed


def test_a_pending_job_past_wait_is_a_timeout(stubs, tmp_path):
    queued = {"id": 7, "state": "queued", "trials_done": 0, "trials_total": 8}
    stub = Stub((202, queued, {"Location": "/v1/jobs/7"}))
    stubs.append(stub)
    r = recommend(*STORED_ARGS, "--server", stub.url, "--wait", "1", "--timeout", "2", "--no-fallback",
                  cache=tmp_path / "cache")
    assert r.returncode == ExitStatus.TIMEOUT
    assert "job 7 still queued (0/8 trials) after --wait 1 s" in one_line(r.stderr)
    assert stub.count >= 2, "the client should ask again while --wait lasts"


def test_5xx_and_429_are_retried_with_backoff(service, stubs, tmp_path):
    flaky = Stub((503, {"detail": "restarting"}, {"Retry-After": "0"}), (502, {"detail": "bad gateway"}, {}),
                 (429, {"detail": "slow down"}, {"Retry-After": "0.2"}), (200, service.rec, {}))
    stubs.append(flaky)
    r = recommend(*STORED_ARGS, "--server", flaky.url, "--timeout", "5", "--quiet", cache=tmp_path / "cache",
                  cwd=tmp_path)
    assert r.returncode == ExitStatus.SUCCESS and r.stderr == "", r.stderr
    assert r.exports["ZEROTUNE_SOURCE"] == "service" and flaky.count == 4

    failing = Stub((500, {"detail": "database is locked"}, {}))
    stubs.append(failing)
    r = recommend(*STORED_ARGS, "--server", failing.url, "--timeout", "1", "--no-fallback", cache=tmp_path / "c2")
    assert r.returncode == ExitStatus.SERVER_ERROR
    assert one_line(r.stderr) == f"zerotune: error: HTTP 500: database is locked ({failing.url})"
    assert 3 <= failing.count <= 12, failing.count  # retried, with pauses between the attempts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_is_130(stubs, tmp_path, sig):
    slow = Stub("hang")
    stubs.append(slow)
    proc = subprocess.Popen([*ZEROTUNE, "recommend", *STORED_ARGS, "--server", slow.url, "--timeout", "60"],
                            env=clean_env(ZEROTUNE_CACHE_DIR=str(tmp_path)), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert slow.seen.wait(30), "the client never asked"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == ExitStatus.INTERRUPTED and one_line(err) == "zerotune: interrupted"


# --------------------------------------------------------------------------------------------------
# the Slurm environment → the request


@pytest.mark.parametrize("env, args, cluster", [
    ({"SLURM_JOB_NUM_NODES": "48", "SLURM_GPUS_ON_NODE": "8", "SLURM_CLUSTER_NAME": "frontier",
      "SLURM_JOB_ID": "123"}, [], "frontier:48"),
    ({"SLURM_NNODES": "4", "SLURM_JOB_ID": "9"}, ["--cluster", "dgx-h100"], "dgx-h100:4"),
    ({"SLURM_JOB_NUM_NODES": "3", "SLURM_NNODES": "1", "SLURM_CLUSTER_NAME": "site-x"}, ["--cluster", "frontier"],
     "frontier:3"),
    ({"ZEROTUNE_CLUSTER": "frontier", "SLURM_JOB_NUM_NODES": "16"}, [], "frontier:16"),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4"}, ["--cluster", "local"], "local:4x2"),
    ({"SLURM_JOB_NUM_NODES": "48"}, ["--cluster", "frontier:48"], "frontier:48"),
    ({"SLURM_JOB_NUM_NODES": "48"}, ["--cluster", "frontier:4", "--no-slurm"], "frontier:4"),
    ({}, ["--cluster", "frontier:4"], "frontier:4"),
])
def test_slurm_variables_make_the_request(tmp_path, env, args, cluster):
    r = recommend("--dry-run", "--server", "http://zt.example:8000", *args, cache=tmp_path,
                  ZEROTUNE_MODEL="gpt-neox-20b", ZEROTUNE_TOKEN="s3cret", **env)
    assert r.returncode == ExitStatus.SUCCESS and r.stderr == "", r.stderr
    sent = json.loads(r.stdout)
    body = {"model": "gpt-neox-20b", "cluster": cluster, "objective": "throughput", "executor": "model",
            "budget": {"trials": 40}}
    assert sent["body"] == body and sent["cache_key"] == request_key(body)
    assert sent["url"] == "http://zt.example:8000/v1/recommendations?wait=0"
    assert sent["headers"]["Authorization"] == "Bearer ***" and "s3cret" not in r.stdout


@pytest.mark.parametrize("env, args, runner", [
    ({}, ["--runner", "deepspeed"], "deepspeed"),
    ({"ZEROTUNE_RUNNER": "fsdp"}, [], "fsdp"),
    ({"ZEROTUNE_RUNNER": "fsdp"}, ["--runner", "deepspeed"], "deepspeed"),  # the flag wins
    ({}, ["--runner", "zerotune"], None),  # the default: the body, and its cache key, stay as before
])
def test_a_prologue_asks_for_the_runner_it_trains_with(tmp_path, env, args, runner):
    r = recommend("--dry-run", "--model", "gpt-neox-20b", "--cluster", "frontier:4", *args, cache=tmp_path, **env)
    assert r.returncode == ExitStatus.SUCCESS, r.stderr
    sent = json.loads(r.stdout)
    assert sent["body"].get("runner") == runner and sent["cache_key"] == request_key(sent["body"])


@pytest.mark.parametrize("env, args, fp32", [
    ({}, ["--grad-reduce-in-fp32"], True),
    ({"ZEROTUNE_GRAD_REDUCE_IN_FP32": "1"}, [], True),
    ({"ZEROTUNE_GRAD_REDUCE_IN_FP32": "no"}, [], None),
    ({}, [], None),  # the default: the body, and its cache key, stay as before
])
def test_a_prologue_says_when_its_training_reduces_gradients_in_fp32(tmp_path, env, args, fp32):
    r = recommend("--dry-run", "--model", "gpt-neox-20b", "--cluster", "frontier:4", *args, cache=tmp_path, **env)
    assert r.returncode == ExitStatus.SUCCESS, r.stderr
    sent = json.loads(r.stdout)
    assert sent["body"].get("grad_reduce_in_fp32") == fp32 and sent["cache_key"] == request_key(sent["body"])
    fallback = default_recommendation(sent["body"])  # the offline answer keeps the training's reduction
    assert fallback["strategy"]["grad_bits"] == (32 if fp32 else 16)
    assert fallback["exports"]["fsdp"]["mixed_precision"]["reduce_dtype"] == ("float32" if fp32 else "bfloat16")


@pytest.mark.parametrize("env, args, message", [
    ({"ZEROTUNE_RUNNER": "megatron"}, ["--cluster", "frontier:2"], "runner='megatron': must be one of"),
    ({"ZEROTUNE_GRAD_REDUCE_IN_FP32": "sometimes"}, ["--cluster", "frontier:2"],
     "ZEROTUNE_GRAD_REDUCE_IN_FP32='sometimes': must be 1, true or yes"),
    ({"SLURM_JOB_NUM_NODES": "abc"}, ["--cluster", "frontier"], "SLURM_JOB_NUM_NODES='abc': must be a positive"),
    ({"SLURM_JOB_NUM_NODES": "0"}, ["--cluster", "frontier"], "SLURM_JOB_NUM_NODES='0': must be a positive"),
    ({"SLURM_NNODES": "-2"}, ["--cluster", "frontier"], "SLURM_NNODES='-2': must be a positive"),
    ({"SLURM_JOB_NUM_NODES": "48", "SLURM_GPUS_ON_NODE": "4"}, ["--cluster", "frontier"],
     "SLURM_GPUS_ON_NODE=4: the frontier preset has 8 ranks per node"),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8x"}, ["--cluster", "frontier"],
     "SLURM_GPUS_ON_NODE='8x': must be a positive integer"),
    ({"SLURM_JOB_NUM_NODES": "48", "SLURM_CLUSTER_NAME": "site-x"}, [],
     "SLURM_CLUSTER_NAME='site-x': is not a cluster preset"),
    ({"SLURM_JOB_NUM_NODES": "48"}, ["--cluster", "frontier:4"], "SLURM_JOB_NUM_NODES=48: disagrees with --cluster"),
    ({"SLURM_JOB_ID": "12x"}, ["--cluster", "frontier:2"], "SLURM_JOB_ID='12x': must be a job number"),
    ({}, ["--cluster", "frontier"], "cluster='frontier': the node count is unknown"),
    ({}, [], "cluster=None: not given"),
    ({}, ["--cluster", "frontier:2", "--model", ""], "model=None: not given"),
    ({}, ["--cluster", "frontier:2", "--timeout", "0"], "--timeout=0.0: must be a finite number > 0"),
    ({}, ["--cluster", "frontier:2", "--format", "fsdp", "--base", "x.json"], "--base='x.json': merges into"),
])
def test_bad_slurm_variables_and_flags_are_usage_errors(tmp_path, env, args, message):
    model = [] if "--model" in args else ["--model", "gpt-neox-20b"]
    r = recommend("--dry-run", *model, *args, cache=tmp_path, **env)
    assert r.returncode == ExitStatus.USAGE_ERROR and r.stdout == ""
    assert one_line(r.stderr).startswith(f"zerotune: error: {message}"), r.stderr


# --------------------------------------------------------------------------------------------------
# start-up and the pieces


FORBIDDEN = {"torch", "optuna", "sqlalchemy", "fastapi", "uvicorn", "pydantic", "numpy", "starlette"}


def _imported(*args: str, expect: int, cache: Path) -> set[str]:
    """Every module ``python -X importtime -m zerotune.api.cli recommend ...`` imports (no site): zerotune's own by
    their full names, the others by their top-level names. ``cache``: an empty saved-answers folder of the test's
    own, so an answer saved on this machine before cannot stand in for the fallback."""
    proc = subprocess.run([sys.executable, "-S", "-X", "importtime", "-m", "zerotune.api.cli", "recommend", *args],
                          cwd=ROOT, capture_output=True, text=True, env=clean_env(ZEROTUNE_CACHE_DIR=str(cache)),
                          timeout=60)
    assert proc.returncode == expect, proc.stderr[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", proc.stderr, re.MULTILINE)
    assert names, proc.stderr[-2000:]
    return {n if n.startswith("zerotune.") else n.split(".")[0] for n in names}


def _parts(modules: set[str]) -> set[str]:
    """zerotune's modules as their part (``zerotune.api``), the others as they are."""
    return {".".join(n.split(".")[:2]) for n in modules}


def test_the_recommend_path_imports_only_the_standard_library(tmp_path):
    fast = _imported("--dry-run", "--model", "gpt-neox-20b", "--cluster", "frontier:48", expect=0, cache=tmp_path)
    # the CLI's and the prologue's own modules, the error family, the request's fields and the presets' table, all
    # standard library only (``copy``, which ``dataclasses`` imports, tries Jython's ``org.python.core``:
    # importtime lists the failed try)
    outside = _parts(fast) - set(sys.stdlib_module_names) - {"org"}
    assert outside == {"zerotune", "zerotune.api", "zerotune.core", "zerotune.errors"}, sorted(outside)
    core = {name for name in fast if name.startswith("zerotune.core")}
    assert core == {"zerotune.core", "zerotune.core.fields", "zerotune.core.cluster_presets"}, sorted(core)
    # the built-in fallback adds the pure-Python exporters, nothing heavy
    down = f"http://127.0.0.1:{free_port()}"
    slow = _parts(_imported("--model", "gpt-neox-20b", "--cluster", "frontier:48", "--server", down, "--timeout",
                            "0.2", "--format", "deepspeed", "--no-slurm", expect=0, cache=tmp_path))
    assert {"zerotune.core", "zerotune.costmodel", "zerotune.tuner"} <= slow, sorted(slow)
    assert not slow & FORBIDDEN, sorted(slow & FORBIDDEN)
    assert "zerotune.db" not in slow


def test_the_fallback_is_a_valid_deepspeed_zero3_config():
    from zerotune.costmodel.catalog import parse_cluster
    from zerotune.tuner.exports import validate_deepspeed_config

    for cluster in ("frontier:48", "dgx-h100:4", "local:2x2"):
        rec = default_recommendation({"model": "gpt-neox-20b", "cluster": cluster})
        ds = rec["exports"]["deepspeed"]
        validate_deepspeed_config(ds, parse_cluster(cluster).world_size)
        zero = ds["zero_optimization"]  # DeepSpeed's defaults, DESIGN.md §7
        assert (zero["stage"], zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"],
                zero["zero_hpz_partition_size"]) == (3, 500_000_000, 50_000_000, 1)
        assert not zero["zero_quantized_weights"] and not zero["zero_quantized_gradients"]
        assert rec["exports"]["fsdp"]["reshard_after_forward"] is True


def test_merge_keeps_the_users_keys():
    recommended = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                   "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "reduce_bucket_size": 10}}
    merged, warnings = merge_deepspeed({}, recommended)  # no clipping anywhere: 1.0, said
    assert merged == {**recommended, "gradient_clipping": 1.0} and "gradient_clipping 1.0" in warnings[0]
    recommended = {**recommended, "gradient_clipping": 0.5}
    assert merge_deepspeed({}, recommended) == (recommended, [])
    mine = {"fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    merged, warnings = merge_deepspeed(mine, recommended)
    assert merged == {"fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                      "train_batch_size": 64, "gradient_accumulation_steps": 1,
                      "zero_optimization": {"stage": 3, "reduce_bucket_size": 10, "offload_param": {"device": "cpu"}}}
    assert len(warnings) == 2 and "offload_param (device cpu)" in warnings[0] and "keeps fp16" in warnings[1]
    with pytest.raises(UsageError, match=r"--base train_batch_size=1024: conflicts with the recommended "
                                         r"train_batch_size=64"):
        merge_deepspeed({"train_batch_size": 1024}, recommended)
    kept, warnings = merge_deepspeed({"train_batch_size": 1024}, recommended, keep_base_batch=True)
    assert (kept["train_batch_size"], kept["train_micro_batch_size_per_gpu"], kept["gradient_accumulation_steps"]) \
        == (1024, 16, 1) and "1024 sequences per step, not the 64" in warnings[-1]
    with pytest.raises(UsageError, match="DeepSpeed's batch rule"):  # 100 = 3 x 1 x 64 has no solution
        merge_deepspeed({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 3}, recommended,
                        keep_base_batch=True)
    # Hugging Face's usual base: "auto" batch keys take the measured batch (the Trainer checks its arguments
    # against them: the warning names those), "auto" precision is the user's choice, not a mismatch
    hf = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    merged, warnings = merge_deepspeed(hf, recommended)
    assert [merged[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                "gradient_accumulation_steps")] == [64, 1, 1]
    assert merged["gradient_clipping"] == "auto" and merged["bf16"] == {"enabled": "auto"}
    assert len(warnings) == 1 and "per_device_train_batch_size=1 and gradient_accumulation_steps=1" in warnings[0]
    # a base that checkpoints under a stage-3 answer measured without checkpointing (reuse distance 0) is warned about
    ckpt = {"activation_checkpointing": {"number_checkpoints": 4}}
    released = {**recommended, "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0}}
    merged, warnings = merge_deepspeed(ckpt, released)
    assert merged["activation_checkpointing"] == ckpt["activation_checkpointing"]
    assert len(warnings) == 1 and "gathers a checkpointed block three times a step" in warnings[0]
    kept = {**released, "activation_checkpointing": {"number_checkpoints": 4}, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 100}}
    assert merge_deepspeed(ckpt, kept)[1] == []  # an answer measured with checkpointing: nothing to warn of
    # an answer that checkpoints with reuse distance 0 (exported before the export kept the recompute's gathers)
    stale = {**kept, "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0}}
    for base in ({}, ckpt):
        merged, warnings = merge_deepspeed(base, stale)
        assert "activation_checkpointing" in merged and len(warnings) == 1, warnings
        assert "checkpoints with stage3_max_reuse_distance 0" in warnings[0] and "export it again" in warnings[0]
    assert merge_deepspeed({}, {**stale, "zero_optimization": {"stage": 2}})[1] == []  # stage 2 gathers nothing


def test_backoff_is_jittered_bounded_and_stops_at_the_deadline():
    low, high = Retry(rng=lambda: 0.0), Retry(rng=lambda: 0.999999)
    for n in range(12):
        d = min(2.0, 0.1 * 2**n)
        assert low.delay(n) == pytest.approx(d / 2) and d / 2 < high.delay(n) <= d
    down = f"http://127.0.0.1:{free_port()}"
    pauses: list[float] = []

    def sleep(s: float) -> None:
        pauses.append(s)
        time.sleep(s)

    start = time.monotonic()
    client = Client(down, timeout=1, deadline=start + 0.6, retry=Retry(), sleep=sleep)
    with pytest.raises(ServiceError) as err:
        client.request("GET", "/healthz")
    assert err.value.kind == "unreachable" and client.attempts >= 3
    assert time.monotonic() - start < 0.9 and len(pauses) >= 2 and sum(pauses) <= 0.61
    assert 0.05 <= pauses[0] <= 0.1 and (len(pauses) < 3 or 0.1 <= pauses[1] <= 0.2)  # d/2..d, d doubling


def test_every_exit_status_is_documented_in_the_prologue_doc():
    doc = (ROOT / "docs" / "prologue.md").read_text()
    section = doc[doc.index("## Exit statuses"):]
    for status in ExitStatus:
        assert re.search(rf"^\| {int(status)} \| `{status.name}` \|", section, re.MULTILINE), status.name


def test_notes_name_the_precision_the_measurement_ran_in():
    from zerotune.api.prologue import notes_of

    rec = {"metrics": {"dtype": "float32", "device": "cpu (x86_64)"},
           "exports": {"zerotune": {"dtype": "bf16"}, "deepspeed_notes": ["hpZ is off"], "fsdp": {"notes": ["x"]}}}
    notes = notes_of(rec, "deepspeed")
    assert notes[0] == "DeepSpeed: hpZ is off"
    assert "the exports are for bf16 (the target cluster's); the measurement behind this answer ran in float32 on " \
           "cpu (x86_64)" in notes[1]
    assert notes_of(rec, "fsdp")[0] == "FSDP2: x" and len(notes_of(rec, "env")) == 3
    same = {**rec, "metrics": {"dtype": "bfloat16"}}
    assert notes_of(same, "zerotune") == []


def test_notes_say_where_the_models_lean_on_checkpointing_could_overturn_the_pick():
    from zerotune.api.prologue import notes_of

    call = {"rival_trial_id": 7, "gain": 0.05, "lean": -0.099, "verdict": "within",
            "why": "the pick runs without activation checkpointing ... measure both before trusting it"}
    rec = {"metrics": {"dtype": "bfloat16", "decision": {"checkpointing": call}}, "exports": {"zerotune": {}}}
    for fmt in ("zerotune", "deepspeed", "fsdp", "env"):
        assert notes_of(rec, fmt) == [f"model: {call['why']}"]
    held = {**rec, "metrics": {"decision": {"checkpointing": {**call, "verdict": "beyond"}}}}
    assert notes_of(held, "env") == []  # a pick that leads beyond the lean needs no caveat


def test_notes_say_where_the_answers_collectives_were_measured_off_the_model():
    from zerotune.api.prologue import notes_of

    slower = {"library": "RCCL", "gpus": 256, "measured_over_predicted": 2.92,
              "source": "bench/collectives_at_scale.py"}
    rec = {"metrics": {"dtype": "bfloat16", "decision": {"collectives": slower}}, "exports": {"zerotune": {}}}
    for fmt in ("zerotune", "deepspeed", "fsdp", "env"):
        (note,) = notes_of(rec, fmt)
        assert note.startswith("model: RCCL's flat rings over 256 GPUs were measured at 2.92x the model's time")
        assert "optimistic" in note and "--executor slurm" in note
    faster = {**rec, "metrics": {"decision": {"collectives": {**slower, "measured_over_predicted": 0.79}}}}
    assert "pessimistic" in notes_of(faster, "deepspeed")[0]
    assert notes_of({"metrics": {"decision": {"band": 0.07}}}, "deepspeed") == []
