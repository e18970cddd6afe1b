#!/usr/bin/env bash
# Install Prometheus (the server and promtool, Debian's package) for the observability tests
# (tests/live/test_prometheus_live.py: a real Prometheus scrapes the node agents and the scheduler, and evaluates
# MuxFlow's alert rules; promtool checks the rules and the exposition format) when it is missing and we are root.
# The tests run their own server (their own port, configuration and storage): the package's service, where the
# machine starts one, is not used. Never fails the make: the tests skip without it, or fail under CI=true.
set -u
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: prometheus/promtool missing; install Debian's 'prometheus' package or the observability tests are" \
       "skipped (fail under CI=true)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing prometheus (server and promtool) for the observability tests"
if ! apt-get install -y -q --no-install-recommends prometheus; then
  apt-get update -q && apt-get install -y -q --no-install-recommends prometheus
fi
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  echo "installed $(prometheus --version 2>&1 | head -1)"
else
  echo "note: could not install prometheus; the observability tests are skipped (fail under CI=true)" >&2
fi
exit 0
