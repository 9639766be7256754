"""What a command line takes for a model, a cluster or a strategy: a preset, or a JSON file.

Only the command lines read files (``zerotune`` and the ranks' ``python -m zerotune.trainer.train``,
whose executors hand it ``model.json``, ``cluster.json`` and ``strategy.json``). The catalog, the
service and the tuner take presets and dicts only (``costmodel.catalog``) and never touch the
filesystem for a name a client sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zerotune.core.hf_config import is_hf_config, model_from_hf
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.errors import SpecError


def is_json_file(text: str) -> bool:
    """Whether ``text`` names a JSON file: it ends in ``.json`` or is an existing file."""
    try:
        return text.endswith(".json") or Path(text).is_file()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL byte: not a file
        return False


def read_json(what: str, path: str) -> Any:
    """The JSON in ``path``; a missing or malformed file is a SpecError on ``what``."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(what, path, "file not found") from None
    except json.JSONDecodeError as exc:
        raise SpecError(what, path, f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise SpecError(what, path, f"cannot be read ({exc.strerror or exc})") from None


def load_cluster(text: str) -> ClusterSpec:
    """``--cluster``: a preset (``frontier:48``, ``local:2x2``) or a ClusterSpec JSON file."""
    return ClusterSpec.from_dict(read_json("cluster", text)) if is_json_file(text) else parse_cluster(text)


def load_model(text: str) -> ModelSpec:
    """``--model``: a preset (``gpt-neox-20b``), a ModelSpec JSON file, or a Hugging Face ``config.json`` (or the
    folder that holds one; ``PATH:SEQ`` trains sequences of SEQ tokens, ``core.hf_config.DEFAULT_SEQ_LEN`` without).
    A Hugging Face model is named after its folder."""
    path, seq = text, None
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit() and head and (Path(head).is_dir() or is_json_file(head)):
        path, seq = head, int(tail)
    try:
        folder = Path(path).is_dir()
    except (OSError, ValueError):
        folder = False
    if folder:
        path = str(Path(path) / "config.json")
    if not (folder or is_json_file(path)):
        return parse_model(text)
    data = read_json("model", path)
    if is_hf_config(data):
        return model_from_hf(data, name=Path(path).resolve().parent.name, seq_len=seq)
    if seq is not None:
        raise SpecError("model", text, "':SEQ' follows a Hugging Face config only (a ModelSpec has its seq_len)")
    return ModelSpec.from_dict(data)


def load_strategy(text: str, cluster: ClusterSpec, **overrides: Any) -> Strategy:
    """``--strategy``: a preset (``zeropp``) or a JSON file of Strategy fields (it may name a ``"preset"`` to
    start from), resolved against ``cluster`` with ``overrides`` on top."""
    spec = read_json("strategy", text) if is_json_file(text) else text
    return build_strategy(spec, cluster, **overrides)

def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["weight_bits=16", "secondary_span=null"]`` → ``{"weight_bits": 16, "secondary_span": None}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SpecError("--set", pair, "must look like FIELD=VALUE (e.g. weight_bits=16)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
