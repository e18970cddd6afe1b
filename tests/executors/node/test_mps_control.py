"""``SubprocessMpsControl`` against a scripted stand-in for ``nvidia-cuda-mps-control``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from executors.node.detector import ErrorDetector, SubprocessMpsControl

FAKE = r"""#!/bin/bash
# stand-in for nvidia-cuda-mps-control: state files in $FAKE_MPS_DIR
d="$FAKE_MPS_DIR"
if [ "$1" = "-d" ]; then echo start >> "$d/log"; exit 0; fi
read -r cmd arg
echo "$cmd $arg" >> "$d/log"
if [ -e "$d/hang" ]; then exec sleep 30; fi
case "$cmd" in
  get_server_list) cat "$d/servers" 2>/dev/null || true ;;
  get_client_list) cat "$d/clients_$arg" 2>/dev/null || true ;;
  quit) rm -f "$d/servers" ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text(FAKE)
    exe.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FAKE_MPS_DIR", str(state))
    return SubprocessMpsControl(pipe_dir=str(tmp_path / "pipe"), binary=str(exe)), state


def _proc():
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _end(p):
    p.stdin.close()
    p.wait(10)


def test_probe_and_reset(fake):
    ctl, state = fake
    assert ctl.probe(5.0)
    assert ctl.reset(5.0)
    log = (state / "log").read_text().split("\n")
    assert "quit " in log and "start" in log
    assert ctl.env["CUDA_MPS_PIPE_DIRECTORY"].endswith("pipe")


def test_hang_is_a_failed_probe_within_the_timeout(fake):
    ctl, state = fake
    (state / "hang").touch()
    t0 = time.monotonic()
    assert not ctl.probe(0.5)
    assert time.monotonic() - t0 < 5.0


def test_missing_binary_means_no_mps(tmp_path):
    ctl = SubprocessMpsControl(binary=str(tmp_path / "absent"))
    assert ctl.server_alive() is None
    assert not ctl.probe(1.0)
    assert ErrorDetector(ctl).check(0.0, []) == []


def test_server_gone_under_live_clients_is_a_crash(fake):
    ctl, state = fake
    server, client = _proc(), _proc()
    try:
        (state / "servers").write_text(f"{server.pid}\n")
        (state / f"clients_{server.pid}").write_text(f"{client.pid}\n")
        assert ctl.server_alive() is True
        _end(server)
        (state / "servers").write_text("")
        assert ctl.server_alive() is False
        assert ctl.server_alive() is True  # reported once
    finally:
        _end(client)
        if server.poll() is None:
            _end(server)


def test_server_exiting_after_its_clients_is_not_a_crash(fake):
    ctl, state = fake
    server, client = _proc(), _proc()
    (state / "servers").write_text(f"{server.pid}\n")
    (state / f"clients_{server.pid}").write_text(f"{client.pid}\n")
    assert ctl.server_alive() is True
    _end(client)
    _end(server)
    (state / "servers").write_text("")  # e.g. the daemon swapped it for another user's server
    assert ctl.server_alive() is True
    assert os.path.exists(f"/proc/{os.getpid()}")
