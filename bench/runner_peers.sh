#!/usr/bin/env bash
# Each runner's host work on one GPU, zerotune train's loop, and DeepSpeed's losses (about 7 minutes for the first
# two parts on an H200, the default, and 3 for the third; PARTS picks them):
#
#     OUT=results bash bench/runner_peers.sh                   # from the repository root, on a machine with one GPU
#     OUT=results PARTS=losses bash bench/runner_peers.sh      # the third part alone
#
# peers: our engine vs FSDP2 vs DeepSpeed ZeRO-3 (zerotune's export of the same strategy) vs DDP on gpt-1.3b at
#    1 sequence (where the host sets the pace: each runner's host floor per block, RUNNER_HOST_S_PER_LAYER)
#    and 4 (where the device does), each with one profiled step kept as a Chrome trace;
# train: zerotune train at 4 sequences per micro-step, 2 micro-steps a step, profiled: what its loop adds to
#    the engine's step (bench/data/h200-runner-peers: 0.290 s with the device busy 283 ms);
# losses: in fp32, our engine, DeepSpeed running the export, DeepSpeed with its own defaults (ds3d) and DDP, one
#    sequence, 8 steps: all four should agree now that the bench asks DeepSpeed for no clipping (before, its
#    default clip at 1.0 took its losses 0.4 below ours and DDP's: bench/data/h200-runner-peers/fp32-b1.json).
# DeepSpeed must be importable (pip install deepspeed); without it its rows are left out and said so.
# A device without a profile needs PEAK_TFLOPS (bench/gpu_setup.sh).
# Each part writes into $OUT as it finishes, so a run cut short keeps what it measured.
OUT=${OUT:-bench/data/runner-peers}
PARTS=${PARTS:-peers train}
source "$(dirname "$0")/gpu_setup.sh"
$PY -c 'import deepspeed; print("deepspeed", deepspeed.__version__)' 2>&1 | tail -1 | tee -a "$OUT/log.txt"

for batch in 1 4; do
  [[ " $PARTS " == *" peers "* ]] || break
  log "trainer vs FSDP2 vs DeepSpeed vs DDP, $MODEL, batch $batch, profiled"
  timeout 240 $PY bench/trainer_vs_fsdp.py --worlds 1 --model "$MODEL" --configs zero3,fsdp2,ds3,ddp --steps 8 \
      --warmup 3 --batch $batch --profile --trace-dir "$OUT/trace" --json-out "$OUT/peers-b$batch.json" 2>&1 \
      | tee "$OUT/peers-b$batch.txt"
done

if [[ " $PARTS " == *" train "* ]]; then
  log "zerotune train $MODEL zero3, 4 sequences per micro-step, 8 a step, profiled"
  timeout 150 $PY -m torch.distributed.run --standalone --nproc-per-node=1 -m zerotune.trainer.train \
      --model "$MODEL" --cluster "$OUT/one-gpu.json" --strategy zero3 --set micro_batch_size=4 --steps 6 --warmup 2 \
      --global-batch 8 --profile --trace-dir "$OUT/trace" --out "$OUT/train-$MODEL-zero3-mbs4.json" 2>&1 \
      | tail -4 | tee -a "$OUT/log.txt"
fi
for f in "$OUT"/trace/*.json; do [ -e "$f" ] && gzip -f "$f"; done
if compgen -G "$OUT/trace/*.gz" > /dev/null; then
  $PY bench/trace_phases.py "$OUT"/trace/*.gz 2>&1 | tee "$OUT/phases.txt"
fi
if [[ " $PARTS " == *" losses "* ]]; then
  log "losses in fp32: ours vs DeepSpeed (the export, its defaults) vs DDP, $MODEL, 1 sequence"
  timeout 240 $PY bench/trainer_vs_fsdp.py --worlds 1 --model "$MODEL" --configs zero3,ds3,ds3d,ddp --steps 8 \
      --warmup 3 --batch 1 --dtype fp32 --json-out "$OUT/fp32-b1.json" 2>&1 | tee "$OUT/fp32-b1.txt"
fi
log "done"
