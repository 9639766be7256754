"""The cost model against published measurements of clusters this service cannot reach.

    python bench/published.py                  # every table in bench/published/
    python bench/published.py --table zeropp_blog --json
    python bench/published.py --defaults       # and beside it, every table with every reading at its default

Each ``bench/published/*.toml`` transcribes one source: its ``[source]`` (title, url, what was assumed
where the source is silent), the clusters (a device and links from ``zerotune/costmodel/hardware.py``,
or a preset; ``host`` names the node's host design in ``HOSTS`` where the source gives it, else
NCCL's defaults for an unknown host), the models, the strategies (a preset and the fields the source's
engine used), and the published values: ``[[groups]]`` of rows ``[model, micro-batch, value per strategy column]`` and
``[[compare]]`` ratios of two rows. Every prediction uses the device and link profiles as they are —
nothing here is fitted to these tables — and the error is (predicted - published) / published.

A table's ``stack`` names the software its figures ran on (``pytorch``: eager PyTorch, FSDP;
``megatron``: Megatron-DeepSpeed-class fused kernels; ``flash``: fused kernels with FlashAttention-2),
which picks the device's efficiency (``hardware.STACKS``). Its ``attention`` names the attention kernel the runs
used where it has a published rate of its own (``attention.ATTENTION_KERNELS``: ``flash2`` for FlashAttention-2 and
SDPA's flash backend; ``triton``); the default is the stack's own (``attention.STACK_ATTENTION``: ``flash2`` for
the ``flash`` stack, ``fused-softmax`` for the ``megatron`` stack, else ``matmul``, attention at the stack's compute
rate, as an unfused attention's batched matmuls run; ``eager``, those matmuls and the unfused attention's scale,
mask and softmax passes over the scores it writes to HBM, ``attention.SCORE_PASSES``; ``fused-softmax``, the same
with the three fused in one kernel, Megatron's), and a preset cluster keeps its own unless the table names one. Its
``loss`` names the loss kernel (``torch``, the default, ``fused`` or ``vocab-parallel``: ``Calibration.loss_kernel``),
and ``kernels`` its blocks' memory-bound kernels (``eager``, the default, or ``nanotron``:
``Calibration.block_kernels``). A table
with ``role = "calibration"`` is where a profile constant comes from, and one with ``role = "reference"``
measured what the model does not express (tensor or pipeline parallelism): both are printed, never scored.
A table's ``collectives`` says how its engine ran a collective over several levels: ``flat`` (the
default: one NCCL ring over the whole group, as DeepSpeed and FSDP issue it) or ``hierarchical`` (one
ring per level, as zerotune's engine and MiCS's hierarchical all-gather do); a preset cluster keeps
its own calibration, run as the table's ``runner`` runs it (``rates.RUNNERS``; default zerotune's
engine). Its ``outer_reduce`` says where the engine
reduced gradients beyond their shard group: ``boundary`` (the default: after backward, serial, where a
source does not say it overlapped them) or ``backward`` (overlapped with the final backward: DeepSpeed's
``overlap_comm``, DDP and HSDP buckets, zerotune's engine), as the source states it. Its ``gathers``
says how the engine fetched parameters:
``bucket`` (the default: one all-gather per bucket, as FSDP and zerotune's engine do) or ``module``
(one per sub-module, as DeepSpeed ZeRO-3 and the engines built on it do); a strategy column may set its
own ``gathers`` and ``stack`` where its engine is not the table's, and ``overlap_comm = false`` where its engine
ran its collectives on the compute stream (DeepSpeed's ``overlap_comm``: ``Calibration.overlap`` 0, every
collective serialized with the compute). A gather per module also brings DeepSpeed
ZeRO-3's host floor, measured on a GPU host (``rates.RUNNER_HOST_S_PER_LAYER``): a block whose device time is
shorter waits for the host's hooks (``rates.with_host_floor``). ``copies = true`` says its engine copied each
gather's output and each reduction's input (FSDP2: ``Calibration.copies``). ``weight_sync = "broadcast"`` says its
optimizer handed out whole parameters and synced the updated weights with one broadcast per owning rank
(InternEvo: ``Calibration.weight_sync``); the default, ``gather``, an all-gather per bucket. ``early_stop = true``
says its checkpointed blocks ran torch's non-reentrant checkpoint on torch 2.1 or later, whose backward stops
recomputing before the block's last matmul (``Calibration.recompute_early_stop``); the default, false, reruns the
whole forward, as Megatron's, DeepSpeed's and InternEvo's reentrant checkpoints and torch 2.0's do. A cluster may
set its own ``early_stop`` where the table's runs came from campaigns on different software (each cluster is one
campaign's machines and image), and a group its ``set``, strategy fields every column of its rows takes (the mixed
precision a campaign ran, say: ``set = { grad_bits = 32 }``).

Metrics: ``tflops_per_gpu`` (``flops = "hardware"`` counts the recomputation of checkpointed
activations, as Megatron-DeepSpeed's and FSDP's figures do: 4/3 of the model FLOPs), and
``tokens_per_s_per_gpu``, and ``samples_per_s`` (sequences per second of the whole cluster). A table with
``scored = "ratios"`` has its ratios scored and its figures printed only (a source whose absolute figures
leave out part of the step, as DeepSpeed's autotuner metric does). A group with several strategy columns
compares every column with the first; "-" marks a column the source has no figure for.
Goal: every row and ratio within ±15%.

**Readings stand on quotes.** The keys above that change how a table is predicted — its ``[source]``'s ``stack``,
``flops``, ``collectives``, ``outer_reduce``, ``gathers``, ``runner``, ``weight_sync``, ``loss``, ``kernels``,
``attention``, ``copies`` and ``early_stop`` (``SOURCE_READINGS``: the path is the key), a cluster's ``early_stop``
(``clusters.NAME.early_stop``), ``host`` (``clusters.NAME.host``) and its levels' measured bus bandwidths
(``clusters.NAME.levels.LEVEL.busbw_gbps``, LEVEL its name or its place from 0, and each ``BUSBW_FIELDS``), a
column's ``stack``, ``gathers`` and ``overlap_comm`` (``strategies.NAME.gathers``), a group's ``set``
(``groups.I.set.FIELD``, ``I`` counting the ``[[groups]]`` from 0) — are readings of the source. A
reading stands only where the table's ``[quotes]`` holds a quote from the source or its code that states it, keyed
by the reading's path (or a table above it: ``strategies.zero3`` covers that column's settings) with the text
``"quote — location"``; a reading that differs from its global default (``SOURCE_READINGS``; a column's or a
cluster's too, not the table's own: a column that names its own engine's way is a reading of that engine) and has no
quote takes that global default, in the main score and in the band
(``settle_readings``; the bench prints each one it dropped). The cluster's devices, links, sizes,
``peak_tflops`` and ``gbps_per_rank`` describe the hardware (the source's ``cluster``), and the strategies' own
fields the runs' configuration: they are not readings. ``--defaults`` scores every table with every reading at its
default, quoted or not, and prints it beside the main score (what the quoted readings carry); ``--as-written``
scores every reading as written (what the unquoted ones would carry: never the main score).

**Scores** (``bench/scoreboard.py``, whose docstring states each rule). Printed first, the ranking: within each
configuration a source measured several strategies on (a group's row; the ``[[compare]]`` ratios of two strategies
on one setting join it), the pairs in order (published gap >= 5%), the winner, the regret, by scale band (<= 256,
384-512, >= 1,024 GPUs), and AMSP's plan-against-plan ratios at 1,024 GPUs. Then the error by band, with the misses'
split between too fast and too slow. **A ratio that repeats scored rows counts once**: a ratio of two rows that are
both scored as rows is printed, and enters the error band of comparisons ``model_error.json`` serves (the error of a
decision), but is no item of the error score or the tally: its error is its rows'. **Outliers**, found before
anything is scored by one rule for every table (``scoreboard.outliers``: a row faster per GPU by more than 10% than a
row of its own series that does as much work per GPU on as few GPUs, where it is in every such contradiction of its
series), are printed with the rows that contradict them and left out of every score and band, with every ratio
that reads them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

import scoreboard

from zerotune.core.spec import BUSBW_FIELDS, ClusterSpec, ModelSpec
from zerotune.costmodel import Calibration, calibration_for, predict
from zerotune.costmodel.attention import ATTENTION_KERNELS, STACK_ATTENTION, with_attention
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.error import ERROR_FILE, at_scale, band_items, band_of, on_device
from zerotune.costmodel.hardware import device_key_of
from zerotune.costmodel.profiles import profile_calibration, profile_cluster, with_measured_links
from zerotune.costmodel.rates import (
    BLOCK_KERNELS,
    GATHERS,
    LOSS_KERNELS,
    OUTER_REDUCE,
    RINGS,
    RUNNERS,
    WEIGHT_SYNC,
    run_by,
    with_host_floor,
)

ROOT = Path(__file__).resolve().parent.parent

TABLES = ROOT / "bench" / "published"
GOAL = 0.15
METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "samples_per_s")
COLUMN_SETTINGS = ("stack", "gathers", "overlap_comm")
"""What a strategy column may set of how its engine ran, beside its strategy's fields (module docstring)."""
SOURCE_READINGS: dict[str, Any] = {
    "stack": "pytorch", "flops": "model", "collectives": "flat", "outer_reduce": "boundary", "gathers": "bucket",
    "runner": "zerotune", "weight_sync": "gather", "loss": "torch", "kernels": "eager", "attention": None,
    "copies": False, "early_stop": False}
"""The ``[source]`` keys that change how a table is predicted, with their global defaults (what their absence gives;
``attention``'s is the stack's own kernel)."""
READINGS = ("quoted", "written", "defaults")
"""How a table's readings are taken (``settle_readings``): those with a quote (the main score and the band), all as
written, or none (``--defaults``)."""


class Reading(NamedTuple):
    """A per-table reading that differs from its default: its path (the ``[quotes]`` key that stands for it), value,
    and whether a quote stands for it."""

    path: str
    value: Any
    quoted: bool


def _flat_quotes(quotes: Any, where: str, prefix: str = "") -> dict[str, str]:
    """``[quotes]`` as dotted path -> text (a TOML key written without quotes around its dots nests: read it back)."""
    if not isinstance(quotes, dict):
        raise ValueError(f"{where}: quotes must be a table of reading path = \"quote — location\"")
    out: dict[str, str] = {}
    for key, text in quotes.items():
        path = f"{prefix}{key}"
        if isinstance(text, dict):
            out.update(_flat_quotes(text, where, f"{path}."))
        elif isinstance(text, str) and text.strip():
            out[path.removeprefix("source.")] = text
        else:
            raise ValueError(f"{where}: quotes.{path}={text!r}: must be a non-empty string (the quote and its "
                             f"location)")
    return out


def _reading_sites(data: dict[str, Any]) -> list[tuple[str, dict[str, Any], str, Any]]:
    """Every reading the table writes, in the order they settle: ``(path, the table holding it, key, default)``; a
    cluster's or column's default is the global one too (``_default_of``), a group's ``set`` field's and a level's bus
    bandwidth's is its absence."""
    source = data.get("source", {})
    sites = [(key, source, key, default) for key, default in SOURCE_READINGS.items() if key in source]
    for name, spec in data.get("clusters", {}).items():
        if "early_stop" in spec:
            sites.append((f"clusters.{name}.early_stop", spec, "early_stop", None))
        if "host" in spec:  # the host design NCCL's overheads are read for (``HOSTS``)
            sites.append((f"clusters.{name}.host", spec, "host", "unknown"))
        for level in spec.get("levels", []):
            sites += [(f"clusters.{name}.levels.{level['name']}.{f}", level, f, None)
                      for f in BUSBW_FIELDS if f in level]
    for name, spec in data.get("strategies", {}).items():
        sites += [(f"strategies.{name}.{key}", spec, key, None) for key in COLUMN_SETTINGS if key in spec]
    for i, group in enumerate(data.get("groups", [])):
        fields = group.get("set")
        if isinstance(fields, dict):
            sites += [(f"groups.{i}.set.{key}", fields, key, None) for key in fields]
    return sites


def _default_of(path: str, key: str, default: Any, source: dict[str, Any]) -> Any:
    """What the absence of ``key`` at ``path`` gives, once the ``[source]`` keys have settled."""
    if path == "attention":
        return STACK_ATTENTION.get(source.get("stack", SOURCE_READINGS["stack"]), "matmul")
    if path.startswith("clusters.") and key == "early_stop":
        return SOURCE_READINGS["early_stop"]
    if path.startswith("strategies."):
        return {"stack": SOURCE_READINGS["stack"], "gathers": SOURCE_READINGS["gathers"], "overlap_comm": True}[key]
    return default


def covers(quote: str, path: str) -> bool:
    """Whether a quote on ``quote`` stands for the reading at ``path``: the path itself or a table above it (a quote
    on ``strategies.zero3`` states how that column ran, on ``clusters.x.levels.node`` that level's bus bandwidths)."""
    return path == quote or path.startswith(quote + ".")


def settle_readings(data: dict[str, Any], mode: str = "quoted") -> tuple[dict[str, Any], list[Reading], list[str]]:
    """The table ``data`` with its readings taken as ``mode`` says (``READINGS``): a reading that differs from its
    default stands if a ``[quotes]`` entry covers it (``quoted``), always (``written``) or never (``defaults``); one
    that does not stand is removed, so it takes its default. Returns the settled table, every reading that differs
    from its default (``Reading.quoted``: whether a quote covers it; those not standing are what was dropped), and
    the quotes that cover no reading the table writes."""
    if mode not in READINGS:
        raise ValueError(f"readings={mode!r}: must be one of {list(READINGS)}")
    quotes = _flat_quotes(data.get("quotes", {}), "[quotes]")
    for name, spec in data.get("clusters", {}).items():  # a level may be named by its place, from 0 innermost
        for i, level in enumerate(spec.get("levels", [])):
            at = f"clusters.{name}.levels.{i}"
            quotes = {f"clusters.{name}.levels.{level['name']}{q[len(at):]}" if covers(at, q) else q: text
                      for q, text in quotes.items()}
    data = copy.deepcopy(data)
    readings: list[Reading] = []
    paths: list[str] = []
    for path, holder, key, default in _reading_sites(data):
        paths.append(path)
        value = holder[key]
        if value == _default_of(path, key, default, data.get("source", {})):
            continue
        quoted = any(covers(q, path) for q in quotes)
        readings.append(Reading(path, value, quoted))
        if mode == "defaults" or (mode == "quoted" and not quoted):
            if path.startswith(("strategies.", "clusters.")) and key in ("early_stop", *COLUMN_SETTINGS):
                holder[key] = _default_of(path, key, default, data.get("source", {}))  # not the table's own
            else:
                del holder[key]
    stray = sorted(q for q in quotes if not any(covers(q, p) for p in paths))
    return data, readings, stray


class RowId(NamedTuple):
    """The parts of a row id ``cluster/model/micro-batch/strategy``; a row of a group with ``accumulation`` M > 1
    writes its micro-batch ``MBSxM`` (``4x16``: 16 micro-batches of 4 sequences per optimizer step)."""

    cluster: str
    model: str
    mbs: int
    strategy: str
    accum: int = 1

    @classmethod
    def parse(cls, row_id: str) -> RowId:
        cluster, model, mbs, strategy = row_id.split("/")
        micro, _, accum = mbs.partition("x")
        return cls(cluster, model, int(micro), strategy, int(accum or 1))

    def __str__(self) -> str:
        batch = f"{self.mbs}x{self.accum}" if self.accum > 1 else str(self.mbs)
        return f"{self.cluster}/{self.model}/{batch}/{self.strategy}"


PUBLISHED_STAGE3 = "defaults"
"""What a published DeepSpeed ZeRO-3 run held its gathered parameters under (``Calibration.stage3_settings``):
DeepSpeed's own stage-3 prefetch, live and reuse settings, which no source here says it changed (zerotune's export
sets its own; a run by any other engine ignores them)."""


def build_cluster(name: str, spec: dict[str, Any], stack: str, rings: str, outer_reduce: str, gathers: str,
                  runner: str, copies: bool = False, weight_sync: str = "gather",
                  attention: str | None = None, early_stop: bool = False,
                  loss: str = "torch", kernels: str = "eager") -> tuple[ClusterSpec, Calibration]:
    """A table's cluster and the calibration its profiles give (a preset carries its own, run by ``runner``);
    ``attention``: the runs' attention kernel, None for the stack's (the preset's) own; ``early_stop``: its
    checkpointed blocks' backward stopped recomputing before their last matmul
    (``Calibration.recompute_early_stop``); ``loss``: the runs' loss kernel (``Calibration.loss_kernel``);
    ``kernels``: their blocks' memory-bound kernels (``Calibration.block_kernels``)."""
    if "preset" in spec:
        cluster = parse_cluster(spec["preset"])
        calib = dataclasses.replace(run_by(calibration_for(cluster), runner), weight_sync=weight_sync,
                                    stage3_settings=PUBLISHED_STAGE3, loss_kernel=loss, block_kernels=kernels)
        if attention is not None:  # the rate and the forward share of the kernel the table names
            calib = with_attention(calib, attention, device_key_of(cluster.device) or "")
        return cluster, calib
    levels_spec = tuple((lv["name"], lv["size"], lv["link"]) for lv in spec["levels"])
    links = tuple(link for _, _, link in levels_spec)
    # a source's own hardware notes: a link shared by fewer NICs than the profile's, a lower-power part, and the
    # bus bandwidth it measured on a level (Level.busbw_gbps: that level's collectives reach it, as on a user's)
    cluster = profile_cluster(name, spec["device"], levels_spec,
                              tuple(lv.get("gbps_per_rank") for lv in spec["levels"]))
    cluster = dataclasses.replace(cluster, peak_tflops=spec.get("peak_tflops", cluster.peak_tflops), levels=tuple(
        dataclasses.replace(lv, **{f: given.get(f) for f in BUSBW_FIELDS}) for lv, given in zip(
            cluster.levels, spec["levels"], strict=True)))
    calib = profile_calibration(f"{spec['device']} {stack} profile", spec["device"], links, stack, rings,
                                outer_reduce, host=spec.get("host", "unknown"), gathers=gathers, attention=attention,
                                fabric=spec.get("fabric", ""))
    return cluster, with_host_floor(dataclasses.replace(with_measured_links(calib, cluster), copies=copies,
                                                        weight_sync=weight_sync, recompute_early_stop=early_stop,
                                                        stage3_settings=PUBLISHED_STAGE3, loss_kernel=loss,
                                                        block_kernels=kernels))


def build_model(name: str, spec: dict[str, Any]) -> ModelSpec:
    return parse_model(spec["preset"]) if "preset" in spec else ModelSpec(name=name, **spec)


class Table:
    """One source: its rows (published values by id) and comparisons, and how to predict any id."""

    def __init__(self, path: Path, readings: str = "written") -> None:
        """``readings``: how its per-table readings are taken (``settle_readings``; the bench scores ``quoted``)."""
        self.path, self.name = path, path.stem
        data, self.readings, self.stray_quotes = settle_readings(tomllib.loads(path.read_text()), readings)
        self.reading_mode = readings
        self.source = data["source"]
        self.flops = self.source.get("flops", "model")
        self.stack = self.source.get("stack", "pytorch")
        self.role = self.source.get("role", "agreement")
        if self.role not in ("agreement", "calibration", "reference"):
            raise ValueError(f"{path.name}: source.role={self.role!r}: must be agreement, calibration or reference")
        self.metric = self._choice("metric", "", METRICS)
        self.scored = self._choice("scored", "all", ("all", "ratios"))
        self.rings = self._choice("collectives", "flat", RINGS)
        self.outer_reduce = self._choice("outer_reduce", "boundary", OUTER_REDUCE)
        self.gathers = self._choice("gathers", "bucket", GATHERS)
        self.runner = self._choice("runner", "zerotune", tuple(RUNNERS))
        self.weight_sync = self._choice("weight_sync", "gather", WEIGHT_SYNC)
        self.loss = self._choice("loss", "torch", LOSS_KERNELS)
        self.kernels = self._choice("kernels", "eager", BLOCK_KERNELS)
        # the kernel the table names, else its stack's own (attention.STACK_ATTENTION)
        self.named_attention = self.source.get("attention")
        self.attention = self._choice("attention", STACK_ATTENTION.get(self.stack, "matmul"), tuple(ATTENTION_KERNELS))
        self.copies = self._flag(self.source, "copies", "source")
        self.early_stop = self._flag(self.source, "early_stop", "source")
        self.cluster_specs: dict[str, dict[str, Any]] = data.get("clusters", {})
        for name, spec in self.cluster_specs.items():
            self._flag(spec, "early_stop", f"clusters.{name}")
        self.clusters = {k: self._build(k, self.stack, self.named_attention) for k in self.cluster_specs}
        self.models = {k: build_model(k, v) for k, v in data.get("models", {}).items()}
        self.strategies = data["strategies"]
        for name, spec in self.strategies.items():
            self._flag(spec, "overlap_comm", f"strategies.{name}", default=True)
        self.rows: dict[str, tuple[float, str]] = {}  # id -> (published value, caption)
        self.row_fields: dict[str, dict[str, Any]] = {}  # id -> its group's ``set``: fields every column takes
        self.compares: list[dict[str, Any]] = []
        columns = list(self.strategies)
        for i, group in enumerate(data.get("groups", [])):
            accumulation = group.get("accumulation", 1)
            if not isinstance(accumulation, int) or isinstance(accumulation, bool) or accumulation < 1:
                raise ValueError(f"{path.name}: groups[{i}].accumulation={accumulation!r}: must be a whole number "
                                 f">= 1 (micro-batches per optimizer step)")
            fields = group.get("set", {})
            if not isinstance(fields, dict) or {"preset", *COLUMN_SETTINGS} & set(fields):
                raise ValueError(f"{path.name}: groups[{i}].set={fields!r}: must be a table of strategy fields "
                                 f"(not preset, {', '.join(COLUMN_SETTINGS[:-1])} or {COLUMN_SETTINGS[-1]}: "
                                 f"those are a column's)")
            for model, mbs, *values in group["rows"]:
                present = [(c, v) for c, v in zip(columns, values, strict=False) if v != "-"]  # "-": no figure
                ids = [str(RowId(group["cluster"], model, mbs, column, accumulation)) for column, _ in present]
                for row_id, (_, value) in zip(ids, present, strict=True):
                    if row_id in self.rows:
                        raise ValueError(f"{path.name}: groups[{i}]: row {row_id} is already given by an earlier group")
                    self.rows[row_id] = (float(value), group["caption"])
                    if fields:
                        self.row_fields[row_id] = fields
                for row_id in ids[1:]:
                    self.compares.append({"of": row_id, "over": ids[0], "caption": group["caption"]})
        self.compares += data.get("compare", [])
        self._predicted: dict[str, dict[str, Any]] = {}

    def _build(self, cluster: str, stack: str, attention: str | None) -> tuple[ClusterSpec, Calibration]:
        """``cluster`` and its calibration as the table's runs ran (``build_cluster`` with every table setting), on
        ``stack`` with ``attention``."""
        return build_cluster(cluster, self.cluster_specs[cluster], stack, self.rings, self.outer_reduce, self.gathers,
                             self.runner, self.copies, self.weight_sync, attention, self._early_stop(cluster),
                             self.loss, self.kernels)

    def how(self) -> str:
        """How the table's engine ran, as its predictions charge it."""
        if all("preset" in spec for spec in self.cluster_specs.values()):
            return f"cluster presets, run by {self.runner}"
        sync = ", weights synced by a broadcast per owning rank" if self.weight_sync == "broadcast" else ""
        return (f"{self.stack} stack, {self.rings} rings, a gather per {self.gathers}, "
                f"outer reduction {'in backward' if self.outer_reduce == 'backward' else 'at the boundary'}{sync}")

    def _flag(self, spec: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
        """``spec[key]``, a boolean (``default`` when absent); anything else is refused by name."""
        value = spec.get(key, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.path.name}: {where}.{key}={value!r}: must be true or false")
        return value

    def _early_stop(self, cluster: str) -> bool:
        """Whether the checkpointed blocks of ``cluster``'s runs stopped recomputing early: its own setting, else
        the table's."""
        return self.cluster_specs[cluster].get("early_stop", self.early_stop)

    def _choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.source.get(key, default)
        if value not in allowed:
            raise ValueError(f"{self.path.name}: source.{key}={value!r}: must be one of {list(allowed)}")
        return str(value)

    def predict(self, row_id: str) -> dict[str, Any]:
        """The prediction for ``cluster/model/micro-batch[xM]/strategy``, with the table's metric as ``value``."""
        if row_id not in self._predicted:
            key = RowId.parse(row_id)
            cluster, calib = self.clusters[key.cluster]
            model = self.models[key.model]
            fields = {**self.strategies[key.strategy], **self.row_fields.get(row_id, {})}
            if "stack" in fields:  # a column whose engine ran other kernels than the table's
                stack = fields.pop("stack")
                cluster, calib = self._build(key.cluster, stack, STACK_ATTENTION.get(stack, self.named_attention))
            if "gathers" in fields:  # a column whose engine fetches otherwise than the table's
                gathers = fields.pop("gathers")
                if gathers != calib.gathers:
                    calib = with_host_floor(dataclasses.replace(calib, gathers=gathers))
            if not fields.pop("overlap_comm", True):  # a column whose collectives ran on the compute stream
                calib = dataclasses.replace(calib, overlap=0.0)
            s = build_strategy(fields, cluster, micro_batch_size=key.mbs)
            p = predict(model, cluster, s, calibration=calib,
                        global_batch=cluster.world_size * key.mbs * key.accum)
            if self.metric == "tokens_per_s_per_gpu":
                value = p["tokens_per_s"] / p["world_size"]
            elif self.metric == "samples_per_s":
                value = p["tokens_per_s"] / model.seq_len
            else:
                # hardware FLOPs count each fully checkpointed block's forward again: 4/3 when every block is
                redo = s.checkpointed_blocks(model.layers) / model.layers if s.recompute == "full" else 0.0
                value = p["tflops_per_rank"] * (1 + redo / 3 if self.flops == "hardware" else 1)
            self._predicted[row_id] = {**p, "value": value, "checkpointing": s.checkpointing}
        return self._predicted[row_id]

    def device(self, row_id: str) -> str:
        """The device of the row's cluster (``ClusterSpec.device``: what a prediction's band is matched on)."""
        return self.clusters[RowId.parse(row_id).cluster][0].device

    def value(self, row_id: str) -> float | None:
        return self.rows[row_id][0] if row_id in self.rows else None


def outlier_points(tables: list[Table]) -> list[scoreboard.Point]:
    """Every table's rows as the outlier rule reads them (``scoreboard.outliers``): a series is one table's model,
    strategy (with its group's ``set``) and machines (device and levels, their sizes aside); rows of a metric of the
    whole cluster (samples per second) form none."""
    points = []
    for t in tables:
        if t.metric == "samples_per_s":
            continue
        for row_id, (value, _) in t.rows.items():
            key = RowId.parse(row_id)
            cluster = t.clusters[key.cluster][0]
            machines = (cluster.device, tuple((lv.name, lv.bandwidth_gbps, lv.latency_us) for lv in cluster.levels))
            fields = tuple(sorted(t.row_fields.get(row_id, {}).items()))
            points.append(scoreboard.Point(f"{t.name}:{row_id}", (t.name, key.model, key.strategy, fields, machines),
                                           cluster.world_size, key.mbs, key.mbs * key.accum, value))
    return points


def configurations(t: Table, skip: set[str]) -> list[scoreboard.Configuration]:
    """The table's settings measured with several strategies (``scoreboard``'s module docstring): its rows by cluster,
    model, micro-batch and accumulation, joined by the ``[[compare]]`` ratios of two strategies on one of them (a
    ratio reaching a strategy without a row places it from the other; a setting only ratios give starts from 1).
    Rows in ``skip`` (outliers) are left out, and every ratio that reads one."""
    published: dict[tuple[str, str, int, int], dict[str, float]] = {}
    for row_id, (value, _) in t.rows.items():
        if row_id not in skip:
            key = RowId.parse(row_id)
            published.setdefault((key.cluster, key.model, key.mbs, key.accum), {})[key.strategy] = value
    pending = []
    for c in t.compares:
        of, over = RowId.parse(c["of"]), RowId.parse(c["over"])
        if (of.cluster, of.model, of.mbs, of.accum) != (over.cluster, over.model, over.mbs, over.accum) \
                or of.strategy == over.strategy or {c["of"], c["over"]} & skip:
            continue  # one strategy at two scales, or two settings: no configuration
        ratio = c.get("value")
        if ratio is None:
            ratio = t.value(c["of"]) / t.value(c["over"])  # type: ignore[operator]
        pending.append(((of.cluster, of.model, of.mbs, of.accum), of.strategy, over.strategy, float(ratio)))
    while pending:  # place each ratio's strategies from the ones already placed
        progress, rest = False, []
        for key, a, b, ratio in pending:
            known = published.setdefault(key, {})
            if a in known and b not in known:
                known[b] = known[a] / ratio
            elif b in known and a not in known:
                known[a] = known[b] * ratio
            elif a not in known and b not in known:
                rest.append((key, a, b, ratio))
                continue
            progress = True  # placed, or both already placed: the ratio repeats what the rows give
        if not progress:  # a setting that only ratios give: start it from 1 (a ratio that meets no row of a setting
            key, a, b, ratio = rest[0]  # the rows give is not placed: it has no common scale with them)
            if not published[key]:
                published[key].update({b: 1.0, a: ratio})
            rest = rest[1:]
        pending = rest
    out = []
    for (cluster, model, mbs, accum), values in sorted(published.items()):
        if len(values) < 2:
            continue
        ids = {s: str(RowId(cluster, model, mbs, s, accum)) for s in values}
        out.append(scoreboard.Configuration(t.name, str(RowId(cluster, model, mbs, "*", accum)),
                                            t.predict(next(iter(ids.values())))["world_size"], values,
                                            {s: t.predict(i)["value"] for s, i in ids.items()}))
    return out


def evaluate(tables: list[Table]) -> dict[str, Any]:
    """Every row and ratio predicted, the outliers found before scoring, and the scores: the ranking (primary), the
    error by band (secondary), the summary, and the band ``model_error.json`` serves."""
    outlier, unexplained = scoreboard.outliers(outlier_points(tables))  # "table:row id" -> the ids contradicting it
    rows, ratios = [], []
    for t in tables:
        for row_id, (published, caption) in t.rows.items():
            p = t.predict(row_id)
            b = p["breakdown"]
            role = t.role if t.scored == "all" else "reference"  # a ratios-only source's figures are shown
            rows.append({"table": t.name, "role": role, "id": row_id, "caption": caption, "metric": t.metric,
                         "gpus": p["world_size"], "device": t.device(row_id),
                         "published": published, "predicted": p["value"], "error": p["value"] / published - 1,
                         "step_s": p["step_time_s"], "compute_s": b["compute_s"],
                         "exposed_comm_s": b["exposed_comm_s"], "slowdown_s": b["overlap_slowdown_s"],
                         "boundary_s": b["boundary_s"], "feasible": p["feasible"],
                         "peak_over_memory": p["memory_bytes"]["peak"] / (p["memory_bytes"]["peak"]
                                                                          + p["headroom_bytes"]),
                         "peak_over_capacity": p["memory_bytes"]["peak"] / (
                             p["memory_bytes"]["peak"] + p["headroom_bytes"] + p["memory_reserve"]["total_bytes"]),
                         "checkpointing": p["checkpointing"],
                         "outlier": [i.split(":", 1)[1] for i in outlier.get(f"{t.name}:{row_id}", [])] or None})
        for c in t.compares:
            published = c.get("value")
            if published is None:
                published = t.value(c["of"]) / t.value(c["over"])  # type: ignore[operator]
            predicted = t.predict(c["of"])["value"] / t.predict(c["over"])["value"]
            gpus = max(t.predict(c["of"])["world_size"], t.predict(c["over"])["world_size"])
            reads = [i for i in (c["of"], c["over"]) if f"{t.name}:{i}" in outlier]
            ratios.append({"table": t.name, "role": t.role, "of": c["of"], "over": c["over"], "gpus": gpus,
                           "device": t.device(c["of"]), "explicit": "value" in c,
                           "caption": c.get("caption", ""), "published": published, "predicted": predicted,
                           "error": predicted / published - 1, "outlier": reads or None})
    scored = [r for r in rows if r["role"] == "agreement" and not r["outlier"]]
    scored_ratios = [r for r in ratios if r["role"] == "agreement" and not r["outlier"]]
    own_ratios = scoreboard.dedup(scored_ratios, {(r["table"], r["id"]) for r in scored})
    items = scored + own_ratios  # each published figure once: a ratio of two scored rows is theirs
    errors = [abs(r["error"]) for r in items] or [math.nan]
    by_table: dict[str, list[int]] = {}  # table -> [within the goal, scored]
    for r in items:
        tally = by_table.setdefault(r["table"], [0, 0])
        tally[0] += abs(r["error"]) <= GOAL
        tally[1] += 1
    configs = [c for t in tables if t.role == "agreement" for c in configurations(
        t, {i.split(":", 1)[1] for i in outlier if i.startswith(f"{t.name}:")})]
    calibration = [r for r in rows if r["role"] == "calibration"]
    return {"rows": rows, "ratios": ratios,
            "error": model_error(tables, scored, scored_ratios, calibration),
            "ranking": scoreboard.ranking(configs),
            "configurations": [c._asdict() for c in configs],
            "by_band": scoreboard.error_by_band(items),
            "outliers": {"rows": dict(sorted(outlier.items())), "unexplained": unexplained},
            "readings": {t.name: {"dropped": [[r.path, r.value] for r in t.readings if t.reading_mode == "defaults"
                                              or (t.reading_mode == "quoted" and not r.quoted)],
                                  "quoted": [r.path for r in t.readings if r.quoted],
                                  "stray_quotes": t.stray_quotes} for t in tables},
            "summary": {"rows": len(scored), "ratios": len(own_ratios),
                        "repeats": len(scored_ratios) - len(own_ratios),
                        "outliers": sum(bool(r["outlier"]) for r in rows if r["role"] == "agreement"),
                        "calibration_rows": sum(r["role"] != "agreement" for r in rows + ratios),
                        "within_goal": sum(e <= GOAL for e in errors), "median_abs_error": statistics.median(errors),
                        "max_abs_error": max(errors), "by_table": dict(sorted(by_table.items()))}}


def is_scaling(ratio: dict[str, Any]) -> bool:
    """A comparison of one strategy column at two scales (weak scaling), not of two strategies."""
    return RowId.parse(ratio["of"]).strategy == RowId.parse(ratio["over"]).strategy


def model_error(tables: list[Table], rows: list[dict[str, Any]], ratios: list[dict[str, Any]],
                calibration: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What ``zerotune/costmodel/error.py`` serves: the bands of the scored absolute figures, of the
    comparisons of two strategies (a decision's error) and of one strategy's scaling (median and 90th
    percentile of |error|), and every scored item with the GPUs it ran on, from which a prediction reads the
    band at its own scale. Scaling ratios are kept apart: the same strategy at two sizes is an easier
    ratio than two strategies side by side, and would narrow the band a recommendation's margin is held to.

    Leave one table out (``error.py``): the rows of a table a profile constant was set from (``role =
    "calibration"``: the source runs ``rebase.py`` re-bases on, ``hardware.SOURCE_RUNS`` from ``ibm_fsdp.toml``, and
    the FlashAttention-2 figure from ``flash_attention2.toml``) are kept as items with their table, and ``held_out``
    names those tables: a band never reads them, since each is scored with the constant it set."""
    def items(group: list[dict[str, Any]]) -> list[list]:
        return [[r["gpus"], round(r["error"], 4), r["device"], r["table"]] for r in group]
    calibration = calibration or []
    pairs = [r for r in ratios if not is_scaling(r)]
    scaling = [r for r in ratios if is_scaling(r)]
    return {"rows": band_of([r["error"] for r in rows]), "comparisons": band_of([r["error"] for r in pairs]),
            "scaling": band_of([r["error"] for r in scaling]),
            "tables": sorted(t.name for t in tables if t.role == "agreement"),
            "held_out": {t.name: "a profile constant was set from it (role = calibration)" for t in tables
                         if t.role == "calibration" and any(r["table"] == t.name for r in calibration)},
            "items": {"rows": items(rows + calibration), "comparisons": items(pairs), "scaling": items(scaling)},
            "checkpointing": checkpointing_lean(rows),
            "collectives": collectives_error()}


def checkpointing_lean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How the model's figures for (fully) checkpointed runs lean against its figures for uncheckpointed ones,
    within the tables that measured both (so that one table's cluster, software and counting are common to both sides):
    each such table's median signed error of its checkpointed rows and of its uncheckpointed ones, and the ratio
    of the two, ``(1 + checkpointed) / (1 + uncheckpointed) - 1``: how far a predicted comparison of a
    checkpointed configuration with an uncheckpointed one sat from the published one. ``lean`` is the median of
    the tables' ratios (negative: the model favours the uncheckpointed side). Nothing is corrected with it: it
    is stated beside a decision that turns on checkpointing (``tuner.choice``)."""
    by_table: dict[str, dict[str, list[float]]] = {}
    for r in rows:  # full checkpointing against none: selective or partial checkpointing is neither side
        sides = by_table.setdefault(r["table"], {"none": [], "full": [], "selective": [], "some blocks": []})
        sides[r["checkpointing"]].append(r["error"])
    tables = []
    for name, sides in sorted(by_table.items()):
        if sides["full"] and sides["none"]:
            on, off = statistics.median(sides["full"]), statistics.median(sides["none"])
            tables.append({"table": name, "checkpointed": [len(sides["full"]), round(on, 4)],
                           "uncheckpointed": [len(sides["none"]), round(off, 4)],
                           "ratio": round((1 + on) / (1 + off) - 1, 4)})
    return {"lean": round(statistics.median(t["ratio"] for t in tables), 4) if tables else None,
            "tables": tables}


def collectives_error() -> dict[str, Any]:
    """How much slower each library's flat rings on each fabric ran than its fabric law charges them (``fabrics``:
    rows on the node design the law was measured on), by GPU count: the median over the sizes and collectives measured
    (``bench/collectives_at_scale.py``), what a prediction of flat rings at that scale should expect beyond its band."""
    sys.path.insert(0, str(ROOT / "bench"))
    import collectives_at_scale as bench  # noqa: PLC0415 (a sibling bench script, not a package)

    items = bench.rows(sorted(bench.TABLES.glob("*.toml")))
    summary = bench.summary(items)
    out: dict[str, Any] = {"source": "bench/collectives_at_scale.py (" + ", ".join(sorted({r["table"] for r in items}))
                           + ": bench/published/collectives), after the fabric laws of zerotune/costmodel/fabrics.py",
                           "measured_over_predicted": {}}
    for s in summary:  # what a preset's calibration is charged: the rows its fabric's law charges
        if s["law"]:
            out["measured_over_predicted"].setdefault(s["fabric"], []).append([s["gpus"], s["measured_over_predicted"]])
    return out


RANKING_GOALS = {"pairs": 0.95, "picked": (34, 36), "regret_median": 0.0, "regret_p90": 0.03}
"""The issue's goals for the ranking: 95% of pairs in order in every band, the published winner in 34 of 36
configurations (the count the issue was written against; the tables give their own), regret median 0, p90 3%."""
ERROR_GOALS = {"median": 0.10, "misses": 0.20, "one_side": 0.60}
"""The issue's goals for the error at 384 GPUs and more: median |error| at most 10%, at most 20% of items outside
±15%, no more than 60% of the misses on one side."""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def amsp_plans(result: dict[str, Any]) -> list[dict[str, Any]]:
    """AMSP's plan against the MiCS plan on AMSP's own engine at 1,024 GPUs (§VI-D.1: published 1.30 / 1.10 / 1.13):
    the table's ratios with a value of their own."""
    return [r for r in result["ratios"] if r["table"] == "amsp_paper" and r["explicit"] and r["gpus"] >= 1024]


def ranking_lines(result: dict[str, Any]) -> list[str]:
    """The primary score's lines, one per band, and the total."""
    lines = []
    total = {"pairs_in_order": 0, "pairs": 0, "picked": 0, "configurations": 0}
    for label, band in result["ranking"].items():
        for k in total:
            total[k] += band[k]
        pairs = band["pairs_in_order"] / band["pairs"] if band["pairs"] else None
        lines.append(f"{label:>9} GPUs: pairs in order {band['pairs_in_order']}/{band['pairs']} ({_pct(pairs)}), "
                     f"winners picked {band['picked']}/{band['configurations']}, regret median "
                     f"{_pct(band['regret_median'])} p90 {_pct(band['regret_p90'])}")
    lines.append(f"{'all':>9} GPUs: pairs in order {total['pairs_in_order']}/{total['pairs']}, winners picked "
                 f"{total['picked']}/{total['configurations']}")
    return lines


def error_lines(result: dict[str, Any]) -> list[str]:
    """The secondary score's lines, one per band."""
    lines = []
    for label, band in result["by_band"].items():
        share = band["misses"] / band["count"] if band["count"] else None
        lines.append(f"{label:>9} GPUs: {band['count']} items, median |error| {_pct(band['median'])} p90 "
                     f"{_pct(band['p90'])}, outside ±{GOAL:.0%} {band['misses']} ({_pct(share)}): "
                     f"{band['too_fast']} too fast, {band['too_slow']} too slow")
    return lines


def _print_beside(lines_of: Any, result: dict[str, Any], defaults: dict[str, Any] | None) -> None:
    """Each line of ``lines_of(result)``, with the same line of ``defaults`` (every reading at its default) under it."""
    beside = lines_of(defaults) if defaults is not None else []
    for i, line in enumerate(lines_of(result)):
        print(f"   {line}" + (f"\n      every reading at its default: {beside[i].split(': ', 1)[1]}" if beside else ""))


def print_scores(result: dict[str, Any], defaults: dict[str, Any] | None = None) -> None:
    """The primary score (the ranking), the plan ratios and the goals, then the secondary (the error), with the score
    of every reading at its default beside each where ``defaults`` is given; then the outliers and the readings
    dropped for want of a quote."""
    print(f"RANKING (primary): within each configuration a source measured several strategies on, pairs whose "
          f"published gap is >= {scoreboard.GAP:.0%}; the winner (a strategy within {scoreboard.GAP:.0%} of the "
          f"published best counts); regret = published throughput lost by running the model's first")
    _print_beside(ranking_lines, result, defaults)
    configs = sum(b["configurations"] for b in result["ranking"].values())
    print(f"   goals: >= {RANKING_GOALS['pairs']:.0%} of pairs in order in every band; the winner in >= "
          f"{RANKING_GOALS['picked'][0]} of {RANKING_GOALS['picked'][1]} configurations (the tables give {configs}: "
          f">= {math.ceil(configs * RANKING_GOALS['picked'][0] / RANKING_GOALS['picked'][1])} of them); regret "
          f"median {RANKING_GOALS['regret_median']:.0%}, p90 <= {RANKING_GOALS['regret_p90']:.0%}")
    missed = [c for c in result["configurations"] if not scoreboard.picked(c["published"], c["predicted"])]
    if missed:
        print(f"   configurations whose published winner the model misses ({len(missed)}):")
        for c in missed:
            best = max(c["published"], key=c["published"].get)
            mine = scoreboard.model_winner(c["predicted"])
            print(f"      {c['table']}:{c['key']} ({c['gpus']} GPUs): published {best}, model {mine}, regret "
                  f"{scoreboard.regret(c['published'], c['predicted']):.1%}")
    plans = amsp_plans(result)
    if plans:
        print("   AMSP's plan over MiCS's plan on AMSP's engine, 1,024 GPUs (§VI-D.1; goal: the published side of 1):")
        for r in plans:
            side = "right" if (r["predicted"] - 1) * (r["published"] - 1) > 0 else "WRONG"
            print(f"      {RowId.parse(r['of']).model:<10} published {r['published']:.2f}, predicted "
                  f"{r['predicted']:.2f}: {side} side of 1")
    print(f"ERROR (secondary): |predicted / published - 1| of every scored row and of each ratio that is not two "
          f"scored rows' ({result['summary']['repeats']} ratios repeat scored rows and count once, through them); "
          f"too fast = predicted above published")
    _print_beside(error_lines, result, defaults)
    print(f"   goals at >= 384 GPUs: median |error| <= {ERROR_GOALS['median']:.0%}, <= {ERROR_GOALS['misses']:.0%} "
          f"outside ±{GOAL:.0%}, <= {ERROR_GOALS['one_side']:.0%} of misses on one side")
    found = result["outliers"]
    print(f"OUTLIERS (bench/scoreboard.py's rule, before scoring: a row faster per GPU by more than "
          f"{scoreboard.OUTLIER_TOLERANCE:.0%} than a row of its series doing as much work per GPU on as few GPUs, "
          f"where it is in every such contradiction): {len(found['rows'])}, left out of every score")
    for row, by in found["rows"].items():
        print(f"   {row}  (contradicted by {', '.join(i.split(':', 1)[1] for i in by)})")
    for ids in found["unexplained"]:
        print(f"   a series no single row explains, scored as it is: {', '.join(ids)}")
    dropped = {name: r["dropped"] for name, r in result["readings"].items() if r["dropped"]}
    quoted = sum(len(r["quoted"]) for r in result["readings"].values())
    print(f"READINGS: {quoted} per-table readings stand on a quote; {sum(map(len, dropped.values()))} differ from "
          f"their default with no quote and take the default (the main score and the band; --as-written keeps them):")
    for name, readings in dropped.items():
        print(f"   {name}: " + ", ".join(f"{path} = {json.dumps(value)}" for path, value in readings))
    for name, r in result["readings"].items():
        if r["stray_quotes"]:
            print(f"   {name}: quotes that cover no reading the table writes: {', '.join(r['stray_quotes'])}")


def _print(tables: list[Table], result: dict[str, Any]) -> None:
    for t in tables:
        role = {"agreement": "", "calibration": "  [a source of the profiles' constants: not scored]",
                "reference": "  [runs the model does not express: not scored]"}[t.role]
        if t.role == "agreement" and t.scored == "ratios":
            role = "  [its figures are printed, its ratios scored]"
        print(f"\n== {t.name}: {t.source['title']}{role}\n   {t.source['url']}\n   {t.source['cluster']}"
              f"\n   run as: {t.how()}")
        print(f"   {'row (cluster/model/micro-batch/strategy)':<42}{'published':>10}{'predicted':>10}{'error':>8}"
              f"{'step s':>8}{'compute':>8}{'exposed':>8}{'slowdn':>8}{'bound.':>8}")
        for r in (r for r in result["rows"] if r["table"] == t.name):
            flag = "  outlier" if r["outlier"] else "" if abs(r["error"]) <= GOAL or r["role"] != "agreement" \
                else "  *"
            print(f"   {r['id']:<42}{r['published']:>10.4g}{r['predicted']:>10.4g}{r['error']:>+8.0%}"
                  f"{r['step_s']:>8.2f}{r['compute_s']:>8.2f}{r['exposed_comm_s']:>8.2f}{r['slowdown_s']:>8.2f}"
                  f"{r['boundary_s']:>8.2f}{flag}")
        for r in (r for r in result["ratios"] if r["table"] == t.name):
            flag = "  reads an outlier" if r["outlier"] else "" if abs(r["error"]) <= GOAL \
                or r["role"] != "agreement" else "  *"
            of, over = RowId.parse(r["of"]), RowId.parse(r["over"])
            label = f"{of.strategy}@{of.cluster} / {over.strategy}@{over.cluster}"
            print(f"   ratio {label:<36}{r['published']:>10.3f}{r['predicted']:>10.3f}{r['error']:>+8.0%}"
                  f"   {r['caption']}{flag}")
    s = result["summary"]
    print(f"\n{s['rows']} rows and {s['ratios']} ratios scored ({s['repeats']} more ratios repeat scored rows and "
          f"count once, {s['outliers']} outlier rows are left out, {s['calibration_rows']} more are printed, not "
          f"scored: sources of the profiles' constants, or runs the model does not express): "
          f"{s['within_goal']} of {s['rows'] + s['ratios']} within "
          f"±{GOAL:.0%} (goal: all); median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}  "
          f"(* = scored and outside the goal; seconds are per optimizer step: compute, exposed communication, "
          f"slow-down of compute beside collectives, step boundary)")
    print("within the goal, by table: " + ", ".join(f"{name} {ok}/{n}" for name, (ok, n) in s["by_table"].items()))
    err = result["error"]
    items = {kind: band_items(err, kind) for kind in err["items"]}
    print("the band a prediction carries, by its scale (zerotune/costmodel/error.py; leave one table out: items of "
          f"the tables a profile constant was set from held out: {', '.join(sorted(err['held_out'])) or 'none'}):")
    for label, lo, hi in scoreboard.BANDS:
        near = [it for it in err["items"]["rows"] + err["items"]["comparisons"] if lo <= it[0] <= hi]
        held = sum(1 for it in near if it[3] in err["held_out"])
        print(f"   {label:>9} GPUs: {len(near) - held} items read, {held} held out")
    for gpus in (16, 128, 384, 1024):
        rows, row_span = at_scale(items["rows"], gpus)
        pairs, pair_span = at_scale(items["comparisons"], gpus)
        print(f"   {gpus:>5} GPUs: figures median {rows['median']:.1%} p90 {rows['p90']:.1%} ({rows['count']} on "
              f"{row_span[0]}-{row_span[1]}), comparisons of two strategies median {pairs['median']:.1%} p90 "
              f"{pairs['p90']:.1%} ({pairs['count']} on {pair_span[0]}-{pair_span[1]})"
              if row_span and pair_span else f"   {gpus}: -")
    scaling = result["error"]["scaling"]
    if scaling["count"]:
        print(f"   one strategy at two scales (weak scaling; not a decision's band): median {scaling['median']:.1%} "
              f"p90 {scaling['p90']:.1%} ({scaling['count']})")
    print("by device, all scales (a prediction also reads its device's items in its scale's range, if 3 or more, "
          "and keeps the wider band):")
    for device in sorted({it[2] for group in items.values() for it in group}):
        parts = [f"{label} median {b['median']:.1%} p90 {b['p90']:.1%} ({b['count']})"
                 for label, b in (("figures", on_device(items["rows"], device, None)),
                                  ("comparisons", on_device(items["comparisons"], device, None))) if b]
        print(f"   {device}: {', '.join(parts) or 'fewer than 3 items'}")
    over = [r for r in result["rows"] if r["role"] == "agreement" and not r["feasible"]]
    scored = sum(r["role"] == "agreement" for r in result["rows"])
    if over:  # every published row ran, so each of these is the memory model's error, not the run's
        bare = sum(r["peak_over_capacity"] > 1 for r in over)
        print(f"memory: every published run fit its GPUs; the model puts {len(over)} of the {scored} scored rows "
              f"over their memory beside the runtime's reserve (predicted peak over capacity less the reserve), "
              f"{bare} over the capacity itself (peak over capacity):")
        for name in sorted({r["table"] for r in over}):
            mine = [r["peak_over_memory"] for r in over if r["table"] == name]
            itself = [r["peak_over_capacity"] for r in over if r["table"] == name]
            print(f"   {name:<22} {len(mine):>3} rows, {min(mine):.2f}-{max(mine):.2f} beside the reserve, "
                  f"{min(itself):.2f}-{max(itself):.2f} of the capacity")
    elif scored:
        print(f"memory: every published run fit its GPUs, and the model puts each of the {scored} scored rows "
              "within its memory beside the runtime's reserve")
    lean = result["error"]["checkpointing"]
    if lean["lean"] is not None:
        print(f"checkpointed against uncheckpointed runs, in the tables that measured both (median signed error of "
              f"each side; nothing corrected): lean {lean['lean']:+.1%}, the median of")
        for t in lean["tables"]:
            (n_on, on), (n_off, off) = t["checkpointed"], t["uncheckpointed"]
            print(f"   {t['table']:<22} checkpointed {on:+.1%} ({n_on}), uncheckpointed {off:+.1%} ({n_off}): "
                  f"{t['ratio']:+.1%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="append", help="a table's name (file stem); default: all")
    ap.add_argument("--json", action="store_true", help="print the rows and ratios as JSON")
    ap.add_argument("--write-error", action="store_true",
                    help=f"store the model's error bands in {ERROR_FILE} (all tables)")
    ap.add_argument("--defaults", action="store_true",
                    help="also score every table with every per-table reading at its default, printed beside")
    ap.add_argument("--as-written", action="store_true",
                    help="score every reading as written, quoted or not (not the main score: what the unquoted carry)")
    args = ap.parse_args(argv)
    paths = sorted(TABLES.glob("*.toml"))
    if args.table:
        unknown = sorted(set(args.table) - {p.stem for p in paths})
        if unknown:
            print(f"published.py: --table={unknown[0]}: no such table; known: {[p.stem for p in paths]}",
                  file=sys.stderr)
            return 2
        paths = [p for p in paths if p.stem in args.table]
    if args.write_error and (args.table or args.as_written):
        print("published.py: --write-error scores every table with its quoted readings; leave out --table and "
              "--as-written", file=sys.stderr)
        return 2
    tables = [Table(p, "written" if args.as_written else "quoted") for p in paths]
    result = evaluate(tables)
    defaults = evaluate([Table(p, "defaults") for p in paths]) if args.defaults else None
    if defaults is not None:
        result["defaults"] = {k: defaults[k] for k in ("ranking", "by_band", "summary", "readings")}
    if args.write_error:
        ERROR_FILE.write_text(json.dumps(result["error"], indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_scores(result, defaults)
        _print(tables, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
