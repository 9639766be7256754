"""The fast tier: the API's logic in-process (FastAPI's TestClient, an in-memory SQLite, no worker), where a
test takes milliseconds. The real-server tier (uvicorn in a subprocess, PostgreSQL, torchrun, Chromium)
is in the other files of this folder; both run under ``make test``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import StaticPool

from zerotune.api.app import create_app
from zerotune.api.deps import get_db
from zerotune.api.settings import Settings
from zerotune.db import repository as repo
from zerotune.db.session import make_session_factory, session_scope

NEOX = {"model": "gpt-neox-20b", "cluster": "frontier:48"}


@pytest.fixture
def app_and_engine() -> Iterator[tuple]:
    # one connection shared by every thread: the in-memory database lives as long as the engine
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    app = create_app(Settings(workers=0, db="sqlite://"), engine=engine)
    yield app, engine
    engine.dispose()


@pytest.fixture
def client(app_and_engine: tuple) -> Iterator[TestClient]:
    with TestClient(app_and_engine[0], base_url="http://127.0.0.1") as c:  # the lifespan migrates the database
        yield c


def test_a_new_request_queues_one_job_and_equal_requests_share_it(client: TestClient, app_and_engine: tuple) -> None:
    first = client.post("/v1/recommendations", json=NEOX)
    assert first.status_code == 202, first.text
    job = first.json()
    assert job["state"] == "queued" and job["trials_total"] == 40 and job["recommendation_id"] is None
    again = client.post("/v1/recommendations", json={**NEOX, "executor": "model", "budget": {"trials": 40}})
    assert again.status_code == 202 and again.json()["id"] == job["id"]  # normalized equal: one search
    other = client.post("/v1/recommendations", json={**NEOX, "budget": {"trials": 7}})
    assert other.json()["id"] != job["id"]
    assert client.get(f"/v1/jobs/{job['id']}").json()["request_key"] == job["request_key"]
    with session_scope(make_session_factory(app_and_engine[1])) as s:  # what the route stored, through db/
        assert repo.job_counts(session=s) == {"queued": 2}


def test_a_cancelled_job_is_cancelled_once(client: TestClient) -> None:
    job = client.post("/v1/recommendations", json=NEOX).json()
    gone = client.delete(f"/v1/jobs/{job['id']}")
    assert gone.status_code == 200 and gone.json()["state"] == "cancelled"
    again = client.delete(f"/v1/jobs/{job['id']}")
    assert again.status_code == 409 and "already ended (cancelled)" in again.json()["detail"]


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({**NEOX, "model": "gpt-99b"}, "body.model", "unknown model preset"),
    ({**NEOX, "cluster": "/etc/hosts.json"}, "body.cluster", "unknown cluster preset"),  # never read as a file
    ({**NEOX, "cluster": "frontier:0"}, "body.cluster", "whole number"),
    ({**NEOX, "budget": {"trials": 0}}, "body.budget.trials", "greater than or equal to 1"),
    ({**NEOX, "budget": {"trials": "5"}}, "body.budget.trials", "valid integer"),
    ({**NEOX, "global_batch": 3}, "body.global_batch", "multiple"),
    ({**NEOX, "emulate": True}, "body.emulate", "only the local executor's runs can be emulated"),
    ({**NEOX, "emulate": "yes"}, "body.emulate", "valid boolean"),
])
def test_bad_input_is_a_422_naming_field_value_and_rule(client: TestClient, body: dict, field: str,
                                                        rule: str) -> None:
    r = client.post("/v1/recommendations", json=body)
    assert r.status_code == 422, r.text
    problem = r.json()["detail"][0]
    assert problem["field"] == field and rule in problem["rule"], problem
    assert client.get("/metrics").status_code == 200  # and the service is still there


@pytest.mark.parametrize("path", ["/v1/jobs/99", "/v1/studies/99", "/v1/trials/99", "/v1/recommendations/99",
                                  "/v1/calibrations/nope"])
def test_missing_rows_are_404s_from_the_one_error_mapping(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and ("99" in r.json()["detail"] or "nope" in r.json()["detail"]), r.text


def test_a_database_outage_is_a_503_with_retry_after(app_and_engine: tuple) -> None:
    app, _ = app_and_engine

    def down() -> Iterator[None]:
        raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))
        yield  # a generator dependency, as get_db is

    app.dependency_overrides[get_db] = down
    try:
        with TestClient(app, base_url="http://127.0.0.1") as c:
            r = c.get("/v1/studies/1")
    finally:
        app.dependency_overrides.clear()
    assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
    assert "database unavailable" in r.json()["detail"]


def test_the_catalog_and_health_answer_without_a_worker(client: TestClient) -> None:
    catalog = client.get("/v1/catalog").json()
    assert "frontier" in catalog["clusters"] and "zeropp" in catalog["strategies"]
    assert client.get("/healthz").json()["status"] == "ok"
