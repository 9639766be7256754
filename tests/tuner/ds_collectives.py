"""What DeepSpeed moves when it runs an exported config, for test_exports.py, run under torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node 4 tests/tuner/ds_collectives.py CONFIG.json[,CONFIG2.json...] MODELS OUT_DIR

MODELS is a JSON list, one model per config (a preset name or a ModelSpec dict). For each config in turn (one
launch: the ranks' start, torch's and DeepSpeed's imports, is most of a run's time here), DeepSpeed (its CPU
accelerator) builds a fresh model of its own and trains it for three steps with that DeepSpeed config;
every call it makes to torch.distributed's collectives during the third step is recorded (name, the
bytes of its largest tensor: an all-gather's output, a reduce-scatter's input, and its group's size), and the most
elements of partitioned parameters it held gathered at once (``watch_gathered``). Each rank writes
OUT_DIR/rank{r}.json: per config, those calls, that peak and the model's parameter count; the pytest side asserts.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_gather", "reduce_scatter",
               "broadcast", "all_to_all_single", "reduce")


def record_collectives(log: list[tuple[str, int, int]]) -> None:
    """Wrap torch.distributed's collectives so that each call appends (name, bytes of its largest tensor, ranks in
    its group)."""
    for name in COLLECTIVES:
        original = getattr(dist, name)

        def wrapped(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            sizes = [t.numel() * t.element_size() for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            log.append((_name, max(sizes, default=0), dist.get_world_size(kwargs.get("group"))))
            return _original(*args, **kwargs)

        setattr(dist, name, wrapped)


def watch_gathered(model: torch.nn.Module, peak: list[int]) -> Callable[[], None]:
    """After each of DeepSpeed's sub-module fetches (which also launches its prefetches), count the elements of the
    parameters it holds whole, gathered or in flight, that it does not keep whole for good (``ds_persist``), and keep
    the largest count in ``peak[0]``: what its coordinator holds at its fullest, which the cost model books for a
    run by DeepSpeed (``costmodel.deepspeed.gathered_peak``). Returns what puts DeepSpeed's own fetch back."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    params = [p for p in model.parameters() if not getattr(p, "ds_persist", False)]
    held = (ZeroParamStatus.AVAILABLE, ZeroParamStatus.INFLIGHT)
    original = PartitionedParameterCoordinator.fetch_sub_module

    def fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        peak[0] = max(peak[0], sum(p.ds_numel for p in params if p.ds_status in held))
        return out

    PartitionedParameterCoordinator.fetch_sub_module = fetch

    def unwatch() -> None:
        PartitionedParameterCoordinator.fetch_sub_module = original

    return unwatch


def main() -> None:
    config_paths, models, out_dir = sys.argv[1].split(","), json.loads(sys.argv[2]), Path(sys.argv[3])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    log: list[tuple[str, int, int]] = []
    record_collectives(log)  # before DeepSpeed binds any of them

    import deepspeed

    from zerotune.costmodel.catalog import parse_model
    from zerotune.trainer.data import TokenSource, sequence_ids
    from zerotune.trainer.gpt import build_gpt

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    runs = []
    for config_path, model_spec in zip(config_paths, models, strict=True):
        spec = parse_model(model_spec)
        model = build_gpt(spec, seed=0)
        config = json.loads(Path(config_path).read_text())
        # the export's note: checkpoint each block's forward (every block, non-reentrant: what
        # trainer.checkpointing.wrap_blocks does for a full-policy strategy, which this harness is not given)
        if config.get("activation_checkpointing"):
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
            for i, block in enumerate(model.blocks):
                model.blocks[i] = checkpoint_wrapper(block)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                          config=config)
        peak, unwatch = [0], None
        data = TokenSource(spec.vocab, spec.seq_len, seed=0)
        micro = engine.train_micro_batch_size_per_gpu()
        for step in range(3):
            if step == 2:
                log.clear()
                if engine.zero_optimization_stage() == 3:
                    unwatch = watch_gathered(model, peak)
            idx, targets = data.batch(sequence_ids(step, 0, rank, accum=1, world=world, batch=micro))
            loss = engine(idx, targets)
            engine.backward(loss)
            engine.step()
        if unwatch is not None:
            unwatch()
        runs.append({"config": config_path, "calls": list(log), "elem_bytes": 4, "gathered_peak": peak[0],
                     "params": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())})
        log.clear()
        dist.barrier()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "runs": runs,
                                                          "deepspeed": deepspeed.__version__}))
    dist.barrier()
    # no teardown: gloo's destructors, with DeepSpeed's threads still alive, can abort a rank at exit
    # ("terminate called without an active exception") after its result is written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
