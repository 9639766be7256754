#!/usr/bin/env bash
# The one-GPU figures in one go (bench/data/h100-1gpu/report.txt came from this script; the H200's
# report from the same commands run one by one):
#
#     OUT=results bash bench/one_gpu.sh            # from the repository root, on a machine with one GPU
#     PEAK_TFLOPS=312 OUT=results bash bench/one_gpu.sh   # a device without a profile: give its dense bf16 peak
#
# 1. the GEMM ceiling at a transformer layer's shapes (bench/gemm_efficiency.py);
# 2. our engine vs FSDP2 vs DDP on gpt-1.3b at 1 and 4 sequences per step, each with one profiled step
#    (kernels launched and their device time: is a step bound by the host or by the device?);
# 3. our engine's collectives on a thread and inline, side by side at one sequence (where the host
#    sets the pace), twice each;
# 4. zerotune train's micro-batch sweep (1, 2, 4, 8 sequences per micro-step, 8 per step), whose
#    run.json files the cost model's tests compare with, each run's max_allocated and max_reserved printed
#    ($OUT/fragmentation.txt: the allocator's fragmentation, reserved over allocated);
# 5. the model's forward and backward split by kernel class (bench/kernel_split.py): the rates the cost
#    model's Hopper figures were read from (bench/data/h200-kernels), for this device;
# 6. causal attention alone (bench/attention_rate.py): SDPA's forward and backward at 1-8k tokens, head sizes 64
#    and 128, in the kernel benchmarks' terms and the model's (hardware.ATTENTION_KERNELS).
# Each part writes into $OUT as it finishes, so a run cut short keeps what it measured.
OUT=${OUT:-bench/data/one-gpu}
source "$(dirname "$0")/gpu_setup.sh"

log "gemm efficiency"
timeout 150 $PY bench/gemm_efficiency.py ${PEAK_TFLOPS:+--peak-tflops $PEAK_TFLOPS} \
    --json-out "$OUT/gemm-efficiency.json" 2>&1 | tee "$OUT/gemm.txt"

for batch in 1 4; do
  log "trainer vs FSDP2 vs DDP, $MODEL, batch $batch, profiled"
  timeout 200 $PY bench/trainer_vs_fsdp.py --worlds 1 --model "$MODEL" --configs zero3,fsdp2,ddp --steps 8 \
      --warmup 3 --batch $batch --profile --json-out "$OUT/trainer_vs_fsdp-b$batch.json" 2>&1 \
      | tee "$OUT/trainer_vs_fsdp-b$batch.txt"
done

for comm in thread inline thread inline; do  # side by side, alternating: the machine's drift hits both
  log "our engine, gpt-1.3b, batch 1, collectives on a $comm"
  timeout 100 $PY bench/trainer_vs_fsdp.py --worlds 1 --model "$MODEL" --configs zero3 --steps 8 --warmup 3 \
      --batch 1 --comm-thread $comm 2>&1 | grep -E "^zero3 " | tee -a "$OUT/comm-thread.txt"
done

for mbs in 1 2 4 8; do
  log "zerotune train $MODEL zero3 micro-batch $mbs"
  timeout 120 $PY -m torch.distributed.run --standalone --nproc-per-node=1 -m zerotune.trainer.train \
      --model "$MODEL" --cluster "$OUT/one-gpu.json" --strategy zero3 --set micro_batch_size=$mbs \
      --steps 6 --warmup 2 --global-batch 8 --out "$OUT/train-$MODEL-zero3-mbs$mbs.json" 2>&1 \
      | tail -4 | tee -a "$OUT/log.txt"
  # the caching allocator's fragmentation, reserved over allocated: the measurement that replaces the cost
  # model's published figure (costmodel.memory.FRAGMENTATION)
  $PY -c 'import json, sys; m = json.load(open(sys.argv[1]))["memory_bytes"]; a, r = m["cuda_max_allocated"], m["cuda_max_reserved"]; print(f"max_allocated {a / 2**30:.2f} GiB  max_reserved {r / 2**30:.2f} GiB  reserved/allocated {r / a:.3f}")' \
      "$OUT/train-$MODEL-zero3-mbs$mbs.json" 2>&1 | tee -a "$OUT/fragmentation.txt" "$OUT/log.txt"
done
log "kernel classes, $MODEL, micro-batches 1, 2, 4, 8"
timeout 150 $PY bench/kernel_split.py --model "$MODEL" ${PEAK_TFLOPS:+--peak-tflops $PEAK_TFLOPS} \
    --json-out "$OUT/kernel_split-$MODEL.json" 2>&1 | grep -v USDT | tee "$OUT/kernel_split-$MODEL.txt"
log "causal attention, SDPA's pick and FlashAttention-2 pinned"
for backend in auto flash; do
  timeout 120 $PY bench/attention_rate.py --backend $backend ${PEAK_TFLOPS:+--peak-tflops $PEAK_TFLOPS} \
      --json-out "$OUT/attention-$backend.json" 2>&1 | tee "$OUT/attention-$backend.txt"
done
log "done"
