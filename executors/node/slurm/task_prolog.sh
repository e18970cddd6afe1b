#!/bin/bash -p
# MuxFlow TaskProlog (runs as the job's user before each task; docs/SLURM.md "Node scripts").
# Lines "export K=V" on stdout become the task's environment. Only offline jobs MuxFlow placed, and jobs in their
# profiling window, are configured:
#  - placed: the planned GPU, the MPS share, the MPS pipe, and xCUDA (LD_PRELOAD + XCUDA_* settings);
#  - profiling window: the GPU (alone, through its MPS pipe, no xCUDA), where the job's iteration report goes
#    (MUXFLOW_ITERATION_REPORT, in the job's own directory the Prolog made; the node agent reads it) and the
#    iteration hook first on PYTHONPATH (its sitecustomize.py writes that report for any PyTorch job: one
#    optimizer step = one iteration; it chains to the job's own sitecustomize).
# The plan comes from the root-owned per-job file the Prolog wrote from the verified plan in the job's comment;
# nothing the job's user can write (the comment, the environment) is read for it, and the paths below are the
# node's, whatever the job's environment says. Online jobs (and anything else) get nothing: never a preload.
# What is exported here is the job's to change: the hard caps are set by the Prolog through the MPS control
# daemon, and the node agent notices a placed job that runs without xCUDA.
# -p: the job's BASH_ENV (its environment is the job's own) is not run here; nor are its PATH or exported
# functions used (the node's PATH below).
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
part="${SLURM_JOB_PARTITION:-}"
# (Only saves an scontrol call for other jobs: a plan file exists for nothing else.)
[[ ",$part," == *",${MUXFLOW_OFFLINE_PARTITION:-offline},"* || ",$part," == *",${MUXFLOW_PROFILE_PARTITION:-profile},"* ]] \
    || exit 0
job="${SLURM_JOB_ID:-none}"
[[ "$job" =~ ^[0-9]+$ ]] || exit 0
plan="@PLAN_DIR@/$job.plan"
# A requeued job released again on the same node may start without its Prolog (slurmd skips the Prolog for a job
# id it has seen; docs/SLURM.md "Node scripts"). The node agent sees this script waiting and runs the Prolog for
# the job (executors/node/prolog_watch.py): a job with a plan in its comment waits up to 30 s for the plan file;
# any other offline job (released by hand) starts at once. What scontrol says here only decides whether to wait:
# the plan itself comes from the root-owned file.
if [[ ! -f "$plan" ]] && scontrol show job -o "$job" 2>/dev/null | grep -q ' Comment=muxflow-plan='; then
    for ((i = 0; i < 120; i++)); do [[ -f "$plan" ]] && break; sleep 0.25; done
fi
[[ -f "$plan" && ! -L "$plan" && "$(stat -c %u "$plan")" == 0 && "$(stat -c %u "$(dirname "$plan")")" == 0 ]] || exit 0
val() { sed -n "s/^$1=\([0-9a-z][0-9a-z.e+-]*\)$/\1/p" "$plan"; }
gpu=$(val gpu); kind=$(val kind)
[[ -n "$gpu" && -n "$kind" ]] || exit 0
pipe="@MPS_PIPE_ROOT@/gpu$gpu"
echo "export CUDA_VISIBLE_DEVICES=$gpu"
echo "export CUDA_MPS_PIPE_DIRECTORY=$pipe"
echo "export MUXFLOW_PLANNED_GPU=$gpu"
if [[ "$kind" == profile ]]; then
    dir="@JOB_DIR@/$job"
    [[ -d "$dir" && ! -L "$dir" && "$(stat -c %u "$dir")" == "$(id -u)" ]] \
        && echo "export MUXFLOW_ITERATION_REPORT=$dir/iteration.json"
    echo "export MUXFLOW_PROFILING_RUN=$(val run)"
    pp="${PYTHONPATH:-}"; pp="${pp//$'\n'/}"  # one line: the job's own path after the hook's
    echo "export PYTHONPATH=@HOOK_DIR@${pp:+:$pp}"
    exit 0
fi
pct=$(val pct)
[[ -n "$pct" ]] || exit 0
echo "export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct"
echo "export LD_PRELOAD=@XCUDA_LIB@"
echo "export XCUDA_GPU_INDEX=$gpu"
# xCUDA's live counters (launch rate, waits, fallback, memory charged) for the node agent's metrics, in the job's
# own directory the Prolog made (the agent reads them as the job user's input; docs/OBSERVABILITY.md)
dir="@JOB_DIR@/$job"
[[ -d "$dir" && ! -L "$dir" && "$(stat -c %u "$dir")" == "$(id -u)" ]] && echo "export XCUDA_STATS_DIR=$dir"
mem=$(val mem); [[ -n "$mem" ]] && echo "export XCUDA_MEM_QUOTA_BYTES=$mem"
kp=$(val kp); [[ -n "$kp" ]] && echo "export XCUDA_KP=$kp"
ki=$(val ki); [[ -n "$ki" ]] && echo "export XCUDA_KI=$ki"
kd=$(val kd); [[ -n "$kd" ]] && echo "export XCUDA_KD=$kd"
exit 0
