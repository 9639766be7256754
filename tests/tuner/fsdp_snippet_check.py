"""Run the FSDP2 export's own code snippet under torchrun (gloo, CPU) and train 2 steps with it.

    torchrun --standalone --nproc-per-node 4 tests/tuner/fsdp_snippet_check.py local:2x2 OUT_DIR

For each preset the snippet of ``tuner.exports.fsdp_config`` is executed as written, with the device
type "cuda" read as "cpu"; each rank writes OUT_DIR/rank{r}.json with the losses and the snippet's
reshard_after_forward per preset, and the pytest side asserts.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.trainer.gpt import build_gpt
from zerotune.tuner.exports import fsdp_config

PRESETS = {"zero3": ("zero3", {}), "zeropp": ("zeropp", {}), "mics": ("mics", {}), "zero2": ("zero2", {}),
           "zero3-full": ("zero3", {"activation_checkpointing": True}),
           "zero3-selective": ("zero3", {"activation_checkpointing": True, "checkpoint_policy": "selective"}),
           "zero3-every2": ("zero3", {"activation_checkpointing": True, "checkpoint_every": 2})}
"""What each run exports: a preset and the changes to it (the checkpointed ones wrap the blocks as the snippet says)."""


def main(cluster_name: str, out_dir: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    cluster, spec = parse_cluster(cluster_name), parse_model("gpt-tiny")
    results = {}
    for preset, (name, changes) in PRESETS.items():
        export = fsdp_config(spec, cluster, build_strategy(name, cluster).replace(**changes), dtype="fp32")
        model = build_gpt(spec, seed=0)
        scope = {"model": model}
        exec(compile(export["code"].replace('"cuda"', '"cpu"'), f"<fsdp export {preset}>", "exec"), scope)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(rank)
        losses = []
        for _ in range(2):
            idx = torch.randint(0, spec.vocab, (2, spec.seq_len), generator=gen)
            loss = model(idx, torch.roll(idx, -1, dims=1))
            loss.backward()
            scope["clip_gradients"](model)  # the snippet's own clipping
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        results[preset] = {"losses": losses, "reshard_after_forward": export["reshard_after_forward"],
                           "mesh": list(export["mesh_shape"])}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
