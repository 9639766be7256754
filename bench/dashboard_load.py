"""Load time of the dashboard's study page for a study with 500 trials, in headless Chromium.

Seeds a real study (the ``model`` executor, Optuna's random sampler, 500 trials of gpt-neox-20b on
frontier:48: every trial a real cost-model prediction, with its Optuna study for the parameter
importance) into a fresh SQLite file, starts ``zerotune serve`` on it without workers, and opens
``/dashboard/studies/{id}`` in Chromium (Debian's ``/usr/bin/chromium`` driven by Playwright). The
page counts as rendered when every chart has been drawn (importance included, which the page fetches
after loading) and the trials table shows its first page (100 rows; sorting and filtering see all
500); the time is the page's own clock from the start of navigation. Cold: the first load (empty
browser cache, importance computed). Warm: the median of the following loads in the same browser.
First contentful paint (the browser's own figure) is printed too, and the machine's load average:
other work on a 2-core machine moves these figures a lot.

    python bench/dashboard_load.py                   # --trials 500 --loads 7
    python bench/dashboard_load.py --db sqlite:////tmp/zt.sqlite --keep   # reuse a seeded file

Goal on a 2-core machine: under 1 s to a rendered page.
"""

from __future__ import annotations

import argparse
import json
import os
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
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
RENDERED = ("() => { const charts = [...document.querySelectorAll('.chart')];"
            " return charts.length > 0 && charts.every(c => c.dataset.rendered)"
            " && document.querySelectorAll('#trials tbody tr').length === Math.min(N, 100); }")
FCP = "(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || NaN"


def seed(url: str, trials: int) -> int:
    """Run a real model-executor study of ``trials`` trials into ``url``; return its study id."""
    from zerotune.costmodel.catalog import parse_cluster, parse_model
    from zerotune.db.migrate import upgrade
    from zerotune.db.session import make_engine, make_session_factory, session_scope
    from zerotune.tuner.executors.predicted import ModelExecutor
    from zerotune.tuner.request import TuneRequest
    from zerotune.tuner.study import Tuner
    from zerotune.tuner.study_options import TunerOptions

    upgrade(url)
    request = TuneRequest(model=parse_model("gpt-neox-20b"), cluster=parse_cluster("frontier:48"), executor="model",
                          trials=trials, sampler="random", seed=0)
    engine = make_engine(url)
    with tempfile.TemporaryDirectory() as work:
        tuner = Tuner(request, sessions=make_session_factory(engine), executor=ModelExecutor(), workdir=Path(work),
                      options=TunerOptions(verify_quantized=False))
        rec = tuner.run()
    engine.dispose()
    from zerotune.db.models import Trial

    with session_scope(make_session_factory(make_engine(url))) as s:
        n = s.query(Trial).filter(Trial.study_id == rec["study_id"]).count()
    print(f"seeded study {rec['study_id']}: {n} trials ({trials} finished) in {url}", file=sys.stderr)
    return int(rec["study_id"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "zerotune.api.cli", "serve", "--port", str(port), "--db", url,
                                 "--workers", "0"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"zerotune serve did not become ready:\n{log.read_text()[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--loads", type=int, default=7, help="page loads (the first is the cold one)")
    parser.add_argument("--db", help="an already seeded database (its newest study is opened)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary database")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="zerotune-dashboard-bench-"))
    url = args.db or f"sqlite:///{tmp / 'zerotune.sqlite'}"
    started = time.perf_counter()
    study_id = seed(url, args.trials) if not args.db else None
    seeded_s = time.perf_counter() - started
    port = free_port()
    proc = serve(url, port, tmp / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        if study_id is None:
            with urllib.request.urlopen(f"{base}/v1/studies?limit=1") as r:
                study_id = json.load(r)["data"][0]["id"]
        with urllib.request.urlopen(f"{base}/v1/studies/{study_id}") as r:
            count = sum(json.load(r)["trial_counts"].values())
        times, paints = [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            errors: list[str] = []
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            for _ in range(args.loads):
                page.goto(f"{base}/dashboard/studies/{study_id}", wait_until="commit")
                page.wait_for_function(RENDERED.replace("N", str(count)), polling="raf", timeout=60000)
                times.append(page.evaluate("performance.now()") / 1000)
                paints.append(page.evaluate(FCP) / 1000)
            browser.close()
        if errors:
            print(f"errors in the page: {errors}", file=sys.stderr)
        warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
        paint = statistics.median(paints[1:]) if len(paints) > 1 else paints[0]
        every = ", ".join(f"{t:.3f}" for t in times)
        print(f"study page with {count} trials in headless Chromium, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}: every chart drawn and the table's first page (100 rows): "
              f"cold {times[0]:.3f} s, warm median {warm:.3f} s over {len(times) - 1} loads (all: {every}); "
              f"first contentful paint: cold {paints[0]:.3f} s, warm median {paint:.3f} s; goal < 1 s"
              + (f"; seeding took {seeded_s:.0f} s" if args.db is None else ""))
        return 0 if warm < 1.0 and not errors else 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        if not args.keep and not args.db:
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
        elif args.keep:
            print(f"kept {url}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
