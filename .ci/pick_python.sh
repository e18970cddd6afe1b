#!/usr/bin/env bash
# The Python the virtual environment is made from: the first candidate (Python >= 3.11 with venv)
# that every user of the machine can run. Offline jobs run the reference workloads and xCUDA's
# harness from the venv as their owners, and the scheduler's service account runs Dagster from it:
# a Python under a private home (pyenv's under /root, mode 0700) would be "Permission denied" for
# all of them. Falls back to the first usable candidate, with a note, when none is open to all.
#   usage: .ci/pick_python.sh [CANDIDATE...]   (default: python3 /usr/bin/python3 /usr/local/bin/python3)
set -u
candidates=("$@")
[ ${#candidates[@]} -gt 0 ] || candidates=(python3 /usr/bin/python3 /usr/local/bin/python3)
first=""
for c in "${candidates[@]}"; do
  command -v "$c" >/dev/null 2>&1 || continue
  verdict=$("$c" - <<'EOF' 2>/dev/null
import os, stat, sys
if sys.version_info < (3, 11):
    print("old"); raise SystemExit
try:
    import ensurepip, venv  # noqa: F401  (Debian ships venv without ensurepip unless python3-venv is installed)
except ImportError:
    print("novenv"); raise SystemExit

def open_to_all(path):
    """Every directory above `path` is searchable by others, and `path` itself readable and searchable."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(1, len(parts)):
        d = os.sep.join(parts[:i]) or os.sep
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_IROTH) and bool(mode & stat.S_IXOTH)

ok = open_to_all(sys.executable) and open_to_all(os.path.dirname(os.__file__))
print("open" if ok else "private")
EOF
)
  case "$verdict" in
    open) echo "$c"; exit 0 ;;
    private) [ -n "$first" ] || first="$c" ;;
  esac
done
if [ -n "$first" ]; then
  echo "note: no Python >= 3.11 that every user can run was found; using $first (jobs and the service" \
       "account cannot run the venv: the live tests that run as them fail)" >&2
  echo "$first"
  exit 0
fi
echo "error: no Python >= 3.11 with venv among: ${candidates[*]}" >&2
exit 1
