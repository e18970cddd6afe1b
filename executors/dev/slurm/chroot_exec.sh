#!/bin/sh
# Run a command inside a Slurm release's root file system (docs/SLURM.md "Slurm 24.11").
#   chroot_exec.sh ROOT DIR... -- CMD ARG...
# In a mount namespace of its own (gone with its last process): /proc, /dev and /sys of the host, and
# each DIR bound at the same path (the cluster's state directory, the repository), then chroot.
# unshare and chroot exec in place, so the PID the dev cluster records is the command's.
set -e
root=$1; shift
binds=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do binds="$binds $1"; shift; done
[ "$1" = "--" ] && shift
exec unshare --mount --propagation private -- /bin/sh -ec '
root=$1; binds=$2; shift 2
for d in /proc /dev /sys; do mount --rbind "$d" "$root$d"; done
for d in $binds; do mkdir -p "$root$d"; mount --rbind "$d" "$root$d"; done
exec chroot "$root" "$@"' chroot_exec "$root" "$binds" "$@"
