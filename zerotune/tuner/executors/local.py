"""The ``local`` executor: the trainer under ``torchrun`` on this machine, one process per rank.

A target cluster larger than this machine is *emulated*: the same number of levels, each of size 2
(capped at ``max_ranks`` by collapsing inner levels), so every span of the strategy still means
the same tiers and every collective runs level by level. A model too big for this machine runs as
a scaled-down *proxy* with the same strategy (at most 4 layers, hidden 256); both substitutions
are stated in the result. The run is a subprocess in its own process group with a timeout; a
crash, a timeout or an unhealthy run fails the trial with its reason; step-time lines feed a
pruning callback that can stop a run early.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from typing import Any

from zerotune.core.records import RunMetrics
from zerotune.core.spec import ClusterSpec, ModelSpec
from zerotune.costmodel.catalog import parse_cluster
from zerotune.trainer.faults import failure_reason
from zerotune.trainer.launch import run_torchrun
from zerotune.tuner.executors.base import Executor, StepHook, TrialResult, TrialSpec

STEP_LINE = re.compile(r"^step (\d+)/(\d+) .* ([0-9.]+) s\s*$")
"""Called with (step, step seconds) as the run goes; True stops it (the trial is pruned)."""


def local_cluster_for(cluster: ClusterSpec, max_ranks: int = 8) -> ClusterSpec:
    """The cluster as run here: itself if it is a local one that fits, else its levels at size 2."""
    if cluster.device == "cpu" and cluster.world_size <= max_ranks:
        return cluster
    sizes = [min(2, lv.size) for lv in cluster.levels]
    for i in range(len(sizes)):  # collapse inner levels first: the outer (slow) ones matter most
        if math.prod(sizes) <= max_ranks:
            break
        sizes[i] = 1
    emulated = parse_cluster("local:" + "x".join(map(str, sizes)))
    levels = tuple(dataclasses.replace(lv, name=orig.name) for lv, orig in zip(emulated.levels, cluster.levels,
                                                                              strict=True))
    return dataclasses.replace(emulated, levels=levels)


def runs_as_is(cluster: ClusterSpec, max_ranks: int = 8) -> bool:
    """Whether this machine runs ``cluster`` itself (a ``cpu`` cluster of at most ``max_ranks``), not an emulation."""
    return local_cluster_for(cluster, max_ranks) == cluster


def proxy_model_for(model: ModelSpec, max_params: int = 30_000_000, hidden: int = 256, vocab: int = 4096,
                    seq_len: int = 128) -> ModelSpec:
    """The model itself if small enough for this machine, else a model of the same family, scaled down: its block
    family (``arch``), its attention's grouping (query heads per key head, as near as the proxy's heads allow) and
    its head's tying kept."""
    if model.num_params() <= max_params:
        return model
    heads = hidden // 32
    kv_heads = None
    if model.kv_heads is not None and model.kv_heads != model.heads:
        group = model.heads // model.kv_heads
        kv_heads = max(d for d in range(1, heads + 1) if heads % d == 0 and d <= max(1, heads // group))
    return ModelSpec(name=f"{model.name}-proxy", layers=min(model.layers, 4), hidden=hidden, heads=heads,
                     vocab=min(model.vocab, vocab), seq_len=min(model.seq_len, seq_len), kv_heads=kv_heads,
                     tied_head=model.tied_head, arch=model.arch)


def emulated_links(local: ClusterSpec, target: ClusterSpec) -> ClusterSpec:
    """The cluster an emulation builds for a run of ``target`` at ``local``'s sizes: each level keeps the
    target's bandwidth and latency (the hierarchy to feel) at the local size."""
    levels = tuple(dataclasses.replace(orig, size=lv.size) for lv, orig in zip(local.levels, target.levels,
                                                                                strict=True))
    return dataclasses.replace(local, levels=levels)


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, max_ranks: int = 8, max_params: int = 30_000_000, stream: bool = False,
                 proxy_hidden: int = 256, proxy_vocab: int = 4096, proxy_seq_len: int = 128,
                 emulate: bool = False) -> None:
        if max_ranks < 1:
            raise ValueError(f"max_ranks={max_ranks}: must be >= 1")
        if proxy_hidden < 32 or proxy_hidden % 32:
            raise ValueError(f"proxy_hidden={proxy_hidden}: must be a multiple of 32")
        self.max_ranks, self.max_params, self.stream, self.proxy_hidden = max_ranks, max_params, stream, proxy_hidden
        self.proxy_vocab, self.proxy_seq_len = proxy_vocab, proxy_seq_len
        self.emulate = emulate
        """Run on an emulated cluster: the local sizes with the requested cluster's links (``executors.emulate``)."""
        self._scale_of: float | None = None

    def prepare(self, spec: TrialSpec) -> TrialSpec:
        """The spec as it will run here (emulated cluster, proxy model)."""
        cluster = local_cluster_for(spec.cluster, self.max_ranks)
        model = proxy_model_for(spec.model, self.max_params, self.proxy_hidden, self.proxy_vocab, self.proxy_seq_len)
        global_batch = spec.global_batch
        if cluster != spec.cluster and global_batch:  # emulated: each rank keeps its share of the batch
            global_batch = cluster.world_size * (global_batch // spec.cluster.world_size) or None
        return dataclasses.replace(spec, cluster=cluster, model=model, global_batch=global_batch)

    def _scale(self, spec: TrialSpec, local: TrialSpec) -> float:
        """The emulation's slow-down, measured once per executor (``tuner.executors.emulate.measured_scale``)."""
        from zerotune.tuner.executors import emulate

        if self._scale_of is None:
            self._scale_of = emulate.measured_scale(spec.cluster, local.cluster.world_size)[0]
        return self._scale_of

    def run(self, spec: TrialSpec, *, stop: threading.Event, on_step: StepHook | None = None) -> TrialResult:
        """One short run under torchrun. ``stop`` kills it (an ``interrupted`` result); ``on_step`` sees
        every step line the ranks print and prunes the run by returning True."""
        local = self.prepare(spec)
        local.write_inputs()
        out = local.workdir / "run.json"
        for stale in [out, *local.workdir.glob("run.json.rank*")]:
            stale.unlink(missing_ok=True)

        def on_line(line: str) -> bool:
            m = STEP_LINE.match(line.strip())
            return bool(m and on_step is not None and on_step(int(m.group(1)), float(m.group(3))))

        target = ["zerotune.trainer.train", *local.train_args(out)]
        extra: dict[str, Any] = {"cluster_run": local.cluster.name, "emulated": local.cluster != spec.cluster}
        if self.emulate:
            from zerotune.tuner.executors import emulate, netns

            if (lack := netns.missing()) is not None:
                return TrialResult(status="failed", reason=f"cannot emulate {spec.cluster.name} here: this machine "
                                   f"lacks {lack}", executor=self.name, extra=extra)
            with emulate.emulation(emulated_links(local.cluster, spec.cluster), self._scale(spec, local)) as plan:
                extra["emulation"] = plan.summary()
                result = run_torchrun(local.cluster.world_size, target, timeout_s=spec.timeout_s, stream=self.stream,
                                      on_line=on_line, env={**dict(spec.env), **emulate.agent_env()}, stop=stop,
                                      agents=emulate.agent_commands(plan, target))
        else:
            result = run_torchrun(local.cluster.world_size, target, timeout_s=spec.timeout_s, stream=self.stream,
                                  on_line=on_line, env=dict(spec.env), stop=stop)
        (local.workdir / "log.txt").write_text(result.output)
        logs = "\n".join(result.output.splitlines()[-200:])
        proxy = local.model.to_dict() if local.model != spec.model else None
        if result.interrupted:
            return dataclasses.replace(self.interrupted("the run was stopped", **extra),
                                       logs=logs, proxy_model=proxy)
        if result.stopped:
            return TrialResult(status="pruned", reason="pruned: step times worse than the study's best",
                               extra={**extra, "pruned": True}, logs=logs, executor=self.name, proxy_model=proxy)
        if not result.ok or not out.is_file():
            reason = failure_reason(out, result.output, result.timed_out, spec.timeout_s)
            return TrialResult(status="failed", reason=reason, logs=logs, executor=self.name, proxy_model=proxy,
                               extra=extra)
        metrics: RunMetrics = json.loads(out.read_text())
        if "emulation" in extra:  # as zerotune train --emulate records it
            metrics["emulation"] = extra["emulation"]
        verdict = metrics["health"]
        if verdict["verdict"] != "ok":
            return TrialResult(status="failed", metrics=metrics, logs=logs, executor=self.name, proxy_model=proxy,
                               extra=extra, reason=f"unhealthy run ({verdict['verdict']}): {verdict['evidence']}")
        return TrialResult(status="complete", metrics=metrics, logs=logs, executor=self.name, proxy_model=proxy,
                           extra=extra)
