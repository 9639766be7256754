"""The Slurm prologue client behind ``zerotune recommend``: this job's config, fast, and never the reason it fails.

Standard library only on the way to a stored answer (``zerotune/api/cli/recommend.py`` imports this package for
``recommend`` and nothing of the service); the built-in fallback imports the pure-Python ``tuner.exports`` and
``costmodel.catalog`` when it is needed, never torch, optuna, sqlalchemy, fastapi or uvicorn.

The flow:

1. :func:`resolve_cluster` turns ``--cluster`` / ``$ZEROTUNE_CLUSTER`` / ``$SLURM_CLUSTER_NAME`` and
   the allocation (``$SLURM_JOB_NUM_NODES``, else ``$SLURM_NNODES``; ``$SLURM_GPUS_ON_NODE`` when
   Slurm set it) into a cluster: ``frontier`` on 48 nodes is ``frontier:48``. Bad values raise
   :class:`UsageError` naming the variable, its value and the rule.
2. :func:`build_request` fills the service's defaults, so that equivalent requests share one cache key
   (:func:`request_key`).
3. :func:`fetch` asks the service (``POST /v1/recommendations``, ``?wait=`` for a pending job, then
   again until ``--wait`` is spent) through :class:`~zerotune.api.prologue.client.Client`, which retries with
   jittered backoff inside the total deadline. No answer raises :class:`Unanswered` (why: ``timeout``
   or ``server``); a 4xx is the caller's :class:`~zerotune.api.prologue.client.ServiceError`.
4. A fresh answer is stored on disk (:func:`save_answer`, atomic); without one, :func:`saved_answer`
   returns the last answer for the same request, else :func:`default_recommendation` builds plain
   ZeRO-3 with DeepSpeed's default buckets.
5. :func:`write_outputs` writes the chosen format (atomically) and returns the ``export`` lines.

Modules: ``body`` (1, 2), ``answers`` (3, 4), ``outputs`` (5), ``client`` (HTTP with retries); the request's
fields, their names and defaults, are ``zerotune/core/fields.py``'s (standard library only too).
"""

from zerotune.api.prologue.answers import (
    Unanswered,
    answers_dir,
    default_recommendation,
    fetch,
    save_answer,
    saved_answer,
)
from zerotune.api.prologue.body import (
    DEEPSPEED_DEFAULT_BUCKETS,
    PRESET_DEVICES_PER_NODE,
    build_request,
    env_flag,
    job_id,
    read_json_file,
    request_key,
    resolve_cluster,
    resolve_model,
    slurm_nodes,
)
from zerotune.api.prologue.outputs import (
    BATCH_KEYS,
    ENV_FILES,
    FORMAT_ALIASES,
    FORMATS,
    OFFLOAD_KEYS,
    PRECISION_KEYS,
    collectives_caveat,
    env_lines,
    merge_deepspeed,
    notes_of,
    warn,
    write_atomic,
    write_outputs,
)
from zerotune.core.fields import EXECUTORS, RUNNERS  # what a request may name, as the command line offers it

__all__ = [
    "slurm_nodes",
    "job_id",
    "read_json_file",
    "resolve_cluster",
    "resolve_model",
    "build_request",
    "env_flag",
    "request_key",
    "PRESET_DEVICES_PER_NODE",
    "DEEPSPEED_DEFAULT_BUCKETS",
    "EXECUTORS",
    "RUNNERS",
    "fetch",
    "answers_dir",
    "save_answer",
    "saved_answer",
    "default_recommendation",
    "Unanswered",
    "write_atomic",
    "merge_deepspeed",
    "env_lines",
    "collectives_caveat",
    "notes_of",
    "write_outputs",
    "warn",
    "FORMATS",
    "FORMAT_ALIASES",
    "ENV_FILES",
    "BATCH_KEYS",
    "PRECISION_KEYS",
    "OFFLOAD_KEYS",
]
