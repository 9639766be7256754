"""The cluster presets and the calibrations they carry: each preset's device and links (``PROFILES``, ``PRESET_HOSTS``),
how a calibration is built from the device, link and host profiles (``profile_calibration``; ``hardware``,
``links``, ``attention``), the efficiency a device's figure is re-based to where the model can express the run it
came from (``source_run_efficiency``: solved on the whole model by ``rebase``, read from ``rebased.json`` here, so
that building a preset never runs a prediction), and the calibration any cluster is predicted with
(``calibration_for``: a preset's, a profiled device's at its own links, the nominal one, or measured links').

Sources are cited by the keys of ``hardware``'s docstring ([olcf-frontier], [nersc-perlmutter], [dgx-a100], [h200]).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from pathlib import Path

from zerotune.core.cluster_presets import CLUSTER_PRESETS
from zerotune.core.spec import ClusterSpec
from zerotune.costmodel.attention import (
    FIGURE_ATTENTION,
    SCORE_PASSES,
    STACK_ATTENTION,
    attention_efficiency,
    with_attention,
)
from zerotune.costmodel.gemm import PLATEAU_TOKENS, gemm_curve
from zerotune.costmodel.hardware import (
    DEVICES,
    ENGINE_STACK,
    OVERLAP_SLOWDOWN,
    QUANT_BYTES_PER_ELEM,
    SOURCE_RUNS,
    STEP_BYTES_PER_ELEM,
    STREAM_FRACTION,
    device_key_of,
    gemm_efficiency,
)
from zerotune.costmodel.links import HOSTS, LINKS, RING_PROTOCOLS
from zerotune.costmodel.rates import NOMINAL, NOMINAL_LINK_EFFICIENCY, Calibration, run_by


def profile_calibration(name: str, device: str, links: tuple[str, ...], stack: str = ENGINE_STACK,
                        rings: str = "hierarchical", outer_reduce: str = "backward",
                        host: str = "unknown", gathers: str = "bucket", whole_run: bool = True,
                        attention: str | None = None) -> Calibration:
    """The calibration of a GPU cluster from its device's and its levels' profiles (innermost first),
    for the software ``stack`` that runs on it (zerotune's own engine: eager PyTorch) and the way it
    runs collectives over several levels (``Calibration.rings``; zerotune's engine: hierarchical) and
    reduces gradients beyond ``grad_span`` (``Calibration.outer_reduce``; zerotune's engine: in the final backward)
    and fetches parameters (``Calibration.gathers``; zerotune's engine: a bucket per all-gather),
    on nodes of the ``host`` design (a key of ``HOSTS``). No host floor: ``run_by`` gives it the floor of
    the runner that runs it. A published efficiency whose run the model expresses (``SOURCE_RUNS``) is
    re-based so that the model predicts that run's published step (``source_run_efficiency``, stored);
    ``whole_run=False`` re-bases it on the run's compute alone (``gemm_efficiency``). A model's matmuls run at that
    efficiency times the device's GEMM law at its micro-batch over the law at the micro-batch of the figure's run
    (``gemm.gemm_curve``): a ``SOURCE_RUNS`` run's own (IBM's 7B: 2 sequences of 4,096 tokens); every other figure's
    run is taken on the GEMM plateau (``gemm.PLATEAU_TOKENS``, 2,048 tokens or more a micro-batch: Megatron's 1T and
    FlashAttention-2's GPT3-2.7B at 2,048-token sequences, DeepSpeed's BERT-Large at several sequences of 512 a GPU
    (its micro-batch is not stated), the engine's own kernels at 2,048-16,384 tokens, and the unnamed models' figures,
    10B parameters or more). The eager stacks' blocks pay their memory-bound kernels' fixed cost
    (``Device.memory_floor``). ``attention`` names the
    run's attention kernel (``ATTENTION_KERNELS``; default: the stack's own, ``STACK_ATTENTION``): where it has a
    rate on this device its FLOPs are charged at it, and the re-base takes the source run's own kernel's time out
    (``FIGURE_ATTENTION``)."""
    if host not in HOSTS:
        raise ValueError(f"host={host!r}: must be one of {sorted(HOSTS)}")
    d, h = DEVICES[device], HOSTS[host]
    memory_bound = STREAM_FRACTION * d.hbm_gbps * 1e9  # bytes/s: quantization and the optimizer's passes
    efficiency, measured_on = d.efficiency(stack), d.source_model(stack)
    source_tokens = PLATEAU_TOKENS
    if measured_on is not None:
        model, ran_on = measured_on
        source, figure = DEVICES[ran_on], d._figure(stack)
        if (ran_on, figure) in SOURCE_RUNS:
            source_tokens = SOURCE_RUNS[(ran_on, figure)].micro_batch * model.seq_len
        stored = source_run_efficiency(ran_on, figure) if (ran_on, figure) in SOURCE_RUNS else None
        if whole_run and stored is not None and source.peak_tflops == d.peak_tflops:
            efficiency = stored
        else:
            ran = FIGURE_ATTENTION.get(figure, "matmul")
            efficiency = gemm_efficiency(efficiency, model, d.peak_tflops,
                                         source.memory_fraction(stack) * source.hbm_gbps * 1e9,
                                         attention_efficiency(ran, ran_on, model), SCORE_PASSES.get(ran, (0, 0)))
    calib = Calibration(name=name, compute_efficiency=efficiency,
                        memory_bytes_per_s=d.memory_fraction(stack) * d.hbm_gbps * 1e9,
                        gemm_curve=gemm_curve(device, source_tokens),
                        memory_floor_s_per_block=d.memory_floor(stack),
                        bandwidth_efficiency=tuple(LINKS[k].efficiency for k in links),
                        quant_elems_per_s=memory_bound / QUANT_BYTES_PER_ELEM,
                        optimizer_elems_per_s=memory_bound / STEP_BYTES_PER_ELEM,
                        collective_launch_us=RING_PROTOCOLS[d.protocols]["Simple"][0],
                        overlap_slowdown=OVERLAP_SLOWDOWN, rings=rings,
                        outer_reduce=outer_reduce, gathers=gathers, protocols=d.protocols,
                        net_overhead_us=h.net_overhead_us,
                        ll_max_busbw_gbps=(d.ll_max_busbw_gbps, *h.ll_max_busbw_gbps) if d.ll_max_busbw_gbps else (),
                        ll128=h.nic_beside_gpu, ring_plateau=d.ring_plateau)
    return with_attention(calib, attention or STACK_ATTENTION.get(stack, "matmul"), device)


def profile_cluster(name: str, device: str, levels: tuple[tuple[str, int, str], ...],
                    bandwidths: tuple[float | None, ...] | None = None) -> ClusterSpec:
    """A ClusterSpec from a device key and (level name, size, link key) triples, innermost first; a level
    whose ``bandwidths`` entry is given has that per-rank bandwidth (GB/s: a link shared by fewer NICs
    than the profile's), None keeps its link's."""
    d = DEVICES[device]
    own = bandwidths or (None,) * len(levels)
    out = tuple(LINKS[link].level(lv, size) for lv, size, link in levels)
    out = tuple(dataclasses.replace(level, bandwidth_gbps=bw) if bw is not None else level
                for level, bw in zip(out, own, strict=True))
    return ClusterSpec(name=name, levels=out, device=d.name, device_memory_gib=d.memory_gib, peak_tflops=d.peak_tflops)


PROFILES = CLUSTER_PRESETS
"""The cluster presets: device and (level, size, link) innermost first; the outermost size is set by ``NAME:N``
(``zerotune.core.cluster_presets``: plain data, which the prologue reads too)."""


PRESET_HOSTS: dict[str, str] = {"frontier": "amd", "dgx-h100": "intel", "dgx-h200": "intel", "dgx-a100": "amd",
                                "perlmutter": "amd-cpu-nic"}
"""The host design of each preset's node (``HOSTS``): Frontier, one AMD EPYC 7A53 per node with the NICs on
the MI250X packages [olcf-frontier]; DGX H100 and DGX H200, two Intel Xeon Platinum 8480C (NVIDIA DGX H100
user guide, [h200]);
DGX A100, two AMD EPYC 7742 with the NICs on the GPUs' PCIe switches [dgx-a100]; Perlmutter, one AMD EPYC
7763 [nersc-perlmutter] (the NIC placement: ``HOSTS["amd-cpu-nic"]``)."""

REBASED_FILE = Path(__file__).with_name("rebased.json")
"""The compute efficiency each source run (``SOURCE_RUNS``) re-bases its device's figure to, as
``python -m zerotune.costmodel.rebase --write`` solved it on the model (a test solves them again and fails when
the file is stale)."""


def _stored_efficiencies() -> dict[tuple[str, str], float]:
    """``REBASED_FILE`` by (key in ``DEVICES``, stack); a source run it lacks (all of them while it is not
    written) is said once, as a warning, so that ``rebase`` can still run the model to write it."""
    runs = json.loads(REBASED_FILE.read_text())["source_runs"] if REBASED_FILE.exists() else []
    stored = {(run["device"], run["stack"]): float(run["compute_efficiency"]) for run in runs}
    missing = sorted(set(SOURCE_RUNS) - set(stored))
    if missing:
        warnings.warn(f"{REBASED_FILE.name} holds no efficiency for SOURCE_RUNS {missing}: those figures are "
                      "re-based on their run's compute alone until python -m zerotune.costmodel.rebase --write",
                      stacklevel=2)
    return stored


SOURCE_RUN_EFFICIENCY: dict[tuple[str, str], float] = _stored_efficiencies()


def source_run_efficiency(ran_on: str, stack: str) -> float | None:
    """The compute efficiency at which the model predicts the source run of ``DEVICES[ran_on]``'s ``stack`` figure
    (``SOURCE_RUNS``) at its published tokens per second, the whole step held to it (``rebase.bisect_source_run``),
    as ``REBASED_FILE`` stores it; None where the file holds none."""
    return SOURCE_RUN_EFFICIENCY.get((ran_on, stack))


PRESET_CALIBRATIONS: dict[str, Calibration] = {
    base: run_by(profile_calibration(f"{base}-profile", device, tuple(link for _, _, link in levels),
                                     host=PRESET_HOSTS[base]), "zerotune")
    for base, (device, levels) in PROFILES.items()}
"""The calibration each cluster preset carries, by preset name: zerotune's engine running on it."""


MEASURED_LINKS_SUFFIX = ", measured links"
"""What ends the name of a calibration whose links' efficiency came from the cluster's measured bus bandwidths
on a device with no profile (``nominal, measured links``)."""


DEVICE_CALIBRATION_SUFFIX = "-device"
"""What ends the name of a ``device_calibration`` (``H200-device``): how a caller that holds only a prediction's
``calibration`` name tells a device profile on unprofiled links from the nominal calibration."""


def with_measured_links(calib: Calibration, cluster: ClusterSpec) -> Calibration:
    """``calib`` with each level that carries a measured bus bandwidth (``Level.busbw_gbps``) at the efficiency
    it measured: busbw / (ranks under the level x ``bandwidth_gbps``), the rate at which a ring over the level's
    span leaves each group through that many links (``timing.Costs._flat_ring``) and each rank's share of it in
    zerotune's hierarchical exchange; a collective measured apart there (``Level.all_gather_busbw_gbps`` and its
    kin) at its own (``Calibration.collective_efficiency``). The other levels keep ``calib``'s; ``calib`` itself
    where none was measured."""
    measured, own, below = [], [], 1
    for k, lv in enumerate(cluster.levels, 1):
        links = below * lv.bandwidth_gbps
        measured.append(None if lv.busbw_gbps is None else lv.busbw_gbps / links)
        own += [(op, k, gbps / links) for op, gbps in lv.collective_busbw()]
        below *= lv.size
    if all(e is None for e in measured) and not own:
        return calib
    return dataclasses.replace(calib, bandwidth_efficiency=tuple(
        calib.level_efficiency(k) if e is None else e for k, e in enumerate(measured, 1)),
        collective_efficiency=tuple(own))


@functools.lru_cache(maxsize=1024)
def calibration_for(cluster: ClusterSpec) -> Calibration:
    """The calibration a cluster carries: its preset's profile when it is a preset (same levels and
    links); else, when it names a profiled device at that device's peak, the device's profile on its own
    levels (``device_calibration``); else the generic nominal one (fit your own with ``zerotune calibrate``).
    A level with a measured bus bandwidth (``Level.busbw_gbps``) makes the cluster a custom one, whose
    collectives on that level reach what was measured (``with_measured_links``)."""
    measured = any(lv.measured_busbw() for lv in cluster.levels)
    base = cluster.name.partition(":")[0]
    profile = PROFILES.get(base)
    if profile is not None and not measured:
        device, levels = profile
        same = len(levels) == cluster.num_levels and all(
            lv.name == name and lv.bandwidth_gbps == LINKS[link].bandwidth_gbps
            for lv, (name, _, link) in zip(cluster.levels, levels, strict=True))
        if same and cluster.peak_tflops == DEVICES[device].peak_tflops:
            return PRESET_CALIBRATIONS[base]
    key = device_key_of(cluster.device)
    if key is None or cluster.peak_tflops != DEVICES[key].peak_tflops:
        calib = dataclasses.replace(NOMINAL, name=f"{NOMINAL.name}{MEASURED_LINKS_SUFFIX}") if measured else NOMINAL
    else:
        calib = device_calibration(key, tuple((lv.bandwidth_gbps, lv.latency_us) for lv in cluster.levels))
    return with_measured_links(calib, cluster)


@functools.lru_cache(maxsize=256)
def device_calibration(device: str, levels: tuple[tuple[float, float], ...]) -> Calibration:
    """The calibration of a custom cluster of ``DEVICES[device]`` whose levels have these (GB/s per rank, µs
    per hop), innermost first, run by zerotune's engine: what belongs to the device is its profile's (the
    engine's compute and memory-bound rates, the library's protocols and LL caps, the runner's host floor;
    NCCL's defaults for the host, ``HOSTS["unknown"]``), and each level's collective efficiency is that of
    the profiled link with the same bandwidth and hop latency (a preset's level resized or re-counted),
    else ``NOMINAL_LINK_EFFICIENCY``: nothing measured those links (``calibration_for`` then puts a level's
    measured bus bandwidth in its place). A device's rates describe it on any
    cluster; a link's do not. One H200 in a cluster file of its own (``bench/one_gpu.sh`` writes one) is
    predicted as the ``dgx-h200`` preset's device, not at the nominal 45% of peak that took the engine's
    kept one-GPU steps for 19-27% longer than measured. Such a calibration carries no published band
    (``error.error_band``): its links are not the published clusters'."""
    efficiency = tuple(next((link.efficiency for link in LINKS.values()
                             if (link.bandwidth_gbps, link.latency_us) == level), NOMINAL_LINK_EFFICIENCY)
                       for level in levels)
    base = profile_calibration(f"{device}{DEVICE_CALIBRATION_SUFFIX}", device, ())
    return run_by(dataclasses.replace(base, bandwidth_efficiency=efficiency), "zerotune")
