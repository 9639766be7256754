"""The Slurm prologue client behind ``zerotune recommend``: this job's config, fast, and never the reason it fails.

Standard library only on the way to a stored answer (``api/cli/recommend.py`` imports this module for
``recommend`` and nothing else); the built-in fallback imports the pure-Python ``tuner.exports`` and
``strategies.catalog`` when it is needed, never torch, optuna, sqlalchemy, fastapi or uvicorn.

The flow:

1. :func:`resolve_cluster` turns ``--cluster`` / ``$ZEROTUNE_CLUSTER`` / ``$SLURM_CLUSTER_NAME`` and
   the allocation (``$SLURM_JOB_NUM_NODES``, else ``$SLURM_NNODES``; ``$SLURM_GPUS_ON_NODE`` when
   Slurm set it) into a cluster: ``frontier`` on 48 nodes is ``frontier:48``. Bad values raise
   :class:`UsageError` naming the variable, its value and the rule.
2. :func:`build_request` fills the service's defaults, so that equivalent requests share one cache key
   (:func:`request_key`).
3. :func:`fetch` asks the service (``POST /v1/recommendations``, ``?wait=`` for a pending job, then
   again until ``--wait`` is spent) through :class:`api.client.Client`, which retries with
   jittered backoff inside the total deadline. No answer raises :class:`Unanswered` (why: ``timeout``
   or ``server``); a 4xx is the caller's :class:`api.client.ServiceError`.
4. A fresh answer is stored on disk (:func:`cache_store`, atomic); without one, :func:`cache_load`
   returns the last answer for the same request, else :func:`default_recommendation` builds plain
   ZeRO-3 with DeepSpeed's default buckets.
5. :func:`write_outputs` writes the chosen format (atomically) and returns the ``export`` lines.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from zerotune.api.client import Client, ServiceError
from zerotune.errors import UsageError

PRESET_DEVICES_PER_NODE = {"frontier": 8, "dgx-h100": 8}
"""Ranks per node of the cluster presets (``strategies/catalog.py``; a test keeps the two in step)."""

DEEPSPEED_DEFAULT_BUCKETS = {"reduce_bucket_mb": 1000.0, "allgather_bucket_mb": 100.0, "prefetch_buckets": 1}
"""The fallback's buckets: DeepSpeed's defaults (reduce_bucket_size 5e8 and stage3_prefetch_bucket_size
5e7 16-bit elements, DESIGN.md §7) in the Strategy's MB of 16-bit values."""

FORMATS = ("env", "deepspeed", "fsdp", "zerotune")
"""One name per format, as the API's ``?format=`` and ``exports`` keys name them."""
FORMAT_ALIASES = {"json": "zerotune"}
"""Older names still accepted (``--format json`` was the zerotune trainer's config)."""
ENV_FILES = {"zerotune": "zerotune.json", "deepspeed": "ds_config.json", "fsdp": "fsdp.json"}


class Unanswered(Exception):
    """The service gave no recommendation in time. ``cause``: ``"timeout"`` (slow, or the job still
    pending) or ``"server"`` (unreachable, 5xx until the deadline, a failed or cancelled job)."""

    def __init__(self, cause: str, message: str) -> None:
        self.cause = cause
        super().__init__(message)


# --------------------------------------------------------------------------------------------------
# the request


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
    """A preset name as is, or the ModelSpec of a JSON file (the service reads no files)."""
    if not model or not model.strip():
        raise UsageError("model", model, "not given: pass --model (a preset such as gpt-neox-20b, or a JSON "
                                         "ModelSpec) or set ZEROTUNE_MODEL")
    model = model.strip()
    if _is_file_arg(model):
        spec = read_json_file("model", model)
        if not isinstance(spec, dict):
            raise UsageError("model", model, "a JSON ModelSpec must be an object")
        return spec
    return model


def build_request(model: str | dict[str, Any], cluster: str | dict[str, Any], *, objective: str = "throughput",
                  executor: str = "model", trials: int = 40, time_s: float | None = None,
                  global_batch: int | None = None) -> dict[str, Any]:
    """The body of ``POST /v1/recommendations`` with the service's defaults filled in."""
    budget: dict[str, Any] = {"trials": trials}
    if time_s is not None:
        budget["time_s"] = time_s
    body: dict[str, Any] = {"model": model, "cluster": cluster, "objective": objective, "executor": executor,
                            "budget": budget}
    if global_batch is not None:
        body["global_batch"] = global_batch
    return body


def request_key(body: Mapping[str, Any]) -> str:
    """The cache key of a request: SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --------------------------------------------------------------------------------------------------
# asking the service


def fetch(client: Client, body: dict[str, Any], wait_s: float = 0.0) -> dict[str, Any]:
    """The recommendation for ``body``: a stored answer at once, or the answer of its job within ``wait_s``.

    Raises:
        Unanswered: no answer before the client's deadline or ``wait_s`` (``timeout``), or the service
            is unreachable, keeps failing, or the job failed (``server``).
        ServiceError: the service refused the request (4xx other than 408/425/429).
    """
    wait_until = time.monotonic() + wait_s
    poll = 0.25
    while True:
        hold = max(0.0, min(wait_until - time.monotonic(), client.remaining() - 1.0))
        try:
            status, _, payload = client.request("POST", f"/v1/recommendations?wait={hold:.3f}", body, hold=hold)
        except ServiceError as exc:
            if not exc.retryable:
                raise
            raise Unanswered("timeout" if exc.kind == "timeout" else "server", str(exc)) from None
        if status == 200 and _is_recommendation(payload):
            return payload
        if status != 202 or not isinstance(payload, dict) or "state" not in payload:
            raise Unanswered("server", f"unexpected answer from the service (HTTP {status})")
        job, state = payload.get("id"), payload["state"]
        if state in ("failed", "cancelled"):
            raise Unanswered("server", f"job {job} {state}: {payload.get('error')}")
        left = min(wait_until, time.monotonic() + client.remaining()) - time.monotonic()
        if left <= 0.05:
            progress = f"{payload.get('trials_done', 0)}/{payload.get('trials_total', '?')} trials"
            if payload.get("phase"):
                progress += f", {payload['phase']}"
            if wait_s > 0:
                raise Unanswered("timeout", f"job {job} still {state} ({progress}) after --wait {wait_s:g} s")
            raise Unanswered("timeout", f"no stored recommendation yet: job {job} is {state} ({progress}); "
                                        f"pass --wait SECONDS to wait for it")
        time.sleep(min(poll, left))  # the service answered before the hold ended (its own cap): ask again
        poll = min(poll * 2, 2.0)


def _is_recommendation(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get("exports"), dict) and "strategy" in payload


# --------------------------------------------------------------------------------------------------
# the cache and the fallback


def cache_dir(env: Mapping[str, str]) -> str:
    """``$ZEROTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/zerotune``, else ``~/.cache/zerotune``."""
    if env.get("ZEROTUNE_CACHE_DIR"):
        return env["ZEROTUNE_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zerotune")


def _cache_path(body: Mapping[str, Any], env: Mapping[str, str]) -> str:
    return os.path.join(cache_dir(env), "recommendations", request_key(body) + ".json")


def cache_store(body: Mapping[str, Any], rec: Mapping[str, Any], env: Mapping[str, str], url: str) -> str | None:
    """Keep ``rec`` as the last answer to ``body``; the path, or None when the cache cannot be written."""
    path = _cache_path(body, env)
    entry = {"request": body, "recommendation": rec, "url": url,
             "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        write_atomic(path, json.dumps(entry, separators=(",", ":")))
    except OSError:
        return None  # a read-only home must not fail the job
    return path


def cache_load(body: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
    """The last answer stored for ``body`` (with ``saved_at``), or None (absent, unreadable, another request)."""
    try:
        with open(_cache_path(body, env)) as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("request") != body:
        return None
    if not _is_recommendation(entry.get("recommendation")):
        return None
    return {**entry["recommendation"], "saved_at": entry.get("saved_at")}


def default_recommendation(body: Mapping[str, Any]) -> dict[str, Any]:
    """The built-in fallback: plain ZeRO-3 (P, G, OS over the world) with DeepSpeed's default buckets.

    Built by the same exporters as the service's answers (``tuner/exports/``, pure Python).

    Raises:
        UsageError: the model or cluster is not one zerotune knows without the service.
    """
    from zerotune.errors import SpecError
    from zerotune.strategies.catalog import build_strategy, parse_cluster, parse_model
    from zerotune.tuner import exports

    try:
        model, cluster = parse_model(body["model"]), parse_cluster(body["cluster"])
        strategy = build_strategy({"preset": "zero3", **DEEPSPEED_DEFAULT_BUCKETS}, cluster)
        gb = body.get("global_batch")
        return {
            "id": None, "strategy": strategy.to_dict(), "value": None, "evidence": "fallback",
            "exports": {"zerotune": exports.zerotune_config(model, cluster, strategy, global_batch=gb),
                        "deepspeed": exports.deepspeed_config(model, cluster, strategy, global_batch=gb),
                        "fsdp": exports.fsdp_config(model, cluster, strategy, global_batch=gb)},
        }
    except SpecError as exc:
        raise UsageError(f"no fallback: {exc.field}", exc.value, exc.rule) from None


# --------------------------------------------------------------------------------------------------
# outputs


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: readers (and the other tasks of the
    node writing the same file) see the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
PRECISION_KEYS = ("bf16", "fp16", "amp")
OFFLOAD_KEYS = ("offload_optimizer", "offload_param")
"""ZeRO keys of a user's config that change what was measured: kept, with a warning naming them."""


def _enabled(section: Any) -> bool:
    """A precision section that is on: ``true``, or a dict whose ``enabled`` is set and not false."""
    if isinstance(section, dict):
        return section.get("enabled") not in (False, "false", None)
    return section is True


def merge_deepspeed(base: Mapping[str, Any], recommended: Mapping[str, Any], keep_base_batch: bool = False,
                    ) -> tuple[dict[str, Any], list[str]]:
    """The user's DeepSpeed config with the recommendation merged in, and a warning per real mismatch.

    - ``zero_optimization``: every key the recommendation sets replaces the user's; the user's other ZeRO
      keys stay. An enabled ``offload_optimizer`` / ``offload_param`` stays too, with a warning: the
      recommendation was measured without offload.
    - Batch: DeepSpeed requires train_batch_size = micro-batch x accumulation x data-parallel ranks. A
      batch key of the base that differs from the recommended one is refused (UsageError naming the key,
      its value and the recommended one): every trial trained the recommended batch. With
      ``keep_base_batch`` the base's keys stay (a warning says the batch differs from the measured one),
      the missing ones are derived by DeepSpeed's rule, and a base that breaks the rule is refused.
      ``"auto"`` (Hugging Face's placeholder, which its Trainer fills) is left to its owner.
    - Precision: the base's ``bf16`` / ``fp16`` / ``amp`` stays; one that differs from the recommended
      precision is warned about. ``activation_checkpointing`` is added only where the base has none.
    """
    out = json.loads(json.dumps(base))
    warnings: list[str] = []
    zero = out.get("zero_optimization") if isinstance(out.get("zero_optimization"), dict) else {}
    for key in OFFLOAD_KEYS:
        device = (zero.get(key) or {}).get("device") if isinstance(zero.get(key), dict) else None
        if device not in (None, "none"):
            warnings.append(f"--base keeps zero_optimization.{key} (device {device}): the recommendation was "
                            f"measured without offload, so memory per rank and step time will differ")
    out["zero_optimization"] = {**zero, **recommended.get("zero_optimization", {})}

    rec_batch = {k: recommended[k] for k in BATCH_KEYS if isinstance(recommended.get(k), int)}
    mine = {k: base[k] for k in BATCH_KEYS if k in base and base[k] != "auto"}
    world = None
    if len(rec_batch) == 3:  # data-parallel ranks, by DeepSpeed's rule on the recommended batch
        world = rec_batch["train_batch_size"] // (rec_batch["train_micro_batch_size_per_gpu"]
                                                  * rec_batch["gradient_accumulation_steps"])
    conflicts = [k for k in BATCH_KEYS if k in mine and k in rec_batch and mine[k] != rec_batch[k]]
    if conflicts and not keep_base_batch:
        key = conflicts[0]
        raise UsageError(f"--base {key}", mine[key], f"conflicts with the recommended {key}={rec_batch[key]} "
                         f"(every trial trained {rec_batch.get('train_batch_size')} sequences per step); remove "
                         "it from the base, or pass --keep-base-batch to train another batch than was measured")
    if keep_base_batch and mine and world:
        tb, mb, ga = (mine.get(k) for k in BATCH_KEYS)
        if not all(v is None or (isinstance(v, int) and v > 0) for v in (tb, mb, ga)):
            raise UsageError("--base batch", mine, "batch keys must be positive integers (or \"auto\")")
        if tb is None and mb is not None:
            tb = mb * (ga or 1) * world
        elif mb is None and tb is not None:
            mb = tb // ((ga or 1) * world)
        if ga is None:
            ga = tb // (mb * world) if tb and mb else 1
        if not (tb and mb and ga) or tb != mb * ga * world:
            raise UsageError("--base train_batch_size", tb, f"must equal train_micro_batch_size_per_gpu ({mb}) x "
                             f"gradient_accumulation_steps ({ga}) x {world} ranks, DeepSpeed's batch rule")
        out.update(dict(zip(BATCH_KEYS, (tb, mb, ga), strict=True)))
        if tb != rec_batch.get("train_batch_size"):
            warnings.append(f"--keep-base-batch: {tb} sequences per step, not the {rec_batch['train_batch_size']} "
                            "every trial measured; the ranking of strategies may differ at another batch")
    else:
        out.update({k: v for k, v in rec_batch.items() if k not in base})  # "auto" stays its owner's

    mine_precision = [k for k in PRECISION_KEYS if _enabled(base.get(k))]
    rec_precision = [k for k in PRECISION_KEYS if _enabled(recommended.get(k))] or ["fp32"]
    if any(k in base for k in PRECISION_KEYS):
        if (mine_precision or ["fp32"]) != rec_precision:
            warnings.append(f"--base keeps {(mine_precision or ['fp32'])[0]}: the recommendation is for "
                            f"{rec_precision[0]}, and memory per rank differs with the precision")
    else:
        out.update({k: recommended[k] for k in PRECISION_KEYS if k in recommended})
    if "activation_checkpointing" not in out and "activation_checkpointing" in recommended:
        out["activation_checkpointing"] = recommended["activation_checkpointing"]
    return out, warnings


def _lines(texts: list[str]) -> str:
    return "".join(t + "\n" for t in texts)


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2) + "\n"


_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]*$")


def _env_value(value: Any) -> str:
    """A value for ``export NAME=value``: as is when the shell needs no quotes (TaskProlog takes the rest of
    the line literally), else single-quoted."""
    text = str(value)
    return text if _SAFE.match(text) else "'" + text.replace("'", "'\"'\"'") + "'"


def env_lines(values: Mapping[str, Any]) -> list[str]:
    return [f"export {name}={_env_value(value)}" for name, value in values.items() if value is not None]


def notes_of(rec: Mapping[str, Any], fmt: str) -> list[str]:
    """What the ``fmt`` config does differently from the measured strategy (the exports' own notes), and
    in which precision the measurement ran when that is not the export's."""
    exports = rec.get("exports") or {}
    fsdp = exports.get("fsdp") or {}
    deepspeed = [f"DeepSpeed: {n}" for n in exports.get("deepspeed_notes") or []]
    fsdp_notes = [f"FSDP2: {n}" for n in (fsdp.get("notes") or [] if isinstance(fsdp, dict) else [])]
    measured = (rec.get("metrics") or {}).get("dtype")
    target = (exports.get("zerotune") or {}).get("dtype")
    dtype = []
    if measured and target and _precision(measured) != _precision(target):
        dtype = [f"the exports are for {target} (the target cluster's); the measurement behind this answer ran in "
                 f"{measured} on {(rec.get('metrics') or {}).get('device', 'another device')}: its memory and time "
                 "figures are for that precision"]
    picked = {"deepspeed": deepspeed, "fsdp": fsdp_notes, "env": deepspeed + fsdp_notes}.get(fmt, [])
    return picked + dtype


def _precision(name: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(name), str(name))


def write_outputs(rec: Mapping[str, Any], fmt: str, output: str | None, base: Mapping[str, Any] | None,
                  source: str, default_dir: str, keep_base_batch: bool = False) -> tuple[str, list[str]]:
    """Write ``rec`` as ``fmt``; return what goes to stdout (the config itself, or ``export`` lines) and
    the warnings to print: the format's notes (``notes_of``) and the ``--base`` merge's.

    ``env`` writes every export into the directory ``output`` (default ``default_dir``): zerotune.json,
    the trainer's input files (strategy.json, and model.json / cluster.json when not presets),
    ds_config.json (merged into ``base`` when given), fsdp.json and notes.txt. ``zerotune`` with
    ``output`` writes the trainer's input files beside it; ``deepspeed`` / ``fsdp`` with ``output`` write
    their notes beside it (``ds_config.notes.txt`` for ``ds_config.json``).
    """
    exports = rec.get("exports") or {}
    zt = exports.get("zerotune") or {}
    ds = exports.get("deepspeed") or {}
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    warnings: list[str] = []
    if base is not None:
        ds, warnings = merge_deepspeed(base, ds, keep_base_batch)
    notes = notes_of(rec, fmt) + warnings
    if fmt != "env":
        content = {"deepspeed": ds, "fsdp": exports.get("fsdp") or {}, "zerotune": zt}[fmt]
        if output is None:
            return _dumps(content), notes
        write_atomic(output, _dumps(content))
        if fmt == "zerotune":
            _trainer_files(zt, os.path.dirname(os.path.abspath(output)))
        if notes:
            write_atomic(os.path.splitext(output)[0] + ".notes.txt", _lines(notes))
        return "", notes
    directory = os.path.abspath(output or default_dir)
    paths = {}
    for key, name in ENV_FILES.items():
        paths[key] = os.path.join(directory, name)
        write_atomic(paths[key], _dumps(ds if key == "deepspeed" else exports.get(key) or {}))
    write_atomic(os.path.join(directory, "notes.txt"), _lines(notes))
    files = _trainer_files(zt, directory)
    model_name = (zt.get("model") or {}).get("name")
    cluster_name = (zt.get("cluster") or {}).get("name")
    values = {
        "ZEROTUNE_SOURCE": source,
        "ZEROTUNE_RECOMMENDATION_ID": rec.get("id"),
        "ZEROTUNE_EVIDENCE": rec.get("evidence"),
        "ZEROTUNE_CONFIG_DIR": directory,
        "ZEROTUNE_CONFIG": paths["zerotune"],
        "ZEROTUNE_DEEPSPEED_CONFIG": paths["deepspeed"],
        "ZEROTUNE_FSDP_CONFIG": paths["fsdp"],
        "ZEROTUNE_NOTES": os.path.join(directory, "notes.txt"),
        "ZEROTUNE_STRATEGY_FILE": files.get("strategy.json"),
        "ZEROTUNE_TRAIN_MODEL": files.get("model.json", model_name),
        "ZEROTUNE_TRAIN_CLUSTER": files.get("cluster.json", cluster_name),
        "ZEROTUNE_NNODES": zt.get("nnodes"),
        "ZEROTUNE_NPROC_PER_NODE": zt.get("nproc_per_node"),
        "ZEROTUNE_GLOBAL_BATCH": zt.get("global_batch"),
        "ZEROTUNE_GRAD_ACCUM_STEPS": zt.get("grad_accum_steps"),
        "ZEROTUNE_MICRO_BATCH_SIZE": (zt.get("strategy") or {}).get("micro_batch_size"),
        "ZEROTUNE_DTYPE": zt.get("dtype"),
    }
    return "".join(line + "\n" for line in env_lines(values)), notes


def _trainer_files(zt: Mapping[str, Any], directory: str) -> dict[str, str]:
    """The files the zerotune export's command reads (``files``: name → key), written into ``directory``."""
    out = {}
    for name, key in (zt.get("files") or {}).items():
        if key in zt and re.match(r"^[A-Za-z0-9_.-]+$", name):
            out[name] = os.path.join(directory, name)
            write_atomic(out[name], _dumps(zt[key]))
    return out


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"zerotune: warning: {' '.join(message.split())}", file=sys.stderr)
