"""Shared fixtures: run real torchrun jobs from tests, under a hard timeout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ranks import run_ranks


@pytest.fixture(scope="session")
def ranks_runner(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict]]:
    def run(nproc: int, script: Path, args: list[str], timeout_s: float = 240.0) -> list[dict]:
        return run_ranks(nproc, script, args, tmp_path_factory.mktemp(script.stem), timeout_s)
    return run
