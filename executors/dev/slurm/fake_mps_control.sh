#!/bin/bash
# A stand-in for nvidia-cuda-mps-control on the dev cluster's GPU-less nodes (docs/SLURM.md "Hard caps").
# It keeps the real one's interface for what MuxFlow's node scripts send, per pipe directory
# ($CUDA_MPS_PIPE_DIRECTORY, one per GPU): `-d` starts "the daemon" (fails when one runs), commands on stdin
# are answered like the real one's and each is appended to commands.log there, with the caller's uid.
# get_server_list prints the PIDs listed in servers (a test writes them: processes standing in for MPS
# servers of some user). Without a running daemon every command fails, as the real client does.
set -u
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
mkdir -p "$pipe"
record() { echo "$(date -u +%FT%T.%NZ) uid=$(id -u) $*" >> "$pipe/commands.log"; }
if [[ "${1:-}" == "-d" ]]; then
    if [[ -f "$pipe/daemon" ]]; then
        echo "An instance of this daemon is already running" >&2
        exit 1
    fi
    echo "$$" > "$pipe/daemon"
    echo 100 > "$pipe/default_active_thread_percentage"
    record "-d"
    exit 0
fi
if [[ ! -f "$pipe/daemon" ]]; then
    echo "Cannot find MPS control daemon process" >&2
    exit 1
fi
status=0
while read -r cmd args; do
    [[ -n "$cmd" ]] || continue
    record "$cmd${args:+ $args}"
    case "$cmd" in
        get_server_list) cat "$pipe/servers" 2>/dev/null ;;
        get_default_active_thread_percentage) cat "$pipe/default_active_thread_percentage" ;;
        set_default_active_thread_percentage) echo "$args" > "$pipe/default_active_thread_percentage" ;;
        set_active_thread_percentage|set_device_pinned_mem_limit|set_default_device_pinned_mem_limit) ;;
        quit) rm -f "$pipe/daemon" ;;
        *) echo "unknown command $cmd" >&2; status=1 ;;
    esac
done
exit $status
