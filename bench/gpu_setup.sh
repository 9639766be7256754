# What the one-GPU scripts (bench/one_gpu.sh, bench/runner_peers.sh) share, sourced after they set OUT:
# strict mode, MODEL and PY, $OUT/log.txt with the device and torch, and $OUT/one-gpu.json, a cluster file
# of the device in hand (one level of one rank, its datasheet peak, its memory). A device without a profile
# needs PEAK_TFLOPS, its dense bf16 peak; without it the script stops (exit 2) rather than guess one.
set -uo pipefail
MODEL=${MODEL:-gpt-1.3b}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }

log "$(nvidia-smi -L 2>/dev/null | head -1)"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' \
    2>&1 | tee -a "$OUT/log.txt"
$PY - "$OUT/one-gpu.json" "${PEAK_TFLOPS:-}" <<'EOF' || exit 2
import json, sys, torch
from zerotune.costmodel.hardware import peak_tflops_of
name = torch.cuda.get_device_name(0)
peak = float(sys.argv[2]) if sys.argv[2] else peak_tflops_of(name)
if peak is None:
    sys.exit(f"{name!r} has no profile: set PEAK_TFLOPS to its dense bf16 peak")
json.dump({"name": "one-gpu", "levels": [{"name": "node", "size": 1, "bandwidth_gbps": 450.0, "latency_us": 3.4}],
           "device": name, "device_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
           "peak_tflops": peak}, open(sys.argv[1], "w"))
EOF
