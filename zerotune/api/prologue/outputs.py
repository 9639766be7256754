"""The files a job reads: the chosen format written atomically, a user's DeepSpeed config merged, the notes
of what differs from what was measured, and the ``export`` lines."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from zerotune.errors import UsageError

FORMATS = ("env", "deepspeed", "fsdp", "zerotune", "torchtitan", "accelerate", "hf-trainer")
"""One name per format, as the API's ``?format=`` and ``exports`` keys name them."""
FORMAT_ALIASES = {"json": "zerotune"}
"""Older names still accepted (``--format json`` was the zerotune trainer's config)."""
ENV_FILES = {"zerotune": "zerotune.json", "deepspeed": "ds_config.json", "fsdp": "fsdp.json"}
TOOL_FILES = {"torchtitan": "torchtitan.toml", "accelerate": "accelerate_fsdp.yaml",
              "accelerate-deepspeed": "accelerate_deepspeed.yaml", "hf-trainer": "hf_ds_config.json"}
"""The files of the formats for other tools, as ``env`` writes them and the API names its downloads."""
TOOL_FORMATS = ("torchtitan", "accelerate", "hf-trainer")


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
      the missing ones are derived by DeepSpeed's rule, and a base that breaks the rule is refused. Without
      it, a missing or ``"auto"`` batch key (Hugging Face's placeholder, which its Trainer would fill from its
      own defaults: another batch than was measured) takes the recommended value, and a warning names the
      TrainingArguments that match.
    - ``gradient_clipping`` is always written: the base's, else the recommendation's, else 1.0 (said in a
      warning), since DeepSpeed's default differs by release (0 before 0.19.6, 1.0 from it).
    - Precision: the base's ``bf16`` / ``fp16`` / ``amp`` stays; one that differs from the recommended
      precision is warned about, one whose ``enabled`` is ``"auto"`` is the user's (their Trainer's) choice.
      ``activation_checkpointing`` is added only where the base has none. A merged
      config that checkpoints under stage 3 with ``stage3_max_reuse_distance`` 0 is warned about (DeepSpeed then
      gathers a checkpointed block three times a step: ``tuner/exports/deepspeed.py``): a base's own checkpointing
      under a recommendation measured without it, or a recommendation exported before the export kept the
      recompute's gathers.
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
        filled = [k for k in rec_batch if base.get(k) == "auto"]
        out.update({k: v for k, v in rec_batch.items() if base.get(k, "auto") == "auto"})
        if filled and len(rec_batch) == 3:
            warnings.append(f"--base had \"auto\" for {', '.join(filled)}: set to the measured batch "
                            f"({rec_batch['train_batch_size']} sequences per step); with the HF Trainer pass "
                            f"per_device_train_batch_size={rec_batch['train_micro_batch_size_per_gpu']} and "
                            f"gradient_accumulation_steps={rec_batch['gradient_accumulation_steps']}, which it checks "
                            "against these (or use --format hf-trainer, which leaves them \"auto\")")
    if "gradient_clipping" not in base:  # DeepSpeed's own default is 0 (none) before 0.19.6 and 1.0 from it
        clip = recommended.get("gradient_clipping")
        out["gradient_clipping"] = clip if isinstance(clip, int | float) else 1.0
        if not isinstance(clip, int | float):
            warnings.append("--base has no gradient_clipping and this answer none either: gradient_clipping 1.0 "
                            "(DeepSpeed's default differs by release: 0, no clipping, before 0.19.6)")

    auto_precision = any(isinstance(base.get(k), dict) and base[k].get("enabled") == "auto" for k in PRECISION_KEYS)
    mine_precision = [k for k in PRECISION_KEYS if _enabled(base.get(k))]
    rec_precision = [k for k in PRECISION_KEYS if _enabled(recommended.get(k))] or ["fp32"]
    if any(k in base for k in PRECISION_KEYS):  # "auto": the user's choice, made by their Trainer's arguments
        if not auto_precision and (mine_precision or ["fp32"]) != rec_precision:
            warnings.append(f"--base keeps {(mine_precision or ['fp32'])[0]}: the recommendation is for "
                            f"{rec_precision[0]}, and memory per rank differs with the precision")
    else:
        out.update({k: recommended[k] for k in PRECISION_KEYS if k in recommended})
    merged_zero = out["zero_optimization"]
    if "activation_checkpointing" not in out and "activation_checkpointing" in recommended:
        out["activation_checkpointing"] = recommended["activation_checkpointing"]
    if ("activation_checkpointing" in out and merged_zero.get("stage") == 3
            and merged_zero.get("stage3_max_reuse_distance") == 0):
        # reuse distance 0 releases what a checkpointed block's recompute gathered before its backward
        if "activation_checkpointing" not in recommended:
            warnings.append("--base keeps activation_checkpointing: the recommendation was measured without it, "
                            "and with its stage3_max_reuse_distance 0 DeepSpeed gathers a checkpointed block three "
                            "times a step (forward, recompute, backward), not the twice that was measured")
        else:  # an answer exported before the export kept the recompute's gathers (a stored one, say)
            warnings.append("the recommendation checkpoints with stage3_max_reuse_distance 0: DeepSpeed then gathers "
                            "a checkpointed block three times a step (forward, recompute, backward); export it again "
                            "(zerotune recommend) for a reuse distance of 2 x a block's elements, or set that")
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
    """What the ``fmt`` config does differently from the measured strategy (the exports' own notes), in
    which precision the measurement ran when that is not the export's, where the answer's collectives
    were measured off the model at its scale (``metrics.decision.collectives``), where the model's lean on
    checkpointed runs could overturn the pick (``metrics.decision.checkpointing``, verdict ``within``), and what
    the answer was built on when fewer trials completed than its budget (``metrics.trials.short``)."""
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
    tools = {name: [f"{label}: {n}" for n in ((exports.get(name) or {}).get("notes") or [])]
             for name, label in (("torchtitan", "torchtitan"), ("accelerate", "Accelerate"))}
    tools["hf-trainer"] = list((exports.get("hf-trainer") or {}).get("notes") or [])  # labelled by the export
    picked = {"deepspeed": deepspeed, "fsdp": fsdp_notes, "env": deepspeed + fsdp_notes, **tools}.get(fmt, [])
    decision = (rec.get("metrics") or {}).get("decision") or {}
    slower = decision.get("collectives")
    lean = decision.get("checkpointing") or {}  # only a pick the model's lean on checkpointing could overturn
    short = ((rec.get("metrics") or {}).get("trials") or {}).get("short")  # fewer trials than the budget, and why
    on_job = measured_note(rec)
    return ([on_job] if on_job else []) + picked + dtype + (
        [f"model: {collectives_caveat(slower)}"] if slower else []) + (
        [f"model: {lean['why']}"] if lean.get("verdict") == "within" else []) + ([f"study: {short}"] if short else [])


def measured_note(rec: Mapping[str, Any]) -> str | None:
    """The notes' line for an answer measured by a job (``zerotune recommend --measure``): on this allocation
    (``rec["job"]``, the job writing it, set by the client), or on an earlier one of its shape."""
    job = rec.get("job")
    on = (rec.get("metrics") or {}).get("measured_on_job")
    if not on:
        return None
    runs = on.get("runs") or []
    done = sum(r.get("status") == "complete" for r in runs)
    where = (f"measured on this allocation, job {on['job']}" if job is not None and str(on["job"]) == str(job) else
             f"measured on an allocation of the same shape ({on.get('cluster')}), job {on['job']}")
    cut = on.get("cut_off") or []
    return (f"{where}: {done} of {len(runs) + len(cut)} shortlisted strategies ran"
            + (f", {len(cut)} cut off by its --measure budget" if cut else "")
            + (f"; the cluster's calibration was refitted as {on['refit']}" if on.get("refit") else ""))


def collectives_caveat(slower: Mapping[str, Any], advice: bool = True) -> str:
    """The sentence every client prints for an ``error_band.collectives`` / ``decision.collectives``: the
    runner's flat rings at a scale where its vendor library was measured off the model's ring; with
    ``advice``, what to do before trusting a predicted margin."""
    ratio = slower["measured_over_predicted"]
    said = (f"{slower['library']}'s flat rings over {slower['gpus']} GPUs were measured at {ratio:.2f}x the model's "
            f"time ({slower['source']}): this prediction's communication is "
            f"{'optimistic' if ratio > 1 else 'pessimistic'} by as much")
    return said + ("; measure its shortlist (--executor slurm) before trusting the margin" if advice else "")


def _precision(name: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(name), str(name))


def write_outputs(rec: Mapping[str, Any], fmt: str, output: str | None, base: Mapping[str, Any] | None,
                  source: str, default_dir: str, keep_base_batch: bool = False) -> tuple[str, list[str]]:
    """Write ``rec`` as ``fmt``; return what goes to stdout (the config itself, or ``export`` lines) and
    the warnings to print: the format's notes (``notes_of``) and the ``--base`` merge's.

    ``env`` writes every export into the directory ``output`` (default ``default_dir``): zerotune.json,
    the trainer's input files (strategy.json, and model.json / cluster.json when not presets),
    ds_config.json (merged into ``base`` when given), fsdp.json, the files of ``TOOL_FILES`` and notes.txt.
    With ``output``, every other format writes its notes beside it (``x.notes.txt`` for ``x.json``), and what
    else it needs, each file named after ``output`` so that recommendations written into one folder keep their
    own: ``zerotune`` its trainer's input files (``x.zt.strategy.json`` for ``x.zt.json``, the command naming
    them), ``accelerate`` (the FSDP2-plugin YAML) its DeepSpeed-plugin YAML (``x.deepspeed.yaml``) and the
    DeepSpeed config it reads (``x.ds_config.json``, merged into ``base`` when given), ``hf-trainer`` (the
    ``--deepspeed`` config) the TrainingArguments that match it (``x.training_args.json``). ``torchtitan`` is
    the TOML file.
    """
    exports = rec.get("exports") or {}
    zt = exports.get("zerotune") or {}
    ds = exports.get("deepspeed") or {}
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    warnings: list[str] = []
    if base is not None:
        ds, warnings = merge_deepspeed(base, ds, keep_base_batch)
    notes = notes_of(rec, fmt) + warnings
    if fmt in TOOL_FORMATS and not isinstance(exports.get(fmt), dict):
        raise UsageError("--format", fmt, "this answer has no such export (it was stored by an older service); "
                                          "ask the service again")
    if fmt != "env":
        text = _tool_text(exports, fmt) if fmt in TOOL_FORMATS else _dumps(
            {"deepspeed": ds, "fsdp": exports.get("fsdp") or {}, "zerotune": zt}[fmt])
        if output is None:
            return text, notes
        stem = _stem(output)
        if fmt == "accelerate":  # the DeepSpeed plugin beside it, reading the DeepSpeed export written beside too
            ds_path = os.path.abspath(stem + ".ds_config.json")
            write_atomic(ds_path, _dumps(ds))
            write_atomic(stem + ".deepspeed.yaml", _accelerate_deepspeed(exports, ds_path))
        if fmt == "hf-trainer":
            write_atomic(stem + ".training_args.json", _dumps(exports["hf-trainer"].get("training_arguments") or {}))
        if fmt == "zerotune":  # its files beside it, named after it: the command reads those
            text = _dumps(_trainer_files(zt, os.path.dirname(os.path.abspath(output)), _prefix(output)))
        write_atomic(output, text)
        if notes:
            write_atomic(stem + ".notes.txt", _lines(notes))
        return "", notes
    directory = os.path.abspath(output or default_dir)
    paths = {}
    for key, name in ENV_FILES.items():
        paths[key] = os.path.join(directory, name)
        write_atomic(paths[key], _dumps(ds if key == "deepspeed" else exports.get(key) or {}))
    for key, name in TOOL_FILES.items():
        paths[key] = os.path.join(directory, name)
        if key == "accelerate-deepspeed":
            if isinstance(exports.get("accelerate"), dict):
                write_atomic(paths[key], _accelerate_deepspeed(exports, paths["deepspeed"]))
        elif isinstance(exports.get(key), dict):
            write_atomic(paths[key], _tool_text(exports, key))
    write_atomic(os.path.join(directory, "notes.txt"), _lines(notes))
    written = _trainer_files(zt, directory)
    files = {name: os.path.join(directory, name) for name in (written.get("files") or {})}
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
        **{f"ZEROTUNE_{key.upper().replace('-', '_')}_CONFIG": paths[key] for key in TOOL_FILES
           if os.path.exists(paths[key])},
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


def _stem(output: str) -> str:
    """``DIR/x.zt.json`` → ``DIR/x.zt``: the files written beside an output start with it."""
    return os.path.splitext(output)[0]


def _prefix(output: str) -> str:
    """What names the trainer's files beside ``-o DIR/x.zt.json``: ``x.zt.`` (``x.zt.strategy.json``), so that
    recommendations written into one folder keep their own; none beside ``zerotune.json`` (the env format's)."""
    name = os.path.basename(_stem(output))
    return "" if name == "zerotune" else name + "."


def _trainer_files(zt: Mapping[str, Any], directory: str, prefix: str = "") -> dict[str, Any]:
    """Write the files the zerotune export's command reads (``files``: name → key) into ``directory``, each named
    ``prefix + name``; return the export with its ``files`` and ``command`` naming the files written."""
    out = dict(zt)
    files: dict[str, str] = {}
    command = str(zt.get("command") or "")
    for name, key in (zt.get("files") or {}).items():
        if key in zt and re.match(r"^[A-Za-z0-9_.-]+$", name):
            path = os.path.join(directory, prefix + name)
            files[prefix + name] = key
            write_atomic(path, _dumps(zt[key]))
            if prefix:
                command = re.sub(rf"(?<=\s){re.escape(name)}(?=\s|$)", prefix + name, command)
    if files:
        out["files"], out["command"] = files, command
    return out


def _tool_text(exports: Mapping[str, Any], fmt: str) -> str:
    """The file of a format for another tool: torchtitan's TOML, Accelerate's FSDP2 YAML, the HF Trainer's JSON."""
    export = exports[fmt]
    if fmt == "torchtitan":
        return str(export["toml"])
    if fmt == "accelerate":
        return str(export["fsdp_yaml"])
    return _dumps(export["config"])


def _accelerate_deepspeed(exports: Mapping[str, Any], ds_path: str) -> str:
    """Accelerate's DeepSpeed-plugin YAML, its ``deepspeed_config_file`` the DeepSpeed export written at ``ds_path``."""
    acc = exports["accelerate"]
    name = json.dumps(acc.get("deepspeed_config_file", "ds_config.json"))
    return str(acc["deepspeed_yaml"]).replace(f"deepspeed_config_file: {name}",
                                               f"deepspeed_config_file: {json.dumps(ds_path)}")


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"zerotune: warning: {' '.join(message.split())}", file=sys.stderr)
