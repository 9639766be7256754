"""What the test files share: the repository root, PostgreSQL databases made and dropped for a test, and
real torchrun jobs under a hard timeout (``postgres``, ``ranks``)."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the checkout under test)."""


def unavailable(what: str) -> None:
    """A test's real dependency (PostgreSQL, CAP_NET_ADMIN, ...) is missing here: skip with the reason on a
    developer's machine, fail under ``CI=true``, where CI provides it and a skip would hide the test."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run this test, but {what}")
    pytest.skip(what)
