#!/bin/bash
# MuxFlow Prolog (root, on the node before a job's first step; docs/SLURM.md "Node scripts", docs/SECURITY.md).
# For an offline job MuxFlow placed, or a job in its profiling window:
#  1. read the plan from the job's comment and verify it (MuxFlow's signature, for this Slurm job: a plan the
#     job's user wrote or copied from another job is no plan), then write it to a root-owned per-job plan file,
#     the only thing the TaskProlog reads;
#  2. make the job's own directory under the job-state directory (owned by the job's user, mode 0700), where the
#     job's iteration report goes; the node agent reads it from there;
#  3. set the hard caps through the planned GPU's MPS control daemon: the SM share as the active thread
#     percentage and the memory quota as the pinned device memory limit, for the next server and for a server
#     already running for the job's user (its new clients observe them). With several jobs placed on the GPU,
#     the largest of their plans; a profiling window has the GPU alone (100 %, no quota). A client's
#     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can only lower them; xCUDA stays the pacer and the quota accountant.
# Never fails the job: a failing Prolog drains the node. Every directory it writes in must be root's alone; one
# that is not (say a user made it first under /tmp) is not used, and the log says so.
set -u
umask 022
LOG_DIR="${MUXFLOW_NODE_LOG_DIR:-/var/log/muxflow}"
PLAN_DIR="@PLAN_DIR@"
JOB_DIR="@JOB_DIR@"
PLAN_KEY="@PLAN_KEY@"
PLAN_TOOL="@PLAN_TOOL@"
MPS_CONTROL="@MPS_CONTROL@"
PIPE_ROOT="${MUXFLOW_MPS_PIPE_ROOT:-@MPS_PIPE_ROOT@}"
OFFLINE="${MUXFLOW_OFFLINE_PARTITION:-offline}"
PROFILE="${MUXFLOW_PROFILE_PARTITION:-profile}"
job="${SLURM_JOB_ID:-}"
by="${MUXFLOW_PROLOG_BY:+ (run by the $MUXFLOW_PROLOG_BY: slurmd skipped it)}"

# A directory root alone can write to: made (mode 0755) when missing; not a link, owned by root, not writable by
# group or others. Returns non-zero for anything else.
root_dir() {
    [[ -e "$1" || -L "$1" ]] || mkdir -p -m 0755 "$1" 2>/dev/null
    [[ -d "$1" && ! -L "$1" && "$(stat -c '%u' "$1" 2>/dev/null)" == 0 ]] || return 1
    (( ( 8#$(stat -c '%a' "$1") & 8#022 ) == 0 ))
}
root_dir "$LOG_DIR" || LOG_DIR=""
log() {
    local line
    line="$(date -u +%FT%TZ) prolog job=${job:-?} node=${SLURMD_NODENAME:-?}$by: $*"
    if [[ -n "$LOG_DIR" ]]; then echo "$line" >> "$LOG_DIR/muxflow-node.log"; else logger -t muxflow-prolog -- "$line" 2>/dev/null; fi
}

[[ -n "$job" && "$job" =~ ^[0-9]+$ ]] || exit 0
# The job's record as JSON (squeue --json lists every job on some releases: the tool picks ours by id); only an
# offline or profile-partition job's plan counts, and only one that verifies.
# The tool prints the plan file (exit 0) or why there is none (exit 1), never both.
why=""
if ! plan=$(squeue --json -j "$job" 2>/dev/null | python3 "$PLAN_TOOL" prolog "$PLAN_KEY" "$job" "$OFFLINE,$PROFILE" \
            "${SLURMD_NODENAME:-}" 2>&1); then
    why=$plan plan=""
fi
val() { sed -n "s/^$1=\([0-9A-Za-z.+-]*\)$/\1/p" <<<"$plan"; }
gpu=$(val gpu); kind=$(val kind)
if [[ -z "$gpu" || -z "$kind" ]]; then
    log "not a MuxFlow placement: ${why:-no plan}; nothing to do"
    exit 0
fi
if ! root_dir "$PLAN_DIR"; then
    log "plan directory $PLAN_DIR is not root's alone: plan not written, caps not set"
    exit 0
fi
tmp="$PLAN_DIR/.$job.$$"
# uid=: whose plan it is (slurmd's SLURM_JOB_UID): xCUDA takes the plan only for a process of that user.
planuid=""
[[ "${SLURM_JOB_UID:-}" =~ ^[0-9]+$ ]] && planuid="uid=$SLURM_JOB_UID"
printf '%s\n' "$plan" ${planuid:+"$planuid"} > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$PLAN_DIR/$job.plan"
log "plan ($kind) for GPU $gpu: $(tr '\n' ' ' <<<"$plan")"

# The job's own directory (its iteration report), fresh for every run of the job.
uid="${SLURM_JOB_UID:-}" gid="${SLURM_JOB_GID:-}"
if [[ "$uid" =~ ^[0-9]+$ && "$gid" =~ ^[0-9]+$ ]] && root_dir "$JOB_DIR"; then
    rm -rf -- "${JOB_DIR:?}/$job" && mkdir -m 0700 "$JOB_DIR/$job" && chown "$uid:$gid" "$JOB_DIR/$job" \
        || log "cannot make $JOB_DIR/$job for uid $uid"
else
    log "no job directory (job-state directory $JOB_DIR not root's alone, or no job uid)"
fi

if ! command -v "$MPS_CONTROL" >/dev/null 2>&1; then
    log "no MPS control daemon on this node ($MPS_CONTROL not found): hard caps not set (no-op)"
    exit 0
fi
pipe="$PIPE_ROOT/gpu$gpu"
if ! root_dir "$PIPE_ROOT" || ! root_dir "$pipe" || ! root_dir "$pipe.log"; then
    log "MPS pipe directory $pipe is not root's alone: hard caps not set"
    exit 0
fi
export CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$pipe.log"
ctl() {
    if [[ -n "$LOG_DIR" ]]; then echo "$*" | "$MPS_CONTROL" >/dev/null 2>>"$LOG_DIR/muxflow-node.log"
    else echo "$*" | "$MPS_CONTROL" >/dev/null 2>&1; fi || log "MPS control: '$*' failed"
}
if ! servers=$(echo get_server_list | "$MPS_CONTROL" 2>/dev/null); then
    "$MPS_CONTROL" -d 2>/dev/null && log "started MPS control daemon for GPU $gpu (pipe $pipe)"
    servers=""
fi
read -r cap mem <<<"$(python3 "$PLAN_TOOL" caps "$PLAN_DIR" "${SLURMD_NODENAME:-}" "$gpu" 2>/dev/null)"
pct=$(val pct); [[ "$kind" == profile ]] && pct=100
[[ -n "${cap:-}" ]] || cap=$pct
[[ "$cap" == "$pct" ]] || log "GPU $gpu also runs other placed jobs: caps at the largest of their plans"
ctl set_default_active_thread_percentage "$cap"
# MPS takes the limit in whole MiB and reads 0 as no limit: a placed job's quota is rounded up, never below 1M (the
# plan tool refuses quotas under 64 MiB already). Only a profiling window has the GPU with no quota, said as 0.
limit=""
[[ "${mem:-}" =~ ^[0-9]+$ ]] && limit="$(( (mem + 1048575) / 1048576 ))" && limit="$(( limit < 1 ? 1 : limit ))M"
[[ -n "$limit" ]] && ctl set_default_device_pinned_mem_limit "$gpu" "$limit"
[[ -z "$limit" && "$kind" == profile ]] && ctl set_default_device_pinned_mem_limit "$gpu" 0
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
