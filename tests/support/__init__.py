"""What the test files share: the repository root, the one way a test says a real dependency is missing,
the sessions of a database, PostgreSQL databases made and dropped for a test, and real torchrun jobs under
a hard timeout (``postgres``, ``ranks``)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the checkout under test)."""


def unavailable(what: str) -> NoReturn:
    """A test's real dependency (PostgreSQL, CAP_NET_ADMIN, ...) is missing here: skip with the reason on a
    developer's machine, fail under ``CI=true``, where CI provides it and a skip would hide the test."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run this test, but {what}")
    pytest.skip(what)


def require_module(name: str, install: str) -> ModuleType:
    """The module ``name``, imported; where it is not installed, :func:`unavailable` says so with ``install``,
    the way to get it (``pytest.importorskip`` would skip under CI too)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{name} is not installed ({exc}; {install})")


def session_factory(url: str) -> sessionmaker[Session]:
    """Sessions on the database at ``url``, on an engine of their own (what a Tuner is given)."""
    from zerotune.db.session import make_engine, make_session_factory

    return make_session_factory(make_engine(url))
