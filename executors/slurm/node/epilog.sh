#!/bin/bash
# MuxFlow Epilog (root, after the job): remove the job's plan file and per-job leftovers, and put the planned
# GPU's MPS defaults back (the next server gets the whole GPU until the next placement sets its caps), or, while
# other placed jobs run on the GPU, to the largest of their plans.
# The MPS control daemon is left running for the next job on the GPU (the node agent resets it on errors).
# Never fails.
set -u
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
[[ -d "$LOG_DIR" ]] || LOG_DIR=/tmp
PLAN_DIR="@PLAN_DIR@"
MPS_CONTROL="@MPS_CONTROL@"
job="${SLURM_JOB_ID:-none}"
# The caps of GPU $1 on this node: the largest share and memory quota among the plans of the jobs placed there
# (several jobs may share a GPU, and their one user's one MPS server; the plan file $2 left out). Per-client
# limits, so every job keeps at least its own; its environment and xCUDA hold it to its own share.
# Prints "<pct> <mem>" (mem may be empty), or nothing when no plan is left on the GPU.
gpu_caps() {
    local f p m best_p="" best_m=""
    for f in "$PLAN_DIR"/*.plan; do
        [[ -f "$f" && "$f" != "${2:-}" ]] || continue
        grep -qx "gpu=$1" "$f" && grep -qx "node=${SLURMD_NODENAME:-}" "$f" || continue
        p=$(sed -n 's/^pct=\([0-9]*\)$/\1/p' "$f"); m=$(sed -n 's/^mem=\([0-9]*\)$/\1/p' "$f")
        [[ -n "$p" ]] && (( ${best_p:-0} < p )) && best_p=$p
        [[ -n "$m" ]] && (( ${best_m:-0} < m )) && best_m=$m
    done
    [[ -n "$best_p" ]] && echo "$best_p $best_m"
}
plan="$PLAN_DIR/$job.plan"
gpu=$(sed -n 's/^gpu=\([0-9]*\)$/\1/p' "$plan" 2>/dev/null)
if [[ -n "$gpu" ]] && command -v "$MPS_CONTROL" >/dev/null 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY="${MUXFLOW_MPS_PIPE_ROOT:-@MPS_PIPE_ROOT@}/gpu$gpu"
    # Jobs still placed on the GPU keep the caps of their plans; with none left the GPU is whole again.
    read -r cap mem <<<"$(gpu_caps "$gpu" "$plan")"
    echo "set_default_active_thread_percentage ${cap:-100}" | "$MPS_CONTROL" >/dev/null 2>&1
    limit=0
    [[ -n "${mem:-}" ]] && limit="$(( mem / 1048576 ))M"
    echo "set_default_device_pinned_mem_limit $gpu $limit" | "$MPS_CONTROL" >/dev/null 2>&1
fi
rm -f "$plan" "/tmp/muxflow-job-$job".* 2>/dev/null
echo "$(date -u +%FT%TZ) epilog job=$job node=${SLURMD_NODENAME:-?}: cleaned up" >> "$LOG_DIR/muxflow-node.log"
exit 0
