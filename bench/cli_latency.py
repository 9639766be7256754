"""Wall time of ``zerotune recommend`` as a Slurm prologue runs it: a new process each time.

1. Stored answer: a local ``zerotune serve`` (SQLite in a temporary directory) holding the
   recommendation of the request; ``zerotune recommend --format env`` writes the configs and prints
   the export lines. Goal: median of 30 <= 0.25 s.
2. Service down (a port nobody listens on), ``--timeout 1``, empty cache: the built-in fallback is
   written. Goal: median of 30 <= 1.2 s, and the fallback file exists after every run.

    python bench/cli_latency.py [--runs 30] [--url http://127.0.0.1:8000]   # --url: an already running service

Bytecode is cached (in a temporary PYTHONPYCACHEPREFIX) as it is for an installed package. Also printed:
the import time of ``api.cli`` + ``api.prologue`` in a fresh interpreter (``-X importtime``)
and a bare ``python -c pass`` for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "gpt-125m", "cluster": "frontier:2", "executor": "model", "budget": {"trials": 8}}
ARGS = ["--model", "gpt-125m", "--cluster", "frontier:2", "--trials", "8"]


def zerotune() -> list[str]:
    script = Path(sys.executable).parent / "zerotune"
    if script.exists():
        return [str(script)]
    found = shutil.which("zerotune")
    return [found] if found else [sys.executable, "-m", "zerotune.api.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PYCACHE = Path(tempfile.gettempdir()) / "zerotune-bench-pycache"


def clean_env(**extra: str) -> dict[str, str]:
    """No SLURM_*/ZEROTUNE_* from this shell; bytecode cached (under PYCACHE, the checkout stays clean) as in
    an installed package, even where PYTHONDONTWRITEBYTECODE is set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ZEROTUNE_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env.update(extra)
    return env


def start_service(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp / "serve.log", "wb")
    proc = subprocess.Popen([*zerotune(), "serve", "--port", str(port), "--db", f"sqlite:///{tmp / 'zt.sqlite'}",
                             "--workers", "1"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=clean_env(ZEROTUNE_DATA_DIR=str(tmp / "data")), start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"zerotune serve exited {proc.returncode}: {(tmp / 'serve.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    sys.exit("zerotune serve not ready in 120 s")


def store(url: str) -> None:
    req = urllib.request.Request(url + "/v1/recommendations?wait=120", data=json.dumps(BODY).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=150) as r:
        assert r.status == 200, r.status


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return time.perf_counter() - start, proc


def summary(name: str, times: list[float], goal: float) -> str:
    med = statistics.median(times)
    q = statistics.quantiles(times, n=10)
    verdict = "ok" if med <= goal else "MISSED"
    return (f"{name:<34} median {med:6.3f} s  p10 {q[0]:6.3f}  p90 {q[-1]:6.3f}  max {max(times):6.3f}  "
            f"goal <= {goal:g} s: {verdict}")


def import_time_ms(code: str) -> float:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=str(ROOT)))
    total = 0
    for m in re.finditer(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", proc.stderr, re.MULTILINE):
        if m[4] == "zerotune" and len(m[3]) <= 1:  # the package's cumulative time: every part it imported
            total += int(m[2])
    return total / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--url", help="an already running service (default: start one here)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zerotune-bench-"))
    proc = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            proc, url = start_service(tmp)
        store(url)
        cmd = [*zerotune(), "recommend", *ARGS]
        env = clean_env(ZEROTUNE_CACHE_DIR=str(tmp / "cache"))
        for _ in range(3):  # warm the page and bytecode caches and the service's answer cache
            timed([*cmd, "--server", url, "-o", str(tmp / "warm")], env, tmp)
            timed([*cmd, "--server", "http://127.0.0.1:9", "--timeout", "0.2", "--format", "deepspeed"], env, tmp)
        stored: list[float] = []
        for i in range(args.runs):
            t, p = timed([*cmd, "--server", url, "-o", str(tmp / f"out{i}")], env, tmp)
            if p.returncode != 0 or "ZEROTUNE_SOURCE=service" not in p.stdout:
                sys.exit(f"run {i} failed ({p.returncode}): {p.stderr}")
            stored.append(t)
        down = f"http://127.0.0.1:{free_port()}"
        fallback: list[float] = []
        for i in range(args.runs):
            out = tmp / f"down{i}"
            run_env = clean_env(ZEROTUNE_CACHE_DIR=str(tmp / f"empty{i}"))
            t, p = timed([*cmd, "--server", down, "--timeout", "1", "--format", "deepspeed", "-o",
                          str(out / "ds_config.json")], run_env, tmp)
            if p.returncode != 0 or not (out / "ds_config.json").is_file() or "built-in default" not in p.stderr:
                sys.exit(f"fallback run {i} failed ({p.returncode}): {p.stderr}")
            fallback.append(t)
        bare = [timed([sys.executable, "-c", "pass"], env, tmp)[0] for _ in range(10)]
        print(f"zerotune recommend, {args.runs} new processes each ({os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}, bytecode cached in {PYCACHE})")
        print(summary("stored answer (local service)", stored, 0.25))
        print(summary("service down, --timeout 1", fallback, 1.2) + " (fallback written every run)")
        print(f"{'for scale: python -c pass':<34} median {statistics.median(bare):6.3f} s; import of api.cli + "
              f"api.prologue {import_time_ms('import zerotune.api.cli, zerotune.api.prologue'):.1f} ms")
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
