"""The Dockerfile and compose.yaml, checked without a Docker engine: real linters, and every command
they run must exist in the package (parsed by the real ``zerotune`` parser)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.api.conftest import ROOT
from zerotune.api.cli import build_parser
from zerotune.api.settings import Settings

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]' brings it")
    return path


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines()
                                         if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", text, re.M)]


def parses(argv: list[str]) -> None:
    """``argv`` is a valid ``zerotune`` command line (argparse exits on anything unknown)."""
    args = build_parser().parse_args(argv)
    assert getattr(args, "func", None) is not None, argv


def test_dockerfile_passes_hadolint():
    result = subprocess.run([tool("hadolint"), "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_real_commands_as_a_non_root_user():
    steps = instructions(ROOT / "Dockerfile")
    by = {}
    for name, args in steps:
        by.setdefault(name, []).append(args)
    assert by["FROM"][0].endswith("-slim"), "a slim Python base"
    assert any("TORCH_INDEX_URL" in a and "/whl/cpu" in a for a in by["ARG"]), "CPU torch by default, overridable"
    assert "10001" in by["USER"][-1] and not by["USER"][-1].startswith(("root", "0")), "non-root"
    entry, cmd = json.loads(by["ENTRYPOINT"][-1]), json.loads(by["CMD"][-1])
    assert entry == ["zerotune"]
    parses(cmd)
    health = json.loads(by["HEALTHCHECK"][-1].split(" CMD ", 1)[1])
    assert health[0] == "zerotune"
    parses(health[1:])
    for args in by["COPY"]:  # every copied path exists and is let through .dockerignore
        for source in args.split()[:-1]:
            assert (ROOT / source).exists(), source
            assert f"!{source.rstrip('/')}" in (ROOT / ".dockerignore").read_text().replace("/\n", "\n"), source
    script = (ROOT / "pyproject.toml").read_text()
    assert 'zerotune = "zerotune.api.cli:main"' in script  # the console script the image's commands call


def test_health_command_against_a_live_service(api_server):
    ok = subprocess.run([sys.executable, "-m", "zerotune.api.cli", "health", "--url", api_server.url], cwd=ROOT,
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and json.loads(ok.stdout)["status"] == "ok", ok.stderr
    down = subprocess.run([sys.executable, "-m", "zerotune.api.cli", "health", "--url", "http://127.0.0.1:9",
                           "--timeout", "2"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert down.returncode == 1 and "unreachable" in down.stderr


def test_compose_matches_the_compose_spec():
    result = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
                             str(ROOT / "compose.yaml")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_service_worker_and_postgresql_with_real_commands():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"api", "worker", "db"} <= set(services)
    assert services["db"]["image"].startswith("postgres:")
    known = {f"ZEROTUNE_{name.upper()}" for name in Settings.model_fields}
    for name in ("api", "worker"):
        service = services[name]
        assert service["image"].startswith("zerotune") and service["build"] == "."
        parses(service["command"])
        assert service["depends_on"]["db"]["condition"] == "service_healthy"
        env = service["environment"]
        assert set(env) <= known, f"{name}: unknown settings {set(env) - known}"
        assert env["ZEROTUNE_DB"].startswith("postgresql+psycopg://") and "@db:5432/" in env["ZEROTUNE_DB"]
    assert services["api"]["command"][0] == "serve" and services["worker"]["command"][0] == "worker"
    assert "8000:8000" in services["api"]["ports"][0]
