#!/usr/bin/env bash
# `make test`'s runner: run a command (the tests) with the dev Slurm cluster up
# (.ci/ensure_slurm.sh), then take the cluster down again if it was not running
# before, so a fresh machine is left as it was found. A cluster that was already
# running (someone's `muxflow slurm dev-up`, another test run) is left running.
# The command's exit status is this script's, whether the tests pass or fail or
# are interrupted; a dev-down problem is reported but does not change it.
#   usage: .ci/with_slurm.sh COMMAND [ARG...]
# MUXFLOW_SLURM_DIR / _BRIDGE / _PORT_BASE / _SUBNET select another cluster
# (dev-up and the tests read them too).
set -u
cd "$(dirname "$0")/.."
muxflow=${MUXFLOW_BIN:-.venv/bin/muxflow}

running_before=0
# Any recorded dev-cluster process alive counts as "already running", even an unhealthy
# cluster that dev-up is about to repair: it is not ours to stop.
if [ -x "$muxflow" ] && "$muxflow" slurm dev-status 2>/dev/null | grep -qE ' running$'; then
  running_before=1
fi

bash .ci/ensure_slurm.sh

# Interrupted (Ctrl-C, TERM): the command gets the signal too and ends; the cluster still goes down.
trap 'echo "interrupted; waiting for the command to end" >&2' INT TERM
status=0
"$@" || status=$?
trap - INT TERM

if [ "$running_before" = 0 ] && [ "$(id -u)" = 0 ] && [ -x "$muxflow" ] \
   && "$muxflow" slurm dev-status 2>/dev/null | grep -qE ' running$'; then
  echo "taking down the dev Slurm cluster this run brought up (it was not running before)"
  "$muxflow" slurm dev-down || echo "note: 'muxflow slurm dev-down' reported problems (above)" >&2
fi
exit "$status"
