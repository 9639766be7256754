"""Writes need the token when one is set (the cache's fast path too); fuzzing finds no 5xx and no schema drift."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi import checks

from tests.api.conftest import TOKEN, Launcher, wait_job

BODY = {"model": "gpt-tiny", "cluster": "local:2", "executor": "model", "budget": {"trials": 2}}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_writes_without_the_token_are_refused(api_server, headers):
    url = api_server.url
    r = httpx.post(f"{url}/v1/recommendations", json=BODY, headers=headers)
    assert r.status_code == 401 and "ZEROTUNE_TOKEN" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.post(f"{url}/v1/trials", json={}, headers=headers).status_code == 401
    assert httpx.delete(f"{url}/v1/jobs/1", headers=headers).status_code == 401


def test_reads_stay_open_and_a_cached_answer_still_needs_the_token(api_server, tmp_path):
    url, auth = api_server.url, api_server.extra
    body = {**BODY, "cluster": "local:2x2"}
    r = httpx.post(f"{url}/v1/recommendations", json=body, headers=auth)
    assert r.status_code == 202
    assert httpx.get(f"{url}/v1/jobs/{r.json()['id']}").status_code == 200
    for path in ("/v1/studies", "/v1/catalog", "/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert httpx.get(url + path).status_code == 200, path
    launcher = Launcher(tmp_path)  # this service runs no worker: lend it one for this job
    try:
        launcher.worker(api_server.args[api_server.args.index("--db") + 1])
        wait_job(url, r.json()["id"], timeout=120)
    finally:
        launcher.close()
    answered = httpx.post(f"{url}/v1/recommendations", json=body, headers=auth)
    assert answered.status_code == 200  # now cached, and this exact body is on the fast path
    refused = httpx.post(f"{url}/v1/recommendations", json=body)
    assert refused.status_code == 401
    again = httpx.post(f"{url}/v1/recommendations", json=body, headers=auth)
    assert again.status_code == 200 and again.content == answered.content


CHECKS = [not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_headers_conformance, checks.response_schema_conformance]


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """A service with no token (writes open, Host held to loopback names) and no worker."""
    tmp = tmp_path_factory.mktemp("api-open")
    launcher = Launcher(tmp)
    try:
        server = launcher.serve(f"sqlite:///{tmp / 'zerotune.sqlite'}", workers=0, ZEROTUNE_WAIT_MAX_S="1")
        server.extra = {}
        yield server
    finally:
        launcher.close()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("which", ["token", "open"])
def test_fuzz_every_endpoint(which, request):
    """Property-based requests for every operation of the live OpenAPI schema, on a service with a token
    (sent) and on one without: no 5xx, answers as documented."""
    api_server = request.getfixturevalue("api_server" if which == "token" else "open_server")
    schema = schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  phases=[Phase.explicit, Phase.generate])  # a failure is reported as found, not shrunk
        def fuzz(case):
            case.call_and_validate(base_url=api_server.url, headers=api_server.extra, checks=CHECKS, timeout=20)

        fuzz()
