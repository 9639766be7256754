"""The request a job makes: its cluster from the flags, ``ZEROTUNE_*`` and ``SLURM_*``, its model, the body
with the service's defaults filled in (the request's fields, their names and defaults: ``core.fields``, which is
standard library only too), and the key equal requests share."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from zerotune.core.cluster_presets import PRESET_DEVICES_PER_NODE  # the presets' own table, standard library only
from zerotune.core.fields import ALWAYS, OPTIONS, check, to_body
from zerotune.errors import SpecError, UsageError

DEEPSPEED_DEFAULT_BUCKETS = {"reduce_bucket_mb": 1000.0, "allgather_bucket_mb": 100.0, "prefetch_buckets": 1}
"""The fallback's buckets: DeepSpeed's defaults (reduce_bucket_size 5e8 and stage3_prefetch_bucket_size
5e7 16-bit elements, DESIGN.md §7) in the Strategy's MB of 16-bit values."""

def _positive_int(env: Mapping[str, str], name: str, rule: str) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise UsageError(name, raw, f"must be a positive integer ({rule})")
    return int(text)


def slurm_nodes(env: Mapping[str, str]) -> tuple[str, int] | None:
    """``(variable, nodes)`` of the allocation: ``SLURM_JOB_NUM_NODES``, else ``SLURM_NNODES``; None outside Slurm."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        nodes = _positive_int(env, name, "the number of nodes in the job's allocation")
        if nodes is not None:
            return name, nodes
    return None


def job_id(env: Mapping[str, str]) -> str | None:
    """``$SLURM_JOB_ID`` (digits), or None outside Slurm."""
    raw = env.get("SLURM_JOB_ID")
    if raw is None:
        return None
    if not raw.strip().isdigit():
        raise UsageError("SLURM_JOB_ID", raw, "must be a job number (digits)")
    return raw.strip()


def read_json_file(field: str, path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(field, path, f"cannot read a JSON file: {exc}") from None


def _is_file_arg(text: str) -> bool:
    return text.endswith(".json") or os.path.isfile(text)


def resolve_cluster(cluster: str | None, env: Mapping[str, str], use_slurm: bool = True) -> str | dict[str, Any]:
    """The request's ``cluster``: a preset string (``frontier:48``, ``local:8x2``) or an explicit ClusterSpec.

    Inside a Slurm allocation the node count (the outermost level) comes from Slurm: ``frontier``
    becomes ``frontier:$SLURM_JOB_NUM_NODES``, ``frontier:N`` must agree with it, a JSON ClusterSpec's
    outermost level is set to it, ``local:AxB`` becomes ``local:AxNODES``. Without ``cluster`` the name is
    ``$SLURM_CLUSTER_NAME`` when that is a preset. ``$SLURM_GPUS_ON_NODE`` (set only when the job
    asked for GPUs) must equal the preset's ranks per node: zerotune plans for whole nodes.
    """
    slurm = slurm_nodes(env) if use_slurm else None
    gpus = _positive_int(env, "SLURM_GPUS_ON_NODE", "GPUs on this node") if use_slurm else None
    if not cluster:
        name = env.get("SLURM_CLUSTER_NAME", "") if use_slurm else ""
        if not name:
            raise UsageError("cluster", None, "not given: pass --cluster (frontier, dgx-h100, local:AxB or a JSON "
                                              "file) or set ZEROTUNE_CLUSTER")
        if name.lower() not in PRESET_DEVICES_PER_NODE:
            raise UsageError("SLURM_CLUSTER_NAME", name, f"is not a cluster preset {sorted(PRESET_DEVICES_PER_NODE)}; "
                                                         f"pass --cluster NAME or set ZEROTUNE_CLUSTER")
        cluster = name.lower()
    cluster = cluster.strip()
    if _is_file_arg(cluster):
        spec = read_json_file("cluster", cluster)
        levels = spec.get("levels") if isinstance(spec, dict) else None
        if not isinstance(levels, list) or not levels or not all(isinstance(lv, dict) for lv in levels):
            raise UsageError("cluster", cluster, "a JSON ClusterSpec needs a non-empty list of levels")
        if slurm is not None:
            levels[-1] = {**levels[-1], "size": slurm[1]}
        if gpus is not None and len(levels) > 1:
            per_node = math.prod(lv["size"] if isinstance(lv.get("size"), int) else 1 for lv in levels[:-1])
            _check_gpus(gpus, per_node, f"the ClusterSpec in {cluster}")
        return spec
    name, sep, size = cluster.partition(":")
    if name == "local":
        sizes = size.split("x") if size else []
        if sizes and not all(s.isdigit() and int(s) >= 1 for s in sizes):
            raise UsageError("cluster", cluster, "local clusters are written local:AxB with sizes >= 1, innermost "
                                                 "first")
        if slurm is not None:
            if not sizes:
                if gpus is None:
                    raise UsageError("cluster", cluster, "give local:AxN (A ranks per node), or ask Slurm for GPUs "
                                                         "so that SLURM_GPUS_ON_NODE sets A")
                sizes = [str(gpus), str(slurm[1])]
            elif len(sizes) == 1:
                sizes = [sizes[0], str(slurm[1])]
            else:
                _check_size(cluster, int(sizes[-1]), slurm)
                sizes[-1] = str(slurm[1])
        elif not sizes:
            raise UsageError("cluster", cluster, "the sizes are unknown: write local:AxB, or run inside a Slurm "
                                                 "allocation")
        if gpus is not None and len(sizes) > 1:
            _check_gpus(gpus, math.prod(int(s) for s in sizes[:-1]), f"local:{'x'.join(sizes)}")
        return "local:" + "x".join(sizes)
    if sep and not (size.isdigit() and int(size) >= 1):
        raise UsageError("cluster", cluster, "the size after ':' is the number of nodes, a positive integer")
    if slurm is not None:
        if sep:
            _check_size(cluster, int(size), slurm)
        nodes = slurm[1]
    elif sep:
        nodes = int(size)
    else:
        raise UsageError("cluster", cluster, f"the node count is unknown: write {name}:N, or run inside a Slurm "
                                             f"allocation (SLURM_JOB_NUM_NODES)")
    if gpus is not None and name in PRESET_DEVICES_PER_NODE:
        _check_gpus(gpus, PRESET_DEVICES_PER_NODE[name], f"the {name} preset")
    return f"{name}:{nodes}"


def _check_size(cluster: str, size: int, slurm: tuple[str, int]) -> None:
    if size != slurm[1]:
        raise UsageError(slurm[0], slurm[1], f"disagrees with --cluster {cluster} ({size} nodes): inside an "
                                             f"allocation the node count comes from Slurm; drop the size, or "
                                             f"pass --no-slurm to ask for another one")


def _check_gpus(gpus: int, per_node: int, what: str) -> None:
    if gpus != per_node:
        raise UsageError("SLURM_GPUS_ON_NODE", gpus, f"{what} has {per_node} ranks per node and zerotune plans for "
                                                     f"whole nodes: ask Slurm for {per_node} GPUs per node, or pass "
                                                     f"--cluster with a ClusterSpec JSON of {gpus} per node")


def resolve_model(model: str | None) -> str | dict[str, Any]:
    """A preset name as is, or the object of a JSON file: a ModelSpec, or a Hugging Face config.json (also named by
    its folder), which the service reads as ``core.hf_config`` does (the service reads no files)."""
    if not model or not model.strip():
        raise UsageError("model", model, "not given: pass --model (a preset such as gpt-neox-20b, a JSON "
                                         "ModelSpec or a Hugging Face config.json) or set ZEROTUNE_MODEL")
    model = model.strip()
    if os.path.isdir(model) and os.path.isfile(os.path.join(model, "config.json")):
        model = os.path.join(model, "config.json")
    if _is_file_arg(model):
        spec = read_json_file("model", model)
        if not isinstance(spec, dict):
            raise UsageError("model", model, "a JSON ModelSpec must be an object")
        return spec
    return model


def build_request(model: str | dict[str, Any], cluster: str | dict[str, Any], **options: Any) -> dict[str, Any]:
    """The body of ``POST /v1/recommendations`` with the service's defaults filled in, from the request's fields
    by name (``core.fields.Options``: ``trials``, ``time_budget_s``, ``runner`` ...; None: not given).

    A field that is part of every request's key (the objective, the executor, the budget's trials) is sent always,
    where it has a value; any other only where it is not its default, so the bodies, and keys, of earlier clients
    hold.

    Raises:
        UsageError: a value that breaks its field's rule (``runner='x': must be one of [...]``).
    """
    unknown = sorted(set(options) - {d.name for d in OPTIONS if d.about.body is not None})
    if unknown:
        raise TypeError(f"build_request: {unknown[0]!r} is not a field of a request's body")
    values = {}
    for d in OPTIONS:
        value = options.get(d.name)
        value = d.default if value is None else value
        if d.about.body is None or value is None or (d.about.key != ALWAYS and value == d.default):
            continue
        try:
            check(d, value, d.label)
        except SpecError as exc:
            raise UsageError(exc.field, exc.value, exc.rule) from None
        values[d.name] = value
    return {"model": model, "cluster": cluster, **to_body(values)}


def env_flag(name: str, value: str | None) -> bool:
    """A yes/no environment setting: unset or empty is no; 1/true/yes and 0/false/no, in any case."""
    text = (value or "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise UsageError(name, value, "must be 1, true or yes (or 0, false, no, unset)")


def request_key(body: Mapping[str, Any]) -> str:
    """The cache key of a request: SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
