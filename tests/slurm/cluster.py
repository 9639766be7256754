"""A throwaway one-node Slurm cluster on this machine, for the Slurm executor tests.

Everything lives in one test-owned directory: a munge key and a private ``munged`` (its own socket,
so a system munged is left alone), a ``slurm.conf`` with free ports, state, spool, pid and log
files, and ``slurmctld`` + ``slurmd`` started in the foreground as our own children. Clients find
the cluster through ``SLURM_CONF`` (``LocalSlurm.env``). The node advertises more CPUs than the
machine has (``SlurmdParameters=config_overrides``) so a 4-rank job starts on a 2-core runner.

Where ``slurmdbd`` is installed and a MariaDB/MySQL server answers on 127.0.0.1:3306, the cluster
keeps accounting (``sacct`` shows its jobs and steps): a test-owned ``slurmdbd``, also our child, on
a database of its own that ``stop`` drops (tests/slurm/accounting.py). Where it cannot, the cluster
starts without it, ``LocalSlurm.accounting`` is False and ``accounting_off`` says why.

Needs root (slurmd starts jobs as the submitting user, and munged/slurmd run as root here) and the
Debian/Ubuntu packages ``slurm-wlm`` and ``munge``, and ``slurmdbd`` for accounting
(``.ci/install-slurm.sh``).

By hand::

    python -m tests.slurm.cluster start /tmp/zt-slurm   # prints: export SLURM_CONF=...
    python -m tests.slurm.cluster stop /tmp/zt-slurm
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.slurm import accounting

NEEDED = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
PARTITION = "debug"
ACCOUNTING_START_S = 60.0
"""How long slurmdbd may take to make its tables and register the cluster before the cluster starts without it."""

log = logging.getLogger(__name__)


def unavailable_reason() -> str | None:
    """Why a local Slurm cluster cannot be started here (what ``tests.support.unavailable`` reports), or None."""
    if sys.platform != "linux":
        return "a local Slurm cluster needs Linux"
    missing = [exe for exe in NEEDED if shutil.which(exe) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not on PATH; run .ci/install-slurm.sh as root)"
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd/munged for the tests needs root"
    try:
        socket.gethostbyname(short_hostname())
    except OSError:
        return f"this machine's hostname {short_hostname()!r} does not resolve (jobs use it as MASTER_ADDR)"
    return None


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(256, int(line.split()[1]) // 1024 * 9 // 10)
    except (OSError, ValueError, IndexError):
        pass
    return 1024


def slurm_conf(root: Path, *, node: str, ctld_port: int, slurmd_port: int, munge_socket: Path, cpus: int,
               mem_mb: int, dbd_port: int | None = None) -> str:
    """The slurm.conf of the test cluster (no cgroups, root everywhere; accounting through the slurmdbd on
    ``dbd_port``, none when it is None)."""
    if dbd_port is None:
        storage = "AccountingStorageType=accounting_storage/none"
    else:
        # Clients authenticate to slurmdbd through the munged AccountingStoragePass names, not AuthInfo's.
        storage = ("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
                   f"AccountingStoragePort={dbd_port}\nAccountingStoragePass={munge_socket}")
    return f"""\
# zerotune test cluster (tests/slurm/cluster.py): one node, this machine, test-owned files only
ClusterName=zerotune-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={root}/plugstack.conf
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
{storage}
JobCompType=jobcomp/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=20
NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


class LocalSlurm:
    """One slurmctld + one slurmd (+ munged) on this machine, configured under ``root``."""

    def __init__(self, root: Path, *, cpus: int = 16) -> None:
        self.root = Path(root).resolve()
        self.cpus = cpus
        self.node = short_hostname()
        self.conf = self.root / "slurm.conf"
        # A unix socket path must stay under ~108 bytes; pytest's tmp dirs can be deep.
        sock_dir = self.root / "munge"
        if len(str(sock_dir / "munge.socket")) > 100:
            sock_dir = Path(tempfile.mkdtemp(prefix="zt-munge-"))
        self.munge_dir = sock_dir
        self.munge_socket = sock_dir / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.accounting = False
        """Whether slurmdbd keeps the cluster's accounting (``sacct`` shows its jobs and steps)."""
        self.accounting_off = "the cluster is not started"
        """Why the cluster keeps no accounting ("" when it does)."""
        self.database: str | None = None
        """The test-owned database of the cluster's slurmdbd, while it exists."""

    @property
    def env(self) -> dict[str, str]:
        """Variables that point Slurm's clients (sbatch, squeue, ...) at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def command(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env})

    # -- start -------------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 90.0) -> None:
        """Start munged, slurmctld and slurmd; return when the node is idle (raise with the logs if not)."""
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        for sub in ("state", "spool", "run", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.munge_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.munge_dir, 0o755)  # munged: not writable by others, searchable by all
        self._start_munged()
        (self.root / "plugstack.conf").write_text("")
        ports = {"ctld_port": free_port(), "slurmd_port": free_port()}

        def write_conf(dbd_port: int | None) -> None:
            self.conf.write_text(slurm_conf(self.root, node=self.node, munge_socket=self.munge_socket, cpus=self.cpus,
                                            mem_mb=_mem_mb(), dbd_port=dbd_port, **ports))

        why = accounting.unavailable_reason()
        if why is None:
            dbd_port = free_port()
            write_conf(dbd_port)  # sacctmgr finds slurmdbd through it
            why = self._start_accounting(dbd_port)
        if why:
            log.warning("the test Slurm cluster keeps no accounting (sacct shows nothing): %s", why)
            write_conf(None)
        self.accounting, self.accounting_off = not why, why or ""
        deadline = time.monotonic() + timeout_s
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        self._wait(lambda: "UP" in self.command("scontrol", "ping").stdout, deadline, "slurmctld to answer ping")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._node_idle, deadline, f"node {self.node} to be idle")

    def _start_munged(self) -> None:
        key = self.munge_dir / "munge.key"
        if not key.exists():
            made = shutil.which("mungekey") and subprocess.run(
                ["mungekey", "--create", "--keyfile", str(key)], capture_output=True).returncode == 0
            if not made:
                key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--log-file={self.root / 'log' / 'munged.log'}",
                               f"--pid-file={self.munge_dir / 'munged.pid'}",
                               f"--seed-file={self.munge_dir / 'munged.seed'}"])
        self._wait(self.munge_socket.exists, time.monotonic() + 20, "munged's socket")

    def _start_accounting(self, dbd_port: int) -> str:
        """Start slurmdbd on a new database and register the cluster with it: "" when done, else why not (and
        nothing of it left)."""
        t0 = time.monotonic()
        try:
            self.database = accounting.new_database()
            accounting.create_database(self.database)
            accounting.write_private(self.root / "slurmdbd.conf", accounting.slurmdbd_conf(
                self.root, host=self.node, port=dbd_port, munge_socket=self.munge_socket, database=self.database))
            self._spawn("slurmdbd", ["slurmdbd", "-D"])  # reads slurmdbd.conf beside SLURM_CONF
            deadline = t0 + ACCOUNTING_START_S
            self._wait(lambda: accounting.listening(dbd_port), deadline, "slurmdbd to listen")
            self._wait(self._register, deadline, "sacctmgr to register the cluster")
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            self._stop_accounting()
            return str(exc)
        log.info("slurmdbd up on port %d, database %s, in %.1f s", dbd_port, self.database, time.monotonic() - t0)
        return ""

    def _register(self) -> bool:
        r = self.command("sacctmgr", "-i", "add", "cluster", "zerotune-test")
        return r.returncode == 0 or "already exists" in r.stdout + r.stderr

    def _stop_accounting(self) -> None:
        """Stop slurmdbd and drop its database (after slurmctld has stopped: it sends its last records)."""
        proc = self.procs.pop("slurmdbd", None)
        if proc is not None:
            _terminate(proc)
        if self.database:
            why = accounting.drop_database(self.database)
            if why:
                log.warning("%s", why)
            self.database = None
        self.accounting = False
        self.accounting_off = self.accounting_off or "the cluster is stopped"

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "ab")
        try:
            self.procs[name] = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True,
                                                env={**os.environ, **self.env})
        finally:
            log.close()

    def _node_idle(self) -> bool:
        state = self.command("sinfo", "-h", "-N", "-n", self.node, "-o", "%t").stdout.strip().rstrip("*~#!%$@^-")
        if state in ("down", "drain", "drng", "fail"):
            self.command("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
        return state in ("idle", "mix", "alloc")

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if ready():
                    return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    def logs(self, lines: int = 30) -> str:
        """The tails of the daemons' logs (for error messages)."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- stop --------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld, slurmdbd and munged (ours only, by pid) and drop the
        accounting database."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                ids = self.command("squeue", "-h", "-o", "%i").stdout.split()
                if ids:
                    self.command("scancel", *ids)
                    end = time.monotonic() + 30
                    while time.monotonic() < end and self.command("squeue", "-h", "-o", "%i").stdout.strip():
                        time.sleep(0.5)
        for name in ("slurmd", "slurmctld"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _terminate(proc)
        self._stop_accounting()
        proc = self.procs.pop("munged", None)
        if proc is not None:
            _terminate(proc)
        if self.munge_dir != self.root / "munge":
            shutil.rmtree(self.munge_dir, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


def _pids(root: Path) -> dict[str, int]:
    pids = {}
    for name, path in (("slurmd", root / "run" / "slurmd.pid"), ("slurmctld", root / "run" / "slurmctld.pid"),
                       ("slurmdbd", root / "run" / "slurmdbd.pid"), ("munged", root / "munge" / "munged.pid")):
        with contextlib.suppress(OSError, ValueError):
            pids[name] = int(path.read_text().split()[0])
    return pids


def main(argv: list[str] | None = None) -> int:
    """``start DIR`` (leaves the daemons running, prints SLURM_CONF) or ``stop DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("start", "stop"):
        print("usage: python -m tests.slurm.cluster start|stop DIR", file=sys.stderr)
        return 2
    root = Path(args[1]).resolve()
    if args[0] == "start":
        reason = unavailable_reason()
        if reason:
            print(f"cannot start a local Slurm: {reason}", file=sys.stderr)
            return 1
        cluster = LocalSlurm(root)
        cluster.start()
        on = f"on, database {cluster.database}" if cluster.accounting else f"off: {cluster.accounting_off}"
        print(f"# accounting {on}")
        print(f"export SLURM_CONF={root / 'slurm.conf'}")
        return 0
    cluster_env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        ids = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30,
                             env=cluster_env).stdout.split()
        if ids:
            subprocess.run(["scancel", *ids], env=cluster_env, timeout=30)
            time.sleep(6)
    pids = _pids(root)
    for name, pid in pids.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
            print(f"stopped {name} ({pid})")
    database = accounting.database_of(root / "slurmdbd.conf")
    if database:
        end = time.monotonic() + 15
        while "slurmdbd" in pids and Path(f"/proc/{pids['slurmdbd']}").exists() and time.monotonic() < end:
            time.sleep(0.2)
        print(accounting.drop_database(database) or f"dropped database {database}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
