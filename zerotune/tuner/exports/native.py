"""The export for zerotune's own trainer: its strategy JSON and the exact ``torchrun`` command line for
the target cluster."""

from __future__ import annotations

import shlex
from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import MODELS, parse_cluster
from zerotune.errors import SpecError
from zerotune.tuner.exports.common import (
    _plain,
    _prepare,
    _ranks_per_node,
)


def zerotune_config(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                    global_batch: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """The config our trainer takes, with the ``torchrun`` command that runs it on the target.

    Returns ``{"model", "cluster", "strategy"}`` (each ``to_dict()`` as plain JSON), ``global_batch``,
    ``grad_accum_steps``, ``dtype`` (``"bf16"`` or ``"fp32"``, the trainer's ``--dtype``),
    ``nnodes`` and ``nproc_per_node``, ``files`` (file name → the key of this dict to write there)
    and ``command``. The command is run once per node (e.g. under ``srun --ntasks-per-node 1``);
    it reads the strategy from ``strategy.json`` and names the model and cluster by preset when they
    are catalog presets, else by ``model.json`` / ``cluster.json``. Ranks per node =
    ``cluster.span_size(cluster.node_span)`` on a multi-level cluster (every level but the
    outermost), the whole world on a 1-level one; several nodes rendezvous through torchrun's
    c10d backend at ``$MASTER_ADDR:29500`` with ``$SLURM_JOB_ID`` as the run id.

    Raises:
        SpecError (a ValueError): fp16 (the trainer runs bf16 or fp32), a global batch that is not a
            positive multiple of world x micro_batch_size, a strategy invalid for the cluster.
    """
    strategy, gb, accum = _prepare(cluster, strategy, global_batch, dtype, ("bf16", "fp32"), "zerotune's trainer")
    per_node = _ranks_per_node(cluster)
    nnodes = cluster.world_size // per_node
    files = {"strategy.json": "strategy"}
    model_arg = model.name if MODELS.get(model.name) == model else "model.json"
    if model_arg == "model.json":
        files["model.json"] = "model"
    try:
        cluster_arg = cluster.name if parse_cluster(cluster.name) == cluster else "cluster.json"
    except SpecError:  # a cluster of its own: the config carries its cluster.json
        cluster_arg = "cluster.json"
    if cluster_arg == "cluster.json":
        files["cluster.json"] = "cluster"
    parts = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(per_node)]
    if nnodes > 1:
        parts += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:29500", "--rdzv-id", "$SLURM_JOB_ID"]
    parts += ["-m", "zerotune.trainer.train", "--model", shlex.quote(model_arg),
              "--cluster", shlex.quote(cluster_arg), "--strategy", "strategy.json", "--global-batch", str(gb),
              "--dtype", dtype, "--out", "run.json"]
    return {
        "model": _plain(model.to_dict()),
        "cluster": _plain(cluster.to_dict()),
        "strategy": _plain(strategy.to_dict()),
        "global_batch": gb,
        "grad_accum_steps": accum,
        "dtype": dtype,
        "nnodes": nnodes,
        "nproc_per_node": per_node,
        "files": files,
        "command": " ".join(parts),
    }
