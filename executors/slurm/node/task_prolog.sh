#!/bin/bash
# MuxFlow TaskProlog (runs as the job's user before each task; docs/SLURM.md "Node scripts").
# Lines "export K=V" on stdout become the task's environment. Only OFFLINE jobs placed by
# MuxFlow are configured: the planned GPU, the MPS share, the MPS pipe, and xCUDA (LD_PRELOAD +
# XCUDA_* settings). Online jobs (and anything else) get nothing: never a preload.
# The dispatcher writes the plan into the job comment:
#   muxflow-job=<id> muxflow-gpu=<index> muxflow-pct=<pct> muxflow-mem=<bytes> muxflow-kp=.. muxflow-ki=.. muxflow-kd=..
set -u
part="${SLURM_JOB_PARTITION:-}"
[[ "$part" == "${MUXFLOW_OFFLINE_PARTITION:-offline}" ]] || exit 0
comment="${SLURM_JOB_COMMENT:-}"
if [[ -z "$comment" ]] && command -v scontrol >/dev/null; then
    comment=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.* Comment=\(.*\) StdErr=.*/\1/p')
fi
val() { sed -n "s/.*muxflow-$1=\([^ ;]*\).*/\1/p" <<<"$comment"; }
gpu=$(val gpu); pct=$(val pct)
[[ -n "$gpu" && -n "$pct" ]] || exit 0
pipe="${MUXFLOW_MPS_PIPE_ROOT:-/tmp/muxflow-mps}/gpu$gpu"
lib="${MUXFLOW_XCUDA_LIB:-@XCUDA_LIB@}"
echo "export CUDA_VISIBLE_DEVICES=$gpu"
echo "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct"
echo "export CUDA_MPS_PIPE_DIRECTORY=$pipe"
echo "export LD_PRELOAD=$lib"
echo "export XCUDA_GPU_INDEX=$gpu"
mem=$(val mem); [[ -n "$mem" ]] && echo "export XCUDA_MEM_QUOTA_BYTES=$mem"
kp=$(val kp); [[ -n "$kp" ]] && echo "export XCUDA_KP=$kp"
ki=$(val ki); [[ -n "$ki" ]] && echo "export XCUDA_KI=$ki"
kd=$(val kd); [[ -n "$kd" ]] && echo "export XCUDA_KD=$kd"
echo "export MUXFLOW_PLANNED_GPU=$gpu"
exit 0
