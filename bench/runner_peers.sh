#!/usr/bin/env bash
# Each runner's host work on one GPU, and zerotune train's loop, profiled (about 6 minutes on an H100):
#
#     OUT=results bash bench/runner_peers.sh       # from the repository root, on a machine with one GPU
#
# 1. our engine vs FSDP2 vs DeepSpeed ZeRO-3 (zerotune's export of the same strategy) vs DDP on gpt-1.3b at
#    1 sequence (where the host sets the pace: each runner's host floor per block, RUNNER_HOST_S_PER_LAYER)
#    and 4 (where the device does), each with one profiled step kept as a Chrome trace;
# 2. zerotune train at 4 sequences per micro-step, 2 micro-steps a step, profiled: what its loop adds to
#    the engine's step (bench/data/h100-accum measured 16 ms).
# DeepSpeed must be importable (pip install deepspeed); without it the ds3 rows are left out and said so.
# Each part writes into $OUT as it finishes, so a run cut short keeps what it measured.
set -uo pipefail
OUT=${OUT:-bench/data/runner-peers}
MODEL=${MODEL:-gpt-1.3b}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }

log "$(nvidia-smi -L 2>/dev/null | head -1)"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' \
    2>&1 | tee -a "$OUT/log.txt"
$PY -c 'import deepspeed; print("deepspeed", deepspeed.__version__)' 2>&1 | tail -1 | tee -a "$OUT/log.txt"

for batch in 1 4; do
  log "trainer vs FSDP2 vs DeepSpeed vs DDP, $MODEL, batch $batch, profiled"
  timeout 240 $PY bench/trainer_vs_fsdp.py --worlds 1 --model "$MODEL" --configs zero3,fsdp2,ds3,ddp --steps 8 \
      --warmup 3 --batch $batch --profile --trace-dir "$OUT/trace" --json-out "$OUT/peers-b$batch.json" 2>&1 \
      | tee "$OUT/peers-b$batch.txt"
done

log "zerotune train $MODEL zero3, 4 sequences per micro-step, 8 a step, profiled"
$PY - "$OUT/one-gpu.json" <<'EOF' || exit 2
import json, sys, torch
from zerotune.strategies.costmodel.hardware import peak_tflops_of
name = torch.cuda.get_device_name(0)
json.dump({"name": "one-gpu", "levels": [{"name": "node", "size": 1, "bandwidth_gbps": 450.0, "latency_us": 3.4}],
           "device": name, "device_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
           "peak_tflops": peak_tflops_of(name) or 989.0}, open(sys.argv[1], "w"))
EOF
timeout 150 $PY -m torch.distributed.run --standalone --nproc-per-node=1 -m zerotune.strategies.train \
    --model "$MODEL" --cluster "$OUT/one-gpu.json" --strategy zero3 --set micro_batch_size=4 --steps 6 --warmup 2 \
    --global-batch 8 --profile --trace-dir "$OUT/trace" --out "$OUT/train-$MODEL-zero3-mbs4.json" 2>&1 \
    | tail -4 | tee -a "$OUT/log.txt"
for f in "$OUT"/trace/*.json; do [ -e "$f" ] && gzip -f "$f"; done
$PY bench/trace_phases.py "$OUT"/trace/*.gz 2>&1 | tee "$OUT/phases.txt"
log "done"
