#!/bin/bash
# MuxFlow Prolog (root, on the node before a job's first step; docs/SLURM.md "Node scripts").
# For an offline job MuxFlow placed:
#  1. read the plan from the job's admin comment (only Slurm's administrators can write it) and write it to
#     a root-owned per-job file, the only thing the TaskProlog reads;
#  2. set the hard caps through the planned GPU's MPS control daemon: the SM share as the active thread
#     percentage and the memory quota as the pinned device memory limit, for the next server and for a
#     server already running for the job's user (its new clients observe them). With several jobs placed on
#     the GPU, the largest of their plans. A client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can only lower them;
#     xCUDA stays the pacer and the quota accountant.
# Never fails the job: a failing Prolog drains the node.
set -u
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
mkdir -p "$LOG_DIR" 2>/dev/null || LOG_DIR=/tmp
PLAN_DIR="@PLAN_DIR@"
MPS_CONTROL="@MPS_CONTROL@"
PIPE_ROOT="${MUXFLOW_MPS_PIPE_ROOT:-@MPS_PIPE_ROOT@}"
OFFLINE="${MUXFLOW_OFFLINE_PARTITION:-offline}"
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
job="${SLURM_JOB_ID:-}"
by="${MUXFLOW_PROLOG_BY:+ (run by the $MUXFLOW_PROLOG_BY: slurmd skipped it)}"
log() { echo "$(date -u +%FT%TZ) prolog job=${job:-?} node=${SLURMD_NODENAME:-?}$by: $*" >> "$LOG_DIR/muxflow-node.log"; }

[[ -n "$job" ]] || exit 0
# The job's record as JSON (squeue --json lists every job on some releases: pick ours by id). Only an offline
# job's admin comment counts, and only its muxflow-<key>=<number> fields.
plan=$(squeue --json -j "$job" 2>/dev/null | python3 -c '
import json, re, sys
want, offline = int(sys.argv[1]), sys.argv[2]
for j in json.load(sys.stdin).get("jobs", []):
    if j.get("job_id") != want or offline not in str(j.get("partition") or "").split(","):
        continue
    for k, v in re.findall(r"muxflow-(job|gpu|pct|mem|kp|ki|kd)=([0-9][0-9.e+-]*)(?:\s|$)", j.get("admin_comment") or ""):
        print(f"{k}={v}")
' "$job" "$OFFLINE" 2>>"$LOG_DIR/muxflow-node.log")
gpu=$(sed -n 's/^gpu=\([0-9]*\)$/\1/p' <<<"$plan")
pct=$(sed -n 's/^pct=\([0-9]*\)$/\1/p' <<<"$plan")
if [[ -z "$gpu" || -z "$pct" ]]; then
    log "not a MuxFlow placement (no plan in the admin comment of an offline job): nothing to do"
    exit 0
fi
umask 022
mkdir -p "$PLAN_DIR" && chown 0:0 "$PLAN_DIR" && chmod 0755 "$PLAN_DIR"
tmp="$PLAN_DIR/.$job.$$"
printf '%s\nnode=%s\n' "$plan" "${SLURMD_NODENAME:-}" > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$PLAN_DIR/$job.plan"
log "plan for GPU $gpu at $pct %: $(tr '\n' ' ' <<<"$plan")"

if ! command -v "$MPS_CONTROL" >/dev/null 2>&1; then
    log "no MPS control daemon on this node ($MPS_CONTROL not found): hard caps not set (no-op)"
    exit 0
fi
pipe="$PIPE_ROOT/gpu$gpu"
mkdir -p "$pipe" "$pipe.log"
export CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$pipe.log"
ctl() { echo "$*" | "$MPS_CONTROL" >/dev/null 2>>"$LOG_DIR/muxflow-node.log" || log "MPS control: '$*' failed"; }
if ! servers=$(echo get_server_list | "$MPS_CONTROL" 2>/dev/null); then
    "$MPS_CONTROL" -d 2>>"$LOG_DIR/muxflow-node.log" && log "started MPS control daemon for GPU $gpu (pipe $pipe)"
    servers=""
fi
read -r cap mem <<<"$(gpu_caps "$gpu")"
[[ -n "${cap:-}" ]] || cap=$pct
[[ "$cap" == "$pct" ]] || log "GPU $gpu also runs other placed jobs: caps at the largest of their plans"
ctl set_default_active_thread_percentage "$cap"
limit=""
[[ -n "${mem:-}" ]] && limit="$(( mem / 1048576 ))M"
[[ -n "$limit" ]] && ctl set_default_device_pinned_mem_limit "$gpu" "$limit"
for pid in $servers; do
    # A server of the job's user (an online replica of the same identity runs on it): the job's clients
    # will be new clients of that server and observe these limits; existing clients keep theirs.
    if [[ "$(stat -c %u "/proc/$pid" 2>/dev/null)" == "${SLURM_JOB_UID:-x}" ]]; then
        ctl set_active_thread_percentage "$pid" "$cap"
        [[ -n "$limit" ]] && ctl set_device_pinned_mem_limit "$pid" "$gpu" "$limit"
    fi
done
log "MPS caps for GPU $gpu: $cap % of the SMs, pinned device memory ${limit:-unlimited} (uid ${SLURM_JOB_UID:-?})"
exit 0
