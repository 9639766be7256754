"""Which exceptions are faults of the infrastructure (the database, the network), not of the work.

A worker runs a study against a database it does not own: a failover, a pooler restart, an idle-connection reaper
(``pg_terminate_backend``), an administrator's shutdown or a serialization conflict ends a connection or a
transaction in the middle of a study. Such a fault says nothing about the request: the study is resumed from where
it stood (:class:`zerotune.tuner.worker.Worker` retries the job with backoff), and only a cause in the work itself
fails it at once. Optuna wraps what its storage meets (``StorageInternalError`` raised *from* SQLAlchemy's error,
itself wrapping the driver's), so the whole chain of causes is read, not only the exception caught.

What counts, by the driver's own classification:

- PostgreSQL, by SQLSTATE (https://www.postgresql.org/docs/current/errcodes-appendix.html): class 08 (connection
  exception), 40001 serialization failure and 40P01 deadlock (both: "retry the transaction"), class 53
  (insufficient resources: disk full, out of memory, too many connections), 55P03 lock not available, 57014 query
  canceled (a statement timeout or ``pg_cancel_backend``), 57P01-57P05 (admin shutdown, crash shutdown, cannot
  connect now, database dropped, idle session timeout) and class 58 (system error: I/O);
- psycopg's ``OperationalError`` with no SQLSTATE at all: the server never answered (connection refused, the
  server closed the connection unexpectedly, a lost socket);
- SQLAlchemy's ``connection_invalidated`` (it saw the connection die), ``DisconnectionError`` and its pool's
  ``TimeoutError`` (no connection could be had);
- SQLite, by result code (https://www.sqlite.org/rescode.html): SQLITE_BUSY and SQLITE_LOCKED (another writer held
  the file past the busy timeout), SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_PROTOCOL;
- the operating system's ``ConnectionError`` (reset, refused, aborted, broken pipe).

Anything else — a constraint violation, invalid data, a bug, a failed run — is the work's own failure.
"""

from __future__ import annotations

import re

SQLSTATES = re.compile(r"^(08...|40001|40P01|53...|55P03|57014|57P0[1-5]|58...)$")
"""The PostgreSQL SQLSTATEs of a fault of the infrastructure (see the module's docstring)."""

SQLITE_CODES = {5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 10: "SQLITE_IOERR", 13: "SQLITE_FULL", 14: "SQLITE_CANTOPEN",
                15: "SQLITE_PROTOCOL"}
"""SQLite's primary result codes of a fault of the infrastructure (an extended code's low byte is its primary)."""

JOB_ATTEMPTS = 8
"""How many times in a row a worker runs a job again after a fault of the infrastructure before it fails the job,
naming the fault: a run that ends a trial meanwhile starts the count again, so only a database that stays away
(about 90 s of backoff, :func:`backoff_s`) fails a job."""


def backoff_s(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt`` (1, 2, ...) of a job that met a fault: 1, 2, 4, ... 30 at most."""
    return float(min(30, 2 ** max(0, attempt - 1)))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first (each once)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and not any(current is s for s in seen) and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or getattr(current, "orig", None) or current.__context__
    return seen


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__module__.split('.')[0]}.{type(exc).__name__}" + (f": {text}" if text else "")


def _one(exc: BaseException) -> bool:
    """Whether ``exc`` itself (not its causes) is a fault of the infrastructure."""
    if isinstance(exc, ConnectionError):
        return True
    module = type(exc).__module__
    if module.startswith("sqlalchemy"):
        name = type(exc).__name__
        return bool(getattr(exc, "connection_invalidated", False)) or name in ("DisconnectionError", "TimeoutError")
    if module.startswith(("psycopg", "psycopg2")):
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        if state:
            return bool(SQLSTATES.match(state))
        return type(exc).__name__ == "OperationalError" or any(
            c.__name__ == "OperationalError" for c in type(exc).__mro__)
    if module == "sqlite3":
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF in SQLITE_CODES
        return type(exc).__name__ == "OperationalError" and ("locked" in str(exc) or "disk I/O" in str(exc))
    return False


def fault(exc: BaseException) -> str | None:
    """The fault of the infrastructure behind ``exc``, named (its innermost such cause: the driver's words), or None
    when ``exc`` is the work's own failure."""
    found = [e for e in _chain(exc) if _one(e)]
    return _first_line(found[-1]) if found else None
