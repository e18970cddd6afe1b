#!/bin/bash
# MuxFlow Epilog (root, after the job): remove the job's plan file and per-job leftovers, and put the planned
# GPU's MPS defaults back (the next server gets the whole GPU until the next placement sets its caps).
# The MPS control daemon is left running for the next job on the GPU (the node agent resets it on errors).
# Never fails.
set -u
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
[[ -d "$LOG_DIR" ]] || LOG_DIR=/tmp
PLAN_DIR="@PLAN_DIR@"
MPS_CONTROL="@MPS_CONTROL@"
job="${SLURM_JOB_ID:-none}"
plan="$PLAN_DIR/$job.plan"
gpu=$(sed -n 's/^gpu=\([0-9]*\)$/\1/p' "$plan" 2>/dev/null)
if [[ -n "$gpu" ]] && command -v "$MPS_CONTROL" >/dev/null 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY="${MUXFLOW_MPS_PIPE_ROOT:-@MPS_PIPE_ROOT@}/gpu$gpu"
    echo "set_default_active_thread_percentage 100" | "$MPS_CONTROL" >/dev/null 2>&1
    echo "set_default_device_pinned_mem_limit $gpu 0" | "$MPS_CONTROL" >/dev/null 2>&1
fi
rm -f "$plan" "/tmp/muxflow-job-$job".* 2>/dev/null
echo "$(date -u +%FT%TZ) epilog job=$job node=${SLURMD_NODENAME:-?}: cleaned up" >> "$LOG_DIR/muxflow-node.log"
exit 0
