"""Accounting for the test cluster (tests/slurm/cluster.py): a test-owned ``slurmdbd``, so ``sacct`` shows its jobs
and their steps.

The slurmdbd keeps its records in a database of its own, ``zt_slurm_<random hex>``, made on the MariaDB/MySQL server
on 127.0.0.1:3306 (user root, no password: what CI and the development machine run) and dropped when the cluster
stops. Its ``slurmdbd.conf`` sits beside the cluster's ``slurm.conf`` (where slurmdbd looks for it, through
``SLURM_CONF``), mode 600 as slurmdbd demands; it listens on a free port and authenticates through the cluster's
private munged. The database is made and dropped with the ``mariadb`` (or ``mysql``) client, so the tests need no
Python driver for it.

Needs the Debian/Ubuntu package ``slurmdbd`` (``.ci/install-slurm.sh``) and a running server; without either the
cluster starts without accounting (``LocalSlurm.accounting`` is False and ``accounting_off`` says why).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
from pathlib import Path

NEEDED = ("slurmdbd", "sacct", "sacctmgr")
MYSQL_HOST = "127.0.0.1"
MYSQL_PORT = 3306
DATABASE = re.compile(r"zt_slurm_[0-9a-f]{12}")
"""The names of the test-owned databases: the only ones this module ever drops."""


def mysql_client() -> str | None:
    """The MariaDB/MySQL command-line client on PATH, or None."""
    return shutil.which("mariadb") or shutil.which("mysql")


def unavailable_reason() -> str | None:
    """Why the cluster cannot keep accounting here, or None."""
    missing = [exe for exe in NEEDED if shutil.which(exe) is None]
    if missing:
        return f"slurmdbd is not installed ({', '.join(missing)} not on PATH; run .ci/install-slurm.sh as root)"
    if mysql_client() is None:
        return "no mariadb or mysql client on PATH (it makes and drops the accounting database)"
    try:
        socket.create_connection((MYSQL_HOST, MYSQL_PORT), timeout=2).close()
    except OSError as exc:
        return f"no MariaDB/MySQL server answers on {MYSQL_HOST}:{MYSQL_PORT} ({exc})"
    try:
        r = sql("SELECT 1")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the MariaDB/MySQL server on {MYSQL_HOST}:{MYSQL_PORT} does not answer a query ({exc})"
    if r.returncode != 0:
        return f"the server on {MYSQL_HOST}:{MYSQL_PORT} refuses root with no password: {r.stderr.strip()}"
    return None


def sql(statement: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run one SQL statement on the server as root with no password (the client's option files ignored: slurmdbd
    logs in with exactly these credentials)."""
    client = mysql_client()
    if client is None:
        raise OSError("no mariadb or mysql client on PATH")
    return subprocess.run([client, "--no-defaults", f"--host={MYSQL_HOST}", f"--port={MYSQL_PORT}", "--user=root",
                           "--connect-timeout=5", "--batch", "--skip-column-names", "-e", statement],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def new_database() -> str:
    """A database name no other cluster uses."""
    return f"zt_slurm_{secrets.token_hex(6)}"


def create_database(name: str) -> None:
    """Make the (new, empty) database ``name``; raise RuntimeError with the server's answer if it cannot."""
    _check(name)
    r = sql(f"CREATE DATABASE `{name}`")
    if r.returncode != 0:
        raise RuntimeError(f"could not create database {name}: {r.stderr.strip()}")


def drop_database(name: str) -> str:
    """Drop the test-owned database ``name`` (if it exists); "" when done, else why not."""
    _check(name)
    try:
        r = sql(f"DROP DATABASE IF EXISTS `{name}`", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not drop database {name}: {exc}"
    return "" if r.returncode == 0 else f"could not drop database {name}: {r.stderr.strip()}"


def _check(name: str) -> None:
    if not DATABASE.fullmatch(name):
        raise ValueError(f"not a test-owned database name: {name!r}")


def slurmdbd_conf(root: Path, *, host: str, port: int, munge_socket: Path, database: str) -> str:
    """The slurmdbd.conf of the test cluster (its own port, pid and log files, its own database)."""
    return f"""\
# zerotune test cluster's accounting (tests/slurm/accounting.py): test-owned files and database only
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={port}
SlurmUser=root
PidFile={root}/run/slurmdbd.pid
LogFile={root}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost={MYSQL_HOST}
StoragePort={MYSQL_PORT}
StorageUser=root
StorageLoc={database}
"""


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only (slurmdbd refuses a slurmdbd.conf others can read)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def database_of(conf: Path) -> str | None:
    """The database a slurmdbd.conf written by :func:`slurmdbd_conf` names (None if none, or not a test-owned one)."""
    try:
        text = conf.read_text()
    except OSError:
        return None
    m = re.search(r"^StorageLoc=(\S+)$", text, re.MULTILINE)
    return m.group(1) if m and DATABASE.fullmatch(m.group(1)) else None


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
