#!/bin/bash
# MuxFlow Epilog (root, after the job): remove per-job leftovers. The MPS control daemon is left
# running for the next job on the GPU (the node agent resets it on errors). Never fails.
set -u
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
[[ -d "$LOG_DIR" ]] || LOG_DIR=/tmp
rm -f "/tmp/muxflow-job-${SLURM_JOB_ID:-none}".* 2>/dev/null
echo "$(date -u +%FT%TZ) epilog job=${SLURM_JOB_ID:-?} node=${SLURMD_NODENAME:-?}: cleaned up" >> "$LOG_DIR/muxflow-node.log"
exit 0
