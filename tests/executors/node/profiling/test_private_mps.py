"""The harness's private MPS control daemon (``colocate.Mps``) against a scripted stand-in for
``nvidia-cuda-mps-control``: started means it answers; one that exits right after ``-d`` says why, from its log."""

from __future__ import annotations

from pathlib import Path

import pytest

from executors.node.profiling.colocate import Mps

# The stand-in: `-d` starts a "daemon" (a state file in the pipe directory) unless it is given -S on a driver
# without static partitions, where it writes its log and exits, as the real one does; a command on stdin is
# answered only while the daemon is there.
FAKE = r"""#!/bin/bash
pipe="$CUDA_MPS_PIPE_DIRECTORY"; logd="$CUDA_MPS_LOG_DIRECTORY"
if [ "$1" = "-d" ]; then
  if [ "$2" = "-S" ] && [ -z "$FAKE_STATIC_OK" ]; then
    echo "[2026-11-29 19:00:00.000 Control 1] Starting control daemon" >> "$logd/control.log"
    echo "[2026-11-29 19:00:00.001 Control 1] static SM partitioning is not supported" >> "$logd/control.log"
    exit 0
  fi
  touch "$pipe/running"; exit 0
fi
read -r cmd
if [ ! -e "$pipe/running" ]; then echo "Cannot find MPS control daemon process"; exit 1; fi
case "$cmd" in
  get_default_active_thread_percentage) echo 100.0 ;;
  quit) rm -f "$pipe/running" ;;
esac
"""


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path


def test_a_daemon_that_answers_is_started(fake_mps: Path) -> None:
    mps = Mps(fake_mps / "run")
    assert mps.start() is None and mps.started
    mps.stop()
    assert not (mps.pipe / "running").exists() and not mps.started


def test_a_daemon_that_exits_after_starting_is_not_taken_for_started_and_its_log_says_why(fake_mps: Path) -> None:
    mps = Mps(fake_mps / "run")
    mps.answer_timeout_s = 0.5
    why = mps.start(static=True)
    assert why is not None and not mps.started
    assert why.startswith("nvidia-cuda-mps-control -d -S: the control daemon does not answer "
                          "(Cannot find MPS control daemon process)")
    assert "static SM partitioning is not supported" in why


def test_static_partitions_where_the_driver_has_them(fake_mps: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_STATIC_OK", "1")
    mps = Mps(fake_mps / "run")
    assert mps.start(static=True) is None and mps.started
