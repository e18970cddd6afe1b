#!/usr/bin/env bash
# Start the machine's PostgreSQL when it is installed but not running. The test
# suite itself falls back to a throwaway server (tests/conftest.py) and, under
# CI=true, fails rather than skips when none can be had.
set -u
host=${MUXFLOW_PG_HOST:-127.0.0.1}
if command -v pg_isready >/dev/null && pg_isready -q -h "$host" -p 5432; then
  exit 0
fi
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  for v in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$v" main start 2>/dev/null || true
  done
  for _ in $(seq 1 50); do
    pg_isready -q -h "$host" -p 5432 && { echo "started PostgreSQL"; exit 0; }
    sleep 0.2
  done
fi
echo "note: no PostgreSQL on $host:5432; tests will try a throwaway server" >&2
exit 0
