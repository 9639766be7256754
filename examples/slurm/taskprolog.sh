#!/bin/bash
# Slurm TaskProlog for zerotune: runs before each task of a step (srun --task-prolog=this-file, or
# TaskProlog= in slurm.conf) and prints `export NAME=value` lines, which slurmstepd turns into the
# task's environment: ZEROTUNE_STRATEGY_FILE, ZEROTUNE_DEEPSPEED_CONFIG, ZEROTUNE_NPROC_PER_NODE, ...
#
# The model and the cluster come from the job's environment (sbatch --export or the batch script):
#   ZEROTUNE_MODEL=gpt-neox-20b  ZEROTUNE_CLUSTER=frontier  ZEROTUNE_URL=http://zerotune.internal:8000
# The node count comes from SLURM_JOB_NUM_NODES. zerotune never fails the task because of the service:
# when it is slow or down, the last cached answer (or plain ZeRO-3) is written and a warning goes to stderr.
# A usage error (a bad model name, a malformed SLURM_* value) is reported and the task keeps its environment.

ZEROTUNE=${ZEROTUNE_BIN:-zerotune}
# Every task of a node writes the same files atomically; one directory per job on the shared file system.
OUT=${ZEROTUNE_CONFIG_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/.zerotune/job-${SLURM_JOB_ID:-local}}

mkdir -p "$OUT" 2>/dev/null
"$ZEROTUNE" recommend --format env -o "$OUT" --timeout "${ZEROTUNE_TIMEOUT:-10}" 2>>"$OUT.log" || \
    echo "print zerotune recommend failed (exit $?), see $OUT.log"
exit 0
