#!/bin/bash
# MuxFlow Epilog (root, after the job): remove the job's plan file and its job directory, and put the planned GPU's
# MPS defaults back (the next server gets the whole GPU until the next placement sets its caps), or, while other
# placed jobs run on the GPU, to the largest of their plans.
# The MPS control daemon is left running for the next job on the GPU (the node agent resets it on errors).
# Never fails.
set -u
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
PLAN_DIR="@PLAN_DIR@"
JOB_DIR="@JOB_DIR@"
PLAN_TOOL="@PLAN_TOOL@"
MPS_CONTROL="@MPS_CONTROL@"
job="${SLURM_JOB_ID:-none}"
[[ "$job" =~ ^[0-9]+$ ]] || exit 0
plan="$PLAN_DIR/$job.plan"
gpu=""
# Only a plan file root wrote counts (the tool checks its owner and mode).
if [[ -f "$plan" && ! -L "$plan" && "$(stat -c %u "$plan")" == 0 ]]; then
    gpu=$(sed -n 's/^gpu=\([0-9]*\)$/\1/p' "$plan")
fi
if [[ -n "$gpu" ]] && command -v "$MPS_CONTROL" >/dev/null 2>&1; then
    pipe="${MUXFLOW_MPS_PIPE_ROOT:-@MPS_PIPE_ROOT@}/gpu$gpu"
    if [[ -d "$pipe" && ! -L "$pipe" && "$(stat -c %u "$pipe")" == 0 ]]; then
        export CUDA_MPS_PIPE_DIRECTORY="$pipe"
        # Jobs still placed on the GPU keep the caps of their plans; with none left the GPU is whole again.
        read -r cap mem <<<"$(python3 "$PLAN_TOOL" caps "$PLAN_DIR" "${SLURMD_NODENAME:-}" "$gpu" "$plan" 2>/dev/null)"
        echo "set_default_active_thread_percentage ${cap:-100}" | "$MPS_CONTROL" >/dev/null 2>&1
        # 0 (no limit) only once no placed job is left on the GPU; a remaining quota rounded up, as the Prolog does
        limit=0
        [[ "${mem:-}" =~ ^[0-9]+$ ]] && limit="$(( (mem + 1048575) / 1048576 ))" && limit="$(( limit < 1 ? 1 : limit ))M"
        echo "set_default_device_pinned_mem_limit $gpu $limit" | "$MPS_CONTROL" >/dev/null 2>&1
    fi
fi
rm -f -- "$plan" 2>/dev/null
# The job's directory sits in a root-owned directory: its user owns what is inside, and rm does not follow links.
[[ -d "$JOB_DIR" && ! -L "$JOB_DIR" && "$(stat -c %u "$JOB_DIR")" == 0 ]] && rm -rf -- "${JOB_DIR:?}/$job" 2>/dev/null
if [[ -d "$LOG_DIR" && ! -L "$LOG_DIR" && "$(stat -c %u "$LOG_DIR")" == 0 ]]; then
    echo "$(date -u +%FT%TZ) epilog job=$job node=${SLURMD_NODENAME:-?}: cleaned up" >> "$LOG_DIR/muxflow-node.log"
fi
exit 0
