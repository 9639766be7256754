"""Hostile input against the live service on SQLite and PostgreSQL: every case a 422 naming the field
and the rule (never a 5xx, never an echo that cannot be serialized), the server healthy after, and
no stored row changed by a refused request."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.api.conftest import Proc, free_port, rows

GOOD = {"model": "gpt-tiny", "cluster": "local:2x2", "executor": "model", "budget": {"trials": 2}}
RUN = {"status": "ok", "model": "gpt-tiny", "cluster": "local:2x2", "strategy": "zero3", "tflops_per_rank": 0.01}


def nested(depth: int) -> dict:
    out: dict = {}
    cur = out
    for _ in range(depth):
        cur["a"] = {}
        cur = cur["a"]
    return out


# (path, raw JSON body, the field the 422 names, a phrase of its rule)
CASES = [
    ("/v1/recommendations", json.dumps({**GOOD, "budget": {"trials": 2}}).replace(': 2}', ': NaN}'),
     "body.budget.trials", "finite"),
    ("/v1/recommendations", json.dumps({**GOOD, "budget": {"trials": 2, "time_s": 9}}).replace(': 9}', ': Infinity}'),
     "body.budget.time_s", "finite"),
    ("/v1/recommendations", json.dumps({**GOOD, "budget": {"trials": 2, "time_s": 9}}).replace(': 9}', ': 1e999}'),
     "body.budget.time_s", "finite"),
    ("/v1/recommendations", json.dumps({**GOOD, "cluster": {"name": "x", "levels": [
        {"name": "a", "size": 2, "bandwidth_gbps": 7}]}}).replace(': 7}', ': NaN}'),
     "body.cluster.levels[0].bandwidth_gbps", "finite"),
    # a cluster or model name never touches the server's files: it is a preset or nothing
    ("/v1/recommendations", json.dumps({**GOOD, "cluster": "Makefile"}), "body.cluster", "unknown cluster preset"),
    ("/v1/recommendations", json.dumps({**GOOD, "cluster": "pyproject"}), "body.cluster", "unknown cluster preset"),
    ("/v1/recommendations", json.dumps({**GOOD, "model": "README.md"}), "body.model", "unknown model preset"),
    ("/v1/recommendations", json.dumps({**GOOD, "cluster": "a" * 300}), "body.cluster", "unknown cluster preset"),
    ("/v1/recommendations", json.dumps({**GOOD, "cluster": "local:" + "x".join(["1"] * 2000)}), "body.cluster",
     "at most 8 levels"),
    ("/v1/recommendations", json.dumps({**GOOD, "cluster": "local:2x2x2x2x2x2x2x2x2"}), "body.cluster",
     "at most 8 levels"),
    ("/v1/trials", json.dumps(RUN).replace("0.01", "NaN"), "body.tflops_per_rank", "finite"),
    ("/v1/trials", json.dumps({**RUN, "step_times_s": [0.5]}).replace("0.5", "Infinity"), "body",
     "step_times_s[0]: inf is not a finite number"),
    ("/v1/trials", json.dumps({**RUN, "extra": nested(300)}), "body", "extra: nested deeper than 32 levels"),
    ("/v1/trials", json.dumps({**RUN, "extra": nested(500)}), "body", "extra: nested deeper than 32 levels"),
    ("/v1/trials", json.dumps({**RUN, "strategy": "Makefile"}), "body.strategy", "unknown strategy preset"),
]


@pytest.mark.timeout(180)
def test_hostile_bodies_get_a_422_naming_the_field_and_change_nothing(db_url, launcher):
    server = launcher.serve(db_url, workers=0)
    url = server.url
    stored = httpx.post(f"{url}/v1/trials", json=RUN, timeout=30)  # something stored that must stay as it is
    assert stored.status_code == 201, stored.text
    tables = ("zt_requests", "zt_studies", "zt_trials", "zt_jobs", "zt_recommendations")
    before = {t: rows(db_url, f"SELECT * FROM {t} ORDER BY id") for t in tables}
    for path, raw, field, rule in CASES:
        r = httpx.post(f"{url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 422, (path, raw[:120], r.status_code, r.text[:300])
        problems = r.json()["detail"]
        assert any(p["field"] == field and rule in p["rule"] for p in problems), (raw[:120], problems)
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    assert {t: rows(db_url, f"SELECT * FROM {t} ORDER BY id") for t in tables} == before
    again = httpx.get(f"{url}/v1/trials/{stored.json()['id']}", timeout=10)
    assert again.status_code == 200 and again.json()["metrics"]["tflops_per_rank"] == 0.01


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


@pytest.mark.timeout(120)
def test_the_database_password_never_reaches_a_command_line(pg_url, launcher):
    """ZEROTUNE_DB with a password, in the environment only: neither the service nor its embedded worker
    shows it in argv (what ``ps`` prints to every user of the host)."""
    secret = "s3cret-pw-7f1c"
    url = make_url(pg_url).set(password=secret).render_as_string(hide_password=False)  # trust auth ignores it
    port = free_port()
    server = Proc(["serve", "--port", str(port), "--workers", "1"], launcher.tmp_path / "serve-env.log",
                  {**launcher.base_env, "ZEROTUNE_DB": url})
    server.url = f"http://127.0.0.1:{port}"
    launcher.procs.append(server.start())
    server.wait_ready()
    assert server.proc is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _descendants(server.proc.pid):
        time.sleep(0.2)
    pids = [server.proc.pid, *_descendants(server.proc.pid)]
    assert len(pids) >= 2, "the embedded worker did not start"
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert secret not in argv, argv
