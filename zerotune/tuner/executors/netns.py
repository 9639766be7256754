"""The Linux side of an emulated cluster: whether this machine can build one (CAP_NET_ADMIN, iproute2,
``sch_netem``), the ``zt<pid>-*`` namespaces an emulation owns and their clean-up, and the ``ip``/``tc`` calls and
queue sizes its shaped links use. ``emulate`` plans and builds the namespaces and links with these."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from zerotune.errors import UsageError

CAP_NET_ADMIN = 12
_NAME = re.compile(r"^zt([0-9a-z]+)-")


class EmulationUnavailable(UsageError):
    """What this machine lacks to emulate a cluster (one line: the field, the value, what is missing)."""


def missing() -> str | None:
    """What this machine lacks for an emulation, or None when it can run one."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' command (iproute2) is not installed"
    if not _has_cap_net_admin():
        return "CAP_NET_ADMIN (run as root, or grant the capability) to create network namespaces and shape links"
    return None


def _has_cap_net_admin() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    match = re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.MULTILINE)
    return bool(match) and bool(int(match.group(1), 16) >> CAP_NET_ADMIN & 1)  # type: ignore[union-attr]


def require() -> None:
    """Raise ``EmulationUnavailable`` naming what is missing (the CLI exits 2 with that line)."""
    lack = missing()
    if lack is not None:
        raise EmulationUnavailable("emulate", "on", f"needs {lack}")


@functools.cache
def has_netem() -> bool:
    """Whether the kernel can delay packets (``sch_netem``): tried once per process on a veth pair in a
    throwaway namespace (the kernel's qdiscs do not change while it runs)."""
    ns = f"{prefix()}-probe"
    try:
        ip("netns", "add", ns)
        ip("-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        return run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"],
                    check=False).returncode == 0
    finally:
        run(["ip", "netns", "del", ns], check=False)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def prefix(pid: int | None = None) -> str:
    """The name prefix of the set a process owns: ``zt`` + its pid in base 36 (Linux names are ≤ 15 bytes)."""
    return f"zt{_base36(os.getpid() if pid is None else pid)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result


def ip(*args: str) -> None:
    run(["ip", *args])


def namespaces() -> list[str]:
    """Every network namespace on this machine (names only)."""
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def clean(stale_only: bool = True) -> list[str]:
    """Remove emulation sets: those whose owner died (``stale_only``), or every ``zt<pid>-`` set. Returns the
    namespaces removed. Only names of this module's own pattern are touched."""
    removed = []
    for ns in namespaces():
        match = _NAME.match(ns)
        if match is None:
            continue
        if stale_only and _alive(int(match.group(1), 36)):
            continue
        if run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
    return removed


def tbf_burst(rate_bps: float) -> int:
    """Bytes a tbf may send at once: a 64 KiB segment (veth passes GSO segments whole) or 10 ms of the rate."""
    return int(min(1 << 30, max(65536 * 2, rate_bps / 8 / 100)))  # tc takes 32-bit byte counts


def tbf_limit(rate_bps: float) -> int:
    """Bytes a tbf may queue: 2 s of the rate, at least 16 MiB. A deep queue delays instead of dropping, so TCP
    sees the link's rate rather than loss and retransmission timeouts (an emulation wants bandwidth, not drops)."""
    return int(min(1 << 30, max(16 << 20, rate_bps / 8 * 2)))
