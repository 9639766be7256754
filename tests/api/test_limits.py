"""What a client may hold, against a real ``zerotune serve``: slow heads and slow bodies are cut off while the health
endpoints keep answering (within 1 s), bodies in memory are bounded, the database password reaches no argv, and
the small HTTP rules (the bearer scheme's case, Allow, the upload schema, ``?wait``'s bound)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from sqlalchemy.engine import make_url

from tests.api.conftest import TOKEN, rows

UPLOAD = {"status": "ok", "model": "gpt-tiny", "cluster": "local:2x2", "strategy": "zero3", "tflops_per_rank": 0.01}


class SlowClients:
    """``count`` connections that send their request a byte at a time (:meth:`drip`)."""

    def __init__(self, port: int, count: int, request: bytes) -> None:
        self.request, self.pos = request, 0
        self.socks: list[socket.socket] = []
        self.answers: dict[int, bytes] = {}
        self.closed: set[int] = set()
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.setblocking(False)
            self.socks.append(s)

    def drip(self, size: int = 1) -> None:
        chunk = self.request[self.pos:self.pos + size]
        self.pos += size
        for i, s in enumerate(self.socks):
            self._read(i, s)
            if i not in self.closed and chunk:
                try:
                    s.send(chunk)
                except OSError:
                    self.closed.add(i)

    def _read(self, i: int, s: socket.socket) -> None:
        while i not in self.closed:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                self.closed.add(i)
                return
            if not data:
                self.closed.add(i)
                return
            self.answers[i] = self.answers.get(i, b"") + data

    def still_open(self) -> int:
        for i, s in enumerate(self.socks):
            self._read(i, s)
        return len(self.socks) - len(self.closed)

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in range(len(self.socks)):
            answer = self.answers.get(i, b"")
            status = answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/1.1 ") else "none"
            out[status] = out.get(status, 0) + 1
        return out

    def close(self) -> None:
        for s in self.socks:
            s.close()


def health_within_1s(url: str) -> None:
    """``/healthz`` and ``/readyz`` answer 200 within 1 s each, on new connections."""
    for path in ("/healthz", "/readyz"):
        start = time.monotonic()
        r = httpx.get(url + path, timeout=1.0)
        assert r.status_code == 200 and time.monotonic() - start < 1.0, (path, r.status_code)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def slow_head(port: int) -> bytes:
    return f"GET /v1/studies HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Pad: {'a' * 2000}\r\n\r\n".encode()


@pytest.mark.timeout(180)
def test_slow_request_heads_are_closed_and_health_answers_throughout(sqlite_url, launcher):
    server = launcher.serve(sqlite_url, workers=0, ZEROTUNE_HEADER_TIMEOUT_S="2")
    port = port_of(server.url)
    slow = SlowClients(port, 150, slow_head(port))
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            slow.drip()
            health_within_1s(server.url)
            time.sleep(0.25)
        assert slow.still_open() == 0, f"{slow.still_open()} of 150 slow heads still open after 5 s"
    finally:
        slow.close()
    server.wait_log("with no complete request head after 2 s (ZEROTUNE_HEADER_TIMEOUT_S)", timeout=15)
    # a client that keeps up is not cut off: a kept-alive connection asks again after more than the head timeout
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(1.0)
        assert client.get("/v1/studies").status_code == 200


@pytest.mark.timeout(180)
def test_past_the_open_file_limit_health_still_answers(sqlite_url, launcher):
    """``ulimit -n 256`` and 300 slow clients, whose heads would take minutes: the ceiling (256 - 128) closes
    the oldest of them, so ``accept()`` never fails and the probes get through."""
    server = launcher.serve(sqlite_url, workers=0, nofile=256)
    port = port_of(server.url)
    slow = SlowClients(port, 300, slow_head(port))
    try:
        for _ in range(12):
            slow.drip()
            health_within_1s(server.url)
            time.sleep(0.25)
        assert slow.still_open() <= 128
    finally:
        slow.close()
    server.wait_log("to stay under 128 open connections (ZEROTUNE_MAX_CONNECTIONS)", timeout=15)


@pytest.mark.timeout(180)
def test_slow_bodies_get_408_or_503_and_health_answers_throughout(sqlite_url, launcher):
    """100 uploads that send their head and then their body a byte at a time: room for two bodies at once
    (1 MiB of 400 kB bodies); those two get 408 after 2 s, the rest 503 with Retry-After after waiting 1 s."""
    server = launcher.serve(sqlite_url, workers=0, ZEROTUNE_BODY_MEMORY_MB="1", ZEROTUNE_BODY_WAIT_S="1",
                            ZEROTUNE_BODY_TIMEOUT_S="2")
    port = port_of(server.url)
    head = (f"POST /v1/trials HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 400000\r\n\r\n").encode()
    slow = SlowClients(port, 100, head + b'{"status": "ok", "logs": "' + b"x" * 399_000)
    try:
        slow.drip(len(head))
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            slow.drip()
            health_within_1s(server.url)
            time.sleep(0.25)
        statuses = slow.statuses()
        assert slow.still_open() == 0, statuses
    finally:
        slow.close()
    assert statuses.get("408") == 2 and statuses.get("503") == 98, statuses
    assert any(b"retry-after: 1" in a.lower() for a in slow.answers.values())
    server.wait_log("(ZEROTUNE_BODY_TIMEOUT_S); answered 408")


def test_bodies_in_memory_at_once_are_bounded():
    """``BodyGuard`` lets bodies in while they fit ``body_memory_bytes`` together: eight 1 MiB bodies under 2 MiB
    are read two at a time (all answered, in turn), or refused with 503 and Retry-After when the wait is short; a
    storm of 500 small bodies is read all at once."""
    from zerotune.api.guard import BodyGuard

    async def storm(count: int, size: int, wait_s: float) -> tuple[int, list[int], list[dict[bytes, bytes]]]:
        reading, most = 0, 0

        async def app(scope: Any, receive: Any, send: Any) -> None:
            nonlocal reading, most
            reading += 1
            most = max(most, reading)
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            await asyncio.sleep(0.05)  # parsing
            reading -= 1
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": str(len(body)).encode()})

        guard = BodyGuard(app, token=None, max_body_bytes=2**20, body_memory_bytes=2 * 2**20, body_wait_s=wait_s)

        async def one() -> tuple[int, dict[bytes, bytes]]:
            sent: list[MutableMapping[str, Any]] = []

            async def receive() -> MutableMapping[str, Any]:
                await asyncio.sleep(0.01)
                return {"type": "http.request", "body": b"x" * size, "more_body": False}

            async def send(message: MutableMapping[str, Any]) -> None:
                sent.append(message)

            scope = {"type": "http", "method": "POST", "path": "/v1/trials",
                     "headers": [(b"content-length", str(size).encode())]}
            await guard(scope, receive, send)
            return sent[0]["status"], dict(sent[0]["headers"])

        answers = await asyncio.gather(*(one() for _ in range(count)))
        return most, [a[0] for a in answers], [a[1] for a in answers]

    most, statuses, _ = asyncio.run(storm(8, 2**20, wait_s=10))
    assert most == 2 and statuses == [200] * 8
    most, statuses, headers = asyncio.run(storm(8, 2**20, wait_s=0.02))
    assert most == 2 and statuses.count(200) == 2 and statuses.count(503) == 6
    assert all(h[b"retry-after"] == b"1" for s, h in zip(statuses, headers, strict=True) if s == 503)
    most, statuses, _ = asyncio.run(storm(500, 300, wait_s=0.02))
    assert most == 500 and statuses == [200] * 500


# -- the database password -------------------------------------------------------------------------------------------

def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


@pytest.mark.timeout(180)
def test_the_database_password_reaches_no_argv(pg_url, launcher, tmp_path):
    """The URL in a file (ZEROTUNE_DB_FILE), no --db: the service opens that database, and neither its argv nor
    its embedded worker's holds the password; the worker has it in its environment."""
    password = "pw-67-never-in-argv"
    url = make_url(pg_url).set(password=password).render_as_string(hide_password=False)
    secret = tmp_path / "db-url"
    secret.write_text(url + "\n")
    server = launcher.serve(None, workers=1, ZEROTUNE_DB_FILE=str(secret))
    assert rows(pg_url, "SELECT count(*) FROM zt_alembic_version") == [(1,)]  # the service's schema is there
    assert server.proc is not None
    deadline = time.monotonic() + 30
    workers: list[int] = []
    while not workers and time.monotonic() < deadline:
        workers = [p for p in children(server.proc.pid) if b"worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
        time.sleep(0.2)
    assert workers, "no embedded worker started"
    for pid in [server.proc.pid, *workers]:
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert f"ZEROTUNE_DB={url}".encode() in Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")


def test_db_flag_with_a_password_warns_in_one_line(pg_url, capsys):
    from zerotune.api.cli import main

    with_password = make_url(pg_url).set(password="pw-67").render_as_string(hide_password=False)
    assert main(["db", "upgrade", "--db", with_password], env={}) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if "warning" in line]
    assert len(warnings) == 1 and "ZEROTUNE_DB" in warnings[0] and "pw-67" not in warnings[0]
    assert main(["db", "upgrade", "--db", make_url(pg_url).set(password=None).render_as_string()], env={}) == 0
    assert "warning" not in capsys.readouterr().err


def test_an_unreadable_db_file_is_one_line(tmp_path, capsys, monkeypatch):
    from zerotune.api.cli import main

    monkeypatch.delenv("ZEROTUNE_DB", raising=False)
    monkeypatch.setenv("ZEROTUNE_DB_FILE", str(tmp_path / "missing"))
    assert main(["db", "upgrade"], env=dict(os.environ)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0] and "cannot be read" in err[0]


# -- the smaller rules -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_the_bearer_scheme_is_case_insensitive(api_server, scheme):
    headers = {"Authorization": f"{scheme} {TOKEN}"}
    r = httpx.post(f"{api_server.url}/v1/recommendations", json={"model": "nope", "cluster": "local:2"},
                   headers=headers)
    assert r.status_code == 422, r.text  # past the token: the unknown model is the answer
    assert httpx.delete(f"{api_server.url}/v1/jobs/999999", headers=headers).status_code == 404
    wrong = httpx.post(f"{api_server.url}/v1/recommendations", json={}, headers={"Authorization": "bearer wrong"})
    assert wrong.status_code == 401


@pytest.mark.parametrize("path, methods", [("/healthz", {"GET", "HEAD"}), ("/metrics", {"GET", "HEAD"}),
                                            ("/v1/jobs/1", {"GET", "DELETE"}), ("/v1/recommendations", {"POST"})])
def test_a_405_allows_every_method_of_the_path(api_server, path, methods):
    r = httpx.options(api_server.url + path)
    assert r.status_code == 405
    assert {m.strip() for m in r.headers["allow"].split(",")} == methods


def upload_schema(url: str) -> jsonschema.Draft202012Validator:
    spec = httpx.get(url + "/openapi.json").json()
    return jsonschema.Draft202012Validator({"$ref": "#/components/schemas/TrialCreate",
                                            "components": spec["components"]})


@pytest.mark.parametrize("change, field, rule", [
    ({"model": ""}, "body.model", "at least 1 character"),
    ({"cluster": ""}, "body.cluster", "at least 1 character"),
    ({"strategy": ""}, "body.strategy", "at least 1 character"),
    ({"tflops_per_rank": None}, "body.tflops_per_rank", "required when status is 'ok'"),
    ({"status": "ok", "tflops_per_rank": None}, "body.tflops_per_rank", "required when status is 'ok'"),
])
def test_the_upload_schema_refuses_what_the_service_refuses(api_server, change, field, rule):
    body = {**UPLOAD, **change}
    assert not upload_schema(api_server.url).is_valid(body)  # the published schema says so
    r = httpx.post(f"{api_server.url}/v1/trials", json=body, headers=api_server.extra)
    assert r.status_code == 422
    assert any(p["field"] == field and p["value"] == change[field.split(".")[1]] and rule in p["rule"]
               for p in r.json()["detail"]), r.json()


def test_the_upload_schema_takes_what_the_service_takes(api_server):
    schema = upload_schema(api_server.url)
    assert schema.is_valid(UPLOAD)
    assert schema.is_valid({**UPLOAD, "status": "failed", "tflops_per_rank": None, "error": "oom"})
    failed = {k: v for k, v in UPLOAD.items() if k != "tflops_per_rank"} | {"status": "failed", "error": "oom"}
    assert httpx.post(f"{api_server.url}/v1/trials", json=failed, headers=api_server.extra).status_code in (200, 201)


def test_wait_is_documented_as_the_setting_bounds_it(api_server):
    from zerotune.api.settings import MAX_WAIT_S, Settings

    spec = httpx.get(api_server.url + "/openapi.json").json()
    wait = next(p for p in spec["paths"]["/v1/recommendations"]["post"]["parameters"] if p["name"] == "wait")
    assert wait["schema"]["maximum"] == MAX_WAIT_S == Settings.model_fields["wait_max_s"].metadata[1].le
    default = Settings.model_fields["wait_max_s"].default
    assert "ZEROTUNE_WAIT_MAX_S" in wait["description"] and f"{default:g} s" in wait["description"]
    # this service's ZEROTUNE_WAIT_MAX_S is 1: a ?wait of 5 is held 1 s
    start = time.monotonic()
    r = httpx.post(f"{api_server.url}/v1/recommendations", params={"wait": 5}, headers=api_server.extra,
                   json={"model": "gpt-tiny", "cluster": "local:2", "executor": "model", "budget": {"trials": 3}},
                   timeout=10)
    assert r.status_code == 202 and time.monotonic() - start < 4.0


def test_trial_command_lines_hold_no_database_url(monkeypatch, tmp_path):
    """What a worker starts for a trial: the ``local`` executor's torchrun argv and the ``slurm`` executor's batch
    script and ``sbatch`` argv. The URL (in the worker's environment) is in none of them: trials never open the
    database. A guard against passing it on, not a fix (none of them ever held it)."""
    from tests.tuner.test_slurm import FakeSlurm, make_spec
    from zerotune.trainer.launch import torchrun_command
    from zerotune.tuner.executors.slurm import SlurmExecutor
    from zerotune.tuner.executors.slurm_commands import SlurmCommands

    monkeypatch.setenv("ZEROTUNE_DB", "postgresql://zerotune:pw-67-trial@db/zerotune")
    spec = make_spec(tmp_path / "trial")
    torchrun = torchrun_command(spec.cluster.world_size, ["zerotune.trainer.train", *spec.train_args(tmp_path)])
    fake = FakeSlurm(sbatch=[(1, "", "sbatch: error: no controller")])
    SlurmExecutor(commands=SlurmCommands(runner=fake), mode="jobs").run(spec, stop=threading.Event())
    script = (tmp_path / "trial" / "job.sbatch").read_text()
    assert fake.calls and all("pw-67-trial" not in " ".join(argv) for argv in [torchrun, *fake.calls])
    assert "pw-67-trial" not in script and "ZEROTUNE_DB" not in script
