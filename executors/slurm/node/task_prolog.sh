#!/bin/bash
# MuxFlow TaskProlog (runs as the job's user before each task; docs/SLURM.md "Node scripts").
# Lines "export K=V" on stdout become the task's environment. Only offline jobs placed by MuxFlow are
# configured: the planned GPU, the MPS share, the MPS pipe, and xCUDA (LD_PRELOAD + XCUDA_* settings).
# The plan comes from the root-owned per-job file the Prolog wrote from the job's admin comment; nothing
# the job's user can write (the comment, the environment) is read. Online jobs (and anything else) get
# nothing: never a preload. What is exported here is the job's to change: the hard caps are set by the
# Prolog through the MPS control daemon, and the node agent notices a job that runs without xCUDA.
set -u
part="${SLURM_JOB_PARTITION:-}"
[[ ",$part," == *",${MUXFLOW_OFFLINE_PARTITION:-offline},"* ]] || exit 0
plan="@PLAN_DIR@/${SLURM_JOB_ID:-none}.plan"
# A requeued job released again on the same node may start without its Prolog (slurmd skips the Prolog
# for a job id it has seen; docs/SLURM.md "Node scripts"). The node agent sees this script waiting and
# runs the Prolog for the job (executors/node/prolog_watch.py): a job MuxFlow placed (a plan in its admin
# comment) waits up to 30 s for the plan file; any other offline job (released by hand) starts at once.
# What scontrol says here only decides whether to wait: the plan itself comes from the root-owned file.
if [[ ! -f "$plan" ]] && scontrol show job -o "${SLURM_JOB_ID:-0}" 2>/dev/null | grep -q 'AdminComment=muxflow-'; then
    for ((i = 0; i < 120; i++)); do [[ -f "$plan" ]] && break; sleep 0.25; done
fi
[[ -f "$plan" && "$(stat -c %u "$plan")" == 0 && "$(stat -c %u "$(dirname "$plan")")" == 0 ]] || exit 0
val() { sed -n "s/^$1=\([0-9][0-9.e+-]*\)$/\1/p" "$plan"; }
gpu=$(val gpu); pct=$(val pct)
[[ -n "$gpu" && -n "$pct" ]] || exit 0
pipe="${MUXFLOW_MPS_PIPE_ROOT:-@MPS_PIPE_ROOT@}/gpu$gpu"
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
