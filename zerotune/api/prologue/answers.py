"""The answer: the service's (``fetch``), the last one saved on disk for the same request, or the built-in
default (plain ZeRO-3 with DeepSpeed's default buckets)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from zerotune.api.prologue.body import DEEPSPEED_DEFAULT_BUCKETS, request_key
from zerotune.api.prologue.client import Client, ServiceError
from zerotune.api.prologue.outputs import write_atomic
from zerotune.errors import UsageError


class Unanswered(Exception):
    """The service gave no recommendation in time. ``cause``: ``"timeout"`` (slow, or the job still
    pending) or ``"server"`` (unreachable, 5xx until the deadline, a failed or cancelled job)."""

    def __init__(self, cause: str, message: str) -> None:
        self.cause = cause
        super().__init__(message)


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


def answers_dir(env: Mapping[str, str]) -> str:
    """``$ZEROTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/zerotune``, else ``~/.cache/zerotune``."""
    if env.get("ZEROTUNE_CACHE_DIR"):
        return env["ZEROTUNE_CACHE_DIR"]
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zerotune")


def _answer_path(body: Mapping[str, Any], env: Mapping[str, str]) -> str:
    return os.path.join(answers_dir(env), "recommendations", request_key(body) + ".json")


def save_answer(body: Mapping[str, Any], rec: Mapping[str, Any], env: Mapping[str, str], url: str) -> str | None:
    """Keep ``rec`` as the last answer to ``body``; the path, or None when it cannot be written."""
    path = _answer_path(body, env)
    entry = {"request": body, "recommendation": rec, "url": url,
             "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        write_atomic(path, json.dumps(entry, separators=(",", ":")))
    except OSError:
        return None  # a read-only home must not fail the job
    return path


def saved_answer(body: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
    """The last answer stored for ``body`` (with ``saved_at``), or None (absent, unreadable, another request)."""
    try:
        with open(_answer_path(body, env)) as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("request") != body:
        return None
    if not _is_recommendation(entry.get("recommendation")):
        return None
    return {**entry["recommendation"], "saved_at": entry.get("saved_at")}


def default_recommendation(body: Mapping[str, Any]) -> dict[str, Any]:
    """The built-in fallback: plain ZeRO-3 (P, G, OS over the world) with DeepSpeed's default buckets, its
    gradients reduced in fp32 when the body says the training does (``grad_reduce_in_fp32``).

    Built by the same exporters as the service's answers (``zerotune/tuner/exports/``, pure Python).

    Raises:
        UsageError: the model or cluster is not one zerotune knows without the service.
    """
    from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
    from zerotune.errors import SpecError
    from zerotune.tuner import exports

    try:
        model, cluster = parse_model(body["model"]), parse_cluster(body["cluster"])
        grad_bits = 32 if body.get("grad_reduce_in_fp32") else 16
        strategy = build_strategy({"preset": "zero3", **DEEPSPEED_DEFAULT_BUCKETS, "grad_bits": grad_bits}, cluster)
        gb = body.get("global_batch")
        return {
            "id": None, "strategy": strategy.to_dict(), "value": None, "evidence": "fallback",
            "exports": exports.all_exports(model, cluster, strategy, gb),
        }
    except SpecError as exc:
        raise UsageError(f"no fallback: {exc.field}", exc.value, exc.rule) from None
