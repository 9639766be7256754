"""Emulated clusters on one machine: network namespaces joined by shaped links, one per group of ranks.

Local short runs talk over loopback on every level, so their step times carry no trace of a
cluster's bandwidth hierarchy. An emulation gives each group of the innermost level its own Linux
network namespace (its ranks talk over that namespace's loopback: the innermost level stays fast)
and joins the groups through bridges, one per group of each outer level, with a veth pair from
every child to its parent's bridge. Each veth end is shaped on egress with ``tc`` ``tbf`` to the
rate of the level it crosses, so traffic between two groups is held to the slowest level on its path:

    level-1 groups      namespaces  <prefix>-g0, -g1, ...   (ranks, loopback inside)
    level-k groups      bridges     in the fabric namespace <prefix>-f, one per group of level k
    child -> parent     veth pair   rate = level k's bandwidth per rank x ranks in the child x scale
                                    (or the level's measured bus bandwidth x scale, where the cluster
                                    gives one: ``Level.busbw_gbps``, what its collectives reach there)

**The scale.** A CPU rank computes a few GFLOPS where a GPU computes tens of TFLOPS; links at the
target's bandwidths would make communication vanish beside compute. Every link is therefore slowed
by one factor, ``scale = local FLOPS per rank / target's achievable FLOPS per rank``, so that the
ratio of compute time to communication time of the emulated run is the target cluster's for the
same model (the bytes are the same; both times are divided by the same factor). ``scale_for``
computes it; ``zerotune emulate --plan`` prints it.

**Latency.** Each link also gets its level's hop latency times the same scale's inverse when the
kernel has ``sch_netem``; without it latency is not emulated and the plan says so.

**Both directions at once.** A shaped link carries its rate in each direction (one ``tbf`` per veth end,
measured: 4 MB one way and 4 MB each way at once both take 1.00-1.07x the shaped time over plain TCP
sockets). Gloo does not always use both: it serves a pair's socket from one thread and often lets one
direction wait on the other, so a two-rank all-gather or all-to-all across a link takes 1.0-2.0x the
full-duplex time from run to run, while a one-way send takes the shaped time. What is measured is
therefore what gloo does on that link; a cost model fitted to emulated runs absorbs it in the level's
effective bandwidth.

**Safety.** Everything an emulation creates lives in namespaces named ``zt<pid>-*`` (the pid of the
process that made them, base 36): the bridges and the veth pairs are inside the fabric namespace, so
deleting the namespaces removes every link and qdisc with them, and nothing outside the prefix is
touched. ``emulation`` removes its set when it exits — normally, on an exception, on SIGTERM or
SIGINT (the ``with`` block unwinds; a process with a SIGTERM handler of its own, such as a worker,
stops its run its own way and the block then exits). A set whose process died without cleaning
up (SIGKILL) is stale: the next emulation, or ``zerotune emulate --clean``, removes every set whose
pid is no longer alive.

Needs Linux, root or CAP_NET_ADMIN, and the ``ip`` and ``tc`` commands (iproute2).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from zerotune.core.spec import ClusterSpec
from zerotune.errors import UsageError
from zerotune.tuner.executors import netns

SUBNET = "10.251"
"""Addresses of the emulated groups: 10.251.0.1 ... (one /16, inside the namespaces only)."""


@dataclass(frozen=True)
class Link:
    """One shaped veth pair: a child (a group's namespace, or a bridge of the level below) to its parent bridge."""

    level: int
    """The level the link crosses (2 = the first level above the namespaces)."""
    child: str
    """The namespace of the child (level 2), or its bridge in the fabric (level ≥ 3)."""
    parent: str
    """The bridge in the fabric namespace."""
    up: str
    """The veth end on the child's side."""
    down: str
    """The veth end on the parent bridge."""
    rate_bps: float
    """Bits per second each way."""
    delay_us: float


@dataclass
class Plan:
    """What an emulation of ``cluster`` at ``scale`` builds: namespaces, bridges, links, addresses."""

    cluster: ClusterSpec
    scale: float
    prefix: str
    groups: list[str]
    """One namespace per level-1 group, in rank order: rank r lives in ``groups[r // sizes[0]]``."""
    addresses: list[str]
    bridges: list[str]
    links: list[Link]
    notes: list[str] = field(default_factory=list)

    @property
    def fabric(self) -> str:
        return f"{self.prefix}-f"

    def namespace_of(self, rank: int) -> str:
        return self.groups[rank // self.cluster.sizes[0]]

    def address_of(self, rank: int) -> str:
        return self.addresses[rank // self.cluster.sizes[0]]

    def summary(self) -> dict[str, Any]:
        """What run.json records of the emulation: scale, link rates per level, whether latency was shaped."""
        levels = {}
        for level in range(2, self.cluster.num_levels + 1):
            links = [lk for lk in self.links if lk.level == level]
            if links:
                levels[self.cluster.levels[level - 1].name] = {"links": len(links), "mb_per_s": links[0].rate_bps / 8e6,
                                                               "delay_us": links[0].delay_us}
        return {"scale": self.scale, "namespaces": len(self.groups), "levels": levels, "notes": self.notes}

    def describe(self) -> list[str]:
        lines = [f"emulating {self.cluster.name}: {len(self.groups)} namespaces of {self.cluster.sizes[0]} ranks, "
                 f"links slowed by scale {self.scale:.3g}"]
        for level in range(2, self.cluster.num_levels + 1):
            lv = self.cluster.levels[level - 1]
            rates = sorted({lk.rate_bps for lk in self.links if lk.level == level})
            if rates:
                given = (f"{lv.busbw_gbps:g} GB/s measured busbw" if lv.busbw_gbps is not None
                         else f"{lv.bandwidth_gbps:g} GB/s per rank")
                lines.append(f"  level {level} ({lv.name}, {given}): "
                             f"{len([lk for lk in self.links if lk.level == level])} links at "
                             f"{rates[0] / 8e6:.4g} MB/s each way")
        return lines + [f"  note: {n}" for n in self.notes]


def plan(cluster: ClusterSpec, scale: float, *, owner: int | None = None, netem: bool = False) -> Plan:
    """The namespaces, bridges and links of an emulation of ``cluster`` with every link rate times ``scale``."""
    if not 0 < scale <= 1 or not math.isfinite(scale):
        raise UsageError("emulate.scale", scale, "must be in (0, 1]: links are slowed, never sped up")
    if cluster.num_levels < 2:
        raise UsageError("cluster", cluster.name, "has one level: nothing to emulate (the innermost level is loopback)")
    pre = netns.prefix(owner)
    sizes = cluster.sizes
    n_groups = math.prod(sizes[1:])
    if n_groups > 250 * 250:
        raise UsageError("cluster", cluster.name, f"{n_groups} namespaces: at most 62,500 can be emulated")
    groups = [f"{pre}-g{i}" for i in range(n_groups)]
    addresses = [f"{SUBNET}.{i // 250}.{i % 250 + 1}" for i in range(n_groups)]
    bridges: list[str] = []
    links: list[Link] = []
    children = list(groups)  # the nodes of the level below, in order
    for level in range(2, cluster.num_levels + 1):
        size = sizes[level - 1]
        ranks_per_child = math.prod(sizes[:level - 1])
        lv = cluster.levels[level - 1]
        # a measured bus bandwidth is what a ring leaving a child group reaches through its ranks' links
        per_child_gbps = lv.busbw_gbps if lv.busbw_gbps is not None else lv.bandwidth_gbps * ranks_per_child
        rate = per_child_gbps * 8e9 * scale
        parents = []
        for p in range(len(children) // size):
            bridge = f"{pre}-b{level}.{p}"
            bridges.append(bridge)
            parents.append(bridge)
            for c in range(size):
                child = children[p * size + c]
                k = len(links)
                links.append(Link(level, child, bridge, f"{pre}-u{k}", f"{pre}-d{k}", rate,
                                  lv.latency_us / scale if netem else 0.0))
        children = parents
    notes = [] if netem else [
        "latency is not emulated: the kernel has no sch_netem (bandwidth only)"]
    if any(len(name) > 15 for name in (*bridges, *groups, *(lk.up for lk in links))):
        raise UsageError("cluster", cluster.name, "too many groups for interface names of 15 characters")
    return Plan(cluster, scale, pre, groups, addresses, bridges, links, notes)


def scale_for(cluster: ClusterSpec, compute_efficiency: float, local_tflops_per_rank: float) -> float:
    """The factor every link of an emulation of ``cluster`` is slowed by: this machine's FLOPS per rank over
    the target's achievable FLOPS per rank (its peak times ``compute_efficiency``), at most 1. Compute time
    and communication time then grow by the same factor, so their ratio stays the target's."""
    target = cluster.peak_tflops * compute_efficiency
    if not (local_tflops_per_rank > 0 and target > 0):
        raise UsageError("emulate.local_tflops", local_tflops_per_rank, "must be > 0 (and the target's peak too)")
    return min(1.0, local_tflops_per_rank / target)


def measured_scale(target: ClusterSpec, ranks: int) -> tuple[float, str]:
    """``scale_for`` with this machine's FLOPS measured (``local_tflops``) and the target's efficiency from its
    calibration, and the line that says how the factor was reached (the CLI and the local executor print it)."""
    from zerotune.costmodel import calibration_for

    local, efficiency = local_tflops(ranks), calibration_for(target).compute_efficiency
    scale = scale_for(target, efficiency, local)
    return scale, (f"links slowed by {scale:.3g} = {local:.3g} TFLOPS per rank here / {target.peak_tflops:g} x "
                   f"{efficiency:.3g} achievable per rank there")


def local_tflops(ranks: int, seconds: float = 0.5) -> float:
    """Dense fp32 TFLOPS per rank when ``ranks`` ranks share this machine: a matmul loop for ``seconds``,
    over all of torch's threads, divided by the ranks (they share the cores)."""
    import time

    import torch

    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        done += 1
    return 2 * n ** 3 * done / (time.perf_counter() - start) / 1e12 / max(1, ranks)


def build(p: Plan) -> None:
    """Create the namespaces, bridges and shaped links of ``p`` (undone by ``teardown``)."""
    fabric = p.fabric
    netns.ip("netns", "add", fabric)
    netns.ip("-n", fabric, "link", "set", "lo", "up")
    for ns in p.groups:
        netns.ip("netns", "add", ns)
        netns.ip("-n", ns, "link", "set", "lo", "up")
    for bridge in p.bridges:
        name = bridge.removeprefix(p.prefix + "-")  # inside the fabric namespace, names need no prefix
        netns.ip("-n", fabric, "link", "add", name, "type", "bridge")
        netns.ip("-n", fabric, "link", "set", name, "up")
    address_of = dict(zip(p.groups, p.addresses, strict=True))
    for lk in p.links:
        up, down = lk.up.removeprefix(p.prefix + "-"), lk.down.removeprefix(p.prefix + "-")
        parent = lk.parent.removeprefix(p.prefix + "-")
        netns.ip("-n", fabric, "link", "add", up, "type", "veth", "peer", "name", down)
        netns.ip("-n", fabric, "link", "set", down, "master", parent, "up")
        if lk.child in address_of:  # a group: its end moves into its namespace as eth0, with its address
            netns.ip("-n", fabric, "link", "set", up, "netns", lk.child)
            netns.ip("-n", lk.child, "link", "set", up, "name", "eth0")
            netns.ip("-n", lk.child, "addr", "add", f"{address_of[lk.child]}/16", "dev", "eth0")
            netns.ip("-n", lk.child, "link", "set", "eth0", "up")
            _shape(lk.child, "eth0", lk)
        else:  # a bridge of the level below
            netns.ip("-n", fabric, "link", "set", up, "master", lk.child.removeprefix(p.prefix + "-"), "up")
            _shape(fabric, up, lk)
        _shape(fabric, down, lk)


def _shape(ns: str, dev: str, lk: Link) -> None:
    rate = f"{int(lk.rate_bps)}bit"
    burst, limit = str(netns.tbf_burst(lk.rate_bps)), str(netns.tbf_limit(lk.rate_bps))
    if lk.delay_us > 0:
        netns.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
              f"{lk.delay_us:.0f}us"])
        netns.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:", "handle", "2:", "tbf", "rate", rate,
              "burst", burst, "limit", limit])
    else:
        netns.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
              "limit", limit])


def teardown(p: Plan) -> None:
    """Delete every namespace of ``p`` (their links and qdiscs go with them); never raises."""
    for ns in (*p.groups, p.fabric):
        netns.run(["ip", "netns", "del", ns], check=False)


class _Terminated(BaseException):
    """SIGTERM turned into an exception, so the ``with`` block unwinds and tears the emulation down."""


@contextlib.contextmanager
def emulation(cluster: ClusterSpec, scale: float) -> Iterator[Plan]:
    """Build an emulation of ``cluster`` for the ``with`` block and remove it afterwards, whatever ends the block.

    Stale sets of dead processes are removed first. On SIGTERM the block unwinds (``_Terminated``), unless
    the process installed a handler of its own (a worker's graceful stop), which then runs instead and ends
    the run its way; Ctrl-C unwinds as KeyboardInterrupt. Raises ``EmulationUnavailable`` where the machine
    cannot emulate."""
    netns.require()
    netns.clean(stale_only=True)
    p = plan(cluster, scale, netem=netns.has_netem())
    previous: Any = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        if callable(previous):  # the process has its own way to stop (a worker hands its job back): let it
            previous(signum, frame)
            return
        raise _Terminated(signum)

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        build(p)
        yield p
    finally:
        teardown(p)
        if in_main:
            signal.signal(signal.SIGTERM, previous)


MASTER_PORT = 29500
"""The rendezvous port on the first namespace's address (a fresh namespace: nothing else listens there)."""


def agent_commands(p: Plan, target: Sequence[str], *, module: bool = True) -> list[list[str]]:
    """One ``torchrun`` agent per namespace (an emulated node of the innermost level): ``--nnodes`` = the
    namespaces, ``--node-rank`` = the namespace's index, static rendezvous on the first namespace's address.
    Static, not c10d: its node ranks are the ones given, so rank r lands in ``p.namespace_of(r)`` and every
    group of every level is a set of ranks that shares the links the plan shaped for it. Run them with
    ``trainer.launch.run_torchrun(..., agents=...)`` and ``agent_env``."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    per = p.cluster.sizes[0]
    return [[ip, "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(p.groups)}",
             f"--node-rank={g}", f"--nproc-per-node={per}", f"--master-addr={p.addresses[0]}",
             f"--master-port={MASTER_PORT}", "--max-restarts=0", *(["-m"] if module else []), *target]
            for g, ns in enumerate(p.groups)]


def agent_env() -> dict[str, str]:
    """What every rank of an emulated run needs: gloo bound to its namespace's interface."""
    return {"GLOO_SOCKET_IFNAME": "eth0"}
