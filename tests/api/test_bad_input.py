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
     "body.budget.trials", "valid integer"),
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
    # bodies the JSON parser cannot read are bad input too: 422 on body, never FastAPI's bare 400
    ("/v1/recommendations", b'{"model": "gpt-tiny\xff", "cluster": "local:2"}', "body", "not valid UTF-8"),
    ("/v1/trials", "[" * 5000 + "]" * 5000, "body", "nested too deeply"),
    ("/v1/recommendations", '{"model": ' * 3000 + "1" + "}" * 3000, "body", "nested too deeply"),
    # no coercion: a string or a boolean is not the integer a field asks for
    ("/v1/recommendations", json.dumps({**GOOD, "budget": {"trials": True}}), "body.budget.trials", "integer"),
    ("/v1/recommendations", json.dumps({**GOOD, "budget": {"trials": "5"}}), "body.budget.trials", "integer"),
    ("/v1/recommendations", json.dumps({**GOOD, "global_batch": "8"}), "body.global_batch", "integer"),
    ("/v1/recommendations", json.dumps({**GOOD, "grad_reduce_in_fp32": "yes"}), "body.grad_reduce_in_fp32", "boolean"),
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


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


@pytest.mark.timeout(120)
def test_the_token_and_the_body_size_are_checked_before_the_body_is_read(sqlite_url, launcher):
    """A write without the token is refused before its body is read (a large body does not grow the server);
    a body over ZEROTUNE_MAX_BODY_MB gets 413 whether it declares its length or streams it; nothing is stored."""
    server = launcher.serve(sqlite_url, workers=0, ZEROTUNE_TOKEN="t0k3n", ZEROTUNE_MAX_BODY_MB="1")
    assert server.proc is not None
    url, auth = server.url, {"Authorization": "Bearer t0k3n"}
    before = _rss_mib(server.proc.pid)
    big = b'{"model": "' + b"x" * (64 * 2**20) + b'"}'
    try:
        r = httpx.post(f"{url}/v1/recommendations", content=big, headers={"content-type": "application/json"},
                       timeout=60)
        assert r.status_code == 401 and "ZEROTUNE_TOKEN" in r.json()["detail"], r.text[:200]
    except httpx.TransportError:
        pass  # the server answered 401 and closed before the client finished sending: as good
    assert _rss_mib(server.proc.pid) - before < 32, "the server read the unauthenticated body"

    two_mib = json.dumps({**RUN, "logs": "y" * 2 * 2**20}).encode()
    r = httpx.post(f"{url}/v1/trials", content=two_mib, headers={**auth, "content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and "ZEROTUNE_MAX_BODY_MB" in r.json()["detail"], r.text[:200]

    def streamed():  # no Content-Length: chunked transfer
        for i in range(0, len(two_mib), 65536):
            yield two_mib[i:i + 65536]

    r = httpx.post(f"{url}/v1/trials", content=streamed(), headers={**auth, "content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413, r.text[:200]
    assert rows(sqlite_url, "SELECT count(*) FROM zt_trials") == [(0,)]
    ok = httpx.post(f"{url}/v1/trials", json=RUN, headers=auth, timeout=30)
    assert ok.status_code == 201, ok.text  # within the limit and with the token: stored


@pytest.mark.timeout(180)
def test_the_fast_path_refuses_what_the_route_refuses(sqlite_url, launcher):
    """A body answered before is served from memory, but only as the route would accept it: a bad ?wait or a
    body that is not declared JSON gets the route's 422, not the cached 200."""
    server = launcher.serve(sqlite_url)
    url = server.url
    r = httpx.post(f"{url}/v1/recommendations", json=GOOD, params={"wait": 120}, timeout=150)
    assert r.status_code == 200, r.text
    raw = json.dumps(GOOD)
    again = httpx.post(f"{url}/v1/recommendations", content=raw, headers={"content-type": "application/json"})
    assert again.status_code == 200 and again.content == r.content  # the fast path
    for params, ctype, field in (({"wait": "abc"}, "application/json", "query.wait"),
                                 ({"wait": "-5"}, "application/json", "query.wait"),
                                 ({"wait": "nan"}, "application/json", "query.wait"),
                                 ({}, "text/plain", "body")):
        refused = httpx.post(f"{url}/v1/recommendations", content=raw, params=params, headers={"content-type": ctype})
        assert refused.status_code == 422, (params, ctype, refused.status_code, refused.text[:200])
        assert any(p["field"].startswith(field) for p in refused.json()["detail"]), refused.json()


def test_remembered_bodies_are_bounded_in_bytes():
    from zerotune.api.cache import MAX_BODIES_BYTES, AnswerCache

    cache = AnswerCache(size=4096)
    for i in range(3000):  # whitespace variants of one body, 4-7 KB each: 16 MB unbounded
        cache.remember_body(b'{"model": "gpt-tiny"' + b" " * (4000 + i) + b"}", "key")
    assert cache.bodies_bytes == sum(map(len, cache.bodies)) <= MAX_BODIES_BYTES
    assert cache.key_for_body(b'{"model": "gpt-tiny"' + b" " * 6999 + b"}") == "key"  # the newest are kept


@pytest.mark.timeout(120)
def test_an_open_local_service_answers_only_loopback_names_and_probes_take_head(sqlite_url, launcher):
    """No token on a loopback address: a request naming another host (a rebound DNS name a web page
    would use) is refused before it reaches a route; loopback names work; HEAD answers the probes."""
    server = launcher.serve(sqlite_url, workers=0)
    url = server.url
    port = url.rsplit(":", 1)[1]
    evil = httpx.post(f"{url}/v1/recommendations", json=GOOD, headers={"host": f"attacker.example:{port}"})
    assert evil.status_code == 400, evil.text
    assert rows(sqlite_url, "SELECT count(*) FROM zt_requests") == [(0,)]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(f"{url}/healthz", headers={"host": host}).status_code == 200
    for path in ("/healthz", "/metrics"):
        head = httpx.head(f"{url}{path}")
        assert head.status_code == 200 and head.content == b"", path
    opened = launcher.serve(sqlite_url, workers=0, ZEROTUNE_ALLOWED_HOSTS='["*"]')
    assert httpx.get(f"{opened.url}/healthz", headers={"host": "zerotune.internal"}).status_code == 200
