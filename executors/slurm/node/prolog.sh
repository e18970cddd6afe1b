#!/bin/bash
# MuxFlow Prolog (runs as root on the node before a job's first step; docs/SLURM.md "Node scripts").
# For offline jobs placed by MuxFlow: make sure the MPS control daemon runs for the planned GPU.
# Without a real GPU (no nvidia-smi / no /dev/nvidia*) it logs a clear no-op. Never fails the job
# for a missing GPU: a failing Prolog drains the node.
set -u
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
mkdir -p "$LOG_DIR" 2>/dev/null || LOG_DIR=/tmp
log() { echo "$(date -u +%FT%TZ) prolog job=${SLURM_JOB_ID:-?} node=${SLURMD_NODENAME:-?}: $*" >> "$LOG_DIR/muxflow-node.log"; }

comment="${SLURM_JOB_COMMENT:-}"
if [[ -z "$comment" ]] && command -v scontrol >/dev/null; then
    comment=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.* Comment=\(.*\) StdErr=.*/\1/p' | sed 's/ [A-Za-z]*=.*//')
fi
gpu=$(sed -n 's/.*muxflow-gpu=\([0-9]*\).*/\1/p' <<<"$comment")
if [[ -z "$gpu" ]]; then
    log "not a MuxFlow placement (no muxflow-gpu in the comment): nothing to do"
    exit 0
fi
pipe="${MUXFLOW_MPS_PIPE_ROOT:-/tmp/muxflow-mps}/gpu$gpu"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    log "no GPU on this node: MPS control daemon for GPU $gpu not started (no-op)"
    exit 0
fi
mkdir -p "$pipe" "$pipe.log"
if CUDA_MPS_PIPE_DIRECTORY="$pipe" nvidia-cuda-mps-control -d 2>/dev/null; then
    log "started MPS control daemon for GPU $gpu (pipe $pipe)"
else
    # -d fails when a daemon already owns the pipe directory: that is the normal case.
    log "MPS control daemon for GPU $gpu already running (pipe $pipe)"
fi
exit 0
